"""Play a policy that ``quarl export`` wrote, with ONNX Runtime and NumPy alone (and
gymnasium for the env): no quarl, no PyTorch, no Stable-Baselines3. What a board or a robot
runs: ``policy.onnx`` and the sidecar ``policy.json`` that says how an observation becomes the
network's input and how its output becomes an action.

    python examples/run_onnx_policy.py results/quick/lunar-int8 --episodes 3

Episode i plays on seed SEED + i, as ``quarl ptq`` plays its episodes, so the returns are
those of quarl's own evaluation of the export (tests/test_onnx_example.py checks it). The
sidecar's ``env.wrappers`` and ``frame_stack`` (Atari, MinAtar) are not rebuilt here: such a
policy needs its wrappers in front of this script's loop.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort


class OnnxPolicy:
    """``policy.onnx`` with the steps ``policy.json`` names around it."""

    def __init__(self, folder: Path) -> None:
        meta = json.loads((folder / "policy.json").read_text())
        self.meta = meta
        self.session = ort.InferenceSession(str(folder / meta["onnx"]), providers=["CPUExecutionProvider"])
        self.input_name = meta["input"]["name"]
        self.head = meta["head"]
        self.n_quantiles = int(meta.get("n_quantiles") or 0)
        self.scale_images = bool(meta.get("scale_images"))
        norm = meta.get("obs_normalizer")  # VecNormalize's statistics, applied as SB3 does
        self.norm = None if norm is None else (np.asarray(norm["mean"]), np.asarray(norm["var"]), float(norm["clip"]),
                                               float(norm["epsilon"]))
        space = meta["action_space"]
        self.low = np.asarray(space["low"], np.float32) if "low" in space else None
        self.high = np.asarray(space["high"], np.float32) if "high" in space else None
        self.nvec = np.asarray(space["nvec"]) if "nvec" in space else None

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs)[None]  # a batch of one
        if self.norm is not None:
            mean, var, clip, epsilon = self.norm
            x = np.clip((x - mean) / np.sqrt(var + epsilon), -clip, clip)
        x = x.astype(np.float32)
        return x / np.float32(255.0) if self.scale_images else x

    def act(self, obs: np.ndarray):
        out = self.session.run(None, {self.input_name: self.preprocess(obs)})[0]
        if self.head == "argmax":  # logits or Q-values
            return int(out.argmax(axis=-1)[0])
        if self.head == "quantile_argmax":  # QR-DQN: the mean over quantiles, laid out (quantile, action)
            return int(out.reshape(1, self.n_quantiles, -1).mean(1).argmax(-1)[0])
        if self.head == "multi_argmax":  # one categorical per sub-action, logits end to end
            edges = np.cumsum(self.nvec)[:-1]
            return np.array([block.argmax() for block in np.split(out[0], edges)])
        if self.head == "bernoulli":
            return (out[0] > 0).astype(np.int8)
        if self.head == "clip":  # the mean action, clipped to the bounds (A2C / PPO)
            return np.clip(out, self.low, self.high)[0]
        if self.head == "unscale":  # a tanh output mapped onto the bounds (SAC, TD3, DDPG, TQC)
            return (self.low + (0.5 * (out + 1.0)) * (self.high - self.low))[0]
        raise ValueError(f"unknown action head {self.head!r} in policy.json")


def play(folder: Path, episodes: int, seed: int) -> list[float]:
    """Each episode's return, episode i on seed ``seed + i``."""
    import gymnasium as gym

    policy = OnnxPolicy(folder)
    env_meta = policy.meta["env"]
    if env_meta.get("wrappers") or int(env_meta.get("frame_stack") or 1) > 1:
        raise SystemExit(f"{folder}: this policy's env needs the wrappers {env_meta.get('wrappers')} and frame stack "
                         f"{env_meta.get('frame_stack')}: put them in front of this loop")
    env = gym.make(env_meta["env_id"], **(env_meta.get("env_kwargs") or {}))
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, help="the folder quarl export wrote (policy.onnx, policy.json)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    returns = play(args.export, args.episodes, args.seed)
    for i, r in enumerate(returns):
        print(f"episode {i} (seed {args.seed + i}): return {r:.2f}")
    print(f"mean return {np.mean(returns):.2f} over {len(returns)} episodes")


if __name__ == "__main__":
    main()
