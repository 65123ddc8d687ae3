"""Training throughput of DQN at fp32, bf16 and fp16 (autocast, fp32 master weights) on
Pong, with the paper's three mixed-precision policies:

    A: 3 conv of 128 filters + FC 128      B: 3 conv of 512 + FC 512      C: 3 conv of 1024 + FC 2048

(kernels and strides as the Nature DQN: 8x8/4, 4x4/2, 3x3/1.) For each policy and precision
it measures gradient steps per second (``model.train`` on a filled replay buffer, batch 32)
and env steps per second of the whole DQN loop (acting, PongNoFrameskip-v4 with the Atari
wrappers, one gradient step every 4 env steps), then prints the ratios to fp32 side by
side.

Run: ``.venv/bin/python benchmarks/bench_train_precision.py [--policies A,B] [--seconds 20]``.
One thread. On a GPU (``--device cuda``, the default when there is one) fp16 is the one to
look at. On a CPU without bf16 / fp16 matrix instructions (AVX512-BF16, AMX) low-precision
convolutions are much slower than fp32, so only policy A runs by default there.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor  # noqa: E402
from torch import nn  # noqa: E402

from quarl.envs import check_env_id  # noqa: E402  (registers the ALE games)
from quarl.training.mixed_precision import enable_mixed_precision  # noqa: E402

torch.set_num_threads(1)

POLICIES = {"A": (128, 128), "B": (512, 512), "C": (1024, 2048)}


class PaperCNN(BaseFeaturesExtractor):
    """Nature-DQN layout with the paper's widths: 3 conv of ``filters`` + FC ``fc``."""

    def __init__(self, observation_space: gym.spaces.Box, filters: int = 128, fc: int = 128) -> None:
        super().__init__(observation_space, fc)
        c = observation_space.shape[0]
        self.cnn = nn.Sequential(
            nn.Conv2d(c, filters, 8, 4), nn.ReLU(), nn.Conv2d(filters, filters, 4, 2), nn.ReLU(),
            nn.Conv2d(filters, filters, 3, 1), nn.ReLU(), nn.Flatten(),
        )
        with torch.no_grad():
            n = self.cnn(torch.zeros(1, *observation_space.shape)).shape[1]
        self.linear = nn.Sequential(nn.Linear(n, fc), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.cnn(x))


def make_model(policy: str, precision: str, device: str) -> DQN:
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    env = VecFrameStack(make_atari_env(check_env_id("PongNoFrameskip-v4"), n_envs=1, seed=0), 4)
    filters, fc = POLICIES[policy]
    model = DQN(
        "CnnPolicy", env, buffer_size=2_000, learning_starts=100, batch_size=32, train_freq=4, gradient_steps=1,
        target_update_interval=1000, seed=0, device=device, verbose=0,
        policy_kwargs={"features_extractor_class": PaperCNN,
                       "features_extractor_kwargs": {"filters": filters, "fc": fc}, "net_arch": []},
    )
    enable_mixed_precision(model, precision)
    return model


def timed(fn, seconds: float, min_calls: int) -> float:
    """Calls per second of ``fn`` over at least ``seconds`` and ``min_calls`` calls."""
    fn()  # warm-up (allocations, oneDNN kernel choice)
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def bench(policy: str, precision: str, device: str, seconds: float) -> dict[str, float]:
    model = make_model(policy, precision, device)
    model.learn(200)  # fills the buffer past learning_starts
    grad = timed(lambda: model.train(gradient_steps=1, batch_size=32), seconds, 2)
    chunk = 16  # env steps per call: 4 gradient steps
    env = timed(lambda: model.learn(chunk, reset_num_timesteps=False), seconds, 2) * chunk
    model.env.close()
    return {"grad_steps_per_s": grad, "env_steps_per_s": env}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default=None,
                        help="comma list of A, B, C (default: A,B,C on a GPU, A on a CPU: B and C take minutes "
                             "per low-precision gradient step there)")
    parser.add_argument("--precisions", default="fp32,bf16,fp16")
    parser.add_argument("--seconds", type=float, default=15.0, help="time per measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a smoke run: policy A, fp32 and bf16, 1 s each")
    args = parser.parse_args()
    if args.quick:
        args.policies, args.precisions, args.seconds = "A", "fp32,bf16", 1.0
    warnings.filterwarnings("ignore")
    console = Console()
    console.print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
                  f"{torch.get_num_threads()} thread, device {args.device}")
    precisions = args.precisions.split(",")
    policies = args.policies or ("A,B,C" if args.device.startswith("cuda") else "A")
    for policy in policies.split(","):
        results = {p: bench(policy, p, args.device, args.seconds) for p in precisions}
        filters, fc = POLICIES[policy]
        table = Table(title=f"policy {policy}: 3 conv x {filters} + FC {fc}, DQN on Pong, batch 32")
        for col in ("precision", "grad steps/s", "x fp32", "env steps/s", "x fp32"):
            table.add_column(col, justify="right")
        base = results[precisions[0]]
        for p, r in results.items():
            table.add_row(p, f"{r['grad_steps_per_s']:.2f}", f"{r['grad_steps_per_s'] / base['grad_steps_per_s']:.2f}",
                          f"{r['env_steps_per_s']:.1f}", f"{r['env_steps_per_s'] / base['env_steps_per_s']:.2f}")
        console.print(table)


if __name__ == "__main__":
    main()
