"""Which registered precisions an ActorQ actor can act in, and how: taken from the
precision registry (:mod:`quarl.quantization.precisions`), so a newly registered precision that
ActorQ can run shows up in ``--actor-precision`` without a second list.

An actor reloads its network at every weight version, so it acts only where that is
cheap: a float precision PyTorch casts to (:data:`~quarl.quant.primitives.FLOAT_DTYPES`:
the broadcaster sends wire-format weights), or a real integer precision whose width has
an actor kernel (the broadcaster sends a ready ONNX Runtime model, refilled per version, no
calibration to redo). The actor kernel of a width is the first registered int mode that
declares ``actor`` (:func:`quarl.quant.modes.actor_modes`): ``int8-dyn-tensor``, the
fastest at batch 1 on the ActorQ policies, and ``int4-block``, MatMulNBits with 4-bit
block-wise weights (int8 compute), its broadcast model about half the int8 one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.summary import ActorQuant

INT8_ACTOR_KEEP = frozenset({0})
"""The layer that reads the observations stays fp32, by the core's rule for MLPs
(:func:`quarl.quantization.choice.keep_options`): CartPole's angle (~0.01 rad) and angular velocity
(~1 rad/s) share one activation range per call, and with that layer in int8 the DQN actors
needed about twice the env steps to reach the target (README, ActorQ results)."""


def actor_precisions() -> tuple[str, ...]:
    """Every registered precision an actor can act in, in registration order."""
    from quarl.quant.modes import actor_modes
    from quarl.quant.primitives import FLOAT_DTYPES
    from quarl.quantization.precisions import PRECISIONS

    widths = actor_modes()
    return tuple(p.name for p in PRECISIONS.values()
                 if p.name in FLOAT_DTYPES or (p.real_int and p.bits in widths))


def onnx_mode(precision: str) -> str | None:
    """The ONNX Runtime mode an actor of ``precision`` runs (its width's kernel), or None
    for a float precision (PyTorch, wire-format weights)."""
    from quarl.quant.modes import actor_modes
    from quarl.quantization.precisions import PRECISIONS

    entry = PRECISIONS.get(precision)
    if entry is None or not entry.real_int or entry.bits is None:
        return None
    mode = actor_modes().get(entry.bits)
    return None if mode is None else mode.label


def actor_quant(config: ActorQConfig) -> ActorQuant:
    """How the actors' network was quantized (part of what a stored run is; JSON)."""
    mode = onnx_mode(config.actor_precision)
    if mode is None:
        return {"precision": config.actor_precision, "wire_bits": config.wire_bits}
    return {"precision": config.actor_precision, "mode": mode, "fp32_layers": sorted(INT8_ACTOR_KEEP)}
