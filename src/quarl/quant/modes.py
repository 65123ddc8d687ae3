"""Real integer execution modes and their registry (the automatic choice among them is
:mod:`quarl.quantization.choice`).

Each :class:`IntMode` is something ONNX Runtime really executes on this CPU, with a
PyTorch reference (:mod:`quarl.quant.backends.reference`) it is tested against:

================  ====  =====================================================================
mode              bits  what runs
================  ====  =====================================================================
dyn-tensor         8    MatMulInteger, weights per tensor, activations uint8 per call (range
                        of the whole row)
dyn-channel        8    as dyn-tensor with weights per output channel
block              8/4  MatMulNBits, weights per block of ``block_size`` inputs, activations
                        int8 per row and block (``accuracy_level`` 4)
weight-only        8/4  MatMulNBits with fp32 activations: only the weights are rounded (the
                        paper's PTQ); 8-bit has no fast kernel on CPU, 4-bit beats fp32 on
                        large layers
static             8    QDQ, weights per channel, activation ranges calibrated (CNNs)
mixed              4    per layer: convolutions as ``static`` (int8), Linear layers as
                        ``block`` (4-bit MatMulNBits); CNNs only
block-head8        4    mixed int4/int8: ``block`` with 4-bit weights but the last layer (the
                        Q-value or logits head) in 8-bit blocks; recover's repair where one
                        4-bit rounding of the head flips near-tied actions, never chosen by
                        the automatic choice (its size is not int4's)
weight-only-head8  4    the same with fp32 activations (its fallback)
================  ====  =====================================================================

On a CNN the MatMul modes (dyn-*, block, weight-only) quantize its Linear layers only and
keep the convolutions in fp32 (ONNX Runtime's ConvInteger is slower than fp32): a
NatureCNN's one Linear layer holds 95 % of its weights, so int4 block on it cuts the model
4x while ``mixed`` also runs the convolutions, most of the work, in int8. On a CNN the
modes that quantize convolutions are tried first, with each choice of fp32 layers, before
the MatMul modes.

``static`` fixes activation ranges from observations, so states beyond them saturate: the
automatic choice uses it for CNNs only (where it is the one fast mode), and checks it on
calibration states it was not fit to. Measured: an A2C CartPole MLP whose static int8
agreed with fp32 on the very states its ranges came from scored 144 instead of 500.

``int8`` / ``int4`` without a mode is *automatic*: :mod:`quarl.quantization.choice` builds every
registered mode the policy supports, checks it against fp32 on calibration states (and
episodes) and picks the fastest that agrees; the choice is stored
(:mod:`quarl.quantization.choice_cache`, keyed by the set of registered modes too, so a new mode is
tried on a machine with a warm cache). ``choose``, ``keep_options`` and ``Returns`` are
still importable from here.

Adding a mode is one :func:`register_mode` call: a builder from the fp32 ONNX model, a
reference, what it supports, and what the rest of quarl reads from the entry alone (no mode
name is compared outside this module): the grid recover's student simulates
(:class:`StudentGrid`), the mode run instead where this CPU cannot run it (``fallback``)
and whether ActorQ's actors can run it (``actor``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.backends.reference import simulate_dynamic_int8, simulate_nbits, simulate_qdq
from quarl.quant.cpu_probes import int8_compute, probe_int8_compute, runtime_key  # noqa: F401  (importable from here)

if TYPE_CHECKING:  # policies builds on quant: only annotations name a Policy here
    pass


@dataclass(frozen=True)
class BuildRequest:
    """What a mode needs to build its model."""

    network: nn.Module
    model: bytes
    """The fp32 ONNX export of ``network``."""
    calibration: np.ndarray | None
    """Preprocessed observations (network inputs) for static activation ranges."""
    weights: str = "asymmetric"
    """8-bit weight format of the MatMulInteger / QDQ modes: asymmetric (uint8) or symmetric (int8)."""
    block_size: int = 32
    keep: frozenset[int] = frozenset()
    """Indices of the weight layers (Linear / Conv2d, in order) left in fp32."""

    def excluded_nodes(self) -> list[str]:
        names = ortb.weight_node_names(self.model)
        return [names[i] for i in sorted(self.keep)]


@dataclass(frozen=True)
class StudentGrid:
    """What recover's student (:mod:`quarl.quant.student`) simulates of a mode's kernel: the
    fake-quant grid it distills into, at the mode's bits. Like torchao's QAT configs, derived
    from the kernel itself: a mode that declares one is recovered into its own grid."""

    weights: Literal["block", "tensor", "channel"]
    """A Linear weight's grid: ``block``, affine per block of inputs at the mode's bits
    (MatMulNBits' layout); ``tensor`` / ``channel``, 8-bit per tensor / per output channel in
    the request's int8 format, asymmetric uint8 or symmetric int8 (MatMulInteger's)."""
    activations: Literal["fp32", "int8-block", "uint8-row"]
    """How the kernel rounds a Linear layer's inputs: not at all; symmetric int8 per row and
    block where this CPU computes in int8 (:func:`int8_compute`, MatMulNBits at
    ``accuracy_level`` 4); uint8 over each row's range (DynamicQuantizeLinear at batch 1)."""
    block_size: int | None = None
    """Inputs per weight (and activation) block whatever the request asks; None: the
    request's ``block_size``."""
    head_bits: int | None = None
    """``block`` weights of the last weight layer (the action head) at these bits instead of
    the mode's (a mixed int4/int8 mode); None: every layer at the mode's bits."""

    def blocks(self, requested: int) -> int:
        """Inputs per block this grid uses when ``requested`` is asked for."""
        return self.block_size if self.block_size is not None else requested


@dataclass(frozen=True)
class IntMode:
    name: str
    bits: int
    summary: str
    build: Callable[[BuildRequest], bytes]
    reference: Callable[[BuildRequest, bytes], nn.Module] | None
    """``(request, built model) -> a PyTorch module computing the same in float`` (static
    modes read their calibrated grids back from the model)."""
    per_row: bool = False
    """The engine must run rows one by one (activation ranges per call would mix rows)."""
    convolutions: bool = False
    """Whether it quantizes convolutions (True) or leaves a CNN's convolutions in fp32."""
    needs_conv: bool = False
    """Meaningful only for networks with convolutions (a per-layer mix)."""
    needs_calibration: bool = False
    cpu_unsupported: Callable[[], str | None] = lambda: None
    """Why this CPU cannot run the mode exactly (probed at run time), or None."""
    fallback: str | None = None
    """The label of the mode run instead where ``cpu_unsupported`` says this CPU cannot run
    this one (ActorQ's actors, recover's student); None: none, this mode is run as it is."""
    student: StudentGrid | None = None
    """The grid recover's student simulates; None: no student of its own (calibrated
    activation ranges, quantized convolutions), recover trains the student of the first
    registered mode of its bits that has one (:func:`student_mode_for`)."""
    actor: bool = False
    """ActorQ's actors can run it: its model is refilled per weight version without rebuilding
    (:class:`quarl.actorq.acting.ActorModelTemplate` refills MatMulInteger per-tensor uint8
    and 4-bit MatMulNBits weights; no calibration to redo). The first registered such mode
    of a width is the actor kernel of the real int precisions of that width."""
    automatic: bool = True
    """Whether the automatic choice of ``intN`` tries it (:func:`modes_for`); False for a mode
    that is not plainly its width (a mixed int4/int8 mode: ``int4`` must not come back as a
    model with 8-bit layers), run only where named."""

    @property
    def label(self) -> str:
        return f"int{self.bits}-{self.name}"

    def unsupported(self, network: nn.Module) -> str | None:
        """Why this mode cannot run ``network`` (None when it can)."""
        if self.needs_conv and not ortb.has_conv(network):
            return f"{self.label} mixes convolution and Linear kernels: this network has no convolutions"
        return self.cpu_unsupported()

    def runnable(self, network: nn.Module) -> IntMode:
        """This mode, or its :attr:`fallback` where it cannot run ``network`` on this CPU."""
        if self.fallback is None or self.unsupported(network) is None:
            return self
        return get_mode(self.fallback)

    def request_for(self, request: BuildRequest) -> BuildRequest:
        """``request`` with a CNN's convolutions kept in fp32 when this mode does not quantize them."""
        if self.convolutions:
            return request
        return replace(request, keep=request.keep | ortb.conv_layers(request.network))


def _dynamic(per_channel: bool) -> Callable[[BuildRequest], bytes]:
    return lambda r: ortb.quantize_dynamic_int8(r.model, r.weights, per_channel, r.excluded_nodes())


def _nbits(bits: int, compute_int8: bool) -> Callable[[BuildRequest], bytes]:
    return lambda r: ortb.quantize_nbits(r.model, bits, r.block_size, compute_int8, r.excluded_nodes())


def _block_cpu(bits: int) -> Callable[[], str | None]:
    def check() -> str | None:
        if int8_compute(bits) == "inexact":
            return (f"int{bits}-block: this CPU's MatMulNBits int8 kernels are not exact (they match neither int8 nor "
                    "fp32 arithmetic); use weight-only")
        return None

    return check


def _block_reference(bits: int) -> Callable[[BuildRequest, bytes], nn.Module]:
    """What block computes here: int8 activations per block where the CPU has the kernels."""
    return lambda r, model: simulate_nbits(r.network, bits, r.block_size, int8_compute(bits) == "int8", r.keep)


def _mixed_reference(bits: int) -> Callable[[BuildRequest, bytes], nn.Module]:
    def reference(r: BuildRequest, model: bytes) -> nn.Module:
        compute = int8_compute(bits) == "int8"
        return simulate_qdq(r.network, model, lambda layer: simulate_nbits(layer, bits, r.block_size, compute))

    return reference


def head_index(network: nn.Module) -> int:
    """The index of ``network``'s last weight layer (Linear / Conv2d in module order): its
    action head (Q-values, logits, means)."""
    from quarl.quant.layers import linear_layers

    return len(linear_layers(network)) - 1


def _head8(compute_int8: bool) -> Callable[[BuildRequest], bytes]:
    """4-bit MatMulNBits on every quantized layer but the head, then 8-bit MatMulNBits on the
    head (two passes: the quantizer rounds every MatMul it is given at one width)."""

    def build(r: BuildRequest) -> bytes:
        head = ortb.weight_node_names(r.model)[head_index(r.network)]
        excluded = r.excluded_nodes()
        body = ortb.quantize_nbits(r.model, 4, r.block_size, compute_int8, [*excluded, head])
        if head in excluded:
            return body
        return ortb.quantize_nbits(body, 8, r.block_size, compute_int8, excluded)

    return build


def _head8_reference(compute_int8: Callable[[], bool]) -> Callable[[BuildRequest, bytes], nn.Module]:
    """What ``block-head8`` computes: ``block``'s 4-bit reference with the head replaced by
    the 8-bit one."""
    from quarl.quant.layers import linear_layers

    def reference(r: BuildRequest, model: bytes) -> nn.Module:
        head = head_index(r.network)
        compute = compute_int8()
        body = simulate_nbits(r.network, 4, r.block_size, compute, r.keep | {head})
        if head in r.keep:
            return body
        name, layer = linear_layers(r.network)[head]
        if not name:  # the network is its head alone
            return simulate_nbits(layer, 8, r.block_size, compute)
        parent, _, attr = name.rpartition(".")
        setattr(body.get_submodule(parent) if parent else body, attr, simulate_nbits(layer, 8, r.block_size, compute))
        return body.eval()

    return reference


def _head8_cpu() -> str | None:
    return _block_cpu(4)() or _block_cpu(8)()


def _static(r: BuildRequest) -> bytes:
    if r.calibration is None:
        raise QuarlError("int8-static needs calibration observations (static activation ranges)")
    return ortb.quantize_static_int8(r.model, r.calibration, r.weights, r.excluded_nodes())


def _mixed(bits: int) -> Callable[[BuildRequest], bytes]:
    """Convolutions static int8 (QDQ), then the Linear layers block-wise ``bits`` (MatMulNBits)."""

    def build(r: BuildRequest) -> bytes:
        if r.calibration is None:
            raise QuarlError(f"int{bits}-mixed needs calibration observations (its convolutions' activation ranges)")
        names = ortb.weight_node_names(r.model)
        linear = [n for i, n in enumerate(names) if i not in ortb.conv_layers(r.network)]
        convs_int8 = ortb.quantize_static_int8(r.model, r.calibration, r.weights, [*r.excluded_nodes(), *linear])
        return ortb.quantize_nbits(convs_int8, bits, r.block_size, int8_compute(bits) == "int8", r.excluded_nodes())

    return build


MODES: Registry[IntMode] = Registry("int mode")
"""Every real integer mode by label (``int8-dyn-channel``...), in order of preference:
expected speed, measured on this project's machines (block-wise int8 compute is the
fastest on large layers and as fast as any on small ones; 8-bit weight-only has no fast
CPU kernel). Filled by :func:`register_mode`."""

MODE_BITS = (8, 4)
"""The widths a real int mode can run at (the ``int8`` and ``int4`` precisions)."""


def register_mode(mode: IntMode) -> IntMode:
    """Add a real int mode (``intN-NAME``) after those registered before it (registry order is
    the automatic choice's order of preference among near ties); returns it. The automatic
    choice tries it from then on, and a stored choice made without it is not reused
    (:mod:`quarl.quantization.choice_cache` keys on the set of modes)."""
    if mode.bits not in MODE_BITS:
        raise QuarlError(f"int mode {mode.name!r}: bits={mode.bits}, allowed {', '.join(map(str, MODE_BITS))}")
    if not mode.name or not all(ch in "abcdefghijklmnopqrstuvwxyz0123456789-" for ch in mode.name):
        # labels are parsed lower-cased (QuantConfig.parse): an upper-case name could never be asked for
        raise QuarlError(f"int mode name {mode.name!r}: allowed lower-case letters, digits and '-'")
    if mode.fallback is not None and (mode.fallback == mode.label or not mode.fallback.startswith(f"int{mode.bits}-")):
        # it may be registered after this mode (registry order is preference): checked where it is run
        raise QuarlError(f"int mode {mode.label!r}: fallback {mode.fallback!r} must be another int{mode.bits} mode")
    if mode.student is not None and mode.student.block_size is not None and mode.student.block_size <= 0:
        raise QuarlError(f"int mode {mode.label!r}: student block size {mode.student.block_size} must be positive")
    return MODES.register(mode.label, mode)  # a label taken twice: one line, from the registry


_BLOCK = StudentGrid("block", "int8-block")
_WEIGHT_ONLY = StudentGrid("block", "fp32")

register_mode(IntMode("block", 8, "MatMulNBits, weights and activations int8 per block", _nbits(8, True),
                      _block_reference(8), cpu_unsupported=_block_cpu(8), fallback="int8-weight-only",
                      student=_BLOCK))
register_mode(IntMode("dyn-channel", 8, "MatMulInteger, weights per output channel, activations uint8 per call",
                      _dynamic(True), lambda r, _: simulate_dynamic_int8(r.network, r.weights, True, r.keep),
                      per_row=True, student=StudentGrid("channel", "uint8-row")))
register_mode(IntMode("dyn-tensor", 8, "MatMulInteger, weights per tensor, activations uint8 per call",
                      _dynamic(False), lambda r, _: simulate_dynamic_int8(r.network, r.weights, False, r.keep),
                      per_row=True, student=StudentGrid("tensor", "uint8-row"), actor=True))
register_mode(IntMode("weight-only", 8, "MatMulNBits, 8-bit block weights, fp32 activations", _nbits(8, False),
                      lambda r, _: simulate_nbits(r.network, 8, r.block_size, False, r.keep), student=_WEIGHT_ONLY))
register_mode(IntMode("static", 8, "QDQ, weights per channel, calibrated activation ranges", _static,
                      lambda r, model: simulate_qdq(r.network, model), convolutions=True, needs_calibration=True))
register_mode(IntMode("mixed", 4, "convolutions QDQ int8, Linear layers MatMulNBits 4-bit block", _mixed(4),
                      _mixed_reference(4), convolutions=True, needs_calibration=True, needs_conv=True,
                      cpu_unsupported=_block_cpu(4)))
register_mode(IntMode("block", 4, "MatMulNBits, 4-bit block weights, activations int8 per block", _nbits(4, True),
                      _block_reference(4), cpu_unsupported=_block_cpu(4), fallback="int4-weight-only",
                      student=_BLOCK, actor=True))
register_mode(IntMode("weight-only", 4, "MatMulNBits, 4-bit block weights, fp32 activations", _nbits(4, False),
                      lambda r, _: simulate_nbits(r.network, 4, r.block_size, False, r.keep), student=_WEIGHT_ONLY,
                      actor=True))
# mixed int4/int8 (recover's repair of Q-value heads, issue 50): named only, never the automatic choice's
register_mode(IntMode("block-head8", 4, "mixed int4/int8: MatMulNBits 4-bit blocks, the head 8-bit blocks, "
                      "activations int8 per block", _head8(True), _head8_reference(lambda: int8_compute(4) == "int8"),
                      cpu_unsupported=_head8_cpu, fallback="int4-weight-only-head8",
                      student=StudentGrid("block", "int8-block", head_bits=8), automatic=False))
register_mode(IntMode("weight-only-head8", 4, "mixed int4/int8: MatMulNBits 4-bit blocks, the head 8-bit blocks, "
                      "fp32 activations", _head8(False), _head8_reference(lambda: False),
                      student=StudentGrid("block", "fp32", head_bits=8), automatic=False))


def modes_for(bits: int) -> list[IntMode]:
    """The modes of ``bits`` the automatic choice tries (those registered ``automatic``)."""
    return [m for m in MODES.values() if m.bits == bits and m.automatic]


def get_mode(label: str) -> IntMode:
    return MODES.lookup(label)


def student_modes() -> list[IntMode]:
    """The modes recover's student reproduces (those that declare a :class:`StudentGrid`)."""
    return [m for m in MODES.values() if m.student is not None]


def student_mode_for(mode: IntMode) -> IntMode:
    """``mode`` where it has a student, else the first registered mode of its bits that has
    one (the most preferred: ``int8-static`` -> ``int8-block``, ``int4-mixed`` -> ``int4-block``)."""
    if mode.student is not None:
        return mode
    stand_in = next((m for m in student_modes() if m.bits == mode.bits), None)
    if stand_in is None:
        raise QuarlError(f"{mode.label} has no student and no int{mode.bits} mode has one: allowed "
                         f"{', '.join(m.label for m in student_modes())}")
    return stand_in


def wider_head_mode(mode: IntMode) -> IntMode | None:
    """The registered mixed mode that is ``mode`` with its head in wider blocks (its student
    grid the same but for ``head_bits``: ``int4-block`` -> ``int4-block-head8``), or None."""
    grid = mode.student
    if grid is None or grid.head_bits is not None:
        return None
    return next((m for m in student_modes() if m.bits == mode.bits and m.student is not None
                 and m.student.head_bits is not None and replace(m.student, head_bits=None) == grid), None)


def actor_modes() -> dict[int, IntMode]:
    """ActorQ's actor kernel by width: the first registered mode of each width that declares
    ``actor`` (:mod:`quarl.actorq.actor_precisions`)."""
    kernels: dict[int, IntMode] = {}
    for mode in MODES.values():
        if mode.actor:
            kernels.setdefault(mode.bits, mode)
    return kernels
