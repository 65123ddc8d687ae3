"""Inference latency of the policy networks at every precision, side by side, and the
evaluation throughput of ``quarl ptq``.

Run: ``.venv/bin/python benchmarks/bench_inference.py`` (one thread, median of repeated
calls, random weights; ~2 minutes). Prints one table per policy with the speedup of each
path over PyTorch fp32 at batch 1 and batch 256, then env steps per second of the
evaluation loop.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from quarl.core.timing import median_us  # noqa: E402
from quarl.quant.backends.onnxruntime import (  # noqa: E402
    OrtEngine,
    export_onnx,
    has_vnni,
    quantize_dynamic_int8,
    quantize_nbits,
    quantize_static_int8,
)
from quarl.quant.backends.torch_backend import TorchEngine  # noqa: E402

torch.set_num_threads(1)


def mlp(sizes: list[int], act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1]).eval().requires_grad_(False)  # as a loaded Policy holds it


def nature_cnn(n_actions: int = 6) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 1), nn.ReLU(),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, n_actions),
    ).eval().requires_grad_(False)


def engines(net: nn.Module, shape: tuple[int, ...], calib: np.ndarray) -> dict[str, object]:
    conv = any(isinstance(m, nn.Conv2d) for m in net.modules())
    onnx_fp32 = export_onnx(net, shape)
    out: dict[str, object] = {
        "torch fp32": TorchEngine(net),
        "torch fp16": TorchEngine(mlp_copy(net).half(), torch.float16),
        "torch bf16": TorchEngine(mlp_copy(net).bfloat16(), torch.bfloat16),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if conv:
            from torch.ao.quantization import get_default_qconfig_mapping
            from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

            prepared = prepare_fx(mlp_copy(net), get_default_qconfig_mapping("x86"), (torch.from_numpy(calib[:1]),))
            with torch.inference_mode():
                prepared(torch.from_numpy(calib))
            out["torch int8 (static fx)"] = TorchEngine(convert_fx(prepared))
        else:
            out["torch int8 (dynamic)"] = TorchEngine(
                torch.ao.quantization.quantize_dynamic(mlp_copy(net), {nn.Linear}, dtype=torch.qint8)
            )
    out["ORT fp32"] = OrtEngine(onnx_fp32)
    if conv:  # quarl's auto is s8 where the CPU has VNNI (exact there), u8 elsewhere
        out["ORT int8 static u8"] = OrtEngine(quantize_static_int8(onnx_fp32, calib, "asymmetric"))
        out["ORT int8 static s8"] = OrtEngine(quantize_static_int8(onnx_fp32, calib, "symmetric"))
    else:
        out["ORT int8 u8 dyn-tensor"] = OrtEngine(quantize_dynamic_int8(onnx_fp32, "asymmetric"))
        out["ORT int8 s8 dyn-tensor"] = OrtEngine(quantize_dynamic_int8(onnx_fp32, "symmetric"))
        out["ORT int8 s8 dyn-channel"] = OrtEngine(quantize_dynamic_int8(onnx_fp32, "symmetric", per_channel=True))
        out["ORT int8 block (MatMulNBits)"] = OrtEngine(quantize_nbits(onnx_fp32, 8, 32, compute_int8=True))
        out["ORT int8 weight-only"] = OrtEngine(quantize_nbits(onnx_fp32, 8, 32))
        out["ORT int4 block (MatMulNBits)"] = OrtEngine(quantize_nbits(onnx_fp32, 4, 32, compute_int8=True))
        out["ORT int4 weight-only"] = OrtEngine(quantize_nbits(onnx_fp32, 4, 32))
    return out


def mlp_copy(net: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(net)


def bench_policy(name: str, net: nn.Module, shape: tuple[int, ...], batches: list[int], budget: float) -> None:
    rng = np.random.default_rng(0)
    calib = rng.uniform(0, 1, (32, *shape)).astype(np.float32)
    table = engines(net, shape, calib)
    print(f"\n## {name}  (input {shape}, {sum(p.numel() for p in net.parameters()) / 1e6:.2f} M params)")
    header = "| path | " + " | ".join(f"batch {b} (us) | x fp32" for b in batches) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(batches)))
    base: dict[int, float] = {}
    for label, engine in table.items():
        cells = []
        for b in batches:
            x = rng.uniform(0, 1, (b, *shape)).astype(np.float32)
            us = median_us(engine, x, budget if b == 1 else budget * 2)
            base.setdefault(b, us)
            cells.append(f"{us:,.1f} | {base[b] / us:.2f}x")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def bench_automatic_choice(name: str, net: nn.Module, shape: tuple[int, ...], budget: float) -> None:
    """quarl's automatic int8 against the fastest mode that agrees with fp32 (>= 99 % of
    random states), both timed again side by side, interleaved, at batch 1."""
    import gymnasium as gym

    from quarl.policies.base import Policy
    from quarl.quantization.choice import choose
    from quarl.quantization.config import QuantConfig

    rng = np.random.default_rng(0)
    calib = rng.uniform(0, 1, (256, *shape)).astype(np.float32)
    n_out = [m for m in net.modules() if isinstance(m, nn.Linear)][-1].out_features
    policy = Policy(mlp_copy(net), gym.spaces.Box(0.0, 1.0, shape, np.float32), gym.spaces.Discrete(n_out), "argmax")
    config = QuantConfig("int8").resolved()
    chosen, tried = choose(policy, 8, calib, config.int8_weights, config.block_size, config.min_agreement,
                           config.action_tolerance)
    agreeing = [c for c in tried if c.agreement >= config.min_agreement] or [chosen]
    x = calib[:1]
    times: dict[int, list[float]] = {id(c): [] for c in agreeing}
    for _ in range(5):
        for c in agreeing:
            times[id(c)].append(median_us(c.engine, x, budget / 5))
    us = {id(c): float(np.min(t)) for c, t in ((c, times[id(c)]) for c in agreeing)}  # fastest round, as quarl times
    fastest = min(agreeing, key=lambda c: us[id(c)])
    mine = us.get(id(chosen), float("nan"))
    print(f"| {name} | {chosen.mode} (fp32 {sorted(chosen.keep)}) | {mine:,.1f} | {fastest.mode} "
          f"(fp32 {sorted(fastest.keep)}) | {us[id(fastest)]:,.1f} | {mine / us[id(fastest)]:.2f} |", flush=True)


def bench_evaluation(episodes: int) -> None:
    from pathlib import Path

    import gymnasium as gym

    from quarl.api import quantize
    from quarl.envs import EnvSpec
    from quarl.evaluation.episodes import evaluate
    from quarl.policies.base import Policy

    zoo = Path(__file__).resolve().parents[1].parent / "shared" / "zoo" / "ppo" / "CartPole-v1_1"
    if zoo.exists():
        from quarl.checkpoints import load_checkpoint

        policy, source = load_checkpoint(zoo).policy, "RL Zoo ppo CartPole-v1"
    else:
        env = gym.make("CartPole-v1")
        policy = Policy(mlp([4, 64, 64, 2], nn.Tanh), env.observation_space, env.action_space, "argmax")
        source = "random 64x64 policy"
    spec = EnvSpec("CartPole-v1")
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    steps, t = 0, time.perf_counter()
    while steps < 50_000:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            env.reset()
    env_only = steps / (time.perf_counter() - t)
    print(f"\n## evaluation throughput, {source}, {episodes} episodes (env steps / s)")
    print("| precision | n_envs=1 | n_envs=8 | n_envs=32 |")
    print("|---|---|---|---|")
    for label in ("fp32", "fp16", "int8"):
        q = quantize(policy, label, spec)  # int8: the automatic mode, calibrated on seeds apart from these
        cells = [f"{evaluate(q, spec, episodes=episodes, n_envs=n).steps_per_s:,.0f}" for n in (1, 8, 32)]
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    print(f"| (CartPole env alone, random actions) | {env_only:,.0f} | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timing per cell")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: tiny budget, few episodes (the test suite's)")
    args = parser.parse_args()
    if args.quick:
        args.budget, args.episodes = 0.02, 2
    import onnxruntime

    print(f"# quarl inference benchmark: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, VNNI: {has_vnni()}, torch {torch.__version__}, "
          f"onnxruntime {onnxruntime.__version__}, 1 thread")
    bench_policy("CartPole policy 64x64 (tanh)", mlp([4, 64, 64, 2], nn.Tanh), (4,), [1, 256], args.budget)
    bench_policy("ActorQ policy 3 x 2048", mlp([17, 2048, 2048, 2048, 6]), (17,), [1, 256], args.budget)
    bench_policy("NatureCNN 4x84x84", nature_cnn(), (4, 84, 84), [1, 256], args.budget)
    print("\n## the automatic int8 against the fastest mode that agrees (batch 1, us; random states)")
    print("| policy | automatic | us | fastest agreeing | us | automatic / fastest |")
    print("|---|---|---|---|---|---|")
    bench_automatic_choice("CartPole policy 64x64 (tanh)", mlp([4, 64, 64, 2], nn.Tanh), (4,), args.budget)
    bench_automatic_choice("ActorQ policy 3 x 2048", mlp([17, 2048, 2048, 2048, 6]), (17,), args.budget)
    bench_automatic_choice("NatureCNN 4x84x84", nature_cnn(), (4, 84, 84), args.budget)
    bench_evaluation(args.episodes)


if __name__ == "__main__":
    main()
