"""Mixed-precision training for Stable-Baselines3 algorithms.

SB3 runs its gradient updates in ``model.train()``. :func:`enable_mixed_precision` runs
that method under ``torch.autocast`` (bf16 or fp16): matmuls and convolutions compute in
the low precision while parameters, optimizer state and the losses stay fp32 (the
master copy). The output layers (action logits, values, Q-values, actor means) stay
fp32: with 8 significant bits, bf16 log-probabilities put a bias into PPO's ratio and
values lose their resolution; PPO on CartPole no longer learns with bf16 heads
(return 9) and learns as fp32 does with fp32 heads (500). A convolutional policy is put
in ``channels_last`` memory format (the layout cuDNN's and oneDNN's low-precision
convolution kernels run fastest in).

For fp16, whose range is narrow, a dynamic loss scale keeps small gradients from
flushing to zero, with ``torch.amp.GradScaler``'s algorithm and kernels
(:class:`LossScale`), driven where SB3's update already calls out:

- every ``loss.backward()`` inside ``train()`` back-propagates ``loss * scale`` (at every
  low precision, backward runs outside autocast, as PyTorch recommends);
- before SB3 clips the gradients (``clip_grad_norm_``) or steps an optimizer, that
  optimizer's gradients are unscaled and checked for inf / NaN in one fused kernel
  (``torch._amp_foreach_non_finite_check_and_unscale_``), without a host sync;
- the optimizer's ``step`` reads the overflow flag (one host sync per optimizer step, as
  ``GradScaler.step``), skips the step on overflow, and the scale is updated on the device
  (``torch._amp_update_scale_``): halved on overflow, doubled after ``growth_interval``
  clean steps. A fused optimizer (``torch.optim.Adam(..., fused=True)``, e.g. SB3's
  ``policy_kwargs={"optimizer_kwargs": {"fused": True}}``) skips on the device itself: no
  host sync at all.

An SB3 update with one optimizer (DQN, PPO, A2C, QR-DQN) is therefore exactly a
``GradScaler`` loop (``scale(loss).backward(); unscale_(opt); clip; step(opt); update()``);
algorithms with several optimizers (SAC, TD3, TQC) update the scale after each optimizer's
step, as ``GradScaler`` does when ``update()`` follows every ``step()``.

On CUDA, :func:`pinned_batches` makes the replay / rollout buffer hand its batches to the
GPU from pinned memory with non-blocking copies.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.buffers import BaseBuffer

log = logging.getLogger(__name__)

TRAIN_PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class LossScale:
    """A dynamic loss scale with ``torch.amp.GradScaler``'s semantics and kernels, kept on
    ``device``: :meth:`scale_loss` before backward, :meth:`unscale_` (optional: before
    clipping), :meth:`step` (skips on overflow, then updates the scale)."""

    def __init__(self, device: torch.device | str = "cpu", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.device = torch.device(device)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self._scale = torch.full((), init_scale, dtype=torch.float32, device=self.device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=self.device)
        self._found_inf: dict[int, torch.Tensor] = {}  # optimizer id -> its flag, unscaled since the last step
        self._skipped = torch.zeros((), dtype=torch.float32, device=self.device)
        self.steps = 0
        """Optimizer steps asked for."""

    @property
    def skipped(self) -> int:
        """Of :attr:`steps`, those skipped for an inf / NaN gradient (a host sync: for reports
        and tests, not the update)."""
        return int(self._skipped.item())

    @property
    def scale(self) -> float:
        """The current scale (a host sync: for reports and tests, not the update)."""
        return float(self._scale.item())

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale.to(device=loss.device, non_blocking=True)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any is
        inf / NaN (on the device: no sync). Once per optimizer between steps."""
        if id(optimizer) in self._found_inf:
            return
        found_inf = torch.zeros(1, dtype=torch.float32, device=self.device)
        inv_scale = self._scale.double().reciprocal().float()
        grads: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    grads.setdefault((param.grad.device, param.grad.dtype), []).append(param.grad)
        for (device, _), tensors in grads.items():
            flag = found_inf if device == self.device else torch.zeros(1, dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, flag, inv_scale.to(device))
            if flag is not found_inf:
                found_inf += flag.to(self.device)
        self._found_inf[id(optimizer)] = found_inf

    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``step(*args, **kwargs)`` unless ``optimizer``'s gradients overflowed, then the
        scale's update (on the device). A fused optimizer (``fused=True``: it declares
        ``_step_supports_amp_scaling``) is handed the overflow flag and skips its own update on
        the device, as ``GradScaler`` does: no host sync. Any other optimizer costs one host sync
        (reading the flag)."""
        self.unscale_(optimizer)
        found_inf = self._found_inf.pop(id(optimizer))
        self.steps += 1
        self._skipped += found_inf.squeeze()
        result = None
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # the gradients are unscaled already: only the flag, read by the fused kernel
            optimizer.found_inf = found_inf.reshape(())  # type: ignore[attr-defined]  # Adam subtracts it from its scalar step counts
            try:
                result = step(*args, **kwargs)
            finally:
                del optimizer.found_inf  # type: ignore[attr-defined]
        elif found_inf.item():
            log.debug("fp16 overflow: step skipped")
        else:
            result = step(*args, **kwargs)
        torch._amp_update_scale_(self._scale, self._growth_tracker, found_inf, self.growth_factor,
                                 self.backoff_factor, self.growth_interval)
        return result


def optimizers(model: BaseAlgorithm) -> list[torch.optim.Optimizer]:
    """Every optimizer an SB3 algorithm steps (policy, actor, critic, entropy coefficient)."""
    found: dict[int, torch.optim.Optimizer] = {}
    for owner in (model, *model.policy.modules()):
        for value in vars(owner).values():
            if isinstance(value, torch.optim.Optimizer):
                found[id(value)] = value
    return list(found.values())


def enable_mixed_precision(model: BaseAlgorithm, precision: str, channels_last: bool = True,
                           loss_scale: LossScale | None = None) -> LossScale | None:
    """Run ``model``'s gradient updates at ``precision`` (fp32: unchanged). Returns the
    loss scale for fp16 (``loss_scale``, or a new one with GradScaler's defaults), None
    otherwise. ``channels_last``: a convolutional policy in that memory format (bf16 / fp16).
    On CUDA, batches travel through pinned memory (:func:`pinned_batches`) at every precision."""
    if precision not in TRAIN_PRECISIONS:
        raise QuarlError(f"unknown training precision {precision!r}: allowed {', '.join(TRAIN_PRECISIONS)}")
    pinned_batches(model)
    if precision == "fp32":
        return None
    dtype = _DTYPES[precision]
    device_type = model.device.type
    for layer in output_layers(model.policy):
        _fp32_forward(layer, device_type)
    if channels_last and any(isinstance(m, nn.Conv2d) for m in model.policy.modules()):
        # in place: the optimizers keep their parameters (torch's stub of Module.to omits memory_format)
        model.policy.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    # declared by SB3's on- and off-policy bases, not BaseAlgorithm
    train: Callable[..., None] = getattr(model, "train")
    scaler = (loss_scale or LossScale(model.device)) if precision == "fp16" else None
    plain_backward = torch.Tensor.backward
    plain_clip = torch.nn.utils.clip_grad_norm_

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        # outside autocast: the graph keeps the forward's dtypes, and a backward run under
        # autocast would cast its products to the low precision again (more rounding, overflow)
        with torch.autocast(device_type, enabled=False):
            plain_backward(self if scaler is None else scaler.scale_loss(self), *args, **kwargs)

    clip = plain_clip
    if scaler is not None:
        opts = optimizers(model)
        owner = {id(p): opt for opt in opts for group in opt.param_groups for p in group["params"]}
        for opt in opts:
            _guard_step(opt, scaler)

        def unscaled_clip(parameters: torch.Tensor | Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            for opt in {id(owner[id(p)]): owner[id(p)] for p in params if id(p) in owner}.values():
                scaler.unscale_(opt)  # clipping sees true gradients
            return plain_clip(params, *args, **kwargs)

        clip = unscaled_clip

    @functools.wraps(train)
    def train_low(*args: Any, **kwargs: Any) -> Any:
        torch.Tensor.backward = backward  # type: ignore[method-assign]  # only while SB3's update runs
        torch.nn.utils.clip_grad_norm_ = clip
        try:
            with torch.autocast(device_type, dtype=dtype):
                return train(*args, **kwargs)
        finally:
            torch.Tensor.backward = plain_backward  # type: ignore[method-assign]
            torch.nn.utils.clip_grad_norm_ = plain_clip

    _install(model, train_low)
    return scaler


def pinned_batches(model: BaseAlgorithm) -> bool:
    """On CUDA, make ``model``'s replay / rollout buffer copy each sampled batch to the GPU
    from pinned memory without blocking (SB3 copies from pageable memory, waiting on each
    array). Returns whether it did (False on other devices). The buffer still pickles."""
    if model.device.type != "cuda":
        return False
    done = False
    for name in ("replay_buffer", "rollout_buffer"):
        buffer = getattr(model, name, None)
        if buffer is not None and hasattr(buffer, "to_torch"):
            buffer.to_torch = functools.partial(_pinned_to_torch, buffer)
            done = True
    return done


def _pinned_to_torch(buffer: BaseBuffer, array: np.ndarray[Any, Any], copy: bool = True) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if buffer.device.type != "cuda":  # a buffer loaded elsewhere
        return tensor.clone().to(buffer.device) if copy else tensor.to(buffer.device)
    # the caching host allocator keeps a pinned block until the copy from it has run
    return tensor.pin_memory().to(buffer.device, non_blocking=True)


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


def fp32_outputs(policy: nn.Module, device_type: str) -> None:
    """Run ``policy``'s :func:`output_layers` in fp32 under autocast (what
    :func:`enable_mixed_precision` does; for a copy driven by hand)."""
    for layer in output_layers(policy):
        _fp32_forward(layer, device_type)


def _fp32_forward(layer: nn.Module, device_type: str) -> None:
    forward = layer.forward

    @functools.wraps(forward)
    def fp32(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, enabled=False):
            out: torch.Tensor = forward(x.float())  # a Linear's forward (nn.Module types it as returning Any)
            return out

    layer.forward = fp32


def _install(model: BaseAlgorithm, train: Callable[..., None]) -> None:
    """Replace ``model.train``, keeping the replacement out of ``model.save`` (SB3 saves
    the instance's attributes; a closure over the model cannot be pickled)."""
    excluded = model._excluded_save_params

    def excluded_save_params() -> list[str]:
        return [*excluded(), "train", "_excluded_save_params"]

    # instance attributes shadowing SB3's methods (mypy refuses assigning to a method)
    setattr(model, "train", train)
    setattr(model, "_excluded_save_params", excluded_save_params)


def _guard_step(opt: torch.optim.Optimizer, scaler: LossScale) -> None:
    step = opt.step

    @functools.wraps(step)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        return scaler.step(opt, step, *args, **kwargs)

    opt.step = guarded  # type: ignore[method-assign]
