"""ONNX Runtime execution: fp32, and real int8 with ONNX Runtime's integer kernels.

Why ONNX Runtime: measured on this project's 2-core AVX-512 VNNI machine at batch 1 on
one thread (``benchmarks/bench_inference.py``), its per-call overhead is ~10 us against
~50 us for PyTorch eager (small policies are all overhead), and its dynamic int8
MatMulInteger path runs the 3 x 2048 MLP several times faster than PyTorch fp32 and
faster than PyTorch's own dynamic int8.

- MLPs: *dynamic* int8 (``quantize_dynamic``): 8-bit per-tensor weights (asymmetric
  uint8 by default, symmetric int8 on request, see :func:`quantize_dynamic_int8`),
  activations quantized to uint8 per call from their own range. Because that range is
  taken over the whole input tensor, rows of a batch would influence each other; the
  engine runs dynamic models row by row (``per_row``) so that a batch gives exactly what a
  deployed batch-1 policy computes.
- CNNs: *static* int8 (QDQ, per-channel weights) with activation ranges calibrated on
  observations; ONNX Runtime's dynamic ConvInteger is slower than fp32 on CPU.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

INPUT, OUTPUT = "obs", "out"


def session_options(threads: int = 1) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return opts


def export_onnx(network: nn.Module, input_shape: tuple[int, ...]) -> bytes:
    """ONNX bytes of ``network`` with a dynamic batch axis.

    Uses the TorchScript exporter: ~0.2 s against ~4 s for the dynamo exporter, which
    matters when a sweep builds a model per bit width; both give the same Gemm graph for
    these networks."""
    buf = io.BytesIO()
    example = torch.zeros((1, *input_shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            network.eval(),
            (example,),
            buf,
            dynamo=False,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            opset_version=17,
        )
    return buf.getvalue()


@contextlib.contextmanager
def _quiet_quantizer():
    """ONNX Runtime's quantizer logs advice through the root logger at WARNING."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def quantize_dynamic_int8(model: bytes, weights: str = "asymmetric") -> bytes:
    """8-bit weights per tensor and uint8 activations quantized per call.

    ``weights="asymmetric"``: uint8 with a zero point (the affine scheme, the kind the
    paper used); exact integer arithmetic on every x86 CPU. ``"symmetric"``: int8 with
    zero point 0, the u8 x s8 fast path (about 2x faster on the 3 x 2048 MLP), but
    coarser for lopsided weight distributions (it drops the zoo's DQN CartPole from 500
    to ~140) and, on CPUs without VNNI (see :func:`has_vnni`), inexact: the kernels sum
    u8 x s8 pairs into saturating int16."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type = {"asymmetric": QuantType.QUInt8, "symmetric": QuantType.QInt8}[weights]

    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(model)
        quantize_dynamic(src, dst, weight_type=weight_type, per_channel=False)
        return dst.read_bytes()


def quantize_static_int8(model: bytes, calibration: np.ndarray, weights: str = "asymmetric") -> bytes:
    """QDQ 8-bit with per-channel weights and uint8 activation ranges from
    ``calibration`` (a batch of preprocessed observations); ``weights`` as in
    :func:`quantize_dynamic_int8`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter(calibration.astype(np.float32))

        def get_next(self) -> dict | None:
            row = next(self.rows, None)
            return None if row is None else {INPUT: row[None]}

    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(model)
        quantize_static(
            src,
            dst,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type={"asymmetric": QuantType.QUInt8, "symmetric": QuantType.QInt8}[weights],
        )
        return dst.read_bytes()


def has_vnni() -> bool:
    """Whether the CPU has VNNI dot-product instructions. Without them ONNX Runtime's
    u8 x s8 kernels (symmetric int8 weights) sum pairs into saturating int16 and lose
    exactness; u8 x u8 (asymmetric weights) stays exact."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags or "asimddp" in flags


def has_conv(network: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in network.modules())


class OrtEngine:
    """Runs an ONNX model on float32 numpy batches."""

    def __init__(self, model: bytes, per_row: bool = False, threads: int = 1) -> None:
        self.model = model
        self.per_row = per_row
        self.session = ort.InferenceSession(model, session_options(threads), providers=["CPUExecutionProvider"])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        run = self.session.run
        if self.per_row and x.shape[0] > 1:
            return np.concatenate([run(None, {INPUT: x[i : i + 1]})[0] for i in range(x.shape[0])])
        return run(None, {INPUT: x})[0]
