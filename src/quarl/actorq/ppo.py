"""PPO with quantized actors: ActorQ's fourth algorithm, one module and one registration.

The actors act as IMPALA's do (they sample their own, quantized, policy mu and hand over
whole unrolls with mu's outputs); the learner is PPO's (Schulman et al. 2017) with mu as
the "old" policy: the ratio pi / mu is clipped to [1 - eps, 1 + eps] in the surrogate, so
an update never moves far from what the actors actually played, whatever their
quantization. Advantages are GAE(lambda) from the learner's value network, normalized per
batch; each batch of unrolls is learned from for ``ppo_epochs`` passes of ``ppo_minibatches``
minibatches (of whole unrolls).

Nothing else in quarl names this algorithm: the coordinator, the actors, the fleet, the
records, the loader and ``--algo``'s help take it from its registry entry below.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from quarl.actorq.algorithms import (MODULES, Algorithm, _queue_limiter, _unroll_queue, register_algorithm,
                                    validate_unrolls)
from quarl.actorq.config import ActorQConfig
from quarl.actorq.learners import IMPALALearner
from quarl.core.errors import QuarlError


def gae(rewards: torch.Tensor, discounts: torch.Tensor, continues: torch.Tensor, values: torch.Tensor,
        next_values: torch.Tensor, lam: float) -> torch.Tensor:
    """GAE(lambda) advantages, time-major [T, B]: ``delta_t = r_t + d_t V(x'_t) - V(x_t)`` and
    ``A_t = delta_t + d_t lambda k_t A_{t+1}`` (``d_t``: gamma, 0 at a terminal; ``k_t``: 1
    where the episode goes on inside the unroll; ``x'_t`` bootstraps a truncation and the
    unroll's last step), as :func:`quarl.actorq.vtrace.vtrace` reads the same fields."""
    deltas = rewards + discounts * next_values - values
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + discounts[t] * lam * continues[t] * running
        advantages[t] = running
    return advantages


class PPOLearner(IMPALALearner):
    """IMPALA's networks and action distributions (logits, or a Gaussian mean with a fixed
    sigma) learned with PPO's clipped surrogate against the actors' behaviour policy."""

    def step(self, batch: Any) -> dict[str, Any]:
        c = self.config
        b = {k: torch.as_tensor(np.swapaxes(getattr(batch, k), 0, 1), device=self.device)
             for k in ("obs", "action", "reward", "discount", "cont", "next_obs", "behaviour")}
        action = b["action"] if self.discrete else b["action"].float()
        with torch.no_grad():
            values = self.value(b["obs"]).squeeze(-1)
            next_values = self.value(b["next_obs"]).squeeze(-1)
            advantages = gae(b["reward"], b["discount"], b["cont"], values, next_values, c.gae_lambda)
            returns = advantages + values
            log_mu = self.log_prob(b["behaviour"].float(), action)
            before = self.policy(b["obs"])  # pi before this step: the mismatch IMPALA reports
            first_kl = self.kl(b["behaviour"].float(), before)
            first_rho = torch.exp(self.log_prob(before, action) - log_mu)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        unrolls = b["obs"].shape[1]
        size = max(1, unrolls // c.ppo_minibatches)
        generator = torch.Generator().manual_seed(c.seed + self.steps)
        totals = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clipped": 0.0}
        updates = 0
        for _ in range(c.ppo_epochs):
            order = torch.randperm(unrolls, generator=generator)
            for start in range(0, unrolls, size):
                idx = order[start : start + size].to(self.device)
                out = self.policy(b["obs"][:, idx])
                ratio = torch.exp(self.log_prob(out, action[:, idx]) - log_mu[:, idx])
                adv = advantages[:, idx]
                clipped = torch.clamp(ratio, 1 - c.clip_range, 1 + c.clip_range)
                policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
                value_loss = 0.5 * ((self.value(b["obs"][:, idx]).squeeze(-1) - returns[:, idx]) ** 2).mean()
                entropy = (-(F.softmax(out, -1) * F.log_softmax(out, -1)).sum(-1).mean() if self.discrete
                           else torch.zeros((), device=self.device))
                loss = policy_loss + c.baseline_cost * value_loss - c.entropy_cost * entropy
                self.opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_([*self.policy.parameters(), *self.value.parameters()], 0.5)
                self.opt.step()
                totals["policy_loss"] += policy_loss.item()
                totals["value_loss"] += value_loss.item()
                totals["entropy"] += entropy.item()
                totals["clipped"] += ((ratio - 1).abs() > c.clip_range).float().mean().item()
                updates += 1
        self.steps += 1
        means = {k: v / max(updates, 1) for k, v in totals.items()}
        # the mismatch as IMPALA reports it: the actors' mu against the learner's pi before this step
        return {"loss": means["policy_loss"] + c.baseline_cost * means["value_loss"], **means,
                "kl": first_kl.mean().item(), "rho_mean": first_rho.mean().item(), "rho_std": first_rho.std().item(),
                "rho_clipped": (first_rho > 1 + c.clip_range).float().mean().item()}


def _ppo_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool) -> PPOLearner:
    return PPOLearner(config, obs_dim, act_dim, config.learner_device, discrete)


def _validate_ppo(config: ActorQConfig) -> None:
    validate_unrolls(config)
    if not 0 < config.clip_range < 1:
        raise QuarlError(f"--clip-range {config.clip_range} must be in (0, 1)")
    if not 0 <= config.gae_lambda <= 1:
        raise QuarlError(f"--gae-lambda {config.gae_lambda} must be in [0, 1]")
    if not 1 <= config.ppo_epochs <= 100 or not 1 <= config.ppo_minibatches <= 1024:
        raise QuarlError(f"--ppo-epochs {config.ppo_epochs} must be in 1..100 and --ppo-minibatches "
                         f"{config.ppo_minibatches} in 1..1024")


register_algorithm(Algorithm("ppo", MODULES["ppo"][1], "either", _ppo_learner, _unroll_queue, _queue_limiter,
                             unrolls=True, validate=_validate_ppo))
