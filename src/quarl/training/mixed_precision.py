"""Mixed-precision training for Stable-Baselines3 algorithms.

SB3 runs its gradient updates in ``model.train()``. :func:`enable_mixed_precision` runs
that method under ``torch.autocast`` (bf16 or fp16): matmuls and convolutions compute in
the low precision while parameters, optimizer state and the losses stay fp32 (the
master copy). The output layers (action logits, values, Q-values, actor means) stay
fp32: with 8 significant bits, bf16 log-probabilities put a bias into PPO's ratio and
values lose their resolution; PPO on CartPole no longer learns with bf16 heads
(return 9) and learns as fp32 does with fp32 heads (500). For fp16, whose range is narrow, a dynamic loss scale keeps small gradients
from flushing to zero, as ``torch.amp.GradScaler`` does:

- every ``loss.backward()`` inside ``train()`` back-propagates ``loss * scale``;
- a hook on every parameter divides its gradient by ``scale`` before it is accumulated,
  so SB3's gradient clipping and the optimizer see true gradients;
- a non-finite gradient marks the update as overflowed: the optimizers skip that step
  and the scale halves; after ``growth_interval`` clean steps it doubles.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import torch
from torch import nn

from quarl.errors import QuarlError

log = logging.getLogger(__name__)

TRAIN_PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DynamicLossScale:
    """The fp16 loss scale and its overflow bookkeeping."""

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.scale = init_scale
        self.growth_interval = growth_interval
        self.overflow = False
        self.clean_steps = 0
        self.skipped = 0

    def unscale(self, grad: torch.Tensor) -> torch.Tensor:
        grad = grad / self.scale
        if not bool(torch.isfinite(grad).all()):
            self.overflow = True
        return grad

    def finish_step(self) -> bool:
        """After one optimizer step's backward: True when the step may be applied."""
        if self.overflow:
            self.scale /= 2.0
            self.clean_steps = 0
            self.skipped += 1
            self.overflow = False
            return False
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2.0
            self.clean_steps = 0
        return True


def optimizers(model: Any) -> list[torch.optim.Optimizer]:
    """Every optimizer an SB3 algorithm steps (policy, actor, critic, entropy coefficient)."""
    found: dict[int, torch.optim.Optimizer] = {}
    for owner in (model, *model.policy.modules()):
        for value in vars(owner).values():
            if isinstance(value, torch.optim.Optimizer):
                found[id(value)] = value
    return list(found.values())


def enable_mixed_precision(model: Any, precision: str) -> DynamicLossScale | None:
    """Run ``model``'s gradient updates at ``precision`` (fp32: unchanged). Returns the
    loss scale for fp16, None otherwise."""
    if precision not in TRAIN_PRECISIONS:
        raise QuarlError(f"unknown training precision {precision!r}: allowed {', '.join(TRAIN_PRECISIONS)}")
    if precision == "fp32":
        return None
    dtype = _DTYPES[precision]
    device_type = model.device.type
    for layer in output_layers(model.policy):
        _fp32_forward(layer, device_type)
    train = model.train
    scaler = DynamicLossScale() if precision == "fp16" else None

    if scaler is None:
        @functools.wraps(train)
        def train_autocast(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                return train(*args, **kwargs)

        _install(model, train_autocast)
        return None

    for param in model.policy.parameters():
        param.register_hook(scaler.unscale)
    for opt in optimizers(model):
        _guard_step(opt, scaler)
    plain_backward = torch.Tensor.backward

    def scaled_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        plain_backward(self * scaler.scale, *args, **kwargs)

    @functools.wraps(train)
    def train_fp16(*args: Any, **kwargs: Any) -> Any:
        torch.Tensor.backward = scaled_backward  # only while SB3's update runs
        try:
            with torch.autocast(device_type, dtype=dtype):
                return train(*args, **kwargs)
        finally:
            torch.Tensor.backward = plain_backward

    _install(model, train_fp16)
    return scaler


def output_layers(policy: nn.Module) -> list[nn.Module]:
    """The layers whose outputs feed the losses: Linear layers held directly by a policy
    or actor (``action_net``, ``value_net``, ``mu``, ``log_std``) and the last Linear of the
    Q-networks (``q_net``, ``quantile_net``, ``qf0``...) and of a Sequential ``mu``."""
    found: list[nn.Module] = []
    for name, module in policy.named_modules():
        if isinstance(module, nn.Sequential) and re.search(r"(^|\.)(q_net|quantile_net|qf\d+|mu)$", name):
            linears = [m for m in module if isinstance(m, nn.Linear)]
            found += linears[-1:]
        elif isinstance(module, nn.Linear) and not re.search(r"\.\d+$", name):
            found.append(module)
    return found


def _fp32_forward(layer: nn.Module, device_type: str) -> None:
    forward = layer.forward

    @functools.wraps(forward)
    def fp32(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, enabled=False):
            return forward(x.float())

    layer.forward = fp32


def _install(model: Any, train: Any) -> None:
    """Replace ``model.train``, keeping the replacement out of ``model.save`` (SB3 saves
    the instance's attributes; a closure over the model cannot be pickled)."""
    excluded = model._excluded_save_params

    def excluded_save_params() -> list[str]:
        return [*excluded(), "train", "_excluded_save_params"]

    model.train = train
    model._excluded_save_params = excluded_save_params


def _guard_step(opt: torch.optim.Optimizer, scaler: DynamicLossScale) -> None:
    step = opt.step

    @functools.wraps(step)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if scaler.finish_step():
            return step(*args, **kwargs)
        log.debug("fp16 overflow: step skipped, loss scale now %g", scaler.scale)
        return None

    opt.step = guarded
