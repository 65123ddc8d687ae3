"""Measured error rates of quarl's verdict, on real return pools and on synthetic pools with
rare large failures, with what each ``--insure`` setting insures against and costs.

Three tables (see :mod:`quarl.verdict.coverage`):

1. **insurance.md**: every pool (real ones from ``tests/data/return_pools``, made by
   ``benchmarks/make_return_pools.py``; synthetic ones from
   :func:`quarl.verdict.coverage.synthetic_pools`) under the deciding schedule ``quarl ptq``
   runs (20 episodes, then a look every 10, up to 640): whether the default insurance covers
   it, the interval's coverage of the pool's E, how often a decided verdict is wrong, how
   often it decides and the median episodes to decide. An uncovered pool is also run at the
   ``--insure`` that covers it. Pass lines: coverage >= 95 % and wrong <= 5 % on covered
   pools, within Monte Carlo error (``*`` marks a miss).
2. **insure.md**: what each ``--insure K`` costs (median episodes to keep identical play and
   a 2.5 % loss) and which synthetic failures it covers.
3. **coverage.md**: quarl's confidence sequence against the BCa bootstrap and a t-interval
   it replaced, at N = 1..100 paired episodes on the real pools.

Run: ``.venv/bin/python benchmarks/bench_verdict_coverage.py`` (about 5 minutes on 2 cores:
1000 streams per pool; ``--quick`` for a smoke run). Writes
``results/verdict-coverage/{insurance,insure,coverage}.{md,csv,json}`` and prints them.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from quarl.evaluation.reports import write_rows
from quarl.verdict.bounds import DEFAULT_INSURE
from quarl.verdict.coverage import METHODS, SIZES, Pool, fixed_n, load_pools, sequential, synthetic_pools

POOLS = Path(__file__).resolve().parents[1] / "tests" / "data" / "return_pools"
INSURES = (0.5, 1.0, 2.0, 5.0, 10.0, 25.0)


def _median(value: float) -> object:
    return "never" if math.isinf(value) else round(value)


def covering_insure(pool: Pool) -> float | None:
    """The least of :data:`INSURES` that covers ``pool`` (None: none does)."""
    return next((k for k in INSURES if pool.covered(k)), None)


def insurance_rows(pools: list[Pool], streams: int, cap: int, started: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    margin = 2 * math.sqrt(0.05 * 0.95 / streams)  # two Monte Carlo standard errors at the 5 % line
    for pool in pools:
        covered = pool.covered()
        settings = [(DEFAULT_INSURE, covered)]
        cover = covering_insure(pool)
        if not covered and cover is not None:
            settings.append((cover, True))
        for insure, is_covered in settings:
            r = sequential(pool, "cs", 20, cap, streams, seed=1, insure=insure)
            bad = is_covered and (r.coverage < 0.95 - margin or r.wrong > 0.05 + margin)
            rows.append({"pool": f"{pool.name}" + ("" if pool.precision == "synthetic" else f" {pool.precision}"),
                         "env": pool.env_id or "(none)", "E%": round(pool.e, 2),
                         "failure costs": "" if pool.failure_cost is None else round(pool.failure_cost, 1),
                         "insure": insure, "covered": "yes" if is_covered else "no",
                         "coverage%": round(100 * r.coverage, 1),
                         "wrong%": f"{100 * r.wrong:.1f}" + (" *" if bad else ""),
                         "decided%": round(100 * r.decided), "median episodes": _median(r.median_to_decide)})
            print(f"{time.perf_counter() - started:6.0f} s  {rows[-1]}", flush=True)
    return rows


def insure_rows(synthetic: list[Pool], streams: int, cap: int) -> list[dict[str, object]]:
    by = {p.name: p for p in synthetic}
    failures = [p for p in synthetic if p.name.startswith("1 in ")]
    rows: list[dict[str, object]] = []
    for k in INSURES:
        identical = sequential(by["identical"], "cs", 20, cap, streams, seed=2, insure=k)
        noisy = sequential(by["noise E 2.5 sd 2"], "cs", 20, cap, streams, seed=2, insure=k)
        rows.append({"--insure": k,
                     "median to keep, identical play": _median(identical.median_to_decide),
                     "median to keep, E 2.5 % (sd 2 %)": _median(noisy.median_to_decide),
                     "covers failures costing": ", ".join(sorted({f"{p.failure_cost:g}" for p in failures
                                                                  if p.covered(k)}, key=float)) or "none"})
    return rows


def method_rows(pools: list[Pool], draws: int, methods: list[str], sizes: tuple[int, ...],
                cap: int) -> list[dict[str, object]]:
    rows = []
    for pool in pools:
        for method in methods:
            n_draws = draws if method != "bca" else max(draws // 5, 20)
            margin = 2 * math.sqrt(0.05 * 0.95 / n_draws)
            row: dict[str, object] = {"pool": f"{pool.name} {pool.precision}", "E%": round(pool.e, 2), "method": method}
            cells = [(str(n), fixed_n(pool, method, n, n_draws, seed=n)) for n in sizes]
            cells.append(("seq", sequential(pool, method, 20, cap, n_draws, seed=1)))
            for name, r in cells:
                bad = r.coverage < 0.95 - margin or r.wrong > 0.05 + margin
                row[f"N={name}"] = f"{100 * r.coverage:.0f} / {100 * r.wrong:.0f}" + (" *" if bad else "")
            row["seq median"] = _median(cells[-1][1].median_to_decide)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000, help="streams per pool (the bootstrap: a fifth)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--pools", type=Path, default=POOLS)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the tables (default results/verdict-coverage; --quick: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 streams, a few pools, cap 80")
    args = parser.parse_args()
    real = load_pools(args.pools)
    synthetic = synthetic_pools(real=real)
    sizes: tuple[int, ...] = SIZES
    cap = 640
    if args.quick:
        args.streams, real, synthetic, sizes, cap = 40, real[:2], synthetic[:2] + synthetic[-2:], (1, 5, 20), 80
        args.out = args.out or Path(tempfile.mkdtemp(prefix="quarl-coverage-"))  # the docs' tables stay as made
    args.out = args.out or Path("results/verdict-coverage")
    started = time.perf_counter()
    insurance = insurance_rows(synthetic + real, args.streams, cap, started)
    write_rows(insurance, args.out, "insurance")
    insure = insure_rows(synthetic, args.streams // 2, cap) if not args.quick else []
    if insure:
        write_rows(insure, args.out, "insure")
    methods = method_rows(real, args.streams, args.methods.split(","), sizes, cap)
    write_rows(methods, args.out, "coverage")
    print(f"\nunder the deciding schedule (20 episodes, a look every 10, up to {cap}); * a covered pool over the "
          "pass lines (coverage >= 95 %, wrong <= 5 %) beyond Monte Carlo error")
    print((args.out / "insurance.md").read_text())
    if insure:
        print((args.out / "insure.md").read_text())
    print("coverage % / wrong decided % per N (95 % intervals)")
    print((args.out / "coverage.md").read_text())


if __name__ == "__main__":
    main()
