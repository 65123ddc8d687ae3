"""A trainable copy of a network whose forward computes what one real integer kernel
computes, and the real ONNX Runtime model built from its own integers.

Quantization-aware distillation (:mod:`quarl.recovery`) trains this *student*: every
quantized Linear layer rounds its weights on the kernel's grid (per block of
``block_size`` inputs for MatMulNBits, per tensor or per output channel for MatMulInteger)
and its input activations as the kernel rounds them (int8 per row and block at
``accuracy_level`` 4, uint8 per row for the dynamic modes, not at all for weight-only),
with a straight-through gradient. Layers in ``keep`` (and a CNN's convolutions, which the
MatMul modes run in fp32) stay fp32 and train too.

After training, :func:`real_model` builds the mode's ONNX graph and writes the student's
integer codes, scales and zero points into it (not a fresh quantization of its weights),
so the deployed model computes what the student computed; ``tests/test_recovery.py``
holds the two equal per mode on random and on real states.

==================  ==========================================  ===========================
mode                weights (codes, grid)                       activations
==================  ==========================================  ===========================
int8/int4-block     affine per block, ``MatMulNBits`` layout     int8 per row and block
int8/int4-weight-   affine per block, ``MatMulNBits`` layout     fp32
only
int8-dyn-tensor     uint8 affine (or int8 symmetric) per tensor  uint8 per row (its range)
int8-dyn-channel    ... per output channel                       uint8 per row
int4-block-head8    as int4-block, the last layer's blocks 8-bit int8 per row and block
==================  ==========================================  ===========================

Each mode declares its grid (:class:`quarl.quant.modes.StudentGrid`, the ``student`` of its
registration); this module reads the grid and names no mode. ``int8-static`` and
``int4-mixed`` (calibrated activation grids, quantized convolutions) declare none:
:func:`student_mode` names the mode used instead.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
import torch
from pydantic import StringConstraints
from torch import nn
from typing_extensions import TypedDict  # pydantic validates only typing_extensions' TypedDict on Python 3.11

from quarl.core.errors import QuarlError
from quarl.quant.primitives import QParams, dequantize, qparams, quantize

if TYPE_CHECKING:  # imported where used: quarl.quant.modes loads ONNX Runtime
    from quarl.quant.modes import IntMode, StudentGrid


class KernelSpecJson(TypedDict):
    """:class:`KernelSpec` as JSON (:meth:`KernelSpec.to_dict`): recover's ``state.pt``
    (``spec``) and ``recovery.json`` (``kernel``) hold it, checked where they are read
    (:mod:`quarl.recovery.report`)."""

    mode: Annotated[str, StringConstraints(max_length=2000)]
    keep: list[int]
    """Sorted."""
    block_size: int
    int8_weights: str
    compute_int8: bool


@dataclass(frozen=True)
class KernelSpec:
    """Which real kernel a student reproduces."""

    mode: str
    """A label of :data:`quarl.quant.modes.MODES` whose mode declares a student grid."""
    keep: frozenset[int]
    """Weight layers (Linear / Conv2d in module order) left in fp32 (a CNN's convolutions included)."""
    block_size: int = 32
    int8_weights: str = "asymmetric"
    """8-bit weights of the dynamic modes: ``asymmetric`` (uint8, zero point) or ``symmetric`` (int8)."""
    compute_int8: bool = True
    """``block``: whether this CPU's MatMulNBits rounds activations to int8 per block
    (:func:`quarl.quant.modes.int8_compute`); fp32 arithmetic where it does not."""

    @property
    def kernel(self) -> IntMode:
        """The registered mode of :attr:`mode`."""
        from quarl.quant.modes import get_mode

        return get_mode(self.mode)

    @property
    def bits(self) -> int:
        return self.kernel.bits

    @property
    def grid(self) -> StudentGrid:
        """The grid the student simulates (the mode's own)."""
        grid = self.kernel.student
        if grid is None:
            raise _no_student(self.mode)
        return grid

    @property
    def blocks(self) -> int:
        """Inputs per block of the grid (the mode's own, else :attr:`block_size`)."""
        return self.grid.blocks(self.block_size)

    def to_dict(self) -> KernelSpecJson:  # JSON: recover's state and folder
        return {"mode": self.mode, "keep": sorted(self.keep), "block_size": self.block_size,
                "int8_weights": self.int8_weights, "compute_int8": self.compute_int8}

    @classmethod
    def from_dict(cls, d: KernelSpecJson) -> KernelSpec:
        return cls(str(d["mode"]), frozenset(int(i) for i in d["keep"]), int(d["block_size"]), str(d["int8_weights"]),
                   bool(d["compute_int8"]))


def _no_student(label: str) -> QuarlError:
    from quarl.quant.modes import student_modes

    return QuarlError(f"{label} has no student: allowed modes {', '.join(m.label for m in student_modes())}")


def student_mode(label: str) -> str:
    """``label`` where a student reproduces it, else the mode of its bits whose student is
    used instead (:func:`quarl.quant.modes.student_mode_for`)."""
    from quarl.quant.modes import get_mode, student_mode_for

    return student_mode_for(get_mode(label)).label


def _ste(x: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """``rounded`` forward, the identity's gradient backward (straight-through)."""
    return x + (rounded - x).detach()


# ------------------------------------------------------------------ the kernels' grids


def _blocks(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """(N, K) -> (N * k_blocks, block_size), the inputs padded with zeros as MatMulNBits pads."""
    n, k = w.shape
    return nn.functional.pad(w, (0, (-k) % block_size)).reshape(-1, block_size)


def block_qparams(w: torch.Tensor, bits: int, block_size: int) -> QParams:
    """Affine parameters of each block of ``block_size`` inputs of each output row."""
    return qparams(_blocks(w.detach(), block_size), bits, "affine", "channel", 0)


def weight_qparams(w: torch.Tensor, spec: KernelSpec, bits: int | None = None) -> QParams:
    """The grid the kernel puts a Linear weight (N, K) on (``bits``: this layer's block
    width where it is not the mode's, a mixed mode's head)."""
    weights = spec.grid.weights
    if weights == "block":
        return block_qparams(w, bits or spec.bits, spec.blocks)
    scheme = "affine" if spec.int8_weights == "asymmetric" else "symmetric"
    return qparams(w.detach(), 8, scheme, weights, 0)


def weight_on_grid(w: torch.Tensor, spec: KernelSpec, bits: int | None = None) -> torch.Tensor:
    """``w`` rounded onto its kernel grid (``bits``: as :func:`weight_qparams`), the
    gradient passed straight through."""
    qp = weight_qparams(w, spec, bits)
    if spec.grid.weights == "block":
        n, k = w.shape
        rounded = dequantize(quantize(_blocks(w, spec.blocks), qp), qp)
        rounded = rounded.reshape(n, -1)[:, :k]
    else:
        rounded = dequantize(quantize(w, qp), qp)
    return _ste(w, rounded)


def int8_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """MatMulNBits' int8 activations at ``accuracy_level`` 4: each row's blocks symmetric
    int8 with scale ``max|block| / 127`` (as :func:`quarl.quant.primitives.quantize_dequantize_int8_blocks`)."""
    n, k = x.shape
    blocks = nn.functional.pad(x, (0, (-k) % block_size)).reshape(n, -1, block_size)
    scale = blocks.abs().amax(dim=2, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    out = torch.clamp(torch.round(blocks / scale), -127, 127) * scale
    return out.reshape(n, -1)[:, :k]


def uint8_rows(x: torch.Tensor) -> torch.Tensor:
    """DynamicQuantizeLinear of each row alone (a deployed policy acts at batch 1): uint8
    over ``[min(row, 0), max(row, 0)]``, vectorized over the rows."""
    lo = torch.clamp(x.amin(dim=1, keepdim=True), max=0.0)
    hi = torch.clamp(x.amax(dim=1, keepdim=True), min=0.0)
    scale = (hi - lo) / 255.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.clamp(torch.round(-lo / scale), 0, 255)
    return (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale


def activation_rounding(spec: KernelSpec) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How the kernel rounds a layer's inputs (None: fp32)."""
    activations = spec.grid.activations
    if activations == "int8-block" and spec.compute_int8:
        blocks = spec.blocks
        return lambda x: int8_blocks(x, blocks)
    if activations == "uint8-row":
        return uint8_rows
    return None


class StudentLinear(nn.Module):
    """A Linear layer as the kernel computes it, trainable: ``linear(round_act(x), on_grid(W), b)``."""

    def __init__(self, layer: nn.Linear, spec: KernelSpec, bits: int | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.spec = spec
        self.bits = bits or spec.bits
        """This layer's weight width (a mixed mode's head: its ``head_bits``)."""
        self.round_act = activation_rounding(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.round_act is not None:
            flat = x.reshape(-1, x.shape[-1])
            x = _ste(flat, self.round_act(flat)).reshape(x.shape)
        return nn.functional.linear(x, weight_on_grid(self.layer.weight, self.spec, self.bits), self.layer.bias)


def layer_bits(spec: KernelSpec, index: int, count: int) -> int | None:
    """The weight width of weight layer ``index`` of ``count`` where it is not the mode's
    (a mixed mode's head: its grid's ``head_bits``), else None."""
    return spec.grid.head_bits if index == count - 1 else None


def _weight_layers(network: nn.Module) -> list[tuple[str, nn.Linear | nn.Conv2d]]:
    from quarl.quant.layers import linear_layers

    return linear_layers(network)


def make_student(network: nn.Module, spec: KernelSpec) -> nn.Module:
    """A trainable copy of ``network`` with each Linear layer not in ``spec.keep`` a
    :class:`StudentLinear` (the copy's parameters require grad; ``network`` is untouched)."""
    if spec.kernel.student is None:
        raise _no_student(spec.mode)
    net = copy.deepcopy(network)
    if isinstance(net, nn.Linear):
        net = nn.Sequential(net)
    layers = _weight_layers(net)
    for i, (name, layer) in enumerate(layers):
        if isinstance(layer, nn.Linear) and i not in spec.keep:
            parent, _, attr = name.rpartition(".")
            setattr(net.get_submodule(parent) if parent else net, attr,
                    StudentLinear(layer, spec, layer_bits(spec, i, len(layers))))
    net.requires_grad_(True)
    return net.train()


def quantized_layers(student: nn.Module) -> list[StudentLinear]:
    return [m for m in student.modules() if isinstance(m, StudentLinear)]


def plain_network(student: nn.Module, on_grid: bool) -> nn.Module:
    """The student as plain layers (eval, no grad): each quantized layer's weights as
    trained (``on_grid=False``) or rounded onto the kernel's grid (``on_grid=True``: what
    the deployed model multiplies by; what an SB3 checkpoint of the student holds)."""
    net = copy.deepcopy(student)
    for name, module in list(net.named_modules()):
        if isinstance(module, StudentLinear):
            layer = module.layer
            if on_grid:
                with torch.no_grad():
                    layer.weight.copy_(weight_on_grid(layer.weight, module.spec, module.bits))
            parent, _, attr = name.rpartition(".")
            setattr(net.get_submodule(parent) if parent else net, attr, layer)
    net.requires_grad_(False)
    return net.eval()


def sb3_tensors(network: nn.Module, student: nn.Module, on_grid: bool = True) -> dict[str, torch.Tensor]:
    """The student's weights (on the grid, or as trained) by the Stable-Baselines3
    state-dict names that ``network`` (the teacher, as the SB3 loader built it) carries."""
    plain = plain_network(student, on_grid=on_grid)
    named: dict[str, torch.Tensor] = {}
    for (_, original), (_, layer) in zip(_weight_layers(network), _weight_layers(plain), strict=True):
        name = getattr(original, "sb3_name", None)
        if name is None:
            raise QuarlError("this policy's layers carry no SB3 names: it cannot be written back into its zip")
        named[f"{name}.weight"] = layer.weight.detach().clone()
        if layer.bias is not None:
            named[f"{name}.bias"] = layer.bias.detach().clone()
    return named


# ------------------------------------------------------------------ the real model


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 codes 0..15 along the last axis, two per byte (the first in the low nibble),
    as MatMulNBits stores 4-bit weights and zero points (an odd count padded with 0)."""
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), codes.dtype)], axis=-1)
    packed: np.ndarray = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed


def nbits_initializers(w: torch.Tensor, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Linear weight (N, K) as MatMulNBits holds it: ``(B, scales, zero_points)`` with B
    (N, k_blocks, block_size * bits / 8), scales (N, k_blocks), zero points (N, k_blocks) at
    8 bits or packed (N, ceil(k_blocks / 2)) at 4; the codes are the student's own."""
    qp = block_qparams(w, bits, block_size)
    n = w.shape[0]
    codes = quantize(_blocks(w.detach(), block_size), qp).numpy().astype(np.uint8).reshape(n, -1, block_size)
    scales = qp.scale.numpy().astype(np.float32).reshape(n, -1)
    zeros = qp.zero_point.numpy().astype(np.uint8).reshape(n, -1)
    if bits == 4:
        return _pack_nibbles(codes), scales, _pack_nibbles(zeros)
    return codes, scales, zeros


def matmul_integer_initializers(w: torch.Tensor, spec: KernelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Linear weight (N, K) as MatMulInteger holds it: codes (K, N), scale and zero point
    (scalars per tensor, (N,) per channel); uint8 asymmetric or int8 symmetric."""
    qp = weight_qparams(w, spec)
    codes = quantize(w.detach(), qp).numpy()
    per_channel = spec.grid.weights == "channel"
    dtype = np.uint8 if spec.int8_weights == "asymmetric" else np.int8
    scale = qp.scale.numpy().astype(np.float32).reshape(-1 if per_channel else ())
    zero = qp.zero_point.numpy().reshape(-1 if per_channel else ()).astype(dtype)
    return np.ascontiguousarray(codes.T.astype(dtype)), scale, zero


def real_model(student: nn.Module, spec: KernelSpec, input_shape: tuple[int, ...]) -> bytes:
    """The ONNX Runtime model of ``spec.mode`` computing what ``student`` computes: the
    mode's graph (built by its builder from the student's fp32 layers and biases), then
    each quantized layer's weight initializers replaced by the student's own codes,
    scales and zero points."""
    import onnx
    from onnx import numpy_helper

    from quarl.quant.backends import onnxruntime as ortb
    from quarl.quant.modes import BuildRequest, get_mode

    plain = plain_network(student, on_grid=True)
    mode = get_mode(spec.mode)
    request = BuildRequest(plain, ortb.export_onnx(plain, input_shape), None, spec.int8_weights, spec.block_size,
                           spec.keep)
    proto = onnx.load_from_string(mode.build(request))
    inits = {t.name: t for t in proto.graph.initializer}
    nodes = [n for n in proto.graph.node if n.op_type in ("MatMulNBits", "MatMulInteger", "MatMul", "Gemm", "Conv")]
    layers = _weight_layers(plain)
    if len(nodes) != len(layers):
        raise QuarlError(f"the {spec.mode} model has {len(nodes)} weight nodes for {len(layers)} layers")
    students = {id(m.layer): m for m in quantized_layers(student)}

    def put(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(np.require(value, requirements="C"), name))

    trained = [m for m in student.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for node, (_, layer), original in zip(nodes, layers, trained, strict=True):
        weight = original.weight.detach().float()
        if id(original) not in students:
            continue  # fp32: the builder copied the student's values
        if node.op_type == "MatMulNBits":
            b, scales, zeros = nbits_initializers(weight, students[id(original)].bits, spec.blocks)
            put(node.input[1], b)
            put(node.input[2], scales)
            put(node.input[3], zeros)
        elif node.op_type == "MatMulInteger":
            codes, scale, zero = matmul_integer_initializers(weight, spec)
            base = node.input[1].removesuffix("_quantized")
            put(node.input[1], codes)
            put(f"{base}_scale", scale)
            put(node.input[3], zero)
        else:
            raise QuarlError(f"layer {getattr(layer, 'sb3_name', '?')} is quantized in the student but {node.op_type} "
                             f"(fp32) in the {spec.mode} model")
    serialized: bytes = proto.SerializeToString()
    return serialized
