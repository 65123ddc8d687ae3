"""``quarl ptq``: evaluate a policy at several precisions, play on until the verdicts decide
(:func:`decide`), or evaluate an exported model as it is (:func:`run_artifact`).

Each evaluated cell is appended to ``OUT/results.jsonl`` as soon as it finishes and is
reused when the same command runs again, so an interrupted run resumes; the tables and
plots are rebuilt from those records. How a cell is measured, calibrated and keyed is
:mod:`quarl.evaluation.cells`. One run at a time writes to an output folder (a lock).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quarl.core.errors import QuarlError
from quarl.core.records import ResultsLog
from quarl.envs import EnvSpec
from quarl.evaluation.cells import Cell, EvalSettings, Progress, evaluate_cells, output_lock
from quarl.evaluation.record import CellRecord
from quarl.evaluation.reports import paired_decision, plot_verdicts, ptq_rows, write_rows
from quarl.policies.base import Policy
from quarl.quantization.config import QuantConfig, as_config
from quarl.verdict import CHUNK, Decision, Judging

log = logging.getLogger(__name__)


def run_ptq(
    policy: Policy,
    env_spec: EnvSpec,
    precisions: Sequence[QuantConfig | str],
    settings: EvalSettings,
    out_dir: Path,
    progress: Progress | None = None,
    source: str | None = None,
    fixed: dict[str, Policy] | None = None,
    decide_episodes: int = 0,
    decide_seconds: float | None = None,
    judging: Judging = Judging(),
) -> list[CellRecord]:
    """Evaluate each precision (fp32 first, for E); write ``ptq.{csv,md,json}`` and
    ``ptq.png`` (E per precision with its interval).
    ``fixed``: policies evaluated as they are under a label instead of quantizing ``policy``
    (a recovered folder: ``fp32`` is the original policy, ``int4`` its recovered kernel).
    ``decide_episodes``: play more episodes where a verdict is undecided, up to this many per
    cell (:func:`decide`), starting no new chunk after ``decide_seconds`` (wall clock, from
    the start; None: no limit); ``judging``: the verdicts' range (``--insure``,
    ``--return-range``). ``precisions``: configs, as the commands parse them once onto their
    options (a label a Python caller writes is parsed once, here, with the default options); fp32
    is played first, at their options (:meth:`~quarl.quantization.config.QuantConfig.at_fp32`)."""
    given = [as_config(p) for p in precisions]
    fp32 = given[0].at_fp32() if given else QuantConfig()
    configs = {c.label: c for c in [fp32, *given]}  # fp32 first, each label once
    fixed = fixed or {}
    cells = [Cell(label, config, policy=fixed.get(label)) for label, config in configs.items()]
    deadline = None if decide_seconds is None else time.monotonic() + decide_seconds
    with output_lock(out_dir):
        log_file = ResultsLog(out_dir / "results.jsonl")
        records = evaluate_cells(policy, env_spec, cells, settings, log_file, progress, source)
        if decide_episodes > settings.episodes:
            records = decide(policy, env_spec, cells, settings, log_file, records, decide_episodes, progress, source,
                             deadline, judging)
        write_rows(ptq_rows(records, judging=judging), out_dir, "ptq")
        if len(records) > 1:
            plot_verdicts({env_spec.env_id: records}, out_dir / "ptq.png",
                          f"{env_spec.env_id}, {episodes_played(records, settings.episodes)}", judging)
    return records


def episodes_played(records: Sequence[Mapping[str, Any]], asked: int) -> str:
    """``"20 episodes"``, or ``"20..160 episodes"`` where deciding played more in some cells."""
    counts = sorted({int(r.get("episodes") or asked) for r in records}) or [asked]
    return f"{counts[0]} episodes" if len(counts) == 1 else f"{counts[0]}..{counts[-1]} episodes"


def decide(policy: Policy, env_spec: EnvSpec, cells: Sequence[Cell], settings: EvalSettings, log_file: ResultsLog,
           records: list[CellRecord], budget: int, progress: Progress | None = None,
           source: str | None = None, deadline: float | None = None, judging: Judging = Judging()) -> list[CellRecord]:
    """Verdicts that decide: while a cell's verdict is undecided and it has played fewer
    than ``budget`` episodes, fp32 and the undecided cells play :data:`quarl.verdict.CHUNK`
    more episodes (or one per worker, if more) on the next seeds, each chunk a stored cell
    of its own, reused by a rerun, its policy quantized once; decided cells stop, and no new
    chunk starts after ``deadline`` (:func:`time.monotonic`). The verdict's confidence
    sequence is valid at every look, so stopping when it decides does not inflate its error
    rate (:mod:`quarl.verdict`). Returns the records joined per precision (a cell's episodes
    are seeds ``seed``, ``seed + 1``..., fp32's first ones pair with every cell)."""
    joined = {r.precision: r for r in records}
    played = settings.episodes
    built: dict[str, tuple[Policy, float]] = {}
    chunk_size = max(CHUNK, settings.workers or 1)
    while played < budget:
        base = joined.get("fp32")
        undecided = [label for label, record in joined.items() if label != "fp32" and record.episodes == played
                     and base is not None and _undecided(base, record, judging)]
        if not undecided:
            break
        if deadline is not None and time.monotonic() > deadline:
            log.warning("%s undecided after %d episodes: the time budget is spent", ", ".join(undecided), played)
            break
        more = min(chunk_size, budget - played)
        try:
            chunk = dataclasses.replace(settings, episodes=more, seed=settings.seed + played)
        except QuarlError as exc:  # the next seeds would reach reserved ones
            log.warning("undecided verdicts stay undecided: %s", exc)
            break
        log.info("%s undecided after %d episodes: %d more on seeds %d..%d", ", ".join(undecided), played, more,
                 chunk.seed, chunk.seed + more - 1)
        offset = played
        step = evaluate_cells(policy, env_spec, [c for c in cells if c.label in ("fp32", *undecided)], chunk, log_file,
                              (lambda c, n: progress(c, offset + n)) if progress else None, source, built)
        for record in step:
            joined[record.precision] = joined[record.precision].joined(record)
        played += more
    return [joined[r.precision] for r in records]


def _undecided(base: CellRecord, record: CellRecord, judging: Judging) -> bool:
    return paired_decision(base, record, judging) == Decision.UNDECIDED


def run_artifact(policy: Policy, env_spec: EnvSpec, settings: EvalSettings, out_dir: Path,
                 progress: Progress | None = None, source: str | None = None) -> list[CellRecord]:
    """Evaluate an exported model as it is (one cell labelled with its precision, e.g.
    ``int8 (onnx)``); write ``ptq.{csv,md,json}``."""
    cells = [Cell(policy.precision, QuantConfig(), policy=policy)]
    with output_lock(out_dir):
        records = evaluate_cells(policy, env_spec, cells, settings, ResultsLog(out_dir / "results.jsonl"), progress,
                                 source)
        write_rows(ptq_rows(records), out_dir, "ptq")
    return records
