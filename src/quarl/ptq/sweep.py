"""``quarl sweep`` (fp32 against simulated n-bit weights, and activations, for each width) and
``quarl analyze`` (weight statistics and the KL divergence of n-bit weights), resumable as
``ptq`` is: each cell appended to ``OUT/results.jsonl`` as it finishes and reused."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from quarl.core.records import ResultsLog
from quarl.envs import EnvSpec
from quarl.evaluation.cells import Cell, EvalSettings, Progress, evaluate_cells, output_lock
from quarl.evaluation.record import CellRecord, KeyExtras
from quarl.evaluation.reports import plot_sweep, ptq_rows, write_rows
from quarl.policies.base import Policy
from quarl.quant.analysis import RoundingError, WeightStats, kl_by_bits, plot_histograms, plot_kl, weight_stats
from quarl.quantization.config import QuantConfig


def run_sweep(
    policy: Policy,
    env_spec: EnvSpec,
    bits: Sequence[int],
    settings: EvalSettings,
    out_dir: Path,
    base: QuantConfig,
    progress: Progress | None = None,
    title: str = "",
    source: str | None = None,
) -> list[CellRecord]:
    """Evaluate fp32 and simulated n-bit weights for each width: ``base`` (an ``nbit`` config,
    built once by the command) at that width, its scheme, granularity and block size (and layer
    outputs, where its ``activations``, with ranges calibrated on fp32 rollouts); write
    ``sweep.{csv,md,json}`` and ``sweep.png``."""
    cells = [Cell("fp32", QuantConfig())]
    for n in bits:
        config = dataclasses.replace(base, bits=n)
        key: KeyExtras = {"bits": n, "scheme": base.scheme, "granularity": base.granularity,
                          "activations": base.activations}
        cells.append(Cell(config.label, config, key))
    with output_lock(out_dir):
        records = evaluate_cells(policy, env_spec, cells, settings, ResultsLog(out_dir / "results.jsonl"), progress,
                                 source)
        rows = ptq_rows(records)
        for row, record in zip(rows, records, strict=True):
            row["bits"] = record.get("bits", 32)
        write_rows(rows, out_dir, "sweep")
        plot_sweep(records, out_dir / "sweep.png",
                   title or f"{policy.algo} {env_spec.env_id}: {base.scheme}, {base.granularity}")
    return records


def run_analyze(
    policy: Policy, bits: Sequence[int], out_dir: Path, scheme: str = "quarl", granularity: str = "auto",
    title: str = "",
) -> tuple[list[WeightStats], list[RoundingError]]:
    """Write ``weights.{csv,md,json}``, ``kl.{csv,md,json}``, ``histograms.png``, ``kl.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stats_rows = weight_stats(policy.network)
    kl_rows = kl_by_bits(policy.network, bits, scheme, granularity)
    write_rows([r.row(4) for r in stats_rows], out_dir, "weights")
    write_rows([r.row(6) for r in kl_rows], out_dir, "kl")
    title = title or policy.algo
    plot_histograms(policy.network, out_dir / "histograms.png", f"{title}: weight distributions")
    plot_kl(kl_rows, out_dir / "kl.png", f"{title}: KL divergence of n-bit weights ({scheme})")
    return stats_rows, kl_rows
