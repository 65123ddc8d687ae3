"""The distillation loss per action head: a margin or a ranking over actions for Q-values, KL
for categorical policies, action error in the squashed space for actors."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from quarl.policies.base import Policy
from quarl.recovery.config import Q_ALGOS


def _q_values(policy: Policy, out: torch.Tensor) -> torch.Tensor:
    if policy.head == "quantile_argmax":
        return out.reshape(out.shape[0], policy.n_quantiles, -1).mean(1)
    return out


def _margin(student: torch.Tensor, teacher: torch.Tensor, scale: float) -> torch.Tensor:
    """Hinge on the teacher's greedy action: the student's value of it must lead every other
    action by half the teacher's own lead (at most ``scale``); states where the teacher
    itself is tied (lead below 1e-3 of ``scale``) ask nothing."""
    top2 = teacher.topk(2, dim=1)
    best = top2.indices[:, 0]
    lead_t = top2.values[:, 0] - top2.values[:, 1]
    chosen = student.gather(1, best[:, None])[:, 0]
    others = student.scatter(1, best[:, None], float("-inf")).amax(dim=1)
    want = torch.clamp(0.5 * lead_t, max=scale)
    untied = (lead_t > 1e-3 * scale).float()
    return (torch.relu(want - (chosen - others)) * untied).sum() / (untied.sum().clamp(min=1.0) * scale)


def _ranking(student: torch.Tensor, teacher: torch.Tensor, scale: float) -> torch.Tensor:
    """A hinge on every pair of actions the teacher orders (``i`` above ``j``): the student
    keeps ``i`` above ``j`` by half the teacher's gap (at most ``scale``), each state
    weighted by the teacher's own action gap (its lead, over ``scale``; at most 1), so the
    states where a flipped greedy action costs return weigh most and ties ask nothing."""
    gap_t = teacher[:, :, None] - teacher[:, None, :]  # [b, i, j]: how far the teacher puts i above j
    gap_s = student[:, :, None] - student[:, None, :]
    ordered = (gap_t > 1e-3 * scale).float()
    want = torch.clamp(0.5 * gap_t, max=scale)
    top2 = teacher.topk(2, dim=1).values
    weight = torch.clamp((top2[:, 0] - top2[:, 1]) / scale, max=1.0)  # the teacher's action gap
    per_state = (torch.relu(want - gap_s) * ordered).sum((1, 2)) / ordered.sum((1, 2)).clamp(min=1.0)
    return (weight * per_state).sum() / (weight.sum().clamp(min=1e-6) * scale)


def distill_loss(policy: Policy, student_out: torch.Tensor, teacher_out: torch.Tensor, scale: float,
                 q_loss: str = "margin") -> torch.Tensor:
    """The loss of one minibatch, by the policy's action head:

    - Q-values (DQN, QR-DQN: the mean over quantiles): the teacher's argmax kept with a
      margin (:func:`_margin`), plus the values' squared error over ``scale**2`` (an anchor);
    - logits (A2C / PPO / TRPO / ARS discrete): KL(teacher || student), plus the margin;
    - Gaussian means (``clip`` head): squared error of the clipped actions in units of the
      action range, plus a tenth of the raw means' (a gradient where both are clipped);
    - squashed actors (SAC, TQC, TD3, DDPG: ``unscale``, a tanh output): squared error in
      the squashed space [-1, 1];
    - several categoricals (MultiDiscrete): the KL and margin of each sub-action, summed;
      Bernoulli bits (MultiBinary): the KL of each bit's distribution, averaged."""
    if policy.head == "multi_argmax":
        from quarl.policies.base import action_nvec

        sizes = [int(n) for n in action_nvec(policy.action_space)]
        total = student_out.new_zeros(())
        for s, t in zip(student_out.split(sizes, dim=1), teacher_out.split(sizes, dim=1), strict=True):
            kl = nn.functional.kl_div(torch.log_softmax(s, 1), torch.log_softmax(t, 1), log_target=True,
                                      reduction="batchmean")
            total = total + kl + (_margin(s, t, scale) if s.shape[1] > 1 else 0.0)
        return total
    if policy.head == "bernoulli":  # KL(teacher || student) of each bit's Bernoulli
        p_t = torch.sigmoid(teacher_out)
        log_s1, log_s0 = nn.functional.logsigmoid(student_out), nn.functional.logsigmoid(-student_out)
        log_t1, log_t0 = nn.functional.logsigmoid(teacher_out), nn.functional.logsigmoid(-teacher_out)
        return (p_t * (log_t1 - log_s1) + (1 - p_t) * (log_t0 - log_s0)).mean()
    if policy.head in ("argmax", "quantile_argmax"):
        s, t = _q_values(policy, student_out), _q_values(policy, teacher_out)
        margin = _margin(s, t, scale)
        if policy.algo in Q_ALGOS:
            anchor = nn.functional.mse_loss(student_out, teacher_out) / scale**2
            if q_loss == "rank":
                return margin + _ranking(s, t, scale) + anchor
            return margin + anchor
        kl = nn.functional.kl_div(torch.log_softmax(s, 1), torch.log_softmax(t, 1), log_target=True,
                                  reduction="batchmean")
        return kl + margin
    if policy.head == "clip":
        box = policy.action_space
        assert isinstance(box, gym.spaces.Box)  # a clipping head acts in a Box
        low = torch.as_tensor(box.low, dtype=torch.float32)
        high = torch.as_tensor(box.high, dtype=torch.float32)
        width = torch.where(torch.isfinite(high - low) & (high > low), high - low, torch.full_like(low, 2.0))
        s_c = torch.maximum(torch.minimum(student_out, high), low)
        t_c = torch.maximum(torch.minimum(teacher_out, high), low)
        return (((s_c - t_c) / width) ** 2).mean() + 0.1 * (((student_out - teacher_out) / width) ** 2).mean()
    return ((student_out - teacher_out) ** 2).mean()


def loss_scale(policy: Policy, labels: torch.Tensor) -> float:
    """The ``scale`` :func:`distill_loss` takes: the mean spread (best minus worst) of the
    teacher's action values ``labels`` (Q-heads: the unit of the margin and the anchor); 1.0
    for other heads or where every value ties."""
    if policy.head not in ("argmax", "quantile_argmax"):
        return 1.0
    q = _q_values(policy, labels)
    spread = float((q.amax(1) - q.amin(1)).mean())
    return spread if spread > 0 else 1.0
