"""Training throughput of DQN at strict fp32, TF32, bf16 and fp16 (autocast, fp32 master
weights; fp16 with loss scaling) on Pong, with the paper's three mixed-precision policies:

    A: 3 conv of 128 filters + FC 128      B: 3 conv of 512 + FC 512      C: 3 conv of 1024 + FC 2048

(kernels and strides as the Nature DQN: 8x8/4, 4x4/2, 3x3/1.) For each policy and precision
it measures gradient steps per second (``model.train`` on a filled replay buffer, batch 32)
and env steps per second of the whole DQN loop (acting, PongNoFrameskip-v4 with the Atari
wrappers, one gradient step every 4 env steps), then prints the ratios to strict fp32 (the
paper's baseline: TF32 off for matmuls and cuDNN) and to TF32 side by side.

- ``fp32``: strict fp32, ``torch.backends.cuda.matmul.allow_tf32 = False`` and
  ``torch.backends.cudnn.allow_tf32 = False``; ``tf32``: both True (CUDA only: a CPU has
  no TF32); ``bf16`` / ``fp16``: quarl's mixed precision (``enable_mixed_precision``:
  autocast, fp32 output layers, channels_last convolutions, fp16 loss scaling with one
  host sync per update), TF32 off for what stays fp32.
- On CUDA the replay batch reaches the GPU once per update from pinned memory, with
  non-blocking copies (:func:`quarl.training.mixed_precision.pinned_batches`), at every
  precision.
- ``--compile`` also runs every row with ``torch.compile`` on the Q-networks (forward and
  backward of the update) and prints whether that was faster.

Run: ``.venv/bin/python benchmarks/bench_train_precision.py --device cuda --policies A,B,C``
on a GPU (the paper's case study; add ``--compile`` to try it), ``--device cpu`` here
(policy A by default: on a CPU B and C take seconds per low-precision step), ``--quick``
for a smoke run. The first line names the device that ran it (GPU or CPU model).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from collections.abc import Callable

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
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


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


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model (``/proc/cpuinfo``)."""
    if device.startswith("cuda"):
        return f"GPU {torch.cuda.get_device_name(torch.device(device))}"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"CPU {model or platform.processor() or platform.machine()}"


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def make_model(policy: str, precision: str, device: str, compiled: bool, fused: bool = False) -> DQN:
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    env = VecFrameStack(make_atari_env(check_env_id("PongNoFrameskip-v4"), n_envs=1, seed=0), 4)
    filters, fc = POLICIES[policy]
    model = DQN(
        "CnnPolicy", env, buffer_size=2_000, learning_starts=100, batch_size=32, train_freq=4, gradient_steps=1,
        target_update_interval=1000, seed=0, device=device, verbose=0,
        policy_kwargs={"features_extractor_class": PaperCNN,
                       "features_extractor_kwargs": {"filters": filters, "fc": fc}, "net_arch": [],
                       "optimizer_kwargs": {"fused": True} if fused else {}},
    )
    enable_mixed_precision(model, "fp32" if precision == "tf32" else precision)
    if compiled:
        model.q_net.compile(dynamic=False)
        model.q_net_target.compile(dynamic=False)
    return model


def timed(fn: Callable[[], object], seconds: float, min_calls: int, warm_up: int) -> float:
    """Calls per second of ``fn`` over at least ``seconds`` and ``min_calls`` calls."""
    for _ in range(warm_up):  # allocations, cuDNN / oneDNN kernel choice, compilation
        fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def bench(policy: str, precision: str, device: str, seconds: float, compiled: bool, fused: bool) -> dict[str, float]:
    set_tf32(precision == "tf32")
    model = make_model(policy, precision, device, compiled, fused)
    model.learn(200)  # fills the buffer past learning_starts
    warm_up = 5 if compiled else 1
    grad = timed(lambda: model.train(gradient_steps=1, batch_size=32), seconds, 2, warm_up)
    chunk = 16  # env steps per call: 4 gradient steps
    env = timed(lambda: model.learn(chunk, reset_num_timesteps=False), seconds, 2, warm_up) * chunk
    model.env.close()
    set_tf32(False)
    return {"grad_steps_per_s": grad, "env_steps_per_s": env}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--policies", default=None,
                        help="comma list of A, B, C (default: A,B,C on a GPU, A on a CPU: B and C take seconds "
                             "per low-precision gradient step there)")
    parser.add_argument("--precisions", default=None,
                        help=f"comma list of {', '.join(PRECISIONS)} (default: all four on CUDA; no tf32 on a CPU)")
    parser.add_argument("--seconds", type=float, default=15.0, help="time per measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true",
                        help="also run every row with torch.compile on the Q-networks; print compiled x plain")
    parser.add_argument("--optimizer", choices=("auto", "fused", "foreach"), default="auto",
                        help="Adam's implementation at every precision: fused (one kernel per update; on a GPU the "
                             "foreach one spent 2.7 ms of policy C's 7 ms bf16 update) or foreach (SB3's default); "
                             "auto: fused on CUDA, foreach on a CPU")
    parser.add_argument("--quick", action="store_true", help="a smoke run: policy A, fp32, bf16 and fp16, 1 s each")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    precisions = (args.precisions or ",".join(p for p in PRECISIONS if cuda or p != "tf32")).split(",")
    for p in precisions:
        if p not in PRECISIONS:
            parser.error(f"--precisions: unknown {p!r}, allowed {', '.join(PRECISIONS)}")
        if p == "tf32" and not cuda:
            parser.error("--precisions tf32 needs --device cuda (a CPU has no TF32)")
    policies = (args.policies or ("A,B,C" if cuda else "A")).split(",")
    if args.quick:
        policies, precisions, args.seconds = ["A"], [p for p in precisions if p != "tf32"], 1.0
    fused = args.optimizer == "fused" or (args.optimizer == "auto" and cuda)
    if args.compile:
        # SB3 calls the Q-network with and without grad, in and out of autocast: each a recompile
        # (torch's default limit of 8 sent the later ones back to eager)
        torch._dynamo.config.recompile_limit = 64
    warnings.filterwarnings("ignore")
    console = Console()
    console.print(f"{device_name(args.device)}, torch {torch.__version__}, {torch.get_num_threads()} CPU thread, "
                  f"device {args.device}, Adam {'fused' if fused else 'foreach'}")
    for policy in policies:
        filters, fc = POLICIES[policy]
        variants = [False, True] if args.compile else [False]
        results = {(p, c): bench(policy, p, args.device, args.seconds, c, fused) for p in precisions for c in variants}
        table = Table(title=f"policy {policy}: 3 conv x {filters} + FC {fc}, DQN on Pong, batch 32, "
                            f"{device_name(args.device)}")
        columns = ["precision", "grad steps/s", "x fp32", "x tf32", "env steps/s (loop)", "x fp32", "x tf32"]
        if args.compile:
            columns += ["compiled grad x plain", "compiled loop x plain"]
        for col in columns:
            table.add_column(col, justify="right")
        base = results.get(("fp32", False))
        tf32 = results.get(("tf32", False))
        for p in precisions:
            r = results[(p, False)]
            row = [p, f"{r['grad_steps_per_s']:.2f}"]
            row.append(f"{r['grad_steps_per_s'] / base['grad_steps_per_s']:.2f}" if base else "-")
            row.append(f"{r['grad_steps_per_s'] / tf32['grad_steps_per_s']:.2f}" if tf32 else "-")
            row.append(f"{r['env_steps_per_s']:.1f}")
            row.append(f"{r['env_steps_per_s'] / base['env_steps_per_s']:.2f}" if base else "-")
            row.append(f"{r['env_steps_per_s'] / tf32['env_steps_per_s']:.2f}" if tf32 else "-")
            if args.compile:
                c = results[(p, True)]
                row += [f"{c['grad_steps_per_s'] / r['grad_steps_per_s']:.2f}",
                        f"{c['env_steps_per_s'] / r['env_steps_per_s']:.2f}"]
            table.add_row(*row)
        console.print(table)
        if args.compile:
            faster = [p for p in precisions
                      if results[(p, True)]["grad_steps_per_s"] > results[(p, False)]["grad_steps_per_s"]]
            console.print(f"torch.compile was faster in gradient steps for: {', '.join(faster) or 'none'}")


if __name__ == "__main__":
    main()
