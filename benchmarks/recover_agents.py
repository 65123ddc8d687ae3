"""Recovery on agents quarl was not tuned on: for each agent (trained here by
``ptq_own_agents.py``'s recipes, plus the RL Zoo agents in ../shared/zoo where present), PTQ
at int8 and int4 (automatic modes) and then ``quarl recover`` at int4 (and at int8 where
int8 PTQ does not keep), each judged against the ORIGINAL fp32 policy on the same 20
evaluation seeds. Prints and writes per agent: the verdicts and E before and after, the
held-out agreement with the teacher (PTQ against recovered), states labelled, student
updates and wall time. Resumable: trained agents, PTQ cells and recovered folders are reused.

    .venv/bin/python benchmarks/recover_agents.py [--out results/recover-agents] [--only dqn-CartPole-v1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import torch  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))

from ptq_own_agents import AGENTS, train  # noqa: E402

AGENTS["dqn-MountainCar-v0"] = ("sb3", "DQN", "MountainCar-v0", 120_000, {
    # the RL Zoo's hyperparameters for DQN MountainCar-v0
    "learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10_000, "learning_starts": 1000, "gamma": 0.98,
    "target_update_interval": 600, "train_freq": 16, "gradient_steps": 8, "exploration_fraction": 0.2,
    "exploration_final_eps": 0.07, "policy_kwargs": {"net_arch": [256, 256]}})
OWN = ["qrdqn-CartPole-v1", "dqn-MountainCar-v0", "a2c-CartPole-v1", "sac-Pendulum-v1"]
ZOO_TRAINED = [("dqn", "CartPole-v1", 3, None), ("qrdqn", "CartPole-v1", 3, None), ("dqn", "MountainCar-v0", 3, None),
               ("dqn", "Acrobot-v1", 3, None), ("ppo", "Pendulum-v1", 3, None),
               ("dqn", "MinAtar/Breakout-v1", 0, 200_000), ("sac", "HalfCheetah-v4", 0, 60_000)]
"""(algo, env, seed, steps) trained here by ``quarl train`` with the RL Zoo's hyperparameters
(quarl's MinAtar entry where the zoo has none) and budget (None: the zoo's)."""
EPISODES = {"MinAtar": 200}
"""Evaluation episodes where 20 are too few: MinAtar games are chaotic (one flipped action
sends an episode elsewhere), as ptq_image_agents.py found."""
ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"


def agents(only: list[str]) -> list[tuple[str, Path, str | None]]:
    """(name, checkpoint, env id for a bare zip) of every agent to measure."""
    found: list[tuple[str, Path, str | None]] = [(name, Path(), AGENTS[name][2]) for name in OWN]
    found += [(f"trained-{algo}-{env.replace('/', '-')}", Path(), None) for algo, env, _, _ in ZOO_TRAINED]
    if ZOO.is_dir():
        for folder in sorted(p for p in ZOO.glob("*/*_1") if p.is_dir()):
            found.append((f"zoo-{folder.parent.name}-{folder.name}", folder, None))
    return [a for a in found if not only or a[0] in only]


def train_zoo(name: str, out: Path, quick: bool) -> Path:
    """``quarl train ALGO ENV --seed S`` (the RL Zoo's hyperparameters), once."""
    from quarl.training.sb3_train import TrainConfig
    from quarl.training.sb3_train import train as zoo_train

    algo, env, seed, steps = next(t for t in ZOO_TRAINED if f"trained-{t[0]}-{t[1].replace('/', '-')}" == name)
    stem = env.replace("/", "_")
    run = out / "zoo-trained" / algo / f"{stem}_1"
    if not (run / f"{stem}.zip").exists():
        zoo_train(TrainConfig(algo, env, seed=seed, out=out / "zoo-trained", run_dir=run,
                              timesteps=5_000 if quick else steps))
    return run


def measure(name: str, checkpoint: Path, env_id: str | None, out: Path, episodes: int, rounds: int) -> list[dict]:
    import quarl
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.reports import ptq_rows
    from quarl.ptq.run import run_ptq
    from quarl.recovery import RecoverConfig, run_recover

    agent = quarl.load(checkpoint, env=env_id)
    episodes = next((n for key, n in EPISODES.items() if key in agent.env_spec.env_id and episodes >= 20), episodes)
    settings = EvalSettings(episodes=episodes)
    ptq = {r["precision"]: r for r in ptq_rows(run_ptq(agent.policy, agent.env_spec, ["int8", "int4"], settings,
                                                       out / "ptq" / name))}
    rows = []
    for precision in ("int4", "int8"):
        before = ptq[precision]
        if precision == "int8" and str(before["verdict"]).startswith("keeps"):
            continue
        started = time.perf_counter()
        config = RecoverConfig(precision=precision, rounds=rounds)
        folder = out / "recovered" / f"{name}-{precision}"
        record, records = run_recover(checkpoint, agent.env_spec, agent.policy, config, folder, settings)
        after = {r["precision"]: r for r in ptq_rows(records)}[precision]
        rows.append({
            "agent": name, "precision": precision, "fp32": round(ptq["fp32"]["mean"], 2),
            "ptq": round(before["mean"], 2), "ptq E%": before["E%"], "ptq verdict": before["verdict"],
            "ptq mode": before.get("mode", ""), "recovered": round(after["mean"], 2), "recovered E%": after["E%"],
            "recovered verdict": after["verdict"], "recovered mode": record["kernel"]["mode"],
            "ptq agree%": round(100 * record["ptq_agreement"], 1),
            "recovered agree%": round(100 * record["agreement"], 1),
            "rounds": len(record["rounds"]), "states": record["labelled_states"], "updates": record["updates"],
            "distil s": record["wall_s"], "total s": round(time.perf_counter() - started, 1),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/recover-agents"))
    parser.add_argument("--only", default="", help="comma list of agent names")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="one tiny agent, few episodes: a smoke run")
    args = parser.parse_args()
    from quarl.evaluation.reports import write_rows

    only = [s for s in args.only.split(",") if s]
    if args.quick:
        only, args.episodes, args.rounds = ["trained-dqn-CartPole-v1"], 4, 2
        args.out = args.out.with_name(args.out.name + "-quick")
    rows = []
    for name, checkpoint, env_id in agents(only):
        if name in AGENTS:
            checkpoint = train(name, args.out, steps_cap=5_000 if args.quick else None)
        elif name.startswith("trained-"):
            checkpoint = train_zoo(name, args.out, args.quick)
        rows += measure(name, checkpoint, env_id, args.out, args.episodes, args.rounds)
    # rows of agents measured by earlier runs (another --only) are kept; this run's replace theirs
    previous = args.out / "recover.json"
    measured = {(r["agent"], r["precision"]) for r in rows}
    kept = [r for r in json.loads(previous.read_text()) if (r["agent"], r["precision"]) not in measured] \
        if previous.exists() else []
    write_rows(kept + rows, args.out, "recover")
    print(f"wrote {args.out}/recover.csv, recover.md, recover.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
