"""QuantConfig: what to do to a policy's acting network, validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from quarl.errors import QuarlError
from quarl.quant.primitives import GRANULARITIES, MAX_BITS, MIN_BITS, SCHEMES

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "nbit")
"""``fp32``: unchanged. ``fp16`` / ``bf16``: weights and arithmetic in that float format
(PyTorch kernels). ``int8``: real int8 execution (ONNX Runtime integer kernels).
``nbit``: simulated n-bit uniform quantization of the weights (fp32 arithmetic on the
rounded weights), any width from 2 to 16 bits, as in the paper's sweeps."""

INT8_WEIGHTS: tuple[str, ...] = ("asymmetric", "symmetric")


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize the network that picks the actions."""

    precision: str = "fp32"
    """One of :data:`PRECISIONS`."""
    bits: int = 8
    """Bit width of ``nbit`` (2..16); ``int8`` is always 8."""
    scheme: str = "quarl"
    """``nbit`` rounding scheme: ``quarl`` (the paper's, unclamped), ``affine`` (clamped,
    zero point) or ``symmetric`` (zero point 0). See :mod:`quarl.quant.primitives`."""
    granularity: str = "auto"
    """``tensor``, ``channel`` (per output channel), or ``auto``: per tensor for dense
    layers and per channel for convolutions, as in the paper."""
    int8_weights: str = "asymmetric"
    """``int8`` weight format: ``asymmetric`` (uint8 + zero point, default: keeps DQN
    policies intact) or ``symmetric`` (int8, zero point 0: the faster VNNI kernels).
    Activations are always uint8, quantized per call from their own range."""
    activations: bool = False
    """Also fake-quantize layer outputs (``nbit`` only), with ranges calibrated on
    observations passed to :func:`quarl.quant.api.quantize`."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise QuarlError(f"unknown precision {self.precision!r}: allowed {', '.join(PRECISIONS)}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not MIN_BITS <= self.bits <= MAX_BITS:
            raise QuarlError(f"bits={self.bits!r} is out of range: allowed {MIN_BITS}..{MAX_BITS}")
        if self.scheme not in SCHEMES:
            raise QuarlError(f"unknown scheme {self.scheme!r}: allowed {', '.join(SCHEMES)}")
        if self.granularity not in (*GRANULARITIES, "auto"):
            raise QuarlError(f"unknown granularity {self.granularity!r}: allowed auto, {', '.join(GRANULARITIES)}")
        if self.int8_weights not in INT8_WEIGHTS:
            raise QuarlError(f"unknown int8 weight format {self.int8_weights!r}: allowed {', '.join(INT8_WEIGHTS)}")
        if self.activations and self.precision != "nbit":
            raise QuarlError(f"activations=True needs precision 'nbit', got {self.precision!r}")

    @classmethod
    def parse(cls, label: str, **kwargs: object) -> "QuantConfig":
        """Build from a label as the CLI writes it: ``fp32``, ``fp16``, ``bf16``, ``int8``
        (real int8) or ``int2`` .. ``int16`` (simulated n-bit, the paper's sweep)."""
        text = label.strip().lower()
        if text in ("fp32", "fp16", "bf16", "int8"):
            return cls(precision=text, **kwargs)  # type: ignore[arg-type]
        if text.startswith("int") and text[3:].isdigit():
            return cls(precision="nbit", bits=int(text[3:]), **kwargs)  # type: ignore[arg-type]
        raise QuarlError(
            f"unknown precision {label!r}: allowed fp32, fp16, bf16, int8 (real int8 kernels), "
            f"int{MIN_BITS}..int{MAX_BITS} (simulated n-bit)"
        )

    @property
    def label(self) -> str:
        """Short name for tables: ``fp32``, ``int8``, ``q4`` (simulated 4-bit) ..."""
        if self.precision == "nbit":
            return f"q{self.bits}"
        return self.precision


@dataclass(frozen=True)
class QATConfig:
    """How quantization-aware training runs (see :mod:`quarl.quant.qat`)."""

    bits: int
    """Width of weights and activations, 2..16."""
    quant_delay: int
    """Training steps of plain fp32 (ranges monitored) before fake quantization starts."""
    scheme: str = "quarl"
    """Weight scheme: quarl (the paper's), affine or symmetric. Activations are always
    clamped affine within their monitored range."""
    granularity: str = "auto"
    """auto (tensor for dense, channel for conv, as the paper), tensor or channel."""
    critic: bool = False
    """Also fake-quantize the critic / value network (it does not act)."""

    def __post_init__(self) -> None:
        QuantConfig(precision="nbit", bits=self.bits, scheme=self.scheme, granularity=self.granularity)
        if isinstance(self.quant_delay, bool) or not isinstance(self.quant_delay, int) or self.quant_delay < 0:
            raise QuarlError(f"quant delay {self.quant_delay!r} must be an integer >= 0")
