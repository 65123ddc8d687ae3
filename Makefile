# One command each: `make demo` sets up .venv and runs the main job; `make test` sets up
# .venv and runs the tests. An existing .venv is reused; pip only adds what changed.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

export MUJOCO_GL ?= egl
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo test test-as-avx2 test-slow bench bench-quick docs

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/quarl demo

# two pytest workers, each test file on one of them (its fixtures, Ray runs and kills stay
# together); TEST_JOBS=1 runs them one after the other
TEST_JOBS ?= 2

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/mkdocs build --strict --quiet
	$(VENV)/bin/python -m pytest -n $(TEST_JOBS) --dist loadfile

# the suite as on a CPU with AVX2 only (no VNNI; MatMulNBits' int8 compute not exact, so the block
# modes fall back to weight-only) whatever this CPU has: quarl's probes answer so, ONNX Runtime
# runs what it runs (QUARL_CPU_KIND, docs/ptq.md)
test-as-avx2: $(STAMP)
	QUARL_CPU_KIND=avx2 $(VENV)/bin/python -m pytest -n $(TEST_JOBS) --dist loadfile

# the documentation site, into build/site (mkdocs serve for a live preview)
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -m slow

BENCHMARKS := bench_inference bench_evaluation bench_train_precision bench_actorq

bench: $(STAMP)
	for b in $(BENCHMARKS); do $(VENV)/bin/python benchmarks/$$b.py || exit 1; done

# every benchmark (and the three agent studies) at its --quick size: a smoke run that CI makes
bench-quick: $(STAMP)
	for b in $(BENCHMARKS) ptq_own_agents ptq_image_agents recover_agents bench_verdict_coverage bench_cli_latency make_return_pools profile_train_step; do \
		echo "== $$b --quick"; $(VENV)/bin/python benchmarks/$$b.py --quick > /dev/null || exit 1; done
