"""PyBullet agents after recovery: trains small PyBullet agents here with ``quarl train`` (the RL
Zoo's hyperparameters, shorter budgets, fixed seeds) into an RL Zoo folder (ALGO/ENV_1), then
runs ONE command over that folder:

    quarl study runs/pybullet/agents --precisions fp32,int8,int4,rec-int8,rec-int4 --seeds 0 --episodes 20 \
        --out results/pybullet-recovery --decide-minutes 5 -v

Each rec-int8 / rec-int4 cell is the agent recovered by ``quarl recover`` at that precision (once
per agent), its real kernel judged against the ORIGINAL fp32 policy on the same seeds. Also
prints each agent's fp32 return against a uniformly random policy on the same evaluation
seeds, so "it learned" is a number. Evaluation: 20 episodes of seed 0 (``--seeds 0,1,2`` adds
more). Resumable: trained agents are reused, a killed training run starts over, and the study
evaluates (and recovers) only what it lacks.

    nice -n 10 .venv/bin/python benchmarks/pybullet_agents.py [--agents runs/pybullet/agents] \
        [--out results/pybullet-recovery] [--only tqc-ReacherBulletEnv-v0] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

torch.set_num_threads(1)

AGENTS: list[tuple[str, str, int, dict]] = [
    # (algo, env, timesteps, overrides of the RL Zoo's entry); all seed SEED
    ("ppo", "InvertedPendulumBulletEnv-v0", 60_000, {}),  # no zoo entry: SB3's defaults
    ("td3", "InvertedDoublePendulumBulletEnv-v0", 40_000, {}),
    ("tqc", "ReacherBulletEnv-v0", 30_000, {}),
    ("a2c", "HalfCheetahBulletEnv-v0", 100_000, {}),
]
"""The zoo budgets are 0.3-2 M steps; these (partly trained agents) are what a niced process
got of two cores shared with other work in about 45 minutes (TD3: 16 min, TQC: about 25)."""
SEED = 0
PRECISIONS = "fp32,int8,int4,rec-int8,rec-int4"


def name_of(algo: str, env: str) -> str:
    return f"{algo}-{env}"


def train_agent(algo: str, env: str, steps: int, overrides: dict, agents: Path) -> Path:
    """``quarl train ALGO ENV --seed SEED -n STEPS`` into AGENTS/ALGO/ENV_1, once."""
    from quarl.training.sb3_train import TrainConfig, train

    run = agents / algo / f"{env}_1"
    if (run / f"{env}.zip").exists():
        return run
    if run.exists():  # a killed run: start it over rather than mix two runs' checkpoints
        shutil.rmtree(run)
    started = time.perf_counter()
    # eval_freq=0: the study evaluates on its own seeds; a fresh folder each time (a killed run restarts)
    train(TrainConfig(algo, env, timesteps=steps, seed=SEED, out=agents, run_dir=run, hyperparams=dict(overrides),
                      eval_freq=0, tensorboard=False, save_replay=False,
                      on_progress=lambda line: print(f"  {algo} {env}: {line}", flush=True)))
    print(f"trained {name_of(algo, env)} ({steps:,} steps) in {time.perf_counter() - started:.0f} s", flush=True)
    return run


def random_return(env: str, episodes: int, seed: int = 0) -> float:
    """Mean return of uniformly random actions on the study's evaluation seeds (100000 s + i)."""
    import numpy as np

    from quarl.envs import EnvSpec, make_env

    e = make_env(EnvSpec(env))
    e.action_space.seed(seed)
    returns = []
    for i in range(episodes):
        e.reset(seed=100_000 * seed + i)
        total, done = 0.0, False
        while not done:
            _, reward, term, trunc, _ = e.step(e.action_space.sample())
            total, done = total + float(reward), term or trunc
        returns.append(total)
    e.close()
    return float(np.mean(returns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=Path, default=Path("runs/pybullet/agents"))
    parser.add_argument("--out", type=Path, default=Path("results/pybullet-recovery"))
    parser.add_argument("--only", default="", help="comma list of agent names (algo-env) to train")
    parser.add_argument("--seeds", default="0", help="evaluation seeds of the study (20 episodes each)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--decide-minutes", default="5", help="the study's deciding budget: undecided verdicts "
                        "play more episodes (doubling) until this many minutes have passed")
    parser.add_argument("--train-only", action="store_true", help="train the agents, run no study")
    parser.add_argument("--quick", action="store_true", help="a smoke run: the first agent, 2,000 steps, "
                                                               "2 episodes, under runs/pybullet-quick")
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    chosen = [a for a in AGENTS if not only or name_of(a[0], a[1]) in only]
    if args.quick:
        chosen = [(a, e, 2_000, o) for a, e, _, o in chosen[:1]]
        args.agents, args.out, args.seeds, args.episodes = Path("runs/pybullet-quick/agents"), \
            Path("runs/pybullet-quick/study"), "0", 2

    for algo, env, steps, overrides in chosen:
        train_agent(algo, env, steps, overrides, args.agents)
    stored = args.out / "random.json"
    baseline = json.loads(stored.read_text()) if stored.exists() else {}
    baseline = {name_of(a, e): baseline.get(name_of(a, e)) or round(random_return(e, args.episodes), 2)
                for a, e, _, _ in chosen}
    print("random policy, mean return over the study's seed-0 episodes:", json.dumps(baseline), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps(baseline, indent=1) + "\n")
    if args.train_only:
        return 0
    # the one command a user runs; its own output (progress, the table) goes straight to this terminal
    command = [str(Path(sys.executable).with_name("quarl")), "study", str(args.agents), "--precisions", PRECISIONS,
               "--seeds", args.seeds, "--episodes", str(args.episodes), "--out", str(args.out),
               # -v: a line per cell as it finishes (the progress bar needs a terminal)
               "--decide-minutes", args.decide_minutes, "-v"]
    print("$", " ".join(["quarl", *command[1:]]), flush=True)
    code = subprocess.call(command)
    if code == 0:
        agents_table(chosen, baseline, args.out)
    return code


def agents_table(chosen: list[tuple[str, str, int, dict]], baseline: dict[str, float], out: Path) -> None:
    """agents.md / .csv / .json: what each agent is (algo, env, steps, seed) and whether it
    learned: the study's fp32 mean against the random policy's."""
    from quarl.evaluation.reports import print_table, write_rows

    study = json.loads((out / "table.json").read_text())
    rows = []
    for algo, env, steps, _ in chosen:
        fp32 = next(float(r["fp32"]) for r in study if str(r["policy"]).startswith(f"{algo} {env}"))
        rows.append({"agent": name_of(algo, env), "steps": steps, "seed": SEED, "random": baseline[name_of(algo, env)],
                     "fp32": round(fp32, 2)})
    print_table(rows, "PyBullet agents trained here: fp32 (the study's mean) against a random policy")
    write_rows(rows, out, "agents")


if __name__ == "__main__":
    sys.exit(main())
