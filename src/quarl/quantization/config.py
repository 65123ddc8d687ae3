"""QuantConfig: what to do to a policy's acting network, validated when built."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, record_of
from quarl.core.validate import bit_widths, digits, unknown_precision  # noqa: F401  (bit_widths: named here as before)
from quarl.quant.primitives import GRANULARITIES, MAX_BITS, MIN_BITS, SCHEMES, check_block_size
from quarl.quantization import precisions as registry

INT8_WEIGHTS: tuple[str, ...] = ("auto", "asymmetric", "symmetric")


QuantConfigJson = dict[str, str | int | float | bool]
"""A :class:`QuantConfig` as plain fields (:meth:`QuantConfig.to_json`): part of every stored
result's key."""


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize the network that picks the actions."""

    precision: str = "fp32"
    """A name in the precision registry (:data:`quarl.quantization.precisions.PRECISIONS`)."""
    bits: int = 8
    """Bit width of ``nbit`` (2..16); set from the precision for ``int8`` / ``int4``."""
    mode: str = "auto"
    """``int8`` / ``int4``: ``auto`` (the first fast mode that agrees with fp32 on calibration
    states) or one mode of :data:`quarl.quant.modes.MODES` without its ``intN-`` prefix
    (``dyn-tensor``, ``dyn-channel``, ``block``, ``weight-only``, ``static``)."""
    scheme: str = "quarl"
    """``nbit`` rounding scheme: ``quarl`` (the paper's, unclamped), ``affine`` (clamped,
    zero point) or ``symmetric`` (zero point 0). See :mod:`quarl.quant.primitives`."""
    granularity: str = "auto"
    """``tensor``, ``channel`` (per output channel), ``block`` (per ``block_size``
    inputs), or ``auto``: per tensor for dense layers and per channel for convolutions,
    as in the paper."""
    block_size: int = 32
    """Inputs per block for ``granularity="block"`` and the MatMulNBits modes: 16, 32, 64, 128 or 256."""
    int8_weights: str = "auto"
    """8-bit weight format of the MatMulInteger / QDQ modes: ``asymmetric`` (uint8 + zero
    point, exact on every x86 CPU), ``symmetric`` (int8, zero point 0: the faster u8 x s8
    kernels, exact only with VNNI) or ``auto``: symmetric where the CPU has VNNI,
    asymmetric elsewhere."""
    activations: bool = False
    """Also fake-quantize layer outputs (``nbit`` only), with ranges calibrated on
    observations passed to :func:`quarl.quantization.api.quantize`."""
    min_agreement: float = 0.99
    """Automatic modes: share of calibration states whose actions must agree with fp32."""
    action_tolerance: float = 0.02
    """Continuous actions agree when every dimension is within this share of its range."""

    def __post_init__(self) -> None:
        from quarl.quant.modes import MODES

        entry = registry.get(self.precision)
        if entry.bits is not None:
            object.__setattr__(self, "bits", entry.bits)
        if entry.real_int:
            modes = [m.name for m in MODES.values() if m.bits == self.bits]
            if self.mode != "auto" and self.mode not in modes:
                raise QuarlError(f"unknown {self.precision} mode {self.mode!r}: allowed auto, {', '.join(modes)}")
        elif self.mode != "auto":
            raise QuarlError(f"a mode ({self.mode!r}) is for int8 / int4 only, not {self.precision!r}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not MIN_BITS <= self.bits <= MAX_BITS:
            raise QuarlError(f"bits={self.bits!r} is out of range: allowed {MIN_BITS}..{MAX_BITS}")
        if self.scheme not in SCHEMES:
            raise QuarlError(f"unknown scheme {self.scheme!r}: allowed {', '.join(SCHEMES)}")
        if self.granularity not in (*GRANULARITIES, "auto"):
            raise QuarlError(f"unknown granularity {self.granularity!r}: allowed auto, {', '.join(GRANULARITIES)}")
        try:
            check_block_size(self.block_size)
        except ValueError as exc:
            raise QuarlError(str(exc)) from None
        if self.int8_weights not in INT8_WEIGHTS:
            raise QuarlError(f"unknown int8 weight format {self.int8_weights!r}: allowed {', '.join(INT8_WEIGHTS)}")
        if self.activations and self.precision != "nbit":
            raise QuarlError(f"activations=True needs precision 'nbit', got {self.precision!r}")
        if not 0.0 < self.min_agreement <= 1.0:
            raise QuarlError(f"min agreement {self.min_agreement!r} must be in (0, 1]")
        if not self.action_tolerance >= 0.0:
            raise QuarlError(f"action tolerance {self.action_tolerance!r} must be >= 0")

    @classmethod
    def parse(cls, label: str, base: QuantConfig | None = None) -> QuantConfig:
        """Build from a label as the CLI writes it: ``fp32``, ``fp16``, ``bf16``, ``int8`` /
        ``int4`` (real kernels, mode chosen automatically), ``int8-MODE`` / ``int4-MODE``
        (one mode), or ``sim2`` .. ``sim16`` (simulated n-bit weights, the paper's sweep).
        The label sets the precision, bits and mode; every other field is ``base``'s (the
        options a command's cells share, such as ``int8_weights`` and ``block_size``; default:
        every field's default). A command parses each label once, where it reads its options."""
        from quarl.quant.modes import MODES

        base = base or cls()
        text = label.strip().lower()
        if text in registry.PRECISIONS and text != "nbit":
            return replace(base, precision=text, bits=cls.bits, mode=cls.mode)
        if text in MODES:
            mode = MODES[text]
            return replace(base, precision=f"int{mode.bits}", bits=cls.bits, mode=mode.name)
        if text.startswith("sim") and digits(text[3:]) and MIN_BITS <= int(text[3:]) <= MAX_BITS:
            return replace(base, precision="nbit", bits=int(text[3:]), mode=cls.mode)
        raise unknown_precision(label, allowed_precisions())

    def at_fp32(self) -> QuantConfig:
        """fp32 with this config's options (block size, int8 weights, agreement...): the baseline a
        run adds before its precisions, keyed with the options its cells share, as before."""
        return replace(self, precision="fp32", bits=QuantConfig.bits, mode=QuantConfig.mode, activations=False)

    @property
    def label(self) -> str:
        """Name for tables: ``fp32``, ``int8`` (automatic), ``int8-dyn-channel``, ``sim4``..."""
        if self.precision == "nbit":
            return f"sim{self.bits}"
        if registry.get(self.precision).real_int and self.mode != "auto":
            return f"{self.precision}-{self.mode}"
        return self.precision

    def to_json(self) -> QuantConfigJson:
        """The fields in their order, as stored keys hold them."""
        return asdict(self)

    def resolved(self) -> QuantConfig:
        """The config with ``int8_weights="auto"`` replaced by what this CPU runs (the key
        of a stored result must say what was really computed). Symmetric int8 weights on a
        CPU without VNNI are refused: its u8 x s8 kernels saturate and are not exact there."""
        from quarl.quant.backends.onnxruntime import has_vnni

        if self.int8_weights == "auto":
            return replace(self, int8_weights="symmetric" if has_vnni() else "asymmetric")
        if self.int8_weights == "symmetric" and registry.get(self.precision).real_int and not has_vnni():
            raise QuarlError("--int8-weights symmetric needs a CPU with VNNI (AVX512-VNNI or AVX-VNNI), which this one "
                             "lacks: its u8 x s8 kernels saturate int16 sums; use asymmetric or auto")
        return self


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
        if self.granularity == "block":
            raise QuarlError("QAT rounds weights per tensor or per channel: granularity 'block' is for PTQ")
        if isinstance(self.quant_delay, bool) or not isinstance(self.quant_delay, int) or self.quant_delay < 0:
            raise QuarlError(f"quant delay {self.quant_delay!r} must be an integer >= 0")



_Bound = Annotated[float, Field(allow_inf_nan=True)]
"""A monitored bound: finite, or the observer's never-observed sentinel (+inf, -inf) as a pair."""


class QATLayerState(Record):
    """One fake-quantized layer in ``qat.json``: whether it quantizes, and its monitored output
    and weight ranges, each a finite interval of positive width, or never observed (the
    observer's initial +inf, -inf, which ``json.dumps`` writes as ``Infinity, -Infinity``); NaN,
    other infinities, zero or negative widths are refused when read (fake quantization divides
    by the width)."""

    quantize: bool
    out_min: _Bound
    out_max: _Bound
    w_min: _Bound
    w_max: _Bound

    @model_validator(mode="after")
    def _ranges_mean_something(self) -> QATLayerState:
        for lo_name, hi_name in (("out_min", "out_max"), ("w_min", "w_max")):
            lo, hi = getattr(self, lo_name), getattr(self, hi_name)
            if lo == math.inf and hi == -math.inf:
                continue  # never observed
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError(f"{lo_name}..{hi_name} = {lo!r}..{hi!r} is not a finite range (allowed: finite "
                                 "numbers, or Infinity..-Infinity for a layer never observed)")
            if not hi > lo:
                raise ValueError(f"{lo_name}..{hi_name} = {lo!r}..{hi!r} has width {hi - lo!r}: a range must be wider "
                                 "than zero")
        return self


_QAT_CONFIG_FIELDS = record_of("QATConfigFields", QATConfig, base=Record)
"""A :class:`QATConfig`'s fields as ``qat.json`` holds them, typed (checked before it is built)."""


class QATState(Record):
    """What ``qat.json`` holds: the run's settings, whether fake quantization was on, and each
    wrapped layer's state by name; what a QAT run's wrappers restore from and
    :func:`quarl.quantization.api.from_qat_state` rebuilds the quantized policy from. Read back with
    :func:`quarl.training.qat_sb3.read_qat_state`."""

    config: QATConfig
    enabled: bool
    layers: dict[str, QATLayerState]

    @field_validator("config", mode="before")
    @classmethod
    def _settings(cls, config: Any) -> QATConfig:
        if isinstance(config, QATConfig):
            return config
        fields = _QAT_CONFIG_FIELDS.model_validate(config)
        try:
            return QATConfig(**fields.model_dump())
        except QuarlError as exc:  # one line naming the field, as the types' own refusals
            raise ValueError(str(exc)) from None


def allowed_precisions() -> str:
    """What ``--precisions`` takes, as a refusal says it: the registered precisions, the real
    int modes, the simulated widths."""
    from quarl.quant.modes import MODES

    return (f"{', '.join(p for p in registry.PRECISIONS if p != 'nbit')} (int8 / int4: real kernels, automatic mode), "
            f"{', '.join(MODES)}, sim{MIN_BITS}..sim{MAX_BITS} (simulated n-bit weights)")


def precision_labels() -> list[str]:
    """Every label :meth:`QuantConfig.parse` takes (lower case)."""
    from quarl.quant.modes import MODES

    simulated = (f"sim{n}" for n in range(MIN_BITS, MAX_BITS + 1))
    return [*(p for p in registry.PRECISIONS if p != "nbit"), *MODES, *simulated]


def as_config(precision: QuantConfig | str) -> QuantConfig:
    """``precision`` as a config: a :class:`QuantConfig` as given, or a label a Python caller
    wrote (``"int8"``), parsed once with every option's default. The commands parse their
    labels onto their options where they read them and pass configs."""
    return precision if isinstance(precision, QuantConfig) else QuantConfig.parse(precision)
