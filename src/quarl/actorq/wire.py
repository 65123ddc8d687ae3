"""The weight wire format: a versioned set of named tensors, each sent as fp32, fp16 or
n-bit (2..8) per-tensor affine integers packed ``bits`` to the value.

Layout: 4-byte little-endian header length, a JSON header (version, bits and per tensor:
name, shape, scale, zero point, byte offset), then the packed payloads (``bits * ceil(n /
8)`` bytes for n values; see :func:`_pack`). Nothing is
pickled. An n-bit tensor comes back within ``scale / 2`` of the original everywhere
(``scale = (max - min) / (2^bits - 1)``, range widened to include 0).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

from quarl.core.errors import QuarlError
from quarl.quant.primitives import qparams, quantize

Weights = dict[str, np.ndarray]


def _pack(codes: np.ndarray, bits: int) -> bytes:
    """``bits``-wide codes, 8 to a ``bits``-byte word, laid out so decoding is 8 shifts of
    contiguous arrays: the codes (zero-padded to 8m) are cut into 8 segments of m; word i
    holds codes i, m+i, .., 7m+i at bit offsets 0, bits, .., 7*bits; byte b of every word
    is stored together (row b of a bits x m array)."""
    codes = codes.astype(np.uint8).reshape(-1)
    if bits == 8:
        return codes.tobytes()
    m = -(-codes.size // 8)
    flat = np.zeros(8 * m, dtype=np.uint8)
    flat[: codes.size] = codes
    segments = flat.reshape(8, m)
    rows = np.zeros((bits, m), dtype=np.uint8)
    for j in range(8):
        byte, shift = divmod(bits * j, 8)
        rows[byte] |= segments[j] << np.uint8(shift)
        if shift + bits > 8:  # the code straddles two bytes
            rows[byte + 1] |= segments[j] >> np.uint8(8 - shift)
    return rows.tobytes()


def _unpack(raw: bytes | memoryview, bits: int, n: int) -> np.ndarray:
    if bits == 8:
        return np.frombuffer(raw, dtype=np.uint8, count=n)
    m = -(-n // 8)
    rows = np.frombuffer(raw, dtype=np.uint8, count=bits * m).reshape(bits, m)
    segments = np.empty((8, m), dtype=np.uint8)
    for j in range(8):
        byte, shift = divmod(bits * j, 8)
        value = np.right_shift(rows[byte], np.uint8(shift), out=segments[j])
        if shift + bits > 8:  # uint8 drops the high bits; the mask below drops them anyway
            value |= rows[byte + 1] << np.uint8(8 - shift)
    segments &= np.uint8((1 << bits) - 1)
    return segments.reshape(-1)[:n]


def encode(weights: Weights, version: int, bits: int = 32) -> bytes:
    """Serialize ``weights`` (float arrays) at ``bits`` (32, 16 or 2..8)."""
    if bits not in (32, 16) and not 2 <= bits <= 8:
        raise QuarlError(f"wire bits {bits} is not supported: allowed 32, 16, 2..8")
    entries, blobs, offset = [], [], 0
    for name, array in weights.items():
        x = np.ascontiguousarray(array, dtype=np.float32)
        entry: dict = {"name": name, "shape": list(x.shape)}
        if bits == 32:
            blob = x.tobytes()
        elif bits == 16:
            blob = x.astype(np.float16).tobytes()
        else:
            qp = qparams(torch.from_numpy(x), bits, "affine", "tensor")
            codes = quantize(torch.from_numpy(x), qp).numpy().reshape(-1)
            entry.update(scale=float(qp.scale), zero_point=float(qp.zero_point))
            blob = _pack(codes, bits)
        entry.update(offset=offset, nbytes=len(blob))
        offset += len(blob)
        entries.append(entry)
        blobs.append(blob)
    header = json.dumps({"version": int(version), "bits": bits, "tensors": entries}).encode()
    return struct.pack("<I", len(header)) + header + b"".join(blobs)


def decode(payload: bytes) -> tuple[int, Weights]:
    """(version, float32 weights) from :func:`encode`'s bytes."""
    (n,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4 : 4 + n])
    body = memoryview(payload)[4 + n :]
    bits = header["bits"]
    out: Weights = {}
    for e in header["tensors"]:
        raw = body[e["offset"] : e["offset"] + e["nbytes"]]
        count = int(np.prod(e["shape"])) if e["shape"] else 1
        if bits == 32:
            x = np.frombuffer(raw, dtype=np.float32, count=count).copy()
        elif bits == 16:
            x = np.frombuffer(raw, dtype=np.float16, count=count).astype(np.float32)
        else:
            x = _unpack(raw, bits, count).astype(np.float32)
            x -= np.float32(e["zero_point"])
            x *= np.float32(e["scale"])
        out[e["name"]] = x.reshape(e["shape"])
    return int(header["version"]), out


def version_of(payload: bytes) -> int:
    (n,) = struct.unpack_from("<I", payload)
    return int(json.loads(payload[4 : 4 + n])["version"])
