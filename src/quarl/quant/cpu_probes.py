"""What quarl finds out about this CPU at run time, as :mod:`quarl.quant.modes` reads it: what
ONNX Runtime's MatMulNBits really computes at ``accuracy_level`` 4 (:func:`int8_compute`) and
the key of everything that decides a real int result besides its config (:func:`runtime_key`).
Both answer as ``QUARL_CPU_KIND`` says (:mod:`quarl.core.cpu_kind`)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn

from quarl.core.cpu_kind import cpu_kind
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.backends.reference import simulate_nbits


def int8_compute(bits: int) -> str:
    """What ONNX Runtime's MatMulNBits at ``accuracy_level`` 4 does on this CPU
    (:func:`probe_int8_compute`); ``"inexact"`` under ``QUARL_CPU_KIND=avx2``, as on a CPU
    with AVX2 only (:mod:`quarl.core.cpu_kind`)."""
    return "inexact" if cpu_kind() == "avx2" else probe_int8_compute(bits)


@functools.cache
def probe_int8_compute(bits: int) -> str:
    """What ONNX Runtime's MatMulNBits at ``accuracy_level`` 4 really does on this CPU,
    probed once on a small layer: ``"int8"`` (activations rounded per block, as the
    reference says), ``"fp32"`` (the level is a hint; without int8 kernels it computes in
    fp32) or ``"inexact"`` (neither: e.g. saturating u8 x s8 sums). Its weights and inputs
    come from a generator of its own (the numbers ``torch.manual_seed(0)`` gave before), so
    the global torch RNG is left as it was."""
    generator = torch.Generator().manual_seed(0)
    linear = nn.utils.skip_init(nn.Linear, 96, 24)  # no draw from the global RNG
    with torch.no_grad():  # nn.Linear's own initialization, drawn from the local generator
        nn.init.kaiming_uniform_(linear.weight, a=math.sqrt(5), generator=generator)
        bound = 1 / math.sqrt(linear.in_features)
        linear.bias.uniform_(-bound, bound, generator=generator)
    layer = nn.Sequential(linear).eval()
    x = torch.randn(16, 96, generator=generator) * 3
    real = ortb.OrtEngine(ortb.quantize_nbits(ortb.export_onnx(layer, (96,)), bits, 32, True))(x.numpy())
    with torch.inference_mode():
        as_int8 = simulate_nbits(layer, bits, 32, True)(x).numpy()
        as_fp32 = simulate_nbits(layer, bits, 32, False)(x).numpy()
    scale = float(np.abs(as_fp32).max())
    if np.abs(real - as_int8).max() <= 1e-4 * scale:
        return "int8"
    if np.abs(real - as_fp32).max() <= 1e-4 * scale:
        return "fp32"
    return "inexact"


def runtime_key() -> dict[str, str]:
    """What, besides the config, decides a real int cell: the runtime's version and the CPU
    (kernels, the int8-compute probe and the latency order differ between them), with the
    CPU kind quarl answers as where it is not ``native`` (keys stored before it are native's).
    Part of every stored int result's key, so a results folder moved to another machine, or
    run under another ``QUARL_CPU_KIND``, is not reused there."""
    kind = cpu_kind()
    return {**_runtime_key(), "vnni": str(ortb.has_vnni()), **({"cpu_kind": kind} if kind != "native" else {})}


@functools.cache
def _runtime_key() -> dict[str, str]:
    import onnxruntime

    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"onnxruntime": onnxruntime.__version__, "cpu": cpu}
