"""PTQ on image (CNN) agents trained here: MinAtar agents with MinAtar's small CNN and Atari
agents with the RL Zoo's Atari hyperparameters (AtariWrapper, 4 stacked frames, NatureCNN),
each within a step budget that fits 2 CPU cores (the zoo trains Atari agents for 10M
steps; these are partly trained, their score is printed beside the zoo's). Each agent is
evaluated at fp32, fp16, int8 and int4 (automatic modes, chosen on calibration seeds apart
from the evaluation seeds), every E with its 95 % interval and verdict. The default
protocol plays as the RL Zoo does (sampled actions, every precision sharing its noise per
seed and step) with sticky actions on Atari, so seeds are different games; ``--protocol
greedy`` gives the older argmax table.

Resumable: a trained agent is reused (an interrupted training resumes from its last
checkpoint), and every evaluated cell is reused by ``run_ptq``. Trained agents stay out of
git, under OUT/agents.

    .venv/bin/python benchmarks/ptq_image_agents.py [--out results/image-agents] [--only a2c-MinAtar-Breakout]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

ZOO_10M = "the RL Zoo's agent, 10M steps (rl-baselines3-zoo benchmark.md)"
AGENTS: dict[str, tuple[str, str, int, dict, float | None]] = {
    # name: (algo, env, training steps, hyperparameter overrides, the RL Zoo's published score)
    "ppo-MinAtar-Breakout": ("ppo", "MinAtar/Breakout-v1", 300_000, {}, None),
    "a2c-MinAtar-Breakout": ("a2c", "MinAtar/Breakout-v1", 300_000, {}, None),
    "dqn-MinAtar-Breakout": ("dqn", "MinAtar/Breakout-v1", 200_000, {}, None),
    "ppo-MinAtar-SpaceInvaders": ("ppo", "MinAtar/SpaceInvaders-v1", 300_000, {}, None),
    "a2c-MinAtar-Asterix": ("a2c", "MinAtar/Asterix-v1", 300_000, {}, None),
    # Atari: 100-150 training steps/s on one core here (PPO, its 4 epochs per rollout, is the slowest)
    "a2c-Breakout": ("a2c", "BreakoutNoFrameskip-v4", 200_000, {}, 279.8),
    "ppo-Breakout": ("ppo", "BreakoutNoFrameskip-v4", 150_000, {}, 398.0),
    # ppo-Breakout trained on to 600k (see CONTINUES): a stronger player, same lineage
    "ppo-Breakout-600k": ("ppo", "BreakoutNoFrameskip-v4", 600_000, {}, 398.0),
    # the zoo's DQN waits 100k steps and explores over 1M: shortened to fit the budget
    "dqn-Breakout": ("dqn", "BreakoutNoFrameskip-v4", 150_000,
                     {"buffer_size": 50_000, "learning_starts": 10_000, "exploration_fraction": 0.5}, 358.3),
    "a2c-Pong": ("a2c", "PongNoFrameskip-v4", 300_000, {}, 17.3),
}
CONTINUES = {"ppo-Breakout-600k": "ppo-Breakout"}
"""Agents that start from another agent's last checkpoint (its run folder seeded with a copy)
instead of from scratch; the learning-rate schedule jumps there, from the end of the
other's to its place in this longer one."""
EPISODES = {"minatar": 200, "atari": 30}
"""MinAtar games are cheap and chaotic: one flipped action changes the episode, so E needs
hundreds of episodes (measured: SpaceInvaders int8 lost 14.8 % over seeds 0..99 and 2.8 %
over 0..399)."""
DECIDE_EPISODES = {"minatar": 1000, "atari": 60}
"""Where a verdict is undecided, more episodes (the next seeds, fp32 too) until it decides or
a cell has played this many (``ptq --decide-episodes``)."""
ATARI_MAX_STEPS = 27_000
"""108k frames: the usual cap on an Atari evaluation game."""
PROTOCOLS = {"zoo": "ptq-zoo", "greedy": "ptq"}
"""Evaluation protocol -> the folder of its records under OUT."""
ATARI_STICKY = 0.25
"""Machado et al. 2018 and ALE v5's repeat_action_probability."""


def train(name: str, out: Path, steps_cap: int | None = None) -> Path:
    """The agent's run folder, trained (or resumed) if it has no final model yet."""
    import shutil

    from quarl.training.periodic_saves import has_checkpoint, latest_checkpoint
    from quarl.training.sb3_train import TrainConfig
    from quarl.training.sb3_train import train as train_run

    algo, env_id, steps, overrides, _ = AGENTS[name]
    steps = min(steps, steps_cap or steps)
    run_dir = out / "agents" / name
    final = run_dir / f"{env_id.replace('/', '_')}.zip"
    if final.exists():
        return run_dir
    if name in CONTINUES and not has_checkpoint(run_dir):
        start = latest_checkpoint(train(CONTINUES[name], out, steps_cap))
        if start is not None and start[0] < steps:
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(start[1], run_dir / f"rl_model_{start[0]}_steps.zip")
            print(f"{name} starts from {CONTINUES[name]}'s checkpoint at {start[0]} steps", flush=True)
    resume = has_checkpoint(run_dir)
    started = time.perf_counter()
    config = TrainConfig(algo, env_id, timesteps=steps, out=out / "agents", eval_freq=0, tensorboard=False,
                         hyperparams=dict(overrides), progress_bar=True, run_dir=run_dir, save_replay=False)
    train_run(config, resume=resume)
    print(f"trained {name} ({steps} steps) in {time.perf_counter() - started:.0f} s", flush=True)
    return run_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/image-agents"))
    parser.add_argument("--only", default="", help="comma list of agent names")
    parser.add_argument("--episodes", type=int, default=0,
                        help="episodes per precision (default: MinAtar 200, Atari 30)")
    parser.add_argument("--precisions", default="fp16,int8,int4")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="zoo",
                        help="zoo: sampled actions as rl_zoo3.enjoy plays Atari and MinAtar, sticky actions 0.25 on "
                             "Atari (MinAtar keeps its own 0.1); greedy: argmax actions, no sticky actions on Atari "
                             "(the table before quarl sampled)")
    parser.add_argument("--train-only", action="store_true", help="train the agents, evaluate nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="the table and plot from the records already stored (the newest per precision, whatever "
                             "quarl version made them), for the agents evaluated so far; nothing is trained or run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: the MinAtar PPO agent trained 4,096 steps, "
                                                               "2 episodes, under results/image-agents-quick")
    args = parser.parse_args()
    if args.quick:
        args.only, args.episodes = args.only or "ppo-MinAtar-Breakout", 2
        if args.out == Path("results/image-agents"):
            args.out = Path("results/image-agents-quick")

    from quarl.checkpoints import load_checkpoint
    from quarl.core.records import ResultsLog
    from quarl.envs import env_family
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.episodes import protocol
    from quarl.evaluation.reports import mode_summary, paper_table, plot_verdicts, print_table, write_rows
    from quarl.ptq.run import run_ptq

    names = [n for n in args.only.split(",") if n] or list(AGENTS)
    unknown = sorted(set(names) - set(AGENTS))
    if unknown:
        parser.error(f"unknown agent {unknown[0]!r}: allowed {', '.join(AGENTS)}")
    labels = args.precisions.split(",")
    per_policy, extra = {}, {}
    for name in names:
        algo, env_id, steps, _, zoo = AGENTS[name]
        family = env_family(env_id).name
        settings = EvalSettings(episodes=args.episodes or EPISODES[family], seed=0,
                                max_steps=ATARI_MAX_STEPS if family == "atari" else None)
        started = time.perf_counter()
        if args.report_only:
            stored = {r["precision"]: r for r in ResultsLog(args.out / PROTOCOLS[args.protocol] / name /
                                                            "results.jsonl").load()}
            if not all(p in stored for p in ["fp32", *labels]):
                continue  # not evaluated yet
            records = [stored[p] for p in ["fp32", *labels]]
        else:
            run_dir = train(name, args.out, 4_096 if args.quick else None)
            if args.train_only:
                continue
            agent = load_checkpoint(run_dir)
            sticky = ATARI_STICKY if family == "atari" and args.protocol == "zoo" else None
            spec, policy = protocol(agent.policy, agent.env_spec, args.protocol == "zoo", sticky)
            decide = 0 if args.quick or args.protocol == "greedy" else DECIDE_EPISODES[family]
            records = run_ptq(policy, spec, labels, settings, args.out / PROTOCOLS[args.protocol] / name,
                              decide_episodes=decide)
        per_policy[name] = records
        extra[name] = {"steps": steps, "zoo (10M steps)": zoo if zoo is not None else "",
                       "episodes": len(records[0]["returns"]),
                       "int modes (agreement)": mode_summary(records)}
        print(name, {r["precision"]: round(r["mean"], 2) for r in records}, extra[name]["int modes (agreement)"],
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    if args.train_only:
        return 0
    rows = paper_table(per_policy, ["fp32", *labels])
    for row in rows:
        row.update(extra[row["policy"]])
    table = "table" if args.protocol == "greedy" else f"table-{args.protocol}"
    print_table(rows, f"image agents trained here, {args.protocol} protocol (E%: reward lost against fp32; zoo: "
                      f"{ZOO_10M})")
    write_rows(rows, args.out, table)
    plot_verdicts(per_policy, args.out / f"{table}.png", f"image agents trained here ({args.protocol} protocol): E "
                                                         "against fp32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
