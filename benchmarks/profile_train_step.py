"""Where one DQN gradient step of ``bench_train_precision.py`` spends its time, per precision.

Builds the same DQN on Pong as ``bench_train_precision.py`` (policy A, B or C), fills the
replay buffer, runs a few warm-up updates, then ``--steps`` updates under
``torch.profiler`` and prints, per precision, the mean wall time of one update and the
operators that took the most device time (CUDA kernels on a GPU, CPU time on a CPU). It is
what the case study's goals ask for where one is missed: the profile says whether the step
is bound by kernels (the matmuls and convolutions low precision speeds up) or by the host
(Python, launches, syncs, the batch's copy), which low precision cannot speed up.

Run: ``.venv/bin/python benchmarks/profile_train_step.py --device cuda --policy C``
(``--quick`` for a smoke run on a CPU: policy A, 2 steps).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from bench_train_precision import POLICIES, PRECISIONS, device_name, make_model, set_tf32  # noqa: E402
from rich.console import Console  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

torch.set_num_threads(1)


def profile_update(policy: str, precision: str, device: str, steps: int, rows: int,
                   fused: bool) -> tuple[float, str]:
    """Mean seconds of one update over ``steps`` (outside the profiler) and the profiler's table."""
    set_tf32(precision == "tf32")
    model = make_model(policy, precision, device, compiled=False, fused=fused)
    model.learn(200)  # fills the buffer past learning_starts
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        model.train(gradient_steps=1, batch_size=32)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        model.train(gradient_steps=1, batch_size=32)
    sync()
    seconds = (time.perf_counter() - start) / steps
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            model.train(gradient_steps=1, batch_size=32)
        sync()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    model.env.close()
    set_tf32(False)
    return seconds, prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--policy", default="C", choices=sorted(POLICIES))
    parser.add_argument("--precisions", default="fp32,tf32,bf16,fp16", help=f"comma list of {', '.join(PRECISIONS)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=20, help="updates timed and profiled")
    parser.add_argument("--rows", type=int, default=15, help="operators shown per precision")
    parser.add_argument("--optimizer", choices=("fused", "foreach"), default="foreach",
                        help="Adam's implementation (foreach: SB3's default)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: policy A, fp32 and bf16, 2 steps")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    precisions = args.precisions.split(",")
    for p in precisions:
        if p not in PRECISIONS:
            parser.error(f"--precisions: unknown {p!r}, allowed {', '.join(PRECISIONS)}")
    if not cuda:
        precisions = [p for p in precisions if p != "tf32"]  # a CPU has no TF32
    if args.quick:
        args.policy, precisions, args.steps, args.rows = "A", ["fp32", "bf16"], 2, 5
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: must be at least 1")
    warnings.filterwarnings("ignore")
    console = Console()
    filters, fc = POLICIES[args.policy]
    console.print(f"{device_name(args.device)}, torch {torch.__version__}, policy {args.policy} "
                  f"(3 conv x {filters} + FC {fc}), DQN on Pong, batch 32, Adam {args.optimizer}, {args.steps} "
                  "updates per precision")
    timings = {}
    for p in precisions:
        seconds, table = profile_update(args.policy, p, args.device, args.steps, args.rows, args.optimizer == "fused")
        timings[p] = seconds
        console.print(f"\n== {p}: {seconds * 1e3:.2f} ms per update")
        console.print(table, markup=False, highlight=False, soft_wrap=True)
    base = timings.get("fp32")
    console.print("\nms per update: " + ", ".join(
        f"{p} {s * 1e3:.2f}" + (f" ({base / s:.2f}x fp32)" if base else "") for p, s in timings.items()))


if __name__ == "__main__":
    main()
