"""The vectorized envs a training run (or a fine-tuning) steps: the one :func:`quarl.envs.make_env`
per worker, with the RL Zoo's frame stack, channel order and normalization on top."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecFrameStack, VecNormalize, VecTransposeImage

from quarl.envs import make_env
from quarl.training.train_setup import TrainSetup


def training_vec_env(setup: TrainSetup, n_envs: int, seed: int, training: bool) -> VecEnv:
    """``n_envs`` envs of ``setup``'s spec seeded from ``seed``; ``training``: normalization
    statistics update (an evaluation env's stay as they are and rewards are not normalized)."""
    spec = setup.env_spec

    def builder(rank: int) -> Callable[[], gym.Env[Any, Any]]:
        def build() -> gym.Env[Any, Any]:
            # the one make_env (its family's kwargs and observation adapter); Atari trains with
            # life loss ending episodes and clipped rewards, Monitor inside sees whole games
            env = make_env(spec, training=True, stack_frames=False, on_made=Monitor)
            env.action_space.seed(seed + rank)
            return env
        return build

    venv: VecEnv = DummyVecEnv([builder(rank) for rank in range(n_envs)])
    venv.seed(seed)
    if spec.frame_stack > 1:
        venv = VecFrameStack(venv, spec.frame_stack)
    observations = venv.observation_space
    if is_image_space(observations) and isinstance(observations, gym.spaces.Box) \
            and not is_image_space_channels_first(observations):
        venv = VecTransposeImage(venv)  # what SB3 does to the training env; the eval env must match it
    if setup.normalize is not None:
        kwargs = dict(setup.normalize)
        if not training:
            kwargs.update(training=False, norm_reward=False)
        venv = VecNormalize(venv, **kwargs)
    return venv
