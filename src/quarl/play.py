"""Watch a policy play: ``quarl play POLICY --precision int8 --video DIR``.

Episodes are played by :func:`quarl.evaluation.evaluate` on one env, so episode ``i``
meets seed ``seed + i`` and scores exactly what ``quarl ptq`` scores for it. With a video
folder, gymnasium's ``RecordVideo`` sits on the bare env (before the RL Zoo's wrappers), so
a video is a whole game as a person sees it, not the agent's cropped grey frames; it needs
no display (frames are rendered off screen, ``MUJOCO_GL=egl`` for MuJoCo).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import gymnasium as gym

from quarl.envs import EnvSpec, make_env
from quarl.errors import QuarlError
from quarl.evaluation import EvalResult, evaluate
from quarl.policies.base import Policy


@dataclasses.dataclass
class Playback:
    result: EvalResult
    videos: list[Path]
    """One .mp4 per episode, in episode order (empty without a video folder)."""


def _recorder(folder: Path, prefix: str):
    def wrap(env: gym.Env) -> gym.Env:
        with warnings.catch_warnings():  # "overwriting existing videos": play removed its old ones itself
            warnings.simplefilter("ignore", UserWarning)
            return gym.wrappers.RecordVideo(env, str(folder), episode_trigger=lambda _: True, name_prefix=prefix,
                                            disable_logger=True)

    return wrap


def play(policy: Policy, env_spec: EnvSpec, episodes: int = 3, seed: int = 0, video: Path | None = None,
         max_steps: int | None = None, name: str = "episode") -> Playback:
    """Play ``episodes`` deterministic episodes on one env; with ``video``, record each one
    as ``VIDEO/NAME-episode-K.mp4``."""
    if video is None:
        env = make_env(env_spec)
    else:
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame (classic control) asks for a sound device
        video.mkdir(parents=True, exist_ok=True)
        for old in video.glob(f"{name}-episode-*.mp4"):  # a replay replaces, never mixes with, an old one
            old.unlink()
        spec = dataclasses.replace(env_spec, env_kwargs={**env_spec.env_kwargs, "render_mode": "rgb_array"})
        try:
            env = make_env(spec, on_made=_recorder(video, name))
        except QuarlError as exc:
            raise QuarlError(f"{env_spec.env_id} cannot render frames for a video: {exc}") from None
    try:
        result = evaluate(policy, env_spec, episodes=episodes, seed=seed, n_envs=1, max_steps=max_steps, envs=[env])
    finally:
        env.close()  # RecordVideo writes the last episode's file on close
    videos = sorted(video.glob(f"{name}-episode-*.mp4"), key=lambda p: int(p.stem.rsplit("-", 1)[1])) if video else []
    return Playback(result, videos)
