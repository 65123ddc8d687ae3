"""Tiny envs with MultiDiscrete and MultiBinary actions (quarl's tests): each step shows a
target per sub-action (one-hot), and pays 1 per sub-action that hits it; 20 steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class MultiTarget(gym.Env):
    def __init__(self, nvec: tuple[int, ...] = (3, 2), binary: int = 0) -> None:
        self.nvec = np.asarray(nvec) if not binary else np.full(binary, 2)
        self.action_space = gym.spaces.MultiBinary(binary) if binary else gym.spaces.MultiDiscrete(list(nvec))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(self.nvec.sum()),), np.float32)
        self.t = 0

    def _observe(self) -> np.ndarray:
        self.target = np.array([self.np_random.integers(n) for n in self.nvec])
        obs = np.zeros(int(self.nvec.sum()), np.float32)
        obs[np.cumsum(np.r_[0, self.nvec[:-1]]) + self.target] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(np.sum(np.asarray(action).reshape(-1) == self.target))
        self.t += 1
        return self._observe(), reward, False, self.t >= 20, {}


gym.register("MultiTarget-v0", entry_point=MultiTarget)
gym.register("BinaryTarget-v0", entry_point=MultiTarget, kwargs={"binary": 3})
