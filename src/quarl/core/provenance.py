"""Where a result came from: package versions and the CPU, stored with every result
record (ptq / study cells, export sidecars, bench tables, ActorQ summaries) so a number
can be traced to the software and hardware that produced it."""

from __future__ import annotations

import functools
import os
import platform
from importlib import metadata
from typing import (
    Annotated,
    NotRequired,  # pydantic validates them on Python 3.11
)

from pydantic import Field, JsonValue, ValidationError
from typing_extensions import TypedDict

from quarl.core.cpu_kind import cpu_kind
from quarl.core.file_schema import Record

PACKAGES = ("quarl", "torch", "onnxruntime", "stable-baselines3", "sb3-contrib", "gymnasium", "numpy", "ray")
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
"""The flags that decide which int8 / bf16 kernels a CPU runs."""


class Provenance(TypedDict):
    """What :func:`provenance` returns and result files store (a JSON object)."""

    versions: dict[str, str | None]
    """Each of :data:`PACKAGES`: its installed version, None where it is not installed."""
    python: str
    cpu: str
    """The CPU model (``/proc/cpuinfo``), else what :mod:`platform` says."""
    cpu_flags: list[str]
    """Those of :data:`CPU_FLAGS` the CPU has."""
    cores: Annotated[int, Field(ge=1, le=2**20)] | None
    """The machine's cores (``os.cpu_count``): a count, checked where it is read back."""
    host: str
    cpu_kind: NotRequired[str]
    """The kind of CPU quarl answered as (``QUARL_CPU_KIND``, :mod:`quarl.core.cpu_kind`) where
    it is not ``native``: the CPU and its flags above are still the real ones."""


def provenance() -> Provenance:
    """:class:`Provenance` of this process (a new dict each call)."""
    kind = cpu_kind()
    found = _provenance()
    return {**found, "cpu_kind": kind} if kind != "native" else {**found}


@functools.cache
def _provenance() -> Provenance:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and cpu in ("", platform.machine(), platform.processor()):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {"versions": versions, "python": platform.python_version(), "cpu": cpu,
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "cores": os.cpu_count(), "host": platform.node()}


StoredProvenance = dict[str, JsonValue]
"""A provenance as a result file holds it: :class:`Provenance` where this quarl wrote it, any
JSON object where an older one did (kept as read, so it is written back unchanged)."""


class _ProvenanceRecord(Record):
    """A stored provenance that is whole (each of :class:`Provenance`'s fields, typed)."""

    provenance: Provenance


def whole_provenance(stored: object) -> Provenance | None:
    """``stored`` (a provenance as a result file holds it) where it has every field of
    :class:`Provenance`, typed; None where it is absent, empty or partial (a record of a quarl
    before it was recorded, or one written by hand)."""
    try:
        return _ProvenanceRecord.model_validate({"provenance": stored}).provenance
    except ValidationError:
        return None
