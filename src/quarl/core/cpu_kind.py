"""Which kind of CPU quarl answers as: ``QUARL_CPU_KIND``.

Two of quarl's choices depend on what the CPU can do, and each is made by a probe: whether
it has VNNI (:func:`quarl.quant.backends.onnxruntime.has_vnni`: ``auto`` int8 weights are
symmetric there, asymmetric elsewhere) and what ONNX Runtime's ``MatMulNBits`` really
computes at ``accuracy_level`` 4 (:func:`quarl.quant.modes.int8_compute`: the block modes run
where it is exact and fall back to weight-only where it is not). ``QUARL_CPU_KIND=avx2``
makes both probes answer as a CPU with AVX2 only (no AVX-512, no VNNI) would, so a machine
with VNNI runs quarl, and its tests, as one without does. Only the probes change: ONNX
Runtime still runs what it runs, and under ``avx2`` it is never asked to run what an AVX2
CPU could not (the block modes are refused, symmetric int8 weights are not chosen).

The kind is part of every stored real int result's key (:func:`quarl.quant.modes.runtime_key`)
and of the int mode choice cache's, and provenance records it where it is not ``native``."""

from __future__ import annotations

import os

from quarl.core.errors import QuarlError

CPU_KIND_ENV = "QUARL_CPU_KIND"
CPU_KINDS = {
    "native": "what this CPU's probes find (the default)",
    "avx2": "as a CPU with AVX2 only: no VNNI, MatMulNBits' int8 compute not exact (block modes fall back)",
}
"""The kinds ``QUARL_CPU_KIND`` takes, with what each means."""


def cpu_kind() -> str:
    """``QUARL_CPU_KIND`` (``native`` where unset or empty), checked: read each time, so a test
    or a caller may change it."""
    raw = os.environ.get(CPU_KIND_ENV, "").strip()
    if not raw:
        return "native"
    if raw.lower() not in CPU_KINDS:
        raise QuarlError(f"{CPU_KIND_ENV}={raw!r} is not a CPU kind: allowed {', '.join(CPU_KINDS)}")
    return raw.lower()


def simulated() -> bool:
    """Whether quarl answers as another kind of CPU than this one (``QUARL_CPU_KIND`` not ``native``)."""
    return cpu_kind() != "native"
