"""``quarl bench``: each precision's latency (median per call at each batch size) and size on
this machine, next to PyTorch fp32 and ONNX Runtime fp32, and the files it writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from quarl.core.atomic import write_atomic
from quarl.core.provenance import provenance
from quarl.core.table import Row
from quarl.core.timing import median_us
from quarl.envs import EnvSpec
from quarl.evaluation.calibration import calibration_inputs, calibration_returns
from quarl.evaluation.reports import write_rows
from quarl.policies.base import Policy
from quarl.quant.backends.onnxruntime import OrtEngine, export_onnx
from quarl.quantization.api import quantize
from quarl.quantization.choice import Returns
from quarl.quantization.config import QuantConfig


def bench_precisions(
    policy: Policy,
    inputs: np.ndarray,
    precisions: Sequence[QuantConfig],
    batches: Sequence[int] = (1, 256),
    budget_s: float = 1.0,
    returns: Returns | None = None,
    as_exported: bool = False,
) -> list[Row]:
    """Latency (median us per call) of each precision's engine at each batch size (``precisions``:
    configs, as the command parses them once), the model's size, next to PyTorch fp32 (the
    ``fp32`` row) and ONNX Runtime fp32 (``fp32-ort``). ``inputs`` are network inputs (preprocessed observations from
    ``ptq.calibration_inputs``) and, with ``returns``, choose the int modes as ``ptq``
    does. ``as_exported``: ``policy`` is an exported model (no float network to quantize
    or compare with): its own engine alone, one row, the ``x`` columns against itself.
    (Process memory is not reported: ONNX Runtime's arenas, not the model, set it.)"""
    x_all = inputs
    rows: list[Row] = []
    base: dict[int, float] = {}
    if as_exported:
        cells: list[tuple[str, Policy | OrtEngine]] = [(policy.precision, policy)]
        precisions = []
    else:
        ort_fp32 = OrtEngine(export_onnx(policy.network, policy.input_shape))
        cells = [("fp32", policy), ("fp32-ort", ort_fp32)]
    for config in precisions:
        if config.label != "fp32":  # the baseline row
            cells.append((config.label, quantize(policy, config, calibration=x_all[:256], returns=returns)))
    for label, p in cells:
        engine = p.engine if isinstance(p, Policy) else p
        assert engine is not None  # a Policy gets its engine at construction
        size = p.size_bytes() if isinstance(p, Policy) else len(p.model)
        quant = p.meta.get("quant") if isinstance(p, Policy) else None
        row: Row = {"precision": label, "engine": "onnxruntime" if as_exported else type(engine).__name__,
                               "mode": quant["mode"] if quant else "", "model_bytes": size}
        for b in batches:
            x = np.resize(x_all, (b, *x_all.shape[1:])).astype(np.float32)
            us = median_us(engine, x, budget_s)
            base.setdefault(b, us)
            row[f"b{b}_us"] = round(us, 1)
            row[f"b{b}_x"] = round(base[b] / us, 2)
        rows.append(row)
    return rows


def bench_checkpoint(policy: Policy, env_spec: EnvSpec, precisions: Sequence[QuantConfig], batches: Sequence[int],
                     budget_s: float, as_exported: bool = False) -> list[Row]:
    """Latency rows of ``policy`` at each precision (an exported model: as exported, alone),
    timed on the calibration seeds' states; int modes chosen as ``ptq`` chooses them."""
    inputs = calibration_inputs(policy, env_spec)
    if as_exported:
        return bench_precisions(policy, inputs, [], batches, budget_s, as_exported=True)
    return bench_precisions(policy, inputs, precisions, batches, budget_s, calibration_returns(env_spec))


def write_bench(rows: Sequence[Row], out: Path, checkpoint: Path, policy: Policy) -> list[Path]:
    """bench.csv / .md / .json and provenance.json (what was timed, on what) in ``out``."""
    written = write_rows(rows, out, "bench")
    record = {"checkpoint": str(checkpoint), "policy_sha256": policy.fingerprint(), **provenance()}
    write_atomic(out / "provenance.json", json.dumps(record, indent=1))
    return [*written, out / "provenance.json"]
