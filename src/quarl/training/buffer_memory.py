"""The replay or rollout buffer a training run will allocate, priced against the machine's
memory before Stable-Baselines3 allocates it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from quarl.core.errors import QuarlError
from quarl.training.hyperparams import TRAINERS, Hyperparams
from quarl.training.train_setup import TrainSetup


def _space_values(space: gym.spaces.Space[Any]) -> list[tuple[int, int]]:
    """(values, bytes a value) of each array a buffer stores for ``space`` (one per key of
    a Dict space)."""
    if isinstance(space, gym.spaces.Dict):
        return [part for sub in space.spaces.values() for part in _space_values(sub)]
    if isinstance(space, gym.spaces.Discrete):
        return [(1, np.dtype(space.dtype).itemsize)]
    if isinstance(space, gym.spaces.MultiDiscrete):
        return [(int(np.prod(space.nvec.shape)), np.dtype(space.dtype).itemsize)]
    if isinstance(space, gym.spaces.MultiBinary):
        return [(int(np.prod(space.shape or (space.n,))), np.dtype(space.dtype).itemsize)]
    return [(int(np.prod(space.shape or ())), np.dtype(space.dtype or np.float32).itemsize)]


def buffer_memory(algo: str, setup: TrainSetup, observation_space: gym.spaces.Space[Any],
                  action_space: gym.spaces.Space[Any]) -> tuple[str, int, int, int] | None:
    """(key, its value, bytes per unit of it, bytes in all) of the buffer SB3 allocates
    for this run: the replay buffer of an off-policy algorithm (``buffer_size``
    transitions: observation and next observation in the space's dtype, unless
    ``optimize_memory_usage``; action, reward, done and timeout) or the rollout buffer of an
    on-policy one (``n_steps`` x ``n_envs`` rows of observation, action and six float32
    scalars); None for an algorithm with neither."""
    import inspect

    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    cls = TRAINERS[algo].algo_class()
    params = inspect.signature(cls).parameters
    kwargs = setup.model_kwargs
    obs = sum(n * b for n, b in _space_values(observation_space))
    actions = sum(n for n, _ in _space_values(action_space))
    action_dtype = np.dtype(action_space.dtype or np.float32)
    if issubclass(cls, OffPolicyAlgorithm):
        size = int(kwargs.get("buffer_size", params["buffer_size"].default))
        size = max(size // setup.n_envs, 1) * setup.n_envs
        copies = 1 if kwargs.get("optimize_memory_usage") else 2
        stored = 4 if action_dtype == np.float64 else action_dtype.itemsize  # SB3 stores float64 actions as float32
        unit = copies * obs + actions * stored + 3 * 4
        return "buffer_size", size, unit, size * unit
    if issubclass(cls, OnPolicyAlgorithm):
        steps = int(kwargs.get("n_steps", params["n_steps"].default))
        unit = setup.n_envs * (obs + actions * action_dtype.itemsize + 6 * 4)
        return "n_steps", steps, unit, steps * unit
    return None


def check_buffer_memory(algo: str, setup: TrainSetup, observation_space: gym.spaces.Space[Any],
                        action_space: gym.spaces.Space[Any], overrides: Hyperparams | None = None) -> None:
    """Refuse in one line a run whose replay or rollout buffer (:func:`buffer_memory`) would
    take more than this machine's memory (``n_steps=1e10`` asked for 1.16 TiB, a
    ``buffer_size=1e10`` replay for 149 GiB), naming the value and the largest that fits."""
    from quarl.core.limits import machine_memory

    priced = buffer_memory(algo, setup, observation_space, action_space)
    if priced is None:
        return
    key, value, unit, total = priced
    memory = machine_memory()
    if total > memory:
        source = "--hp " if key in (overrides or {}) else f"the {algo} hyperparameters' "
        what = ("replay buffer" if key == "buffer_size" else
                f"rollout buffer ({setup.n_envs} env{'s' if setup.n_envs > 1 else ''})")
        raise QuarlError(f"{source}{key}={value:,}: the {what} would take {total / 2**30:,.1f} GiB "
                         f"({unit:,} bytes a {'transition' if key == 'buffer_size' else 'step'}), more than this "
                         f"machine's {memory / 2**30:,.1f} GiB of memory: refused (at most {key}={memory // unit:,})")

