"""Mixed-precision training for Stable-Baselines3 algorithms.

SB3 runs its gradient updates in ``model.train()``. :func:`enable_mixed_precision` runs
that method under ``torch.autocast`` (bf16 or fp16): matmuls and convolutions compute in
the low precision while parameters, optimizer state and the losses stay fp32 (the
master copy). For fp16, whose range is narrow, a dynamic loss scale keeps small gradients
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
from typing import Any

import torch

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
    train = model.train
    scaler = DynamicLossScale() if precision == "fp16" else None

    if scaler is None:
        @functools.wraps(train)
        def train_autocast(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                return train(*args, **kwargs)

        model.train = train_autocast
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

    model.train = train_fp16
    return scaler


def _guard_step(opt: torch.optim.Optimizer, scaler: DynamicLossScale) -> None:
    step = opt.step

    @functools.wraps(step)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if scaler.finish_step():
            return step(*args, **kwargs)
        log.debug("fp16 overflow: step skipped, loss scale now %g", scaler.scale)
        return None

    opt.step = guarded
