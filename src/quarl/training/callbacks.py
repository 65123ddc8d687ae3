"""The callbacks a training run adds to SB3's ``learn``: a checkpoint every so many env steps
(:class:`~quarl.training.periodic_saves.Checkpointer`) and the rolling training return, a line
per tenth of the budget."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from quarl.training.periodic_saves import Checkpointer

REWARD_LINES = 10
"""Lines of rolling training reward a run prints (one per tenth of its budget)."""


class _Every(BaseCallback):
    """Acts once the run passes each multiple of ``every`` env steps (a resumed run: the
    first multiple after the step it resumed at)."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every = every
        self.next = every

    def _on_training_start(self) -> None:
        self.next = (self.num_timesteps // self.every + 1) * self.every

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next:
            self._act()
            self.next = (self.num_timesteps // self.every + 1) * self.every
        return True

    def _act(self) -> None:
        raise NotImplementedError


class RollingReward(_Every):
    """Logs, every ``every`` steps, the mean return of the last (up to 100) training
    episodes (SB3's ``ep_info_buffer``, what its ``rollout/ep_rew_mean`` shows), so a run
    says how it is learning while it learns."""

    def __init__(self, every: int, say: Callable[[str], None]) -> None:
        super().__init__(every)
        self.say = say

    def _act(self) -> None:
        episodes = [info["r"] for info in self.model.ep_info_buffer or []]
        if episodes:
            self.say(f"step {self.num_timesteps:,}: mean training return {float(np.mean(episodes)):.2f} over the "
                     f"last {len(episodes)} episodes")


class CheckpointEvery(_Every):
    """Saves a checkpoint every ``every`` env steps."""

    def __init__(self, every: int, checkpointer: Checkpointer) -> None:
        super().__init__(every)
        self.checkpointer = checkpointer

    def _act(self) -> None:
        self.checkpointer.save(self.model)
