"""PTQ on agents quarl was not tuned on: trains small agents of several algorithms here
(Stable-Baselines3 / sb3-contrib, a few minutes each on one core), then evaluates each at
fp32, fp16, int8 and int4 (automatic modes) on 20 episodes, calibration on seeds disjoint
from evaluation. Resumable: trained agents and evaluated cells are reused.

    .venv/bin/python benchmarks/ptq_own_agents.py [--out results/own-agents] [--only sac-Pendulum-v1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import torch  # noqa: E402

torch.set_num_threads(1)

AGENTS: dict[str, tuple[str, str, str, int, dict]] = {
    # name: (library, class, env, timesteps, kwargs) -- RL Zoo-like settings, shortened
    "sac-Pendulum-v1": ("sb3", "SAC", "Pendulum-v1", 15_000, {"learning_rate": 1e-3}),
    "td3-Pendulum-v1": ("sb3", "TD3", "Pendulum-v1", 15_000, {"learning_rate": 1e-3, "noise": 0.1}),
    "tqc-Pendulum-v1": ("contrib", "TQC", "Pendulum-v1", 15_000, {"learning_rate": 1e-3}),
    "crossq-Pendulum-v1": ("contrib", "CrossQ", "Pendulum-v1", 8_000, {}),
    "dqn-CartPole-v1": ("sb3", "DQN", "CartPole-v1", 60_000, {
        "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99,
        "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128, "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]}}),
    "qrdqn-CartPole-v1": ("contrib", "QRDQN", "CartPole-v1", 60_000, {
        "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99,
        "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128, "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256], "n_quantiles": 10}}),
    "a2c-CartPole-v1": ("sb3", "A2C", "CartPole-v1", 100_000, {"ent_coef": 0.0}),
    "ppo-Acrobot-v1": ("sb3", "PPO", "Acrobot-v1", 100_000, {"n_steps": 256, "gae_lambda": 0.94, "ent_coef": 0.0,
                                                            "n_epochs": 4}),
    "ars-CartPole-v1": ("contrib", "ARS", "CartPole-v1", 50_000, {"n_delta": 8, "policy": "LinearPolicy"}),
    "ppo-LunarLander-v3": ("sb3", "PPO", "LunarLander-v3", 200_000, {
        "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01}),
}


def train(name: str, out: Path, steps_cap: int | None = None) -> Path:
    import gymnasium as gym
    import numpy as np
    import sb3_contrib
    import stable_baselines3 as sb3

    lib, cls, env_id, steps, kwargs = AGENTS[name]
    path = out / "agents" / f"{name}.zip"
    if path.exists():
        return path
    kwargs = dict(kwargs)
    policy = kwargs.pop("policy", "MlpPolicy")
    env = gym.make(env_id)
    if "noise" in kwargs:
        from stable_baselines3.common.noise import NormalActionNoise

        sigma = kwargs.pop("noise")
        n = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(n), sigma * np.ones(n))
    algo = getattr(sb3 if lib == "sb3" else sb3_contrib, cls)
    started = time.perf_counter()
    model = algo(policy, env, seed=1, device="cpu", **kwargs)
    model.learn(min(steps, steps_cap or steps))
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    print(f"trained {name} in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/own-agents"))
    parser.add_argument("--only", default="", help="comma list of agent names")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--precisions", default="fp16,int8,int4")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one agent trained 2,000 steps, 2 episodes, "
                                                               "under results/own-agents-quick")
    args = parser.parse_args()
    if args.quick:
        args.only, args.episodes = args.only or "a2c-CartPole-v1", 2
        if args.out == Path("results/own-agents"):
            args.out = Path("results/own-agents-quick")

    from quarl.checkpoints import load_checkpoint
    from quarl.envs import EnvSpec
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.reports import mode_summary, paper_table, print_table, write_rows
    from quarl.ptq.run import run_ptq

    names = [n for n in args.only.split(",") if n] or list(AGENTS)
    labels = args.precisions.split(",")
    per_policy, modes = {}, {}
    for name in names:
        path = train(name, args.out, 2_000 if args.quick else None)
        ckpt = load_checkpoint(path)
        spec = EnvSpec(AGENTS[name][2])
        records = run_ptq(ckpt.policy, spec, labels, EvalSettings(episodes=args.episodes), args.out / "ptq" / name)
        per_policy[name] = records
        modes[name] = mode_summary(records)
        print(name, {r["precision"]: round(r["mean"], 1) for r in records}, modes[name], flush=True)
    rows = paper_table(per_policy, ["fp32", *labels])
    for row in rows:
        row["int modes (agreement)"] = modes[row["policy"]]
    print_table(rows, f"own agents, {args.episodes} episodes (E%: reward lost against fp32)")
    write_rows(rows, args.out, "table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
