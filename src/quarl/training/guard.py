"""Training stops at the first NaN or inf, at the env step where it appeared.

A NaN reward (a broken env, a reward that overflowed) used to flow into the losses and
train the weights to NaN, and the run went on writing checkpoints of them. :class:`NonFiniteGuard`
wraps a run's callbacks and looks, at each env step, at the transition (rewards and
observations, before SB3 stores them) and, before each rollout, at what the last gradient
update produced (the logged losses and the weights): the first non-finite value raises
:class:`NonFiniteTraining` naming the step and the value, before any other callback (a
checkpoint, an evaluation that would save ``best_model.zip``) sees the step. The checkpoint
writer checks again (:func:`non_finite_state`): a checkpoint on disk is never NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback, CallbackList

from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm


class NonFiniteTraining(QuarlError):
    """Training met a NaN or inf at env step ``step``: ``what`` names it."""

    def __init__(self, step: int, what: str) -> None:
        self.step = step
        self.what = what
        super().__init__(f"training stopped at env step {step:,}: {what} is not finite (NaN or inf)")


def _bad_array(value: Any) -> bool:
    array = np.asarray(value)
    return array.dtype.kind in "fc" and not bool(np.isfinite(array).all())


def non_finite_transition(rewards: Any, observations: Any) -> str | None:
    """What is non-finite in one vectorized env step (None: all finite)."""
    if rewards is not None and _bad_array(rewards):
        env = int(np.flatnonzero(~np.isfinite(np.asarray(rewards, dtype=np.float64)))[0])
        return f"the reward of env {env} ({float(np.asarray(rewards).reshape(-1)[env])!r})"
    parts = observations.items() if isinstance(observations, dict) else [("", observations)]
    for key, part in parts:
        if part is not None and _bad_array(part):
            return f"an observation{f' ({key})' if key else ''}"
    return None


def _tensors(model: BaseAlgorithm) -> Iterable[tuple[str, torch.Tensor]]:
    """The model's parameters, its QAT observers' ranges and the variables SB3 saves beside
    them (SAC's log_ent_coef)."""
    yield from model.policy.named_parameters()
    yield from ((n, b) for n, b in model.policy.named_buffers() if b.is_floating_point())
    for name in model._get_torch_save_params()[1]:
        value = getattr(model, name.split(".")[0], None)
        if isinstance(value, torch.Tensor):
            yield name, value


def non_finite_weight(model: BaseAlgorithm) -> str | None:
    """The first weight holding NaN or inf (observer ranges: NaN only, an unobserved range
    is +-inf by design), or None."""
    for name, tensor in _tensors(model):
        bad = torch.isnan(tensor) if ".output_observer." in name or ".weight_observer." in name \
            else ~torch.isfinite(tensor)
        if bool(bad.any()):
            return f"weight {name}"
    return None


def non_finite_loss(logged: Mapping[str, float]) -> str | None:
    """The first logged loss (``train/*loss*``) that is NaN or inf, or None (``logged``: SB3's
    logger's values of this iteration)."""
    for key, value in logged.items():
        if "loss" in key and isinstance(value, (int, float, np.floating)) and not np.isfinite(value):
            return f"the loss {key} ({float(value)!r})"
    return None


def non_finite_state(model: BaseAlgorithm) -> str | None:
    """What a checkpoint of ``model`` would hold that is not finite: weights, optimizer
    state, normalization statistics (None: all finite)."""
    found = non_finite_weight(model)
    if found:
        return found
    for owner, state in model.get_parameters().items():
        if owner.endswith("optimizer"):
            for slot in state.get("state", {}).values():
                for key, value in slot.items():
                    if isinstance(value, torch.Tensor) and value.is_floating_point() \
                            and not bool(torch.isfinite(value).all()):
                        return f"{owner} state {key}"
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        for name in ("obs_rms", "ret_rms"):
            rms = getattr(vecnorm, name)
            for part in ("mean", "var", "count"):
                if _bad_array(getattr(rms, part)):
                    return f"the normalization statistic {name}.{part}"
    return None


class NonFiniteGuard(CallbackList):
    """The run's callbacks, behind a check for NaN / inf (see the module's doc): the guard
    runs first at each hook and raises :class:`NonFiniteTraining` before the others run."""

    def __init__(self, callbacks: list[BaseCallback]) -> None:
        super().__init__(callbacks)

    def _check_update(self) -> None:
        """What the last gradient update produced (losses it logged, the weights)."""
        what = non_finite_loss(self.logger.name_to_value) or non_finite_weight(self.model)
        if what:
            raise NonFiniteTraining(int(self.num_timesteps), what)

    def _on_rollout_start(self) -> None:
        self._check_update()
        super()._on_rollout_start()

    def _on_step(self) -> bool:
        what = non_finite_transition(self.locals.get("rewards"), self.locals.get("new_obs"))
        if what:
            raise NonFiniteTraining(int(self.num_timesteps), what)
        return super()._on_step()

    def _on_training_end(self) -> None:
        self._check_update()
        super()._on_training_end()


def raise_if_non_finite(model: BaseAlgorithm, exc: BaseException) -> None:
    """For an error SB3 or torch raised inside ``learn`` (PPO's next minibatch after a NaN
    update fails in its distribution's argument check): :class:`NonFiniteTraining` when the
    weights went non-finite, so the run ends in one line naming the step."""
    what = non_finite_weight(model)
    if what:
        raise NonFiniteTraining(int(model.num_timesteps), what) from exc
