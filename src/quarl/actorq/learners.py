"""ActorQ's full-precision learners, in plain PyTorch.

A learner is pure: ``step(batch) -> metrics`` on numpy batches from replay (with
``weight`` and ``index`` from prioritized replay, the loss is importance-weighted and
``metrics["priority"]`` holds each sample's new priority: the absolute TD error for DQN,
the critic's KL to its projected target for D4PG), ``weights()``
for the actors (the policy network only, as named numpy arrays), ``policy_network()``
for evaluation, ``state_dict()`` / ``load_state_dict()`` for checkpoints. DQN's and D4PG's
``targets(batch)`` is what their ``step`` fits to, with no side effect (checked against a
direct loop in ``tests/test_learner_targets.py``). Nothing here knows about processes, Ray
or replay.

- :class:`DQNLearner`: double DQN on n-step returns, Huber loss, a hard-updated target.
- :class:`D4PGLearner`: deterministic policy, distributional critic over ``n_atoms``
  fixed atoms (categorical projection of ``r + gamma^n z``), target networks for both.
- :class:`IMPALALearner`: an actor-critic on the actors' unrolls with V-trace corrections
  (on-policy: the actors' quantized policy is not the learner's), reporting the mismatch.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.optimizer import StateDict

from quarl.actorq.options import D4PGOptions, IMPALAOptions, ReplayOptions, UnrollOptions
from quarl.actorq.replay import Batch
from quarl.actorq.vtrace import vtrace

if TYPE_CHECKING:  # the config validates through the algorithm registry, which builds these learners
    from quarl.actorq.algorithms import LearnerState, Metrics
    from quarl.actorq.config import ActorQConfig


def mlp(
    sizes: list[int], activation: type[nn.Module] = nn.ReLU, out_activation: type[nn.Module] | None = None
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    if out_activation is not None:
        layers.append(out_activation())
    return nn.Sequential(*layers)


def policy_network(config: ActorQConfig, obs_dim: int, act_dim: int, continuous: bool = False) -> nn.Sequential:
    """What actors run: Q-values or action logits, or with ``continuous`` actions in [-1, 1]
    (a tanh output: d4pg's actions, impala's and ppo's Gaussian mean)."""
    sizes = [obs_dim, *config.policy_layers, act_dim]
    return mlp(sizes, out_activation=nn.Tanh if continuous else None)


def adam(params: Any, lr: float) -> torch.optim.Adam:
    # the fused kernel: 5x faster than the default foreach Adam on CPU for the 3 x 2048
    # policy (8 ms against 41 ms a step, one thread), which is a quarter of a DQN step
    return torch.optim.Adam(params, lr=lr, fused=True)


def weighted_mean(per_sample: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Mean loss; with importance weights (prioritized replay) their weighted mean."""
    if batch.weight is None:
        return per_sample.mean()
    return (torch.as_tensor(batch.weight, device=per_sample.device) * per_sample).mean()


def with_priority(metrics: dict[str, float], priority: torch.Tensor, batch: Batch) -> Metrics:
    """Adds the per-sample ``priority`` array for a batch from prioritized replay."""
    if batch.index is None:
        return {**metrics}
    return {**metrics, "priority": priority.cpu().numpy()}


def module_state(state: LearnerState, name: str) -> dict[str, torch.Tensor]:
    """A network's state dict in a learner's checkpoint (TypeError where it is something else)."""
    part = state[name]
    if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
        raise TypeError(f"{name} is not a network's state dict")
    return part


def optimizer_state(state: LearnerState, name: str) -> StateDict:
    """An optimizer's state dict in a learner's checkpoint (TypeError where it is something else)."""
    part = state[name]
    if not isinstance(part, dict) or not {"state", "param_groups"} <= set(part):
        raise TypeError(f"{name} is not an optimizer's state dict")
    return part


def step_count(state: LearnerState) -> int:
    """The learner steps a checkpoint's learner had taken."""
    steps = state["steps"]
    if isinstance(steps, dict):
        raise TypeError("steps is not a count")
    return int(steps)


def to_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


class DQNLearner:
    def __init__(self, config: ActorQConfig, obs_dim: int, n_actions: int, device: str = "cpu") -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.device = torch.device(device)
        self.options = ReplayOptions.of(config)
        self.q = policy_network(config, obs_dim, n_actions).to(self.device)
        self.target = copy.deepcopy(self.q)
        self.opt = adam(self.q.parameters(), config.learning_rate)
        self.steps = 0

    def _tensors(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: torch.as_tensor(v, device=self.device) for k, v in batch.transitions().items()}

    def targets(self, batch: Batch) -> torch.Tensor:
        """The double-DQN target of each row, what :meth:`step` regresses Q(obs, action) on:
        ``reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a))`` (the n-step
        reward and ``discount = gamma^k``, 0 at a terminal, as :class:`~quarl.actorq.replay.NStep`
        built them). No gradient."""
        return self._targets(self._tensors(batch))

    def _targets(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            best = self.q(b["next_obs"]).argmax(1, keepdim=True)  # double DQN: online picks, target rates
            bootstrap = self.target(b["next_obs"]).gather(1, best).squeeze(1)
            return b["reward"] + b["discount"] * bootstrap

    def losses(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample Huber loss and absolute TD error against :meth:`targets`."""
        b = self._tensors(batch)
        q = self.q(b["obs"]).gather(1, b["action"].long().view(-1, 1)).squeeze(1)
        target = self._targets(b)  # the batch moved to the device once
        return F.smooth_l1_loss(q, target, reduction="none"), (q - target).detach().abs()

    def step(self, batch: Batch) -> Metrics:
        per_sample, td = self.losses(batch)
        loss = weighted_mean(per_sample, batch)
        self.opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), 10.0)
        self.opt.step()
        self.steps += 1
        if self.steps % self.options.target_update_period == 0:
            self.target.load_state_dict(self.q.state_dict())
        return with_priority({"loss": loss.item()}, td, batch)

    def weights(self) -> dict[str, np.ndarray]:
        return to_numpy(self.q)

    def policy_network(self) -> nn.Module:
        return self.q

    def state_dict(self) -> LearnerState:
        return {"q": self.q.state_dict(), "target": self.target.state_dict(), "opt": self.opt.state_dict(),
                "steps": self.steps}

    def load_state_dict(self, state: LearnerState) -> None:
        self.q.load_state_dict(module_state(state, "q"))
        self.target.load_state_dict(module_state(state, "target"))
        self.opt.load_state_dict(optimizer_state(state, "opt"))
        self.steps = step_count(state)


class D4PGLearner:
    def __init__(self, config: ActorQConfig, obs_dim: int, act_dim: int, device: str = "cpu") -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.device = torch.device(device)
        self.options = o = D4PGOptions.of(config)
        self.policy = policy_network(config, obs_dim, act_dim, continuous=True).to(self.device)
        self.critic = mlp([obs_dim + act_dim, *o.critic_layers, o.n_atoms]).to(self.device)
        self.target_policy = copy.deepcopy(self.policy)
        self.target_critic = copy.deepcopy(self.critic)
        self.atoms = torch.linspace(o.v_min, o.v_max, o.n_atoms, device=self.device)
        self.policy_opt = adam(self.policy.parameters(), config.learning_rate)
        self.critic_opt = adam(self.critic.parameters(), config.learning_rate)
        self.steps = 0

    def project(self, reward: torch.Tensor, discount: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """Categorical projection of the distribution ``reward + discount * z`` (each atom
        z with probability ``probs``) back onto the fixed atoms (C51 / D4PG)."""
        z = self.atoms
        dz = (self.options.v_max - self.options.v_min) / (self.options.n_atoms - 1)
        tz = (reward[:, None] + discount[:, None] * z[None, :]).clamp(self.options.v_min, self.options.v_max)
        pos = (tz - self.options.v_min) / dz
        lo, hi = pos.floor().long(), pos.ceil().long()
        w_hi = pos - lo.float()
        w_lo = 1.0 - w_hi
        out = torch.zeros_like(probs)
        out.scatter_add_(1, lo, probs * w_lo)
        out.scatter_add_(1, hi, probs * w_hi * (hi != lo).float())  # an atom hit exactly gets weight once
        return out

    def _q_logits(self, critic: nn.Module, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return critic(torch.cat([obs, action], dim=1))

    def _tensors(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: torch.as_tensor(v, device=self.device) for k, v in batch.transitions().items()}

    def targets(self, batch: Batch) -> torch.Tensor:
        """The critic's target distribution of each row, ``[rows, n_atoms]``, what :meth:`step`
        fits the critic to: the target critic's distribution at (next_obs, the target
        policy's action there), its atoms moved to ``reward + discount * z`` and projected
        back onto the fixed atoms (:meth:`project`). No gradient."""
        return self._targets(self._tensors(batch))

    def _targets(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            next_logits = self._q_logits(self.target_critic, b["next_obs"], self.target_policy(b["next_obs"]))
            next_probs = F.softmax(next_logits, 1)
            return self.project(b["reward"], b["discount"], next_probs)

    def step(self, batch: Batch) -> Metrics:
        b = self._tensors(batch)
        action = b["action"].float().view(len(b["reward"]), -1)
        target = self._targets(b)  # the batch moved to the device once
        logits = self._q_logits(self.critic, b["obs"], action)
        cross_entropy = -(target * F.log_softmax(logits, 1)).sum(1)
        critic_loss = weighted_mean(cross_entropy, batch)
        # cross-entropy minus the target's own entropy: 0 when the critic matches its target
        kl = cross_entropy.detach() + (target * torch.log(target.clamp_min(1e-12))).sum(1)
        critic_kl = kl.mean()
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()

        probs = F.softmax(self._q_logits(self.critic, b["obs"], self.policy(b["obs"])), 1)
        policy_loss = -(probs * self.atoms).sum(1).mean()
        self.policy_opt.zero_grad()
        policy_loss.backward()
        self.policy_opt.step()

        self.steps += 1
        if self.steps % self.options.target_update_period == 0:
            self.target_policy.load_state_dict(self.policy.state_dict())
            self.target_critic.load_state_dict(self.critic.state_dict())
        metrics = {"critic_loss": critic_loss.item(), "critic_kl": critic_kl.item(), "policy_loss": policy_loss.item()}
        return with_priority(metrics, kl, batch)

    def weights(self) -> dict[str, np.ndarray]:
        return to_numpy(self.policy)

    def policy_network(self) -> nn.Module:
        return self.policy

    def state_dict(self) -> LearnerState:
        return {"policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
                "target_policy": self.target_policy.state_dict(), "target_critic": self.target_critic.state_dict(),
                "policy_opt": self.policy_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "steps": self.steps}

    def load_state_dict(self, state: LearnerState) -> None:
        for name, network in (("policy", self.policy), ("critic", self.critic), ("target_policy", self.target_policy),
                              ("target_critic", self.target_critic)):
            network.load_state_dict(module_state(state, name))
        self.policy_opt.load_state_dict(optimizer_state(state, "policy_opt"))
        self.critic_opt.load_state_dict(optimizer_state(state, "critic_opt"))
        self.steps = step_count(state)


class IMPALALearner:
    """An actor-critic learned from the actors' unrolls with V-trace (:mod:`quarl.actorq.vtrace`):
    a policy network (what actors run: logits, or a Gaussian's mean with a fixed sigma) and
    a value network. ``step(unrolls)`` also measures how far the actors' policy mu was from
    the learner's pi on the very states they acted in: the KL(mu || pi), the importance
    ratios' mean, spread and clipped share."""

    def __init__(self, config: ActorQConfig, obs_dim: int, act_dim: int, device: str = "cpu",
                 discrete: bool = True) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.discrete = discrete
        self.device = torch.device(device)
        self.policy = policy_network(config, obs_dim, act_dim, continuous=not discrete).to(self.device)
        self.options = UnrollOptions.of(config)
        self.value = mlp([obs_dim, *self.options.critic_layers, 1]).to(self.device)
        self.opt = adam([*self.policy.parameters(), *self.value.parameters()], config.learning_rate)
        self.steps = 0

    def log_prob(self, out: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(a | x) from the network output (logits, or the Gaussian's mean)."""
        if self.discrete:
            return F.log_softmax(out, -1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        sigma = self.options.policy_sigma
        return (-0.5 * ((action - out) / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)).sum(-1)

    def kl(self, behaviour: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """KL(mu || pi) per state, from both networks' outputs."""
        if self.discrete:
            log_mu, log_pi = F.log_softmax(behaviour, -1), F.log_softmax(out, -1)
            return (log_mu.exp() * (log_mu - log_pi)).sum(-1)
        return (((behaviour - out) ** 2) / (2 * self.options.policy_sigma ** 2)).sum(-1)  # equal sigmas

    def step(self, batch: Any) -> Metrics:
        c = IMPALAOptions.of(self.config)
        # [B, T, ...] from the queue -> time-major [T, B, ...]
        b = {k: torch.as_tensor(np.swapaxes(getattr(batch, k), 0, 1), device=self.device)
             for k in ("obs", "action", "reward", "discount", "cont", "next_obs", "behaviour")}
        out = self.policy(b["obs"])
        values = self.value(b["obs"]).squeeze(-1)
        with torch.no_grad():
            next_values = self.value(b["next_obs"]).squeeze(-1)
        action = b["action"] if self.discrete else b["action"].float()
        log_pi = self.log_prob(out, action)
        log_mu = self.log_prob(b["behaviour"].float(), action)
        measured_log_rho = (log_pi - log_mu).detach()  # the mismatch, reported in the ablation too
        # the ablation: the actors' data taken as the learner's own
        log_rho = measured_log_rho if c.correction else torch.zeros_like(measured_log_rho)
        targets = vtrace(log_rho, b["reward"], b["discount"], b["cont"], values.detach(), next_values,
                         c.rho_bar, c.c_bar)
        policy_loss = -(targets.advantages * log_pi).mean()
        value_loss = 0.5 * ((targets.vs - values) ** 2).mean()
        entropy = (-(F.softmax(out, -1) * F.log_softmax(out, -1)).sum(-1).mean() if self.discrete
                   else torch.zeros((), device=self.device))
        loss = policy_loss + c.baseline_cost * value_loss - c.entropy_cost * entropy
        self.opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_([*self.policy.parameters(), *self.value.parameters()], 40.0)
        self.opt.step()
        self.steps += 1
        with torch.no_grad():
            rho = torch.exp(measured_log_rho)
            kl = self.kl(b["behaviour"].float(), out.detach())
        return {"loss": loss.item(), "policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                "entropy": entropy.item(), "kl": kl.mean().item(), "rho_mean": rho.mean().item(),
                "rho_std": rho.std().item(), "rho_clipped": (rho > c.rho_bar).float().mean().item()}

    def weights(self) -> dict[str, np.ndarray]:
        return to_numpy(self.policy)

    def policy_network(self) -> nn.Module:
        return self.policy

    def state_dict(self) -> LearnerState:
        return {"policy": self.policy.state_dict(), "value": self.value.state_dict(), "opt": self.opt.state_dict(),
                "steps": self.steps}

    def load_state_dict(self, state: LearnerState) -> None:
        self.policy.load_state_dict(module_state(state, "policy"))
        self.value.load_state_dict(module_state(state, "value"))
        self.opt.load_state_dict(optimizer_state(state, "opt"))
        self.steps = step_count(state)

