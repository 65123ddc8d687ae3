"""How fast the CLI answers when it has nothing to compute: ``--version``, ``--help`` (the
top level and a command's, twice: a quarl before issue 48 made its help lists from the
registries, loading torch, the first time and kept them in a cache under HOME; quarl now reads
the built-in lists, :mod:`quarl.cli.builtin_lists`, and keeps nothing), and refusals of bad
input (a missing checkpoint, an unknown precision, an unknown env id, a text file given as a
checkpoint, ``--out`` naming the input, bad counts, contradicting flags, train's and sweep's
options). Each is a fresh process, as a user types it; the median of ``--repeats`` runs beside
a bare ``python -c pass``, so the ratio is what quarl adds. Every refusal must exit 2; its
first words are printed so a row that refused for another reason shows.

``--baseline DIR`` times another quarl source tree (DIR/src, e.g. ``git archive HEAD src | tar
-x -C DIR`` before a change) in the same run, each command alternating between the two, so
the columns compare under the same load.

Run: ``.venv/bin/python benchmarks/bench_cli_latency.py`` (about a minute; ``--quick``: one run
each). The goal is under a second for every row on a quiet 2-core machine: options and paths
are checked before torch, ONNX Runtime, gymnasium or SB3 load.
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


def timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    said = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1]
    return seconds, done.returncode, said


def rows(quarl: list[str], folder: Path, agent: Path | None) -> list[tuple[str, list[str], bool]]:
    """(name, command, run once): the commands timed."""
    notes = folder / "notes.txt"
    notes.write_text("not a policy\n")
    export = folder / "export"  # what an export's sidecar looks like to a user who gives it as the policy
    export.mkdir()
    sidecar = export / "policy.json"
    sidecar.write_text('{"format": 1}\n')
    (export / "policy.onnx").write_bytes(b"")
    out = [
        ("python -c pass", [sys.executable, "-c", "pass"], False),
        ("quarl --version", [*quarl, "--version"], False),
        ("quarl --help", [*quarl, "--help"], False),
        ("quarl ptq --help (first)", [*quarl, "ptq", "--help"], True),
        ("quarl ptq --help (again)", [*quarl, "ptq", "--help"], False),
        ("quarl actorq run --help", [*quarl, "actorq", "run", "--help"], False),
        ("ptq MISSING", [*quarl, "ptq", "no/such/agent"], False),
        ("ptq a text file", [*quarl, "ptq", str(notes)], False),
        ("ptq policy.json", [*quarl, "ptq", str(sidecar)], False),
        ("train ppo NoSuchEnv-v0", [*quarl, "train", "ppo", "NoSuchEnv-v0"], False),
        ("train ppo CartPole-v1 --timesteps 0", [*quarl, "train", "ppo", "CartPole-v1", "--timesteps", "0"], False),
        ("train ppo2 CartPole-v1", [*quarl, "train", "ppo2", "CartPole-v1"], False),
    ]
    if agent is not None:
        a = str(agent)
        out += [
            ("ptq AGENT --precisions int3x", [*quarl, "ptq", a, "--precisions", "int3x"], False),
            ("ptq AGENT --env NoSuchEnv-v0", [*quarl, "ptq", a, "--env", "NoSuchEnv-v0"], False),
            ("ptq AGENT --out AGENT", [*quarl, "ptq", a, "--out", a], False),
            ("ptq AGENT --workers 0", [*quarl, "ptq", a, "--workers", "0"], False),
            ("ptq AGENT --episodes 0", [*quarl, "ptq", a, "--episodes", "0"], False),
            ("ptq AGENT --stochastic --deterministic", [*quarl, "ptq", a, "--stochastic", "--deterministic"], False),
            ("sweep AGENT --bits 1", [*quarl, "sweep", a, "--bits", "1"], False),
            ("export AGENT --precision int3", [*quarl, "export", a, "--precision", "int3"], False),
            ("play AGENT --episodes 0", [*quarl, "play", a, "--episodes", "0"], False),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one run of each")
    parser.add_argument("--baseline", type=Path, help="another quarl source tree (its src/) timed in the same run")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    agent = ZOO / "ppo" / "CartPole-v1_1"
    trees = {"seconds": None} | ({"baseline": (args.baseline / "src").resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory() as home:
        folder = Path(home)
        base_env = {**os.environ, "OMP_NUM_THREADS": "1"}
        base_env.pop("QUARL_CACHE", None)
        envs = {}
        for name, src in trees.items():  # a home each: a tree that keeps a help-list cache starts it empty
            (folder / name).mkdir()
            envs[name] = base_env | {"HOME": str(folder / name)} | ({"PYTHONPATH": str(src)} if src else {})
        quarl = [sys.executable, "-m", "quarl.cli"]
        header = f"{'command':<40}" + "".join(f" {name:>9}" for name in trees) + f" {'x python':>9} {'exit':>5}   says"
        print(header + f"   (median of {repeats}; {os.cpu_count()} cpus)")
        base = None
        for name, command, once in rows(quarl, folder, agent if agent.exists() else None):
            times: dict[str, list[float]] = {tree: [] for tree in trees}
            code, said = 0, ""
            for _ in range(1 if once else repeats):
                for tree in trees:  # alternating: both trees under the same load
                    seconds, exit_code, words = timed(command, envs[tree], folder)
                    times[tree].append(seconds)
                    if tree == "seconds":
                        code, said = exit_code, words
            medians = {tree: statistics.median(t) for tree, t in times.items()}
            base = base or medians["seconds"]
            print(f"{name:<40}" + "".join(f" {medians[t]:9.2f}" for t in trees)
                  + f" {medians['seconds'] / base:9.1f} {code:5d}   {said[:90]}", flush=True)


if __name__ == "__main__":
    main()
