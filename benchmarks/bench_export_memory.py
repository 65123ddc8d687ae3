"""Model bytes and peak memory of an inference process for the paper's Raspberry Pi MLPs.

The paper's second case study deploys int8 policies on a Raspberry Pi 3b: MLPs of 3 x 64,
3 x 256 and (4096, 512, 1024) hidden units, "4x less memory" at int8. Here each MLP (8
inputs, 4 outputs, ReLU, random weights) goes through the path ``quarl export`` takes
(:func:`quarl.export.artifact.export_policy`: the ONNX file and its sidecar) at fp32, fp16, int8
(``int8-block``, MatMulNBits, and ``int8-dyn-channel``, MatMulInteger) and int4
(``int4-block``); then a fresh process (numpy + onnxruntime only, as a board runs it)
loads the file into an ONNX Runtime session (one thread, default options) and runs 1000
batch-1 inferences. Its peak resident memory (``VmHWM``) is printed beside that of
the same process before the session (``base``: Python, numpy and ONNX Runtime), and the
median batch-1 latency on this CPU.

Run: ``.venv/bin/python benchmarks/bench_export_memory.py`` (~1 minute; ``--quick``: the
small MLP at fp32 and int8). Speed on ARM cannot be measured under emulation: run this
script natively on the board (it needs quarl to build the files, or copy ``--keep DIR``'s
files there and run ``--measure DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

MLPS = {"3x64": (64, 64, 64), "3x256": (256, 256, 256), "4096-512-1024": (4096, 512, 1024)}
PRECISIONS = ("fp32", "fp16", "int8-block", "int8-dyn-channel", "int4-block")
OBS, ACTIONS = 8, 4

# the fresh inference process: imports, session, 1000 batch-1 runs, peak RSS
PROBE = r'''
import json, resource, sys, time
import numpy as np
import onnxruntime as ort

def hwm_kib():
    """This process's peak resident memory: VmHWM (ru_maxrss carries the parent's over a fork)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

base = hwm_kib()
o = ort.SessionOptions()
o.intra_op_num_threads = 1
o.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).standard_normal((1, int(sys.argv[2]))).astype(np.float32)
times = []
for _ in range(1000):
    t = time.perf_counter(); s.run(None, {"obs": x}); times.append(time.perf_counter() - t)
peak = hwm_kib()
print(json.dumps({"base_kib": base, "peak_kib": peak, "b1_us": 1e6 * sorted(times)[500]}))
'''


def build(folder: Path, names: list[str], precisions: list[str]) -> dict[tuple[str, str], Path]:
    """Each MLP at each precision through quarl's export path."""
    import gymnasium as gym
    import numpy as np
    import torch
    from torch import nn

    from quarl.export.artifact import export_policy
    from quarl.policies.base import Policy

    torch.manual_seed(0)
    files = {}
    calibration = np.random.default_rng(0).standard_normal((512, OBS)).astype(np.float32)
    for name in names:
        sizes = (OBS, *MLPS[name], ACTIONS)
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        policy = Policy(nn.Sequential(*layers[:-1]), gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
                        gym.spaces.Discrete(ACTIONS), "argmax", algo="ppo")
        for precision in precisions:
            out = folder / name / precision / "policy"
            export_policy(policy, precision, out, calibration=calibration)
            files[name, precision] = out.with_suffix(".onnx")
    return files


def measure(path: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(path), str(OBS)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"error: the inference process failed on {path}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 3x64 MLP at fp32 and int8-block")
    parser.add_argument("--keep", type=Path, default=None, help="write the models here (default: a temp folder)")
    parser.add_argument("--measure", type=Path, default=None,
                        help="measure the models a --keep run wrote (MLP/PRECISION/policy.onnx) without quarl")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = parser.parse_args()
    names = ["3x64"] if args.quick else list(MLPS)
    precisions = ["fp32", "int8-block"] if args.quick else list(PRECISIONS)
    with tempfile.TemporaryDirectory() as tmp:
        if args.measure is not None:
            files = {(n, p): args.measure / n / p / "policy.onnx" for n in names for p in precisions
                     if (args.measure / n / p / "policy.onnx").exists()}
        else:
            folder = args.keep or Path(tmp)
            files = build(folder, names, precisions)
        print(f"{platform.machine()}, {os.cpu_count()} cpus; one fresh process per row: session + 1000 batch-1 runs")
        print(f"{'MLP':<14} {'precision':<17} {'model KiB':>10} {'x fp32':>7} {'peak RSS MiB':>13} "
              f"{'base MiB':>9} {'peak-base MiB':>14} {'b1 us':>8}")
        rows = []
        for (name, precision), path in files.items():
            got = measure(path)
            size = path.stat().st_size
            fp32 = files.get((name, "fp32"))
            row = {"mlp": name, "precision": precision, "model_kib": size / 1024,
                   "x_fp32": (fp32.stat().st_size / size) if fp32 else float("nan"),
                   "peak_mib": got["peak_kib"] / 1024, "base_mib": got["base_kib"] / 1024,
                   "b1_us": got["b1_us"]}
            row["added_mib"] = row["peak_mib"] - row["base_mib"]
            rows.append(row)
            print(f"{name:<14} {precision:<17} {row['model_kib']:10.1f} {row['x_fp32']:7.2f} {row['peak_mib']:13.1f} "
                  f"{row['base_mib']:9.1f} {row['added_mib']:14.1f} {row['b1_us']:8.1f}", flush=True)
    if args.markdown:
        print("\n| MLP | precision | model KiB | smaller than fp32 | peak RSS MiB | of which past imports MiB | "
              "b1 us (x86) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['mlp']} | {r['precision']} | {r['model_kib']:.1f} | {r['x_fp32']:.2f}x | {r['peak_mib']:.1f} "
                  f"| {r['added_mib']:.1f} | {r['b1_us']:.1f} |")


if __name__ == "__main__":
    main()
