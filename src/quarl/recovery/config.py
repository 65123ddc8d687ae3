"""What a recovery is asked to do (:class:`RecoverConfig`) and the constants of its files and seeds."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from quarl.core.errors import QuarlError
from quarl.evaluation.calibration import DISTILLATION_SEEDS
from quarl.quant.modes import student_modes

if TYPE_CHECKING:
    from quarl.quantization.config import QuantConfig



Q_ALGOS = ("dqn", "qrdqn")
"""Algorithms whose discrete head is action values (a margin loss), not logits (KL)."""
RECOVERY_FILE = "recovery.json"
ORIGINAL_ZIP = "original.zip"
EXPORT_DIR = "export"
STATE_FILE = "state.pt"
RECOVERY_FORMAT: Final = 1
"""The format of recovery.json and state.pt (a literal: :class:`~quarl.recovery.report.RecoveryState`
holds exactly it)."""
MIN_HELDOUT = 256
"""Held-out states needed before a round may end the run: one short episode (a failing
CartPole's 10 steps) agreeing on every state says little."""
TRAIN_SEEDS_END = DISTILLATION_SEEDS.start + 8_000
"""Distillation's training episodes stay below this seed (20,000..27,999)."""
TEST_SEEDS = range(TRAIN_SEEDS_END, DISTILLATION_SEEDS.start + 9_000)
"""Recovery's own calibration episodes (28,000..28,999): the paired tests that choose what
is written (a student against PTQ's own model) and when recovery stops (against the
original fp32). Reserved like every distillation seed (no evaluation may play them) and
never trained on. ptq's calibration episodes (10,100..10,199) are too few: the confidence
sequence needs about 100 clean episodes before it may exclude an unseen failure."""
TEST_FIRST = 16
"""Episodes of a test's first look (then doubled while undecided)."""
TEST_STEPS = 160_000
"""Steps a test may play per policy: its cap is this over the reference's mean episode
length, within :data:`TEST_CAPS` (CartPole at 500 steps: 320 episodes; MuJoCo: 160)."""
TEST_CAPS = (128, 512)
"""Fewer than 128 clean episodes cannot decide *keeps*; more than 512 is a long wait."""


@dataclass(frozen=True)
class RecoverConfig:
    """How a policy is recovered (see the module docstring)."""

    precision: str = "int4"
    """``int8`` / ``int4`` (the mode the automatic choice picks; a mode without a student,
    such as ``int8-static``, is replaced by the block mode of its bits) or a mode label
    (``int4-block``, ``int8-dyn-channel``...)."""
    rounds: int = 12
    """DAgger rounds at most (round 0 is the teacher's)."""
    episodes_per_round: int = 4
    """Episodes played per round for training states (one more for held-out states)."""
    max_episode_steps: int = 1000
    """Distillation episodes are cut here (states, not returns, are what is collected)."""
    updates_per_round: int = 400
    """Adam steps per round."""
    batch_size: int = 256
    lr: float = 5e-4
    target_agreement: float | None = None
    """Held-out agreement that ends the run; None: the teacher's fp16 agreement with
    itself, at most ``min_agreement``."""
    min_agreement: float = 0.99
    action_tolerance: float = 0.02
    """Continuous actions agree when every dimension is within this share of its range."""
    max_states: int = 200_000
    """Aggregated states kept at most (the oldest student states are dropped first)."""
    block_size: int = 32
    int8_weights: str = "auto"
    seed: int = 0
    """Seeds the minibatch order and the student's initial noise-free copy (torch RNG)."""
    closed_loop: bool = True
    """Also require the student to keep the teacher's return on calibration episodes."""
    stop_at_target: bool = True
    """End at the first round that reaches the target (False: play every round, keep the best)."""
    finetune_steps: int = 20_000
    """Env steps of QAT fine-tuning with the agent's own algorithm (:mod:`quarl.training.finetune`;
    0: none), run where the distillation rounds ended without keeping fp32's return. The
    fine-tuned student is a candidate like the distilled ones: written only where it plays
    at least as well as PTQ's own model."""
    q_loss: str = "rank"
    """Q-value heads (DQN, QR-DQN): ``rank`` (a hinge on the teacher's greedy action, one on
    every pair of actions the teacher orders with states weighted by the teacher's action
    gap, and the values' squared error) or ``margin`` (the first and the last only). On a
    DQN LunarLander at int4 (docs/recover.md, "Q-value heads") ``rank`` raised held-out
    agreement from 87.9 % to 92.1 % and kept fp32's return where ``margin`` was undecided."""
    max_rounds: int | None = None
    """DAgger rounds in all, the continuations included (None: three times ``rounds``):
    where ``rounds`` end without keeping fp32's return, distillation goes on ``rounds`` more
    at a time, up to this."""
    budget_minutes: float = 15.0
    """Wall-clock budget: no new stage (more rounds, the fine-tune) starts after it."""

    def __post_init__(self) -> None:
        for name in ("rounds", "episodes_per_round", "max_episode_steps", "updates_per_round", "batch_size",
                     "max_states"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise QuarlError(f"{name}={value!r} must be a whole number of at least 1")
        if self.rounds > 1000 or self.episodes_per_round > 1000 or self.updates_per_round > 1_000_000:
            raise QuarlError(f"rounds {self.rounds}, episodes per round {self.episodes_per_round} or updates "
                             f"{self.updates_per_round} is beyond the allowed 1000 / 1000 / 1,000,000")
        if not (self.lr > 0 and np.isfinite(self.lr)):
            raise QuarlError(f"learning rate {self.lr!r} must be a positive number")
        if self.target_agreement is not None and not 0.0 < self.target_agreement <= 1.0:
            raise QuarlError(f"target agreement {self.target_agreement!r} must be in (0, 1]")
        if isinstance(self.finetune_steps, bool) or not isinstance(self.finetune_steps, int) or \
                not 0 <= self.finetune_steps <= 100_000_000:
            raise QuarlError(f"finetune_steps={self.finetune_steps!r} must be a whole number in 0..100,000,000")
        if self.q_loss not in ("margin", "rank"):
            raise QuarlError(f"q_loss={self.q_loss!r} is not a Q-value loss: allowed margin, rank")
        if self.max_rounds is not None and (isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int)
                                            or not self.rounds <= self.max_rounds <= 1000):
            raise QuarlError(f"max_rounds={self.max_rounds!r} must be a whole number from rounds ({self.rounds}) "
                             "to 1000")
        if self.total_rounds * self.episodes_per_round > TRAIN_SEEDS_END - DISTILLATION_SEEDS.start:
            raise QuarlError(f"{self.total_rounds} rounds of {self.episodes_per_round} episodes would play past the "
                             f"distillation's training seeds ({DISTILLATION_SEEDS.start}..{TRAIN_SEEDS_END - 1}): "
                             "fewer rounds or episodes per round")
        if not (isinstance(self.budget_minutes, (int, float)) and 0 < self.budget_minutes <= 7 * 24 * 60):
            raise QuarlError(f"budget_minutes={self.budget_minutes!r} must be a number of minutes in (0, 10080]")
        if self.max_states > 10_000_000:
            raise QuarlError(f"max states {self.max_states} is beyond the allowed 10,000,000")
        if self.quant.precision not in ("int8", "int4"):  # parsed here, once
            raise QuarlError(f"recover precision {self.precision!r} is not a real int precision: allowed int8, int4 "
                             f"or a mode ({', '.join(m.label for m in student_modes())})")

    @property
    def total_rounds(self) -> int:
        """DAgger rounds at most, the continuations included."""
        if self.max_rounds is not None:
            return self.max_rounds
        room = (TRAIN_SEEDS_END - DISTILLATION_SEEDS.start) // self.episodes_per_round  # the training seeds' room
        return max(self.rounds, min(3 * self.rounds, room, 1000))

    @functools.cached_property
    def quant(self) -> QuantConfig:
        """``precision`` and the quantization options as a :class:`~quarl.quantization.config.QuantConfig`,
        parsed once (at construction, where it is checked) and kept: not a field, so neither
        the files' ``config`` nor equality sees it."""
        from quarl.quantization.config import QuantConfig

        options = QuantConfig(block_size=self.block_size, int8_weights=self.int8_weights,
                              min_agreement=self.min_agreement, action_tolerance=self.action_tolerance)
        return QuantConfig.parse(self.precision, base=options)

    def quant_config(self) -> QuantConfig:
        """:attr:`quant` resolved on this CPU (``int8_weights="auto"``: what it runs;
        :meth:`~quarl.quantization.config.QuantConfig.resolved`)."""
        return self.quant.resolved()

    @classmethod
    def from_record(cls, fields: Mapping[str, Any]) -> RecoverConfig | None:
        """The config a file recorded as its fields (``dataclasses.asdict``: recovery.json's and
        the state's ``config``), compared with a run's own as a config; None where it records
        other fields (an older quarl's) or values no config takes."""
        if set(fields) != {f.name for f in dataclasses.fields(cls)}:
            return None
        try:
            return cls(**fields)
        except (QuarlError, TypeError, ValueError):
            return None
