"""How fast the CLI answers when it has nothing to compute: ``--version``, ``--help`` (the
top level and a command's, first with the help lists made from the registries, then from
their cache), and refusals of bad input (a missing checkpoint, a bad count, an unknown
precision). Each is a fresh process, as a user types it; the median of ``--repeats`` runs
beside a bare ``python -c pass``, so the ratio is what quarl adds.

Run: ``.venv/bin/python benchmarks/bench_cli_latency.py`` (about 30 s; ``--quick``: one run
each). The goal is under a second for every row but the unknown precision, which needs the
precision registry (torch) to list what is allowed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ZOO = Path(__file__).resolve().parents[1].parent / "shared" / "zoo"


def timed(args: list[str], env: dict[str, str], repeats: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        code = subprocess.run(args, env=env, capture_output=True).returncode
        times.append(time.perf_counter() - start)
    return statistics.median(times), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run of each")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    quarl = [sys.executable, "-m", "quarl.cli"]
    agent = ZOO / "ppo" / "CartPole-v1_1"
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "HOME": home}  # the help-list cache starts empty
        env.pop("QUARL_CACHE", None)
        rows = [("python -c pass", [sys.executable, "-c", "pass"], False)]
        rows += [
            ("quarl --version", [*quarl, "--version"], False),
            ("quarl --help", [*quarl, "--help"], False),
            ("quarl ptq --help (lists made)", [*quarl, "ptq", "--help"], True),
            ("quarl ptq --help (lists cached)", [*quarl, "ptq", "--help"], False),
            ("quarl ptq MISSING", [*quarl, "ptq", "no/such/agent"], False),
        ]
        if agent.exists():
            rows += [("quarl ptq AGENT --episodes 0", [*quarl, "ptq", str(agent), "--episodes", "0"], False),
                     ("quarl ptq AGENT --precisions int3x", [*quarl, "ptq", str(agent), "--precisions", "int3x"], False)]
        base = None
        print(f"{'command':<36} {'seconds':>8} {'x python':>9} {'exit':>5}   (median of {repeats}; {os.cpu_count()} cpus)")
        for name, command, once in rows:
            seconds, code = timed(command, env, 1 if once else repeats)
            base = base or seconds
            print(f"{name:<36} {seconds:8.2f} {seconds / base:9.1f} {code:5d}", flush=True)


if __name__ == "__main__":
    main()
