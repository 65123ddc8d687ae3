"""ActorQ actor speed and broadcast cost, side by side in one run.

1. One actor (one thread) stepping its env with the 3 x 2048 policy at fp32, fp16, bf16
   (PyTorch) and int8 (ONNX Runtime dynamic int8): env steps per second, inference ms per
   step, speedup over fp32. PyTorch's own dynamic int8 is timed too, to show why ActorQ
   uses ONNX Runtime for int8.
2. One weight broadcast per wire-bit width: bytes, encode (serialize) ms, decode +
   load ms on the actor, and the int8 model the broadcaster builds for int8 actors.

Run: ``.venv/bin/python benchmarks/bench_actorq.py [--env CartPole-v1 --algo dqn] [--steps 2000]``
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from quarl.actorq import wire  # noqa: E402
from quarl.actorq.acting import Actor, ActorPolicy, Broadcaster, env_info, make_network  # noqa: E402
from quarl.actorq.config import ActorQConfig  # noqa: E402

torch.set_num_threads(1)


def actor_speed(config: ActorQConfig, info, weights, steps: int) -> dict[str, float]:
    b = Broadcaster(config, info)
    b.publish(1, weights)
    actor = Actor(config, info, 0, b.pull)
    actor.run(50)  # warm-up and first load
    r = actor.run(steps)
    return {"steps_per_s": r.steps / r.wall_s, "inference_ms": 1000 * r.times["inference"] / r.steps,
            "env_ms": 1000 * r.times["env"] / r.steps}


def torch_dynamic_int8_ms(config: ActorQConfig, info, weights, calls: int = 2000) -> float:
    net = make_network(config, info)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    qnet = torch.ao.quantization.quantize_dynamic(net.eval(), {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(1, info.obs_dim)
    with torch.inference_mode():
        for _ in range(20):
            qnet(x)
        t = time.perf_counter()
        for _ in range(calls):
            qnet(x)
    return 1000 * (time.perf_counter() - t) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--algo", default="dqn")
    parser.add_argument("--layers", default="2048,2048,2048")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: a 256 x 256 policy, 200 steps")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.steps = "256,256", 200
    warnings.filterwarnings("ignore")
    console = Console(width=130)
    layers = tuple(int(x) for x in args.layers.split(","))
    base = ActorQConfig(args.env, algo=args.algo, policy_layers=layers)
    info = env_info(base)
    weights = {k: v.detach().numpy() for k, v in make_network(base, info).state_dict().items()}

    table = Table(title=f"one actor, {args.env}, policy {args.layers}, {args.steps} steps, 1 thread")
    for col in ("actor precision", "runtime", "env steps/s", "inference ms/step", "env ms/step", "x fp32"):
        table.add_column(col, justify="right")
    results = {}
    for precision in ("fp32", "fp16", "bf16", "int8"):
        config = ActorQConfig(args.env, algo=args.algo, policy_layers=layers, actor_precision=precision)
        results[precision] = actor_speed(config, info, weights, args.steps)
    for precision, r in results.items():
        table.add_row(precision, "ONNX Runtime" if precision == "int8" else "PyTorch", f"{r['steps_per_s']:.0f}",
                      f"{r['inference_ms']:.3f}", f"{r['env_ms']:.3f}",
                      f"{r['steps_per_s'] / results['fp32']['steps_per_s']:.2f}")
    pt_int8 = torch_dynamic_int8_ms(base, info, weights)
    table.add_row("int8", "PyTorch dynamic", "-", f"{pt_int8:.3f}", "-",
                  f"{results['fp32']['inference_ms'] / pt_int8:.2f} (inference)")
    console.print(table)

    table = Table(title="one weight broadcast (decode + load: best of 5 on a float actor)")
    for col in ("payload", "bytes", "x fp32 size", "encode ms", "decode + load ms", "x 8-bit decode + load"):
        table.add_column(col, justify="right")
    raw, rows = None, {}
    for bits in (32, 16, 8, 7, 6, 5, 4, 3, 2):
        t = time.perf_counter()
        payload = wire.encode(weights, 1, bits)
        enc = time.perf_counter() - t
        policy = ActorPolicy(ActorQConfig(args.env, algo=args.algo, policy_layers=layers, actor_precision="fp32"), info)
        rows[bits] = (len(payload), enc, min(sum(policy.load(payload)) for _ in range(5)))
    raw = rows[32][0]
    for bits, (size, enc, dec) in rows.items():
        table.add_row(f"weights at {bits} bits", f"{size:,}", f"{size / raw:.3f}", f"{1000 * enc:.1f}",
                      f"{1000 * dec:.1f}", f"{dec / rows[8][2]:.2f}")
    config = ActorQConfig(args.env, algo=args.algo, policy_layers=layers, actor_precision="int8")
    b = Broadcaster(config, info)
    stats = b.publish(1, weights)
    policy = ActorPolicy(config, info)
    ds, ld = policy.load(b.pull(-1))
    table.add_row("int8 ONNX model", f"{int(stats['bytes']):,}", f"{stats['bytes'] / raw:.3f}",
                  f"{1000 * stats['build_s']:.1f} (build)", f"{1000 * (ds + ld):.1f}", "-")
    console.print(table)


if __name__ == "__main__":
    main()
