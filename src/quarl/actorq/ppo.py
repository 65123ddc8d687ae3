"""PPO with quantized actors: ActorQ's fourth algorithm, its options and one registration.

The actors act as IMPALA's do (they sample their own, quantized, policy mu and hand over
whole unrolls with mu's outputs); the learner is PPO's (Schulman et al. 2017) with mu as
the "old" policy: the ratio pi / mu is clipped to [1 - eps, 1 + eps] in the surrogate, so
an update never moves far from what the actors actually played, whatever their
quantization. Advantages are GAE(lambda) from the learner's value network, normalized per
batch; each batch of unrolls is learned from for ``ppo_epochs`` passes of ``ppo_minibatches``
minibatches (of whole unrolls). The learner is in :mod:`quarl.actorq.ppo_learner`, imported
when one is built, so this module (what ``--help`` reads) stays light.

Nothing else in quarl names this algorithm: the coordinator, the actors, the fleet, the
records, the loader, the run config and ``quarl actorq``'s options take it from its registry
entry below (:data:`quarl.actorq.algorithms.ENTRY_MODULES` imports this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quarl.actorq.algorithms import Algorithm, Learner, queue_limiter, register_algorithm, unroll_queue
from quarl.actorq.options import UnrollOptions
from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from quarl.actorq.config import ActorQConfig


@dataclass(frozen=True)
class PPOOptions(UnrollOptions):
    """ppo: PPO's clipped surrogate on the actors' unrolls, their quantized policy mu as the old one."""

    clip_range: float = 0.2
    """The surrogate's clip on the ratio pi / mu (mu: the actors' quantized policy)."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    ppo_epochs: int = 4
    """Passes over each batch of unrolls."""
    ppo_minibatches: int = 4
    """Minibatches (of whole unrolls) per pass."""

    def validate(self, config: ActorQConfig) -> None:
        super().validate(config)
        if not 0 < self.clip_range < 1:
            raise QuarlError(f"--clip-range {self.clip_range} must be in (0, 1)")
        if not 0 <= self.gae_lambda <= 1:
            raise QuarlError(f"--gae-lambda {self.gae_lambda} must be in [0, 1]")
        if not 1 <= self.ppo_epochs <= 100 or not 1 <= self.ppo_minibatches <= 1024:
            raise QuarlError(f"--ppo-epochs {self.ppo_epochs} must be in 1..100 and --ppo-minibatches "
                             f"{self.ppo_minibatches} in 1..1024")


def _ppo_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.ppo_learner import PPOLearner

    return PPOLearner(config, PPOOptions.of(config), obs_dim, act_dim, config.learner_device, discrete)


register_algorithm(Algorithm("ppo", "PPO's clipped surrogate on the actors' unrolls, their quantized policy as the "
                             "old one (either kind of action)", "either", _ppo_learner, unroll_queue, queue_limiter,
                             PPOOptions, unrolls=True))
