"""Pure quantization maths: quantization parameters, quantize / dequantize, fake quantization.

Three uniform schemes, each per tensor, per output channel (axis 0 of a Linear or Conv
weight) or per block (``block_size`` consecutive inputs of one output unit, ONNX Runtime's
``MatMulNBits`` layout):

``quarl``
    The QuaRL paper's scheme, exactly::

        delta = (|min(W, 0)| + |max(W, 0)|) / 2**n
        z     = floor(-min(W, 0) / delta)
        W_q   = round(W / delta) * delta            # no clamp

    ``round(W / delta)`` spans ``2**n + 1`` integers at most; nothing is clamped.
``affine``
    The standard clamped asymmetric scheme (TensorFlow Lite, PyTorch): the range
    ``[min(W, 0), max(W, 0)]`` mapped onto ``0 .. 2**n - 1`` with an integer zero point.
``symmetric``
    Signed, zero point 0, ``scale = max|W| / (2**(n-1) - 1)``, clamped to
    ``[-(2**(n-1) - 1), 2**(n-1) - 1]``: what ONNX Runtime uses for int8 weights.

Everything here is a function of tensors; nothing holds state. Rounding is
round-half-to-even everywhere (``torch.round``), as in ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn

from quarl.core import validate

Scheme = Literal["quarl", "affine", "symmetric"]
Granularity = Literal["tensor", "channel", "block"]

SCHEMES: tuple[str, ...] = get_args(Scheme)
GRANULARITIES: tuple[str, ...] = get_args(Granularity)
MIN_BITS, MAX_BITS = validate.MIN_BITS, validate.MAX_BITS


@dataclass(frozen=True)
class QParams:
    """Quantization parameters of one tensor.

    ``scale`` and ``zero_point`` are scalars (per tensor) or shaped to broadcast
    against the tensor along ``axis`` (per channel). ``qmin`` / ``qmax`` bound the
    integers; ``None`` means unclamped (the paper's scheme).
    """

    scale: torch.Tensor
    zero_point: torch.Tensor
    bits: int
    scheme: str
    qmin: int | None
    qmax: int | None


def check_bits(bits: int) -> int:
    if not isinstance(bits, int) or isinstance(bits, bool) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits={bits!r} is out of range: allowed {MIN_BITS}..{MAX_BITS}")
    return bits


def resolve_granularity(granularity: str, weight_dim: int) -> str:
    """``auto`` is the paper's choice: per tensor for dense weights (2-d), per output
    channel for convolutions (4-d); ``tensor`` / ``channel`` are kept as they are."""
    if granularity != "auto":
        return granularity
    return "channel" if weight_dim > 2 else "tensor"


def _reduce_dims(x: torch.Tensor, granularity: str, axis: int) -> tuple[int, ...] | None:
    if granularity == "tensor" or x.dim() == 0:
        return None
    if granularity != "channel":
        raise ValueError(f"granularity={granularity!r} is unknown: allowed {', '.join(GRANULARITIES)}")
    axis = axis % x.dim()
    return tuple(d for d in range(x.dim()) if d != axis)


def _amin_amax(x: torch.Tensor, dims: tuple[int, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
    if dims is None:
        return x.min(), x.max()
    if not dims:  # a 1-d tensor per channel: every element is its own channel
        return x, x
    return x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)


def qparams(
    x: torch.Tensor,
    bits: int,
    scheme: str = "quarl",
    granularity: str = "tensor",
    axis: int = 0,
) -> QParams:
    """Quantization parameters for ``x`` from its own range (min / max of the data)."""
    dims = _reduce_dims(x, granularity, axis)
    lo, hi = _amin_amax(x.detach(), dims)
    return qparams_from_range(lo, hi, bits, scheme)


def qparams_from_range(lo: torch.Tensor, hi: torch.Tensor, bits: int, scheme: str = "quarl") -> QParams:
    """Quantization parameters for an observed range ``[lo, hi]`` (tensors of one shape)."""
    check_bits(bits)
    lo = torch.minimum(torch.as_tensor(lo, dtype=torch.float32), torch.zeros(()))
    hi = torch.maximum(torch.as_tensor(hi, dtype=torch.float32), torch.zeros(()))
    if scheme == "quarl":
        scale = (lo.abs() + hi.abs()) / (2**bits)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero_point = torch.floor(-lo / scale)
        return QParams(scale, zero_point, bits, scheme, None, None)
    if scheme == "affine":
        qmax = 2**bits - 1
        scale = (hi - lo) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero_point = torch.clamp(torch.round(-lo / scale), 0, qmax)
        return QParams(scale, zero_point, bits, scheme, 0, qmax)
    if scheme == "symmetric":
        qmax = 2 ** (bits - 1) - 1
        scale = torch.maximum(lo.abs(), hi.abs()) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return QParams(scale, torch.zeros_like(scale), bits, scheme, -qmax, qmax)
    raise ValueError(f"scheme={scheme!r} is unknown: allowed {', '.join(SCHEMES)}")


def quantize(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    """Integer codes of ``x`` (int32). For ``quarl`` the codes are ``round(x / delta)``,
    signed and unclamped; add ``qp.zero_point`` for the unsigned representation."""
    q = torch.round(x / qp.scale)
    if qp.scheme == "affine":
        q = q + qp.zero_point
    if qp.qmin is not None:
        q = torch.clamp(q, qp.qmin, qp.qmax)
    return q.to(torch.int32)


def dequantize(q: torch.Tensor, qp: QParams) -> torch.Tensor:
    """Real values of integer codes produced by :func:`quantize`."""
    q = q.to(torch.float32)
    if qp.scheme == "affine":
        q = q - qp.zero_point
    return q * qp.scale


class _RoundSTE(torch.autograd.Function):
    """Quantize-dequantize whose gradient passes straight through inside the range
    and is zero where the value was clamped (straight-through estimator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, qp: QParams) -> torch.Tensor:  # ctx: autograd's FunctionCtx
        out = dequantize(quantize(x, qp), qp).to(x.dtype)
        if qp.qmin is None or qp.qmax is None:
            ctx.save_for_backward(torch.ones_like(x, dtype=torch.bool))
        else:
            raw = torch.round(x / qp.scale) + (qp.zero_point if qp.scheme == "affine" else 0)
            ctx.save_for_backward((raw >= qp.qmin) & (raw <= qp.qmax))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (inside,) = ctx.saved_tensors
        return grad * inside, None


def fake_quantize(x: torch.Tensor, qp: QParams) -> torch.Tensor:
    """``dequantize(quantize(x))`` with a straight-through gradient."""
    out: torch.Tensor = _RoundSTE.apply(x, qp)
    return out


def quantize_dequantize(
    x: torch.Tensor,
    bits: int,
    scheme: str = "quarl",
    granularity: str = "tensor",
    axis: int = 0,
    block_size: int = 32,
) -> torch.Tensor:
    """Round ``x`` to ``bits`` with parameters from its own range (post-training)."""
    if granularity == "block":
        return quantize_dequantize_blocks(x, bits, scheme, block_size)
    return fake_quantize(x, qparams(x, bits, scheme, granularity, axis))


def quantize_dequantize_blocks(
    w: torch.Tensor, bits: int, scheme: str = "affine", block_size: int = 32
) -> torch.Tensor:
    """Round a weight (outputs on axis 0) with one set of parameters per block of
    ``block_size`` consecutive inputs of each output: the inputs are padded with zeros to
    a whole number of blocks, as ONNX Runtime's ``MatMulNBits`` does (zeros never widen a
    range that always includes 0)."""
    check_block_size(block_size)
    rows = w.reshape(w.shape[0], -1)
    k = rows.shape[1]
    pad = (-k) % block_size
    blocks = torch.nn.functional.pad(rows, (0, pad)).reshape(-1, block_size)
    out = fake_quantize(blocks, qparams(blocks, bits, scheme, "channel", 0))
    return out.reshape(rows.shape[0], k + pad)[:, :k].reshape(w.shape)


def check_block_size(block_size: int) -> int:
    """ONNX Runtime's block-wise kernels take power-of-two blocks from 16 to 256 (its
    MatMulNBits quantizer fails on 1024: measured)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 16 <= block_size <= 256 or \
            block_size & (block_size - 1):
        raise ValueError(f"block size {block_size!r} is not allowed: 16, 32, 64, 128 or 256")
    return block_size


def quantize_dequantize_int8_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """What ONNX Runtime's ``MatMulNBits`` at ``accuracy_level`` 4 does to its input
    activations: each row's blocks of ``block_size`` values rounded to symmetric int8 with
    scale ``max|block| / 127``."""
    rows = x.reshape(-1, x.shape[-1])
    k = rows.shape[1]
    pad = (-k) % block_size
    blocks = torch.nn.functional.pad(rows, (0, pad)).reshape(-1, block_size)
    scale = blocks.abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    out = torch.clamp(torch.round(blocks / scale), -127, 127) * scale
    return out.reshape(rows.shape[0], k + pad)[:, :k].reshape(x.shape)


FLOAT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def cast_roundtrip(x: torch.Tensor, precision: str) -> torch.Tensor:
    """``x`` rounded to a float format and back to its dtype (fp16 / bf16 storage)."""
    if precision not in FLOAT_DTYPES:
        raise ValueError(f"precision={precision!r} is not a float format: allowed {', '.join(FLOAT_DTYPES)}")
    return x.to(FLOAT_DTYPES[precision]).to(x.dtype)


def dynamic_quantize_uint8(x: torch.Tensor) -> torch.Tensor:
    """What ONNX Runtime's DynamicQuantizeLinear does to an activation tensor, as
    quantize-dequantize: uint8 with range ``[min(x, 0), max(x, 0)]`` of the whole tensor."""
    return fake_quantize(x, qparams(x, 8, "affine", "tensor"))


class ActivationFakeQuant(nn.Module):
    """Fake-quantizes a layer's output to ``bits`` within a fixed calibrated range.

    Activations always use the clamped affine scheme: values outside the monitored range
    saturate at its ends (TensorFlow's FakeQuantWithMinMaxVars), whatever scheme the
    weights use; the paper's unclamped scheme would let the grid grow past 2^n levels."""

    def __init__(self, lo: float, hi: float, bits: int) -> None:
        super().__init__()
        self.qp = qparams_from_range(torch.tensor(lo), torch.tensor(hi), bits, "affine")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # plain ops (no straight-through autograd function): inference only, and ONNX-exportable; in the
        # input's dtype (an fp16 / bf16 copy of a QAT network: the grid's float32 scale must not promote it)
        return dequantize(quantize(x, self.qp), self.qp).to(x.dtype)
