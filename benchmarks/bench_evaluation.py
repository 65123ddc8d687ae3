"""Evaluation throughput: quarl's exact evaluation (serial and on every core) against
Stable-Baselines3's ``evaluate_policy`` and the env alone, side by side in one run.

Run: ``.venv/bin/python benchmarks/bench_evaluation.py`` (about 2 minutes: each quarl row three times; ``--quick`` for
a smoke run). Needs the RL Zoo agents in ``../shared/zoo`` (PPO CartPole; PPO HalfCheetah
for the MuJoCo rows), else it trains a small PPO CartPole first. Prints env steps per
second and the ratios the acceptance asks for: quarl fp32 / int8 against SB3 with 8 envs,
and against the env alone times the cores used; beside that, against the env alone run in
as many processes at once (a machine's second vCPU need not double the env's own rate).
Every quarl row also checks that its returns equal the serial fp32 run's episode by
episode (int8: its own serial run), whatever the number of envs side by side.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

ZOO = Path(__file__).resolve().parents[1].parent / "shared" / "zoo"


def env_alone(env_id: str, steps: int, beneath: bool = False) -> float:
    """Env steps per second with random actions, one core (the env's own speed): ``gym.make``'s
    env; ``beneath``: stepped beneath its pass-through wrappers (TimeLimit, OrderEnforcing,
    PassiveEnvChecker), as quarl's evaluation steps the envs it makes."""
    from quarl.evaluation.episodes import _stepper

    env = gym.make(env_id)
    env.reset(seed=0)
    env.action_space.seed(0)
    step, limit = _stepper(env) if beneath else (env.step, -1)
    actions = [env.action_space.sample() for _ in range(1000)]
    length = 0
    start = time.perf_counter()
    for i in range(steps):
        _, _, term, trunc, _ = step(actions[i % 1000])
        length += 1
        if term or trunc or length == limit:
            env.reset()
            length = 0
    return steps / (time.perf_counter() - start)


def sb3_rate(zip_path: Path, env_id: str, episodes: int, n_envs: int) -> tuple[float, float]:
    """SB3's evaluate_policy (deterministic), ``n_envs`` envs in a DummyVecEnv: (steps/s, mean)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    env = gym.make(env_id)  # the zoo's zip pickles gym (not gymnasium) spaces: given here instead
    model = PPO.load(zip_path, device="cpu", custom_objects={
        "learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0,
        "observation_space": env.observation_space, "action_space": env.action_space})
    venv = make_vec_env(env_id, n_envs=n_envs, seed=0)
    start = time.perf_counter()
    returns, lengths = evaluate_policy(model, venv, n_eval_episodes=episodes, deterministic=True,
                                       return_episode_rewards=True)
    return sum(lengths) / (time.perf_counter() - start), float(np.mean(returns))


def _alone_in_worker(args: tuple[str, int]) -> float:
    torch.set_num_threads(1)
    return env_alone(*args)


def env_alone_on(processes: int, env_id: str, steps: int) -> float:
    """Env steps per second of ``processes`` copies of :func:`env_alone` run at once: what
    this machine's cores give the env itself (two vCPUs need not give twice one)."""
    if processes == 1:
        return env_alone(env_id, steps)
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return float(sum(pool.map(_alone_in_worker, [(env_id, steps)] * processes)))


def quarl_rows(run: Path, episodes: int, workers: list[int], sb3_8: float | None, env_id: str, alone_steps: int,
               env_counts: tuple[int, ...], repeats: int) -> list[str]:
    """quarl's rows: fp32 and automatic int8, serial and on every core, at each ``n_envs``.
    Each row runs ``repeats`` times, the env alone timed just before each run on one
    process and on as many as the row uses; the row shows the median rate and the median of
    the runs' ratios: on a shared VM the env's own rate drifts by tens of percent within
    seconds, and a ratio is only worth its two terms taken side by side."""
    import quarl
    from quarl.evaluation import parallel

    agent = quarl.load(run)
    rows = []
    for label in ("fp32", "int8"):
        policy = agent.policy if label == "fp32" else quarl.quantize(agent.policy, label, agent.env_spec)
        serial = None
        for n in workers:
            if n > 1:
                parallel.warm_up(n)
                parallel.evaluate(policy, agent.env_spec, episodes=min(episodes, 2 * n), workers=n)  # workers ready
            for n_envs in env_counts:
                rates, vs_one, vs_many, same = [], [], [], True
                for _ in range(repeats):
                    one = env_alone_on(1, env_id, alone_steps)
                    many = one if n == 1 else env_alone_on(n, env_id, alone_steps)
                    result = parallel.evaluate(policy, agent.env_spec, episodes=episodes, workers=n, n_envs=n_envs)
                    serial = serial if serial is not None else result
                    same &= np.array_equal(result.returns, serial.returns) and np.array_equal(result.lengths,
                                                                                              serial.lengths)
                    rates.append(result.steps_per_s)
                    vs_one.append(result.steps_per_s / (one * n))
                    vs_many.append(result.steps_per_s / many)
                rate = float(np.median(rates))
                vs_sb3 = f"{rate / sb3_8:.2f}x" if sb3_8 else "-"
                spread = f" ({min(vs_one):.2f}-{max(vs_one):.2f})" if repeats > 1 else ""
                rows.append(f"| quarl {label} | {n} | {n_envs} | {rate:,.0f} | {vs_sb3} | "
                            f"{np.median(vs_one):.2f}{spread} | "
                            f"{np.median(vs_many):.2f} | {result.mean:.2f} | {'yes' if same else 'NO'} |")
                print(rows[-1], flush=True)
    return rows


HEADER = ("| path | processes | envs side by side | steps/s | vs SB3 8 envs | vs env alone x processes (runs) | "
          "vs env alone on as many processes | mean return | same returns as serial |\n"
          "|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64, help="CartPole episodes per row (HalfCheetah: half)")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (default: the machine's cores)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row, each beside its own env-alone timing")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: few episodes, one run per row, CartPole only")
    args = parser.parse_args()
    from quarl.core import quiet, validate

    quiet.install()  # MuJoCo's settotalmass and gymnasium's out-of-date notices, as the CLI does

    cores = args.workers or validate.usable_cores()
    episodes = 4 if args.quick else args.episodes
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be at least 1")
    repeats = 1 if args.quick else args.repeats
    counts = sorted({1, cores})
    import onnxruntime

    print(f"# quarl evaluation benchmark: {platform.processor() or platform.machine()}, {cores} cores used, "
          f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, one thread per process")
    cartpole = ZOO / "ppo" / "CartPole-v1_1"
    if not cartpole.exists():
        from quarl.training.sb3_train import TrainConfig, train

        cartpole = train(TrainConfig("ppo", "CartPole-v1", timesteps=20_000, out=Path("results/bench-eval"),
                                     eval_freq=0, tensorboard=False)).run_dir
    steps = 5_000 if args.quick else 50_000
    alone = {n: env_alone_on(n, "CartPole-v1", steps) for n in counts}
    sb3_1, _ = sb3_rate(cartpole / "CartPole-v1.zip", "CartPole-v1", episodes, 1)
    sb3_8, sb3_mean = sb3_rate(cartpole / "CartPole-v1.zip", "CartPole-v1", episodes, 8)
    print(f"\n## PPO CartPole-v1, {episodes} episodes (env steps / s; env alone {alone[1]:,.0f} on one core, "
          f"{alone[cores]:,.0f} on {cores} processes at once)")
    print(HEADER)
    print(f"| SB3 evaluate_policy, 1 env | 1 | 1 | {sb3_1:,.0f} | {sb3_1 / sb3_8:.2f}x | "
          f"{sb3_1 / alone[1]:.2f} | | | |")
    print(f"| SB3 evaluate_policy, 8 envs | 1 | 8 | {sb3_8:,.0f} | 1.00x | "
          f"{sb3_8 / alone[1]:.2f} | | {sb3_mean:.2f} | |")
    for n in counts:
        print(f"| env alone, random actions | {n} | 1 | {alone[n]:,.0f} | {alone[n] / sb3_8:.2f}x | "
              f"{alone[n] / (alone[1] * n):.2f} | 1.00 | | |", flush=True)
    beneath = env_alone("CartPole-v1", steps, beneath=True)
    print(f"| env alone beneath its pass-through wrappers (as quarl steps it) | 1 | 1 | {beneath:,.0f} | "
          f"{beneath / sb3_8:.2f}x | {beneath / alone[1]:.2f} | | | |", flush=True)
    quarl_rows(cartpole, episodes, counts, sb3_8, "CartPole-v1", steps // 2, (8, 32), repeats)
    cheetah = ZOO / "ppo" / "HalfCheetah-v3_1"
    if args.quick or not cheetah.exists():
        return
    alone = {n: env_alone_on(n, "HalfCheetah-v4", 10_000) for n in counts}
    n = max(episodes // 2, cores)
    print(f"\n## PPO HalfCheetah-v4 (MuJoCo), {n} episodes of 1000 steps (env alone {alone[1]:,.0f} on one core, "
          f"{alone[cores]:,.0f} on {cores} processes at once)")
    print(HEADER)
    for k in counts:
        print(f"| env alone, random actions | {k} | 1 | {alone[k]:,.0f} | - | "
              f"{alone[k] / (alone[1] * k):.2f} | 1.00 | | |",
              flush=True)
    quarl_rows(cheetah, n, counts, None, "HalfCheetah-v4", 5_000, (32,), repeats)


if __name__ == "__main__":
    main()
