"""QAT against PTQ, as in the paper's QAT figure: for one algorithm and env, train an fp32
policy and one QAT policy per bit width with the same budget and seed, then evaluate

- PTQ: the fp32 policy with its weights rounded to n bits (and the real int8 kernel, "int8 real");
- QAT: each QAT policy as it was trained (n-bit weights and activations).

Runs are kept under ``OUT/runs`` and reused; every evaluation is appended to
``OUT/results.jsonl`` and reused, so an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.core.records import ResultsLog
from quarl.core.table import Row
from quarl.evaluation.cells import Cell, EvalSettings, evaluate_cells
from quarl.evaluation.record import KeyExtras
from quarl.evaluation.reports import relative_error, save_figure, write_rows
from quarl.quantization.config import QATConfig, QuantConfig
from quarl.training.periodic_saves import has_checkpoint
from quarl.training.sb3_train import TrainConfig, resolve_timesteps, train

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QATStudy:
    """One QAT-vs-PTQ comparison."""

    algo: str
    env_id: str
    bits: tuple[int, ...] = (8, 6, 4, 3, 2)
    timesteps: int | None = None
    """Training budget of every run (None: the RL Zoo's)."""
    quant_delay: int | None = None
    """Env steps before fake quantization starts; None: half the budget (the paper's default)."""
    seed: int = 0
    scheme: str = "quarl"
    hyperparams: tuple[tuple[str, Any], ...] = ()
    """Overrides of the zoo's hyperparameters, as (key, value) pairs."""


def _run(study: QATStudy, out: Path, name: str, qat: QATConfig | None, total: int, progress_bar: bool) -> Path:
    run_dir = out / "runs" / name
    final = run_dir / f"{study.env_id.replace('/', '_')}.zip"
    if final.exists():
        log.info("%s: reusing %s", name, run_dir)
        return run_dir
    config = TrainConfig(
        study.algo, study.env_id, timesteps=total, seed=study.seed, qat=qat, hyperparams=dict(study.hyperparams),
        run_dir=run_dir, progress_bar=progress_bar, eval_freq=max(total // 10, 1),
    )
    resume = has_checkpoint(run_dir)
    train(config, resume=resume)
    return run_dir


def run_qat_study(
    study: QATStudy,
    settings: EvalSettings,
    out: Path,
    on_stage: Callable[[str], None] | None = None,
    progress_bar: bool = False,
) -> list[Row]:
    """Train what is missing, evaluate, write ``qat.{csv,md,json}`` and ``qat.png``; returns the table's rows."""
    total = resolve_timesteps(study.algo, study.env_id, study.timesteps, dict(study.hyperparams))
    delay = study.quant_delay if study.quant_delay is not None else total // 2
    if not 0 <= delay < total:
        raise QuarlError(f"quant delay {delay} must be in 0..{total - 1} (below the training length {total})")
    qat_configs = {n: QATConfig(bits=n, quant_delay=delay, scheme=study.scheme) for n in study.bits}
    stage = on_stage or (lambda _text: None)

    suffix = f"seed{study.seed}-{total}"
    stage(f"training fp32 ({total} steps)")
    base_run = _run(study, out, f"fp32-{suffix}", None, total, progress_bar)
    qat_runs = {}
    for n, qat in qat_configs.items():
        stage(f"training QAT {n}-bit ({total} steps, delay {delay})")
        qat_runs[n] = _run(study, out, f"qat{n}-{study.scheme}-delay{delay}-{suffix}", qat, total, progress_bar)

    stage("evaluating")
    base = load_checkpoint(base_run)
    spec = base.env_spec
    assert spec is not None  # a run folder quarl trained names its env
    common: KeyExtras = {"timesteps": total, "quant_delay": delay, "train_seed": study.seed}
    cells = [Cell("fp32", QuantConfig(), {"method": "fp32", **common}),
             Cell("int8", QuantConfig(precision="int8"), {"method": "ptq", "bits": 8, "real_int8": True, **common})]
    for n in study.bits:
        config = QuantConfig(precision="nbit", bits=n, scheme=study.scheme)
        cells.append(Cell(f"ptq{n}", config, {"method": "ptq", "bits": n, "scheme": study.scheme, **common}))
        # QAT quantizes layer outputs too: PTQ of weights and (calibrated) outputs is its like-for-like baseline
        config = QuantConfig(precision="nbit", bits=n, scheme=study.scheme, activations=True)
        cells.append(Cell(f"ptqa{n}", config, {"method": "ptq_act", "bits": n, "scheme": study.scheme, **common}))
    for n, run_dir in qat_runs.items():
        qat_policy = load_checkpoint(run_dir).policy
        if qat_policy.precision != f"qat{n}":
            raise QuarlError(f"{run_dir} did not train quantized (its quant delay was never reached)")
        cells.append(Cell(f"qat{n}", QuantConfig(), {"method": "qat", "bits": n, "scheme": study.scheme, **common},
                          policy=qat_policy))
    records = evaluate_cells(base.policy, spec, cells, settings, ResultsLog(out / "results.jsonl"), None)
    rows = study_rows(records)
    write_rows(rows, out, "qat")
    plot_qat(records, out / "qat.png", f"{study.algo} {study.env_id}: QAT vs PTQ ({total} steps, delay {delay})")
    return rows


COLUMNS = (("ptq", "PTQ_w"), ("ptq_act", "PTQ_wa"), ("qat", "QAT_wa"))
"""Methods as table columns: PTQ of weights only, PTQ of weights and layer outputs
(ranges calibrated on fp32 rollouts), QAT (weights and layer outputs, trained)."""


REAL_INT8 = "int8 real"
"""The row of the real int8 kernel (PTQ only: QAT's runs are simulated n-bit)."""


def study_rows(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """``bits | PTQ_w | PTQ_wa | QAT_wa`` (and E% of each) with the fp32 and real-int8
    (``int8 real``) rows first; a cell a method has no run for is empty."""
    base = next(r for r in records if r["method"] == "fp32")
    by = {(r["method"], r.get("bits"), r.get("real_int8", False)): r for r in records}

    def row(label: str, cells: Mapping[str, Mapping[str, Any] | None]) -> Row:
        out: Row = {"bits": label}
        for _, col in COLUMNS:
            r = cells.get(col)
            out[col] = round(r["mean"], 2) if r else ""
            out[f"E_{col}%"] = round(relative_error(base["mean"], r["mean"]), 2) if r else ""
        return out

    rows = [row("fp32", {col: base for _, col in COLUMNS})]
    real = by.get(("ptq", 8, True))
    if real is not None:
        rows.append(row(REAL_INT8, {"PTQ_w": real}))
    widths = sorted({r["bits"] for r in records if r["method"] in ("qat", "ptq_act")
                     or (r["method"] == "ptq" and not r.get("real_int8"))}, reverse=True)
    for n in widths:
        rows.append(row(str(n), {col: by.get((method, n, False)) for method, col in COLUMNS}))
    return rows


def plot_qat(records: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """The paper's QAT figure: x = fp32, int8 real, 8, 7, ... 2; one line for PTQ, one for QAT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = study_rows(records)
    labels = [str(r["bits"]) for r in rows]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    styles = {"PTQ_w": ("o", "PTQ (weights)"), "PTQ_wa": ("^", "PTQ (weights + activations)"),
              "QAT_wa": ("s", "QAT (weights + activations)")}
    for _, col in COLUMNS:
        pts = [(i, float(v)) for i, r in zip(x, rows, strict=True) if isinstance(v := r[col], (int, float))]
        marker, label = styles[col]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
    ax.set_xticks(x, labels)
    ax.set_xlabel("bits (int8 real: the real int8 kernel)")
    ax.set_ylabel("mean return")
    ax.set_title(title, fontsize=10)
    ax.legend()
    return save_figure(fig, path)
