"""PPO's learner (:mod:`quarl.actorq.ppo` is its registry entry and options): IMPALA's
networks learned with PPO's clipped surrogate against the actors' behaviour policy, GAE
advantages from the value network."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from quarl.actorq.learners import IMPALALearner

if TYPE_CHECKING:  # the entry (quarl.actorq.ppo) imports this module when it builds a learner
    from quarl.actorq.algorithms import Metrics
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.ppo import PPOOptions


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
    sigma) learned with PPO's clipped surrogate against the actors' behaviour policy; ``options``
    are the config's (the entry passes them)."""

    def __init__(self, config: ActorQConfig, options: PPOOptions, obs_dim: int, act_dim: int, device: str = "cpu",
                 discrete: bool = True) -> None:
        super().__init__(config, obs_dim, act_dim, device, discrete)
        self.ppo = options

    def step(self, batch: Any) -> Metrics:
        c, o = self.config, self.ppo
        b = {k: torch.as_tensor(np.swapaxes(getattr(batch, k), 0, 1), device=self.device)
             for k in ("obs", "action", "reward", "discount", "cont", "next_obs", "behaviour")}
        action = b["action"] if self.discrete else b["action"].float()
        with torch.no_grad():
            values = self.value(b["obs"]).squeeze(-1)
            next_values = self.value(b["next_obs"]).squeeze(-1)
            advantages = gae(b["reward"], b["discount"], b["cont"], values, next_values, o.gae_lambda)
            returns = advantages + values
            log_mu = self.log_prob(b["behaviour"].float(), action)
            before = self.policy(b["obs"])  # pi before this step: the mismatch IMPALA reports
            first_kl = self.kl(b["behaviour"].float(), before)
            first_rho = torch.exp(self.log_prob(before, action) - log_mu)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        unrolls = b["obs"].shape[1]
        size = max(1, unrolls // o.ppo_minibatches)
        generator = torch.Generator().manual_seed(c.seed + self.steps)
        totals = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clipped": 0.0}
        updates = 0
        for _ in range(o.ppo_epochs):
            order = torch.randperm(unrolls, generator=generator)
            for start in range(0, unrolls, size):
                idx = order[start : start + size].to(self.device)
                out = self.policy(b["obs"][:, idx])
                ratio = torch.exp(self.log_prob(out, action[:, idx]) - log_mu[:, idx])
                adv = advantages[:, idx]
                clipped = torch.clamp(ratio, 1 - o.clip_range, 1 + o.clip_range)
                policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
                value_loss = 0.5 * ((self.value(b["obs"][:, idx]).squeeze(-1) - returns[:, idx]) ** 2).mean()
                entropy = (-(F.softmax(out, -1) * F.log_softmax(out, -1)).sum(-1).mean() if self.discrete
                           else torch.zeros((), device=self.device))
                loss = policy_loss + o.baseline_cost * value_loss - o.entropy_cost * entropy
                self.opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_([*self.policy.parameters(), *self.value.parameters()], 0.5)
                self.opt.step()
                totals["policy_loss"] += policy_loss.item()
                totals["value_loss"] += value_loss.item()
                totals["entropy"] += entropy.item()
                totals["clipped"] += ((ratio - 1).abs() > o.clip_range).float().mean().item()
                updates += 1
        self.steps += 1
        means = {k: v / max(updates, 1) for k, v in totals.items()}
        # the mismatch as IMPALA reports it: the actors' mu against the learner's pi before this step
        return {"loss": means["policy_loss"] + o.baseline_cost * means["value_loss"], **means,
                "kl": first_kl.mean().item(), "rho_mean": first_rho.mean().item(), "rho_std": first_rho.std().item(),
                "rho_clipped": (first_rho > 1 + o.clip_range).float().mean().item()}
