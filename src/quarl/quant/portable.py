"""Standard-ONNX form of a MatMulNBits model: the same block-wise weights, readable by any
ONNX runtime.

``MatMulNBits`` (the int4 and int8-block modes) is an ONNX Runtime contrib operator
(``com.microsoft``); other runtimes do not know it. Each one is rewritten here as

    DequantizeLinear(codes (K, N) uint4 / uint8, scales (ceil(K / B), N), zero points,
                     axis=0, block_size=B)  ->  MatMul(A, .)  [-> Add(bias)]

(opset 21 blocked dequantization, IR 10 for 4-bit tensors): the very codes, scales and zero
points, so the dequantized weights are bit for bit the ones MatMulNBits computes with. A
runtime that computes in fp32 gives what the weight-only mode gives; ONNX Runtime fuses
the pair back into MatMulNBits when it loads the model (its DQ + MatMul fusion).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from onnx import NodeProto, TensorProto

PORTABLE_OPSET = 21
"""The first opset with blocked DequantizeLinear and 4-bit tensors."""


def _unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 bytes -> ``count`` 4-bit codes along the last axis (the low nibble first)."""
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return codes[..., :count]


def _pack_int4(arr: np.ndarray) -> bytes:
    """uint8 codes 0..15 as ONNX stores a UINT4 tensor: flattened, two per byte, low nibble first."""
    flat = arr.astype(np.uint8).ravel()
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return ((flat[0::2] & 0x0F) | ((flat[1::2] & 0x0F) << 4)).astype(np.uint8).tobytes()


def _tensor(name: str, arr: np.ndarray, bits: int) -> TensorProto:
    from onnx import TensorProto, helper, numpy_helper

    if bits == 4:
        return helper.make_tensor(name, TensorProto.UINT4, arr.shape, _pack_int4(arr), raw=True)
    return numpy_helper.from_array(np.ascontiguousarray(arr.astype(np.uint8)), name)


def portable_model(model: bytes) -> bytes:
    """``model`` with every ``MatMulNBits`` node as standard DequantizeLinear + MatMul (see the
    module docstring); ``model`` itself when it has none; refused in one line when another
    contrib operator remains."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load_from_string(model)
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    new_nodes: list[NodeProto] = []
    dropped: set[str] = set()
    added: list[TensorProto] = []
    for node in graph.node:
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            if node.domain not in ("", "ai.onnx"):
                raise QuarlError(f"the model uses {node.domain} {node.op_type}, which has no standard ONNX form here: "
                                 "--portable covers MatMulNBits (the int4 and int8-block modes)")
            new_nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n, bits, block = int(attrs["K"]), int(attrs["N"]), int(attrs.get("bits", 4)), int(attrs["block_size"])
        if bits not in (4, 8) or len(node.input) > 4 and any(node.input[4:5]):  # g_idx: act-order, not made here
            raise QuarlError(f"MatMulNBits {node.name} ({bits} bits, g_idx) has no standard form here")
        blocks = -(-k // block)
        b = numpy_helper.to_array(inits[node.input[1]]).reshape(n, blocks, -1)
        codes = (_unpack_nibbles(b, block) if bits == 4 else b).reshape(n, blocks * block)[:, :k]
        scales = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32).reshape(n, blocks)
        if len(node.input) > 3 and node.input[3]:
            zp = numpy_helper.to_array(inits[node.input[3]])
            zeros = (_unpack_nibbles(zp.reshape(n, -1), blocks) if bits == 4 else zp).reshape(n, blocks)
        else:
            zeros = np.full((n, blocks), 1 << (bits - 1), np.uint8)  # MatMulNBits' default: the middle code
        stem = node.input[1]
        names = (f"{stem}_codes", f"{stem}_scales", f"{stem}_zeros", f"{stem}_dequantized")
        added += [_tensor(names[0], codes.T, bits), numpy_helper.from_array(np.ascontiguousarray(scales.T), names[1]),
                  _tensor(names[2], zeros.T, bits)]
        dropped.update(x for x in node.input[1:4] if x)
        new_nodes.append(helper.make_node("DequantizeLinear", list(names[:3]), [names[3]], axis=0, block_size=block,
                                          name=f"{node.name}_dq"))
        bias = node.input[5] if len(node.input) > 5 and node.input[5] else None
        out = node.output[0] if bias is None else f"{node.output[0]}_nobias"
        new_nodes.append(helper.make_node("MatMul", [node.input[0], names[3]], [out], name=f"{node.name}_matmul"))
        if bias is not None:
            new_nodes.append(helper.make_node("Add", [out, bias], [node.output[0]], name=f"{node.name}_bias"))
    if not dropped:  # standard ONNX already (fp32, the MatMulInteger and QDQ modes)
        return model
    still = {x for nd in new_nodes for x in nd.input}
    kept = [t for t in graph.initializer if t.name not in dropped or t.name in still]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    del graph.node[:]
    graph.node.extend(new_nodes)
    opsets = [o for o in proto.opset_import if o.domain not in ("", "ai.onnx", "com.microsoft")]
    del proto.opset_import[:]
    proto.opset_import.extend([helper.make_opsetid("", PORTABLE_OPSET), *opsets])
    proto.ir_version = max(proto.ir_version, 10)
    onnx.checker.check_model(proto)
    serialized: bytes = proto.SerializeToString()
    return serialized
