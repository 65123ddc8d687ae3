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
import functools
import io
import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from quarl.core.cpu_kind import cpu_kind
from quarl.quant.backends.batching import RowVerdicts

INPUT, OUTPUT = "obs", "out"
log = logging.getLogger(__name__)


def session_options(threads: int = 1, fuse: bool = True) -> ort.SessionOptions:
    """One thread by default. ``fuse=False`` runs the graph as written: a QDQ model's
    QuantizeLinear / DequantizeLinear nodes as float operations around fp32 kernels (the
    arithmetic its fused integer kernels must reproduce)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if not fuse:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
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
            buf,  # type: ignore[arg-type]  # torch.onnx.export writes to a file-like object too
            dynamo=False,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            opset_version=17,
        )
    return buf.getvalue()


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ONNX Runtime's quantizers log advice at WARNING and progress at INFO, through the
    root logger and handlers of their own."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


WEIGHT_TYPES = {"asymmetric": "QUInt8", "symmetric": "QInt8"}


def quantize_dynamic_int8(model: bytes, weights: str = "asymmetric", per_channel: bool = False,
                          exclude: Sequence[str] = ()) -> bytes:
    """8-bit weights (per tensor, or per output channel) and uint8 activations quantized
    per call from the whole input's range (``DynamicQuantizeLinear`` + ``MatMulInteger``).

    ``weights="asymmetric"``: uint8 with a zero point (the affine scheme, the kind the
    paper used); exact integer arithmetic on every x86 CPU. ``"symmetric"``: int8 with
    zero point 0, the u8 x s8 fast path (about 2x faster on the 3 x 2048 MLP), but
    coarser for lopsided weight distributions per tensor and, on CPUs without VNNI (see
    :func:`has_vnni`), inexact: the kernels sum u8 x s8 pairs into saturating int16.
    ``exclude``: node names left in fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        # as MatMul nodes named like the layers: ONNX Runtime would rename a Gemm it converts,
        # and nodes_to_exclude would miss it
        src.write_bytes(gemm_to_matmul(model))
        quantize_dynamic(src, dst, weight_type=getattr(QuantType, WEIGHT_TYPES[weights]), per_channel=per_channel,
                         nodes_to_exclude=list(exclude))
        return dst.read_bytes()


def quantize_static_int8(model: bytes, calibration: np.ndarray, weights: str = "asymmetric",
                         exclude: Sequence[str] = ()) -> bytes:
    """QDQ 8-bit with per-channel weights and uint8 activation ranges from
    ``calibration`` (a batch of preprocessed observations); ``weights`` as in
    :func:`quantize_dynamic_int8`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter(calibration.astype(np.float32))

        def get_next(self) -> dict[str, np.ndarray] | None:
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
            weight_type=getattr(QuantType, WEIGHT_TYPES[weights]),
            nodes_to_exclude=list(exclude),
        )
        return dst.read_bytes()


def gemm_to_matmul(model: bytes) -> bytes:
    """The same graph with every ``Gemm(x, W, b, transB=1)`` written as ``MatMul(x, W^T) +
    b``: ONNX Runtime's block-wise n-bit kernels (``MatMulNBits``) replace MatMul nodes
    only. Node names are kept (the MatMul takes the Gemm's name, the Add ``NAME/add``) so
    that layers can still be excluded by name."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load_from_string(model)
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = not attrs.get("transA", 0) and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
        if node.op_type != "Gemm" or node.input[1] not in inits or not plain:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        w = w.T if attrs.get("transB", 0) else w
        graph.initializer.remove(inits.pop(node.input[1]))
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w), node.input[1]))
        if len(node.input) > 2 and node.input[2]:
            product = node.output[0] + "/matmul"
            nodes.append(helper.make_node("MatMul", [node.input[0], node.input[1]], [product], name=node.name))
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=node.name + "/add"))
        else:
            nodes.append(helper.make_node("MatMul", [node.input[0], node.input[1]], [node.output[0]], name=node.name))
    del graph.node[:]
    graph.node.extend(nodes)
    serialized: bytes = proto.SerializeToString()
    return serialized


def _nbits_quantizer() -> Any:
    """ONNX Runtime's MatMulNBitsQuantizer. Its module calls ``logging.basicConfig(level=INFO)``
    on import, which would make every library's INFO lines (quarl's included) appear in a
    user's program: the root logger is put back as it was."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    root.handlers[:] = handlers
    root.setLevel(level)
    return MatMulNBitsQuantizer


def quantize_nbits(model: bytes, bits: int, block_size: int = 32, compute_int8: bool = False,
                   exclude: Sequence[str] = ()) -> bytes:
    """Block-wise n-bit weights (``MatMulNBits``, 8 or 4 bits): every ``block_size``
    consecutive input weights of an output unit share a scale and a zero point (the
    affine scheme). ``compute_int8=False``: activations stay fp32 (weight-only);
    ``True``: ONNX Runtime's ``accuracy_level`` 4, activations rounded to int8 per row
    and block of ``block_size`` (much finer than per tensor) for the integer kernels."""
    import onnx

    MatMulNBitsQuantizer = _nbits_quantizer()
    with _quiet_quantizer():
        quantizer = MatMulNBitsQuantizer(onnx.load_from_string(gemm_to_matmul(model)), bits=bits,
                                         block_size=block_size, is_symmetric=False,
                                         accuracy_level=4 if compute_int8 else None, nodes_to_exclude=list(exclude))
        quantizer.process()
        serialized: bytes = quantizer.model.model.SerializeToString()
        return serialized


def weight_node_names(model: bytes) -> list[str]:
    """Names of the nodes that hold a layer's weights (Gemm, MatMul, Conv), in graph order:
    one per Linear / Conv2d layer of an exported network."""
    import onnx

    return [n.name for n in onnx.load_from_string(model).graph.node if n.op_type in ("Gemm", "MatMul", "Conv")]


def has_vnni() -> bool:
    """Whether the CPU has VNNI dot-product instructions. Without them ONNX Runtime's
    u8 x s8 kernels (symmetric int8 weights) sum pairs into saturating int16 and lose
    exactness; u8 x u8 (asymmetric weights) stays exact. ``QUARL_CPU_KIND=avx2``: False
    (:mod:`quarl.core.cpu_kind`)."""
    return cpu_kind() != "avx2" and _cpuinfo_vnni()


@functools.cache
def _cpuinfo_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags or "asimddp" in flags


def has_conv(network: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in network.modules())


def conv_layers(network: nn.Module) -> frozenset[int]:
    """Indices of the Conv2d layers among the weight layers (Linear / Conv2d, in order)."""
    layers = [m for m in network.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return frozenset(i for i, m in enumerate(layers) if isinstance(m, nn.Conv2d))


def row_scan_model(model: bytes) -> bytes:
    """``model`` run once per row of its input by an ONNX ``Scan`` over the batch axis: each
    row goes through the model's own graph as a batch of one (a dynamic int8 model takes its
    activation range over that row alone), in one ``run`` call instead of one per row."""
    import onnx
    from onnx import TensorProto, helper

    source = onnx.load_from_string(model)
    graph = source.graph
    row_in, row_out, one = "quarl_row", "quarl_row_out", "quarl_axis0"

    def renamed(names: Sequence[str]) -> list[str]:  # the body may not reuse the outer graph's names
        return [f"quarl_body_{n}" if n in (INPUT, OUTPUT) else n for n in names]

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = renamed(copy.input)
        copy.output[:] = renamed(copy.output)
        nodes.append(copy)
    obs = next(i for i in graph.input if i.name == INPUT)
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in obs.type.tensor_type.shape.dim]
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", [row_in, one], renamed([INPUT])), *nodes,
         helper.make_node("Squeeze", [*renamed([OUTPUT]), one], [row_out])],
        "quarl_row", [helper.make_tensor_value_info(row_in, TensorProto.FLOAT, dims[1:])],
        [helper.make_tensor_value_info(row_out, TensorProto.FLOAT, None)],
        initializer=[*graph.initializer, helper.make_tensor(one, TensorProto.INT64, [1], [0])])
    scan = helper.make_node("Scan", [INPUT], [OUTPUT], num_scan_inputs=1, body=body)
    # the policy input and output alone (an exporter may list initializers among the inputs)
    outer = helper.make_graph([scan], "quarl_rows", [i for i in graph.input if i.name == INPUT],
                              [o for o in graph.output if o.name == OUTPUT])
    wrapped = helper.make_model(outer, opset_imports=list(source.opset_import))
    wrapped.ir_version = source.ir_version
    wrapped.functions.extend(source.functions)
    serialized: bytes = wrapped.SerializeToString()
    return serialized


class _EngineState(TypedDict):
    """What a pickled :class:`OrtEngine` holds (its sessions are built again)."""

    model: bytes
    per_row: bool
    options: tuple[int, bool]


class OrtEngine:
    """Runs an ONNX model on float32 numpy batches."""

    def __init__(self, model: bytes, per_row: bool = False, threads: int = 1, fuse: bool = True) -> None:
        self.model = model
        self.per_row = per_row
        self._options = (threads, fuse)
        self.session = ort.InferenceSession(model, session_options(threads, fuse), providers=["CPUExecutionProvider"])
        self._verdicts = RowVerdicts()
        self._scan: ort.InferenceSession | None = None
        self._scan_failed = False

    def __getstate__(self) -> _EngineState:
        """Pickled as its model (evaluation workers): the session is built again on arrival."""
        return {"model": self.model, "per_row": self.per_row, "options": self._options}

    def __setstate__(self, state: _EngineState) -> None:
        OrtEngine.__init__(self, state["model"], state["per_row"], *state["options"])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.per_row and x.shape[0] > 1:
            return self._one_by_one(x)
        out: np.ndarray = self.session.run(None, {INPUT: x})[0]
        return out

    def _one_by_one(self, x: np.ndarray) -> np.ndarray:
        run = self.session.run
        return np.concatenate([run(None, {INPUT: x[i : i + 1]})[0] for i in range(x.shape[0])])

    def _run(self, h: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {INPUT: h.numpy()})[0])

    def _scan_session(self) -> ort.InferenceSession | None:
        """A session of :func:`row_scan_model`, built on first use (``None`` if ONNX Runtime
        cannot build it: the rows then go one call each)."""
        if self._scan is None and not self._scan_failed:
            try:
                self._scan = ort.InferenceSession(row_scan_model(self.model), session_options(*self._options),
                                                  providers=["CPUExecutionProvider"])
            except Exception as exc:  # any build failure only loses speed: say so under -v
                log.debug("no row-scan form of this model (%s): rows run one call each", exc)
                self._scan_failed = True
        return self._scan

    def _run_scan(self, h: torch.Tensor) -> torch.Tensor:
        assert self._scan is not None  # called only once the scan model is built
        return torch.from_numpy(self._scan.run(None, {INPUT: h.numpy()})[0])

    def rows(self, x: np.ndarray) -> np.ndarray:
        """Every row's output as computed alone: one batched call where that is verified to
        give the same bits for this batch size (ONNX Runtime's kernels can pick another code
        path for more rows); else (and always for a dynamic model, ``per_row``) one call of
        the model scanned over the rows (:func:`row_scan_model`) where that is verified, else
        a call per row. Measured on the zoo's HalfCheetah at dynamic int8, 32 rows: the scan
        takes 12.5-14 us per row against 29-33 us in calls of one (two runs)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.shape[0]
        if n == 1:
            return self._one_by_one(x)
        if not self.per_row and self._verdicts.verdict("model", n) is not False:
            return self._verdicts.run("model", torch.from_numpy(x), self._run, self._run).numpy()
        if self._verdicts.verdict("scan", n) is not False and self._scan_session() is not None:
            return self._verdicts.run("scan", torch.from_numpy(x), self._run_scan, self._run).numpy()
        return self._one_by_one(x)
