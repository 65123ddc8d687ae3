#!/usr/bin/env bash
# The paper's GPU case study in one prepared run (docs/benchmarks.md, "On a GPU"):
#  1. bench_train_precision.py on CUDA, policies A and B, then C with and without
#     torch.compile; a torch.profiler table of one update of C per precision;
#  2. quarl actorq run with the learner on cuda against the cpu learner, on the same machine,
#     in local mode (Ray's wheel does not travel to the GPU machine: see the docs).
# The GPU machine has torch but not gymnasium, SB3, ale-py or pydantic: they come as wheels in
# .whl/ (docs/benchmarks.md, "On a GPU", says how to fetch them). Every output goes to a work
# folder, packed after each step into $OUT/case-study.tar (default OUT: results/gpu-case-study):
# one file, whole after every step, however many outputs; each step has its own time limit, so
# one that fails or overruns leaves the others' results.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-case-study}
WORK=$(mktemp -d)
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 COLUMNS=200 MUJOCO_GL=egl OMP_NUM_THREADS=1
PY=${PY:-python3}
log() {
    echo "$(date -u +%H:%M:%S) $*" | tee -a "$WORK/log.txt"
    tar -cf "$OUT/case-study.tar" -C "$WORK" .
}

log "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1), $(nproc) cores"
$PY -c "import torch, gymnasium, stable_baselines3, ale_py, quarl; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" 2>&1 | tee -a "$WORK/log.txt"

# the same ActorQ settings for both learners: the docs' quick CartPole run, and the paper's
# actor-bound 3 x 2048 policy (the defaults) with the same target
QUICK=(--algo dqn --actors 2 --actor-precision int8 --policy-layers 256,256 --lr 1e-3 --batch-size 64
       --min-replay 500 --samples-per-insert 8 --update-period 100 --push-period 50 --eval-seconds 2
       --eval-episodes 3 --target-reward 195 --max-minutes 1)
BIG=(--algo dqn --actors 2 --actor-precision int8 --eval-seconds 2 --eval-episodes 3 --target-reward 195
     --max-minutes 2)
actorq() {  # NAME DEVICE ARGS...
    local name=$1 device=$2; shift 2
    log "actorq $name on $device"
    timeout 150 $PY -m quarl.cli actorq run CartPole-v1 --local --learner-device "$device" "$@" \
        --out "/tmp/aq-$name-$device" > "$WORK/actorq-$name-$device.txt" 2>&1
    cp "/tmp/aq-$name-$device/summary.json" "$WORK/actorq-$name-$device.json" 2>/dev/null
    log "actorq $name on $device: $(tail -1 "$WORK/actorq-$name-$device.txt")"
}

log "train precision: policies A, B (fused Adam)"
timeout 110 $PY benchmarks/bench_train_precision.py --device cuda --policies A,B --seconds 2 \
    > "$WORK/train-precision-AB.txt" 2>&1
log "train precision: policy C with SB3's foreach Adam (as 2026-11-28)"
timeout 60 $PY benchmarks/bench_train_precision.py --device cuda --policies C --seconds 2 --optimizer foreach \
    > "$WORK/train-precision-C-foreach.txt" 2>&1
log "profile: policy C (fused Adam)"
timeout 60 $PY benchmarks/profile_train_step.py --device cuda --policy C --steps 20 --optimizer fused \
    > "$WORK/profile-C.txt" 2>&1

log "train precision: policy C with and without --compile, beside the cpu learner's ActorQ runs"
timeout 230 $PY benchmarks/bench_train_precision.py --device cuda --policies C --seconds 2 --compile \
    > "$WORK/train-precision-C-compile.txt" 2>&1 &
bench=$!
(actorq quick cpu "${QUICK[@]}"; actorq big cpu "${BIG[@]}") &
cpu_runs=$!
wait $bench
log "train precision C done"
wait $cpu_runs
actorq quick cuda "${QUICK[@]}"
actorq big cuda "${BIG[@]}"
log "done"
