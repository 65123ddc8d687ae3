"""Deployment: export a policy's acting network as an ONNX file (fp32 or real int8) with a
JSON sidecar describing how to feed it and read its output, and measure the latency,
size and memory of each precision on this machine.

The sidecar holds what a deployment needs besides the network: the observation
normalization (mean, var, clip), whether images are divided by 255, and the action head
(argmax, or the action bounds a [-1, 1] output is scaled to).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from quarl.errors import QuarlError
from quarl.policies.base import Policy
from quarl.quant.api import quantize
from quarl.quant.backends.onnxruntime import OrtEngine, export_onnx, has_conv
from quarl.quant.config import QuantConfig

EXPORT_PRECISIONS = ("fp32", "int8")


def _space(space: gym.spaces.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    return {"type": "box", "shape": list(space.shape), "low": np.asarray(space.low).tolist(),
            "high": np.asarray(space.high).tolist()}


def sidecar(policy: Policy, precision: str) -> dict[str, Any]:
    norm = policy.obs_normalizer
    return {
        "format": "quarl-policy/1",
        "algo": policy.algo,
        "precision": precision,
        "input": {"name": "obs", "shape": [None, *policy.input_shape], "dtype": "float32"},
        "observation_space": _space(policy.observation_space),
        "action_space": _space(policy.action_space),
        "head": policy.head,
        "n_quantiles": policy.n_quantiles,
        "scale_images": policy.scale_images,
        "obs_normalizer": None if norm is None else {"mean": np.asarray(norm.mean).tolist(),
                                                     "var": np.asarray(norm.var).tolist(),
                                                     "clip": float(norm.clip), "epsilon": float(norm.epsilon)},
    }


def model_bytes(policy: Policy, precision: str, calibration: np.ndarray | None = None) -> bytes:
    """The ONNX model of ``policy`` at ``precision`` (fp32 or int8)."""
    if precision not in EXPORT_PRECISIONS:
        raise QuarlError(f"unknown export precision {precision!r}: allowed {', '.join(EXPORT_PRECISIONS)}")
    if precision == "fp32":  # a QAT policy exports as it acts (n-bit weights, fake-quantized outputs)
        return export_onnx(policy.network, policy.input_shape)
    quantized = quantize(policy, QuantConfig(precision="int8"), calibration=calibration)
    engine = quantized.engine
    if not isinstance(engine, OrtEngine):
        raise QuarlError("int8 export needs the ONNX Runtime engine")
    return engine.model


def export_policy(policy: Policy, precision: str, out: Path, calibration: np.ndarray | None = None) -> dict[str, Any]:
    """Write ``OUT.onnx`` and ``OUT.json``; returns the sidecar with the file sizes."""
    if precision == "int8" and has_conv(policy.network) and calibration is None:
        raise QuarlError("int8 export of a CNN policy needs calibration observations")
    model = model_bytes(policy, precision, calibration)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx_path = out.with_suffix(".onnx")
    onnx_path.write_bytes(model)
    meta = {**sidecar(policy, precision), "onnx": onnx_path.name, "onnx_bytes": len(model)}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return meta


def _rss_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        import os

        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def median_us(fn: Callable[[np.ndarray], Any], x: np.ndarray, budget_s: float) -> float:
    for _ in range(3):
        fn(x)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(times) < 5:
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6


def bench_precisions(
    policy: Policy,
    inputs: np.ndarray,
    precisions: Sequence[str],
    batches: Sequence[int] = (1, 256),
    budget_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Latency (median us per call) of each precision's engine at each batch size, the
    model's size and the memory its engine took, next to PyTorch fp32. ``inputs`` are
    network inputs (preprocessed observations, e.g. from ``ptq.calibration_inputs``)."""
    x_all = inputs
    rows: list[dict[str, Any]] = []
    base: dict[int, float] = {}
    cells = [("torch-fp32", policy)]
    for label in precisions:
        before = _rss_bytes()
        quantized = quantize(policy, QuantConfig.parse(label), calibration=x_all[:256])
        cells.append((label, quantized, _rss_bytes() - before))  # type: ignore[arg-type]
    for cell in cells:
        label, p = cell[0], cell[1]
        engine = p.engine
        size = len(engine.model) if isinstance(engine, OrtEngine) else sum(
            t.numel() * t.element_size() for t in p.network.state_dict().values())
        row: dict[str, Any] = {"precision": label, "engine": type(engine).__name__, "model_bytes": size,
                               "memory_bytes": cell[2] if len(cell) > 2 else None}
        for b in batches:
            x = np.resize(x_all, (b, *x_all.shape[1:])).astype(np.float32)
            us = median_us(engine, x, budget_s)
            base.setdefault(b, us)
            row[f"b{b}_us"] = round(us, 1)
            row[f"b{b}_x"] = round(base[b] / us, 2)
        rows.append(row)
    return rows
