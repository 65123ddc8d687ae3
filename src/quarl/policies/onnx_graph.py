"""A crafted ONNX model refused before ONNX Runtime builds it: only the operators a policy
network exports to, bounded padding, and intermediate tensors bounded per observation and
in all, at a batch larger than any quarl feeds (:func:`check_graph`). Read by
:mod:`quarl.policies.onnx_artifact` before it loads an export."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quarl.core.errors import QuarlError

POLICY_OPS = frozenset({
    # layers and their quantized forms, as quarl's exports write them
    "Gemm", "MatMul", "Conv", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "MatMulNBits",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "LayerNormalization", "BatchNormalization",
    # activations and elementwise arithmetic
    "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Elu", "Selu", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Gelu",
    "Erf", "Clip", "Softmax", "LogSoftmax", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sqrt", "Exp", "Log", "Pow",
    "Min", "Max", "Cast", "Identity", "Constant",
    # reshaping without growing
    "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "AveragePool", "GlobalAveragePool",
    "ReduceMean",
})
"""Operators a policy network exports to. Anything else (ConstantOfShape, Expand, Tile, Pad,
Resize, Loop...) could size its output from the file's numbers rather than from the
observation, so a crafted model is refused before ONNX Runtime runs it."""
MAX_ROW_VALUES = 2**22
"""Values one observation's intermediate tensor may hold (16 MB of fp32): the paper's largest
policy holds 0.4M (1024 channels of 20 x 20); a crafted 1 x 80M weight would make every
row of a batch an 80M-value outer product."""
MAX_PAD = 64
"""Padding and dilation a convolution or pooling may ask for (a real policy's are a few
pixels; ``pads=[10**6, ...]`` would make a 84 x 84 frame a 10^12-pixel one)."""


MAX_GRAPH_VALUES = 2**25
"""Values all intermediate tensors of one observation may hold together (128 MB of fp32):
a chain of tensors each within :data:`MAX_ROW_VALUES` would otherwise add up."""
GROWTH_BATCH = 4096
"""The largest batch the growth check binds the batch axis to: above any batch quarl feeds
(``--n-envs`` is at most 1024), so a tensor that grows faster than the batch is seen at the
size it would really take."""


def check_graph(model: bytes, path: Path, input_shape: tuple[int, ...]) -> None:
    """Refuse in one line a model with an operator outside :data:`POLICY_OPS`, padding /
    dilation past :data:`MAX_PAD`, an input that does not fit an observation of
    ``input_shape``, a tensor whose shape does not follow from the observation's, a tensor
    of more than :data:`MAX_ROW_VALUES` values per observation (or all of them past
    :data:`MAX_GRAPH_VALUES`), or one that grows faster than the batch: every symbolic axis
    is bound to the observation's real size (the batch axis to 1, 2 and
    :data:`GROWTH_BATCH`) and the shapes inferred, before ONNX Runtime builds anything."""
    import onnx
    from onnx import helper

    try:
        proto = onnx.load_from_string(model)
    except Exception:  # protobuf's DecodeError
        raise QuarlError(f"{path} is not an ONNX model (it does not parse)") from None
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx", "com.microsoft") or node.op_type not in POLICY_OPS:
            raise QuarlError(f"{path}: operator {node.domain or 'ai.onnx'}.{node.op_type} (node {node.name!r}) is not "
                             "one a policy network exports to: refused")
        for attr in node.attribute:
            if attr.name == "N" and node.op_type == "MatMulNBits" and helper.get_attribute_value(attr) > MAX_ROW_VALUES:
                raise QuarlError(f"{path}: node {node.name!r} is {helper.get_attribute_value(attr)} outputs wide: "
                                 f"refused (at most {MAX_ROW_VALUES})")
            if attr.name in ("pads", "dilations"):
                values = list(helper.get_attribute_value(attr))
                if any(v < 0 or v > MAX_PAD for v in values):
                    raise QuarlError(f"{path}: node {node.name!r} asks for {attr.name} {values}: refused "
                                     f"(at most {MAX_PAD})")
    slim = _weights_as_inputs(proto)
    one = _sizes_at_batch(slim, 1, input_shape, path)
    total = 0
    for name, size in one.items():
        # broadcasting can grow a tensor too: (1, 2100, 1) + (1, 2100) is 4.4M values; a
        # tensor of fixed initializers is no batch: (30000, 1) + (1, 30000) is 900M values
        if size > MAX_ROW_VALUES:
            raise QuarlError(f"{path}: tensor {name!r} holds {size} values per observation: refused "
                             f"(at most {MAX_ROW_VALUES})")
        total += size
    if total > MAX_GRAPH_VALUES:
        raise QuarlError(f"{path}: its tensors hold {total:,} values per observation together: refused "
                         f"(at most {MAX_GRAPH_VALUES:,})")
    # a graph that reshapes its batch into a square (B x B, then (B x B)^2...) takes
    # gigabytes at the batch evaluation runs, however small it is at one observation
    for batch in (2, GROWTH_BATCH):
        for name, size in _sizes_at_batch(slim, batch, input_shape, path).items():
            if size > batch * one.get(name, 0):
                raise QuarlError(f"{path}: tensor {name!r} holds {size:,} values for {batch} observations "
                                 f"({one.get(name, 0):,} for 1): it grows faster than the batch, refused "
                                 f"(at most {batch} x its size for one)")


def _weights_as_inputs(proto: Any) -> Any:
    """A copy of ``proto`` whose larger initializers are inputs of their shape (their values
    do not decide a shape; copying and inferring the graph then costs no weight bytes). The
    file's own ``value_info`` and output shapes are dropped: shapes are inferred, not taken
    from what the file claims."""
    import onnx
    from onnx import helper

    slim = onnx.ModelProto()
    slim.CopyFrom(proto)
    graph = slim.graph
    kept, moved = [], []
    for tensor in graph.initializer:
        if math.prod(tensor.dims) > 64:
            moved.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            kept.append(tensor)
    weights = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in weights]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    graph.ClearField("input")
    graph.input.extend(inputs)
    graph.input.extend(moved)
    graph.ClearField("value_info")
    for value in graph.output:
        value.type.tensor_type.ClearField("shape")
    slim.metadata_props.add(key="quarl_weights", value="\n".join(v.name for v in moved))
    return slim


def _sizes_at_batch(slim: Any, batch: int, input_shape: tuple[int, ...], path: Path) -> dict[str, int]:
    """Every computed tensor's number of values with the observation input bound to
    ``(batch, *input_shape)``; one line when an input does not fit that shape or a tensor's
    shape does not follow from it. ONNX shape inference skips contrib operators: a
    ``MatMulNBits`` output is ``A.shape[:-1] + (N,)``, added and inferred again."""
    import onnx
    from onnx import helper

    fixed = onnx.ModelProto()
    fixed.CopyFrom(slim)
    weights = set(next((p.value for p in slim.metadata_props if p.key == "quarl_weights"), "").split("\n"))
    weights |= {t.name for t in slim.graph.initializer}
    want = (batch, *input_shape)
    for value in fixed.graph.input:
        if value.name in weights:
            continue
        dims = value.type.tensor_type.shape.dim
        claimed = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        if len(dims) != len(want) or any(d.HasField("dim_value") and d.dim_value != w and (i > 0 or d.dim_value != 1)
                                         for i, (d, w) in enumerate(zip(dims, want, strict=True))):
            raise QuarlError(f"{path}: input {value.name!r} has shape {claimed}; an observation batch is "
                             f"[batch, {', '.join(map(str, input_shape))}]: refused")
        for i, (d, w) in enumerate(zip(dims, want, strict=True)):
            if not d.HasField("dim_value"):
                d.ClearField("dim_param")
                d.dim_value = w
    contrib = [n for n in fixed.graph.node if n.op_type == "MatMulNBits"]
    for _ in range(len(contrib) + 1):
        try:
            inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True).graph
        except Exception:  # an inconsistent graph
            raise QuarlError(f"{path}: its shapes do not fit {batch} observation(s) of shape {input_shape}: "
                             "refused") from None
        shapes: dict[str, tuple[int, ...]] = {}
        types: dict[str, int] = {}
        for value in [*inferred.input, *inferred.value_info, *inferred.output]:
            tensor_type = value.type.tensor_type
            types[value.name] = tensor_type.elem_type
            if tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in tensor_type.shape.dim):
                shapes[value.name] = tuple(d.dim_value for d in tensor_type.shape.dim)
        added = False
        for node in contrib:
            if node.output[0] in shapes or node.input[0] not in shapes:
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            a = shapes[node.input[0]]
            if not a or a[-1] != attrs.get("K"):
                raise QuarlError(f"{path}: node {node.name!r} takes {attrs.get('K')} inputs but is given shape "
                                 f"{list(a)}: refused")
            fixed.graph.value_info.append(helper.make_tensor_value_info(
                node.output[0], types.get(node.input[0]) or onnx.TensorProto.FLOAT, [*a[:-1], int(attrs.get("N", 0))]))
            added = True
        if not added:
            break
    sizes = {}
    for node in inferred.node:
        for name in node.output:
            if not name:
                continue
            if name not in shapes:
                raise QuarlError(f"{path}: the shape of tensor {name!r} (node {node.name!r}) does not follow from an "
                                 f"observation of shape {input_shape}: refused")
            sizes[name] = math.prod(shapes[name])
    return sizes
