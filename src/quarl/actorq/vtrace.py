"""V-trace (Espeholt et al. 2018, IMPALA): off-policy value targets and policy-gradient
advantages for unrolls that actors played with their own (here: quantized, possibly
older) policy mu, learned by the learner's fp32 policy pi.

For one unroll of length T (time-major), with rho_t = pi(a_t | x_t) / mu(a_t | x_t)::

    delta_t = min(rho_bar, rho_t) * (r_t + d_t V(x'_t) - V(x_t))
    v_t - V(x_t) = delta_t + d_t k_t min(c_bar, rho_t) (v_{t+1} - V(x_{t+1}))     (0 past the unroll)
    A_t = min(rho_bar, rho_t) * (r_t + d_t v'_{t+1} - V(x_t))

where ``d_t`` is the discount (gamma, 0 at a terminal state), ``x'_t`` the next state (its
value bootstraps a step whose episode ends by truncation or at the unroll's end), ``k_t``
is 1 when the episode goes on to step t + 1 inside the unroll (0 at a terminal or a
truncation), and ``v'_{t+1}`` is ``v_{t+1}`` where ``k_t`` is 1, else ``V(x'_t)``. With
rho = c = 1 (pi = mu, or no correction) ``v_t`` is the n-step return bootstrapped at the
unroll's end or the episode's (tested against a direct loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VTrace:
    vs: torch.Tensor
    """Value targets v_t, [T, B]."""
    advantages: torch.Tensor
    """Policy-gradient advantages A_t (clipped importance weight included), [T, B]."""
    rho: torch.Tensor
    """Unclipped importance ratios pi / mu, [T, B]."""


@torch.no_grad()
def vtrace(log_rho: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, continues: torch.Tensor,
           values: torch.Tensor, next_values: torch.Tensor, rho_bar: float = 1.0, c_bar: float = 1.0) -> VTrace:
    """V-trace targets for time-major [T, B] tensors: ``log_rho`` = log pi(a|x) - log mu(a|x),
    ``values`` = V(x_t), ``next_values`` = V(x'_t); see the module docstring."""
    rho = torch.exp(log_rho)
    clipped_rho = rho.clamp(max=rho_bar)
    cs = rho.clamp(max=c_bar)
    deltas = clipped_rho * (rewards + discounts * next_values - values)
    T = rewards.shape[0]
    corrections = torch.zeros_like(values)  # v_t - V(x_t)
    later = torch.zeros_like(values[0])
    for t in reversed(range(T)):
        later = deltas[t] + discounts[t] * continues[t] * cs[t] * later
        corrections[t] = later
    vs = values + corrections
    # v'_{t+1}: the next step's target inside the episode, else the next state's value
    following = torch.cat([vs[1:], next_values[-1:]], dim=0)
    bootstrap = torch.where(continues > 0, following, next_values)
    advantages = clipped_rho * (rewards + discounts * bootstrap - values)
    return VTrace(vs, advantages, rho)
