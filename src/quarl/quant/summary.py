"""What a real int mode ran, as records hold it: :class:`CandidateSummary` for one mode built
and checked on calibration states (the automatic choice's candidates, the choice cache) and
:class:`QuantSummary` for how a real int policy runs (``policy.meta["quant"]``, records,
tables, export sidecars, ``recovery.json``). Kernel-layer records, so :mod:`quarl.policies`
reads an export's summary without naming the package that quantizes a Policy."""

from __future__ import annotations

from typing import (
    Annotated,
    Required,  # pydantic validates it on Python 3.11 (recovery.json)
    TypeGuard,
)

from pydantic import Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic validates it on Python 3.11 (the choice cache)

SUMMARY_COUNT = 10**12
"""A count a summary holds (bytes, episodes, a layer's index, a block's size) at most: a file
claiming more (10**400) holds no count."""
SummaryCount = Annotated[int, Field(ge=0, le=SUMMARY_COUNT)]
Measured = Annotated[float, Field(ge=-1e12, le=1e12)] | None
"""A measure (None: not measured; JSON has no NaN)."""
Label = Annotated[str, Field(max_length=200)]


class Measures(TypedDict, total=False):
    """What a built mode measured on calibration states: every field a
    :class:`CandidateSummary` holds (all of them) and a :class:`QuantSummary` may hold."""

    fp32_layers: Annotated[list[SummaryCount], Field(max_length=10_000)]
    agreement: Measured
    kl: Measured
    sampled_agreement: Measured
    latency_us: Measured
    fp32_ort_latency_us: Measured
    model_bytes: SummaryCount
    calibration_return: Measured
    calibration_episodes: SummaryCount
    calibration_verdict: Label


class CandidateSummary(Measures):
    """A built mode as records, ``quarl -v`` and the choice cache hold it:
    :meth:`quarl.quantization.candidates.Candidate.summary` writes every :class:`Measures` field
    (:func:`is_complete` checks one read back)."""

    mode: Required[Label]


class QuantSummary(CandidateSummary, total=False):
    """``policy.meta["quant"]``: how a real int policy runs (records, tables and export sidecars
    hold it). :func:`quarl.quantization.precisions.quantize_int` gives every field: the chosen mode's
    measures, the weight options, whether the choice came from the cache and every mode tried; a
    recovered kernel gives its mode and fp32 layers; an export's sidecar all but ``tried``."""

    int8_weights: str
    block_size: SummaryCount
    chosen_from_cache: bool
    tried: list[CandidateSummary]
    recovered: bool
    """A recovered kernel's (``quarl recover``): trained on the kernel's grid."""


def is_complete(summary: CandidateSummary) -> bool:
    """Whether a candidate's summary read back from a file holds every measure (a stored choice
    lacking one is chosen afresh)."""
    return all(key in summary for key in Measures.__optional_keys__)


def is_quant_summary(value: object) -> TypeGuard[QuantSummary]:
    """Whether ``value`` (an export sidecar's ``quant`` as read) is a :class:`QuantSummary`: a
    mode's name, and each field it has of its type, counts within 0..:data:`SUMMARY_COUNT`
    (checked by pydantic from the TypedDict itself; fields of other names are kept as they are)."""
    try:
        _SUMMARY_CHECK.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


_SUMMARY_CHECK: TypeAdapter[QuantSummary] = TypeAdapter(QuantSummary)


