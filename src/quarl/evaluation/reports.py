"""Tables and plots made from result records alone (dicts with ``precision``, ``mean``,
``std``, ``returns``...). Terminal tables with rich; files as CSV, Markdown and JSON; plots
as PNG with matplotlib."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.table import Table

from quarl.core.atomic import write_all_atomic, write_atomic
from quarl.core.errors import QuarlError
from quarl.core.table import CellValue, Row
from quarl.verdict import Decision, Judging, ReturnsOutsideRange, Verdict, decision, games_of, judge, relative_error

__all__ = ["CellValue", "Row", "relative_error", "verdict_columns", "ptq_rows", "quant_columns", "mode_summary",
           "paper_table", "print_table", "write_rows", "plot_sweep", "plot_verdicts", "save_figure"]


def _pairs(base: Mapping[str, Any], record: Mapping[str, Any]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str | None] | None:
    """(fp32's returns, the record's, a game index per episode or None, the env id) paired by
    episode seed; None where the episodes do not pair."""
    fp32, quant = base.get("returns"), record.get("returns")
    ends = base.get("endings"), record.get("endings")
    if fp32 and quant and len(fp32) > len(quant) and base.get("seed") == record.get("seed"):
        # fp32 played on past a cell that decided earlier (ptq --decide-episodes): episode i is seed + i on
        # both sides, so the first len(quant) of fp32's pair with it
        fp32 = fp32[: len(quant)]
        ends = (ends[0][: len(quant)] if isinstance(ends[0], list) else ends[0]), ends[1]
    if not fp32 or not quant or len(fp32) != len(quant):
        return None
    fp32_ends, quant_ends = ends
    known = all(isinstance(e, list) and len(e) == len(fp32) and all(isinstance(x, str) and x for x in e) for e in ends)
    # records without digests (older ones): episodes as games
    games = games_of(fp32_ends, quant_ends) if known and fp32_ends and quant_ends else None
    return np.asarray(fp32, float), np.asarray(quant, float), games, record.get("env_id") or base.get("env_id")


def paired_verdict(base: Mapping[str, Any], record: Mapping[str, Any], judging: Judging = Judging()) -> Verdict | None:
    """The verdict of ``record`` against the fp32 record ``base``, paired by episode seed
    (:mod:`quarl.verdict`), under ``judging``'s range; None where the episodes do not pair."""
    return _judged(judge, base, record, judging)


def paired_decision(
    base: Mapping[str, Any], record: Mapping[str, Any], judging: Judging = Judging()
) -> Decision | None:
    """What :func:`paired_verdict` decides, without its interval (a deciding loop's look)."""
    return _judged(decision, base, record, judging)


T = TypeVar("T")


def _judged(how: Callable[..., T], base: Mapping[str, Any], record: Mapping[str, Any], judging: Judging) -> T | None:
    pairs = _pairs(base, record)
    if pairs is None:
        return None
    fp32, quant, games, env_id = pairs
    try:
        return how(fp32, quant, games=games, env_id=env_id, returns=judging.return_range, insure=judging.insure)
    except ReturnsOutsideRange as exc:  # a --return-range the returns break: refused, never clipped
        raise QuarlError(f"{record.get('precision', '')}: {exc}") from None


class NotMeaningful(str):
    """A cell that says why a number means nothing here (``n/a (fp32 mean ~ 0)``): its text
    in the terminal, Markdown and CSV, null in JSON (as an absent number is)."""


E_NOT_MEANINGFUL = NotMeaningful("n/a (fp32 mean ~ 0)")
"""``E%`` where fp32's mean return cannot be told from 0 (:attr:`quarl.verdict.Verdict.relative`)."""


def verdict_columns(base: Mapping[str, Any] | None, record: Mapping[str, Any], prefix: str = "",
                    judging: Judging = Judging()) -> Row:
    """``E%``, its 95 % interval (``E lo``, ``E hi``), the verdict (keeps / loses /
    undecided) of ``record`` against the fp32 record ``base`` (:func:`paired_verdict`) and
    the range of returns it assumed (``range``: :meth:`quarl.verdict.ReturnRange.label`).
    Empty for fp32 itself and where the episodes do not pair. Where E means nothing (fp32's
    mean cannot be told from 0: :attr:`quarl.verdict.Verdict.relative`), ``E%`` says so
    (:data:`E_NOT_MEANINGFUL`), its interval is empty and a decided verdict names its bound
    in returns (``keeps (loss <= -0.28 returns)``)."""
    e = f"E_{prefix}" if prefix else "E"
    name = f"{prefix} verdict" if prefix else "verdict"
    span = f"{prefix} range" if prefix else "range"
    if base is None or record is base:
        return {f"{e}%": 0.0 if record is base else math.nan, f"{e} lo": "", f"{e} hi": "", name: "", span: ""}
    v = paired_verdict(base, record, judging)
    if v is None:
        return {f"{e}%": round(relative_error(base["mean"], record["mean"]), 2), f"{e} lo": "", f"{e} hi": "", name: "",
                span: ""}
    spanned = v.returns.label() if v.returns is not None else ""
    # never an E of -613 % beside [-inf, inf] and a decided verdict: the label has its bound in returns
    if not v.relative:
        return {f"{e}%": E_NOT_MEANINGFUL, f"{e} lo": "", f"{e} hi": "", name: v.label(), span: spanned}
    return {f"{e}%": round(v.e, 2), f"{e} lo": round(v.low, 2), f"{e} hi": round(v.high, 2), name: v.label(),
            span: spanned}


IDENTITY = ("algo", "env_id", "checkpoint", "policy_sha256")
"""Columns that say whose a row is (files carry them, so concatenated runs stay apart)."""


def ptq_rows(records: Sequence[Mapping[str, Any]], identity: bool = True, judging: Judging = Judging()) -> list[Row]:
    """``precision | mean | std | E% | E lo | E hi | verdict | range`` rows; E against the fp32
    record, its interval paired by episode seed; then :data:`IDENTITY` (``identity=False``
    leaves it out: the terminal's title says it)."""
    base = next((r for r in records if r["precision"] == "fp32"), None)
    with_modes = any(r.get("quant") for r in records)
    rows = []
    for r in records:
        rows.append(
            {
                "precision": r["precision"],
                "mean": round(r["mean"], 2),
                "std": round(r["std"], 2),
                **verdict_columns(base, r, judging=judging),
                "episodes": r["episodes"],
                "steps_per_s": round(r.get("steps_per_s", math.nan), 1),
                **(quant_columns(r) if with_modes else {}),
                **({k: r.get(k) or "" for k in IDENTITY} if identity else {}),
            }
        )
    return rows


def quant_columns(record: Mapping[str, Any]) -> Row:
    """Mode, fp32 layers and agreement with fp32 (calibration states) of a real int cell."""
    quant = record.get("quant")
    if not quant:
        return {"mode": "", "fp32_layers": "", "agree%": ""}
    agreement, kl, sampled = quant.get("agreement"), quant.get("kl"), quant.get("sampled_agreement")
    return {
        "mode": quant["mode"],
        "fp32_layers": layer_indices(quant.get("fp32_layers", [])) or "none",
        "agree%": "" if agreement is None or agreement != agreement else round(100 * agreement, 1),
        # a categorical head's distance between fp32's and the mode's action distributions, and how often a sampled
        # action stays the same under shared noise (what the automatic choice judges a sampling policy by)
        **({"KL": f"{kl:.2g}"} if isinstance(kl, (int, float)) and kl == kl else {}),
        **({"sampled agree%": round(100 * sampled, 1)} if isinstance(sampled, (int, float)) and sampled == sampled
           else {}),
    }


def layer_indices(layers: Sequence[int]) -> str:
    """fp32 layers by index, ``#0,#2`` (a bare ``0`` read as a count)."""
    return ",".join(f"#{i}" for i in layers)


def mode_summary(records: Sequence[Mapping[str, Any]]) -> str:
    """The int modes that ran, with fp32 layers (by index) and agreement: ``int8: static
    100%, int4: mixed (fp32 #2) 99%``."""
    parts = []
    for r in records:
        quant = r.get("quant")
        if not quant:
            continue
        layers = quant.get("fp32_layers") or []
        agreement = quant.get("agreement")
        parts.append(f"{r['precision']}: {quant['mode'].split('-', 1)[1]}"
                     + (f" (fp32 {layer_indices(layers)})" if layers else "")
                     + ("" if agreement is None else f" {100 * agreement:.0f}%"))
    return ", ".join(parts)


def paper_table(per_policy: Mapping[str, Sequence[Mapping[str, Any]]], precisions: Sequence[str],
                judging: Judging = Judging()) -> list[Row]:
    """The paper's layout: one row per policy, ``fp32 fp16 E_fp16 int8 E_int8 ...``, each
    E with its 95 % interval and verdict (paired by episode seed where the records carry
    ``returns``)."""
    rows = []
    for name, records in per_policy.items():
        by_precision = {r["precision"]: r for r in records}
        base = by_precision.get("fp32")
        row: Row = {"policy": name}
        for p in precisions:
            if p not in by_precision:
                continue
            row[p] = round(by_precision[p]["mean"], 2)
            if p != "fp32" and base is not None:
                row.update(verdict_columns(base, by_precision[p], p, judging))
        rows.append(row)
    return rows


def print_table(rows: Sequence[Mapping[str, CellValue]], title: str | None, console: Console | None = None,
                wide: bool = False) -> None:
    """``rows`` as one table; where it is wider than the terminal (and not ``wide``), as one
    field | value block per row instead, so nothing is cut or folded into a column of
    single letters (the CSV beside it keeps the wide form). Without a terminal (a log file,
    CI), a table wider than the console is the Markdown table ``write_rows`` writes, a row
    per line, whole."""
    from rich.markup import escape
    from rich.measure import Measurement

    console = console or Console()
    columns = list(dict.fromkeys(k for row in rows for k in row))
    table = Table(title=escape(title) if title else None)
    for c in columns:
        # a narrow terminal folds a cell or header onto two lines; nothing is cut to "..."
        table.add_column(escape(c), justify="left" if c in ("policy", "precision", "layer") else "right",
                         overflow="fold")
    for row in rows:
        table.add_row(*[escape(_fmt(row.get(c, ""))) for c in columns])
    natural = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
    if wide or natural <= console.width or not rows:
        console.print(table)
        return
    if not console.is_terminal:  # nobody reads blocks in a log: the rows as table.md holds them
        text = (f"{title}\n\n" if title else "") + "\n".join(markdown_lines(rows, columns))
        console.print(text, soft_wrap=True, highlight=False, markup=False, emoji=False)
        return
    if title:
        console.print(escape(title), style="italic", soft_wrap=True)
    first = columns[0]
    for row in rows:
        block = Table(title=escape(f"{first} {_fmt(row.get(first, ''))}"), show_header=False, title_justify="left")
        block.add_column(overflow="fold")
        block.add_column(overflow="fold")
        for c in columns[1:]:
            if row.get(c, "") != "":
                block.add_row(escape(c), escape(_fmt(row[c])))
        console.print(block)


def markdown_lines(rows: Sequence[Mapping[str, CellValue]], columns: Sequence[str]) -> list[str]:
    """``rows`` as a Markdown table's lines (what ``stem.md`` holds)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |" for row in rows]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.2f}"
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, NotMeaningful) or (isinstance(value, str) and value == ""):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, np.generic):
        return _json_value(value.item())
    return value


def write_rows(rows: Sequence[Mapping[str, CellValue]], out_dir: Path, stem: str) -> list[Path]:
    """``stem.csv``, ``stem.md`` and ``stem.json`` in ``out_dir``, written together through
    temporaries renamed over the old ones (a reader never sees half a table; a full disk
    leaves the old three, :func:`quarl.core.atomic.write_all_atomic`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    csv_path, md_path, json_path = (out_dir / f"{stem}.{ext}" for ext in ("csv", "md", "json"))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    lines = markdown_lines(rows, columns)
    # strict JSON: an absent value (an empty cell in the CSV) and an unmeasured one (NaN) are null
    plain = [{k: _json_value(v) for k, v in row.items()} for row in rows]
    return write_all_atomic([(csv_path, buf.getvalue()), (md_path, "\n".join(lines) + "\n"),
                             (json_path, json.dumps(plain, indent=2, allow_nan=False) + "\n")])


def plot_sweep(records: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Reward (mean +/- std) against bits, with the fp32 reward as a line: the paper's
    "sweet spot" figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted((r for r in records if r.get("bits")), key=lambda r: -r["bits"])
    base = next((r for r in records if r["precision"] == "fp32"), None)
    fig, ax = plt.subplots(figsize=(6, 4))
    bits = [r["bits"] for r in points]
    means = [r["mean"] for r in points]
    stds = [r["std"] for r in points]
    ax.errorbar(bits, means, yerr=stds, marker="o", capsize=3, label="n-bit weights")
    if base is not None:
        ax.axhline(base["mean"], color="k", linestyle="--", label=f"fp32 ({base['mean']:.1f})")
        ax.axhspan(base["mean"] - base["std"], base["mean"] + base["std"], color="k", alpha=0.08)
    ax.set_xlabel("bits")
    ax.set_ylabel("mean return")
    ax.set_xticks(bits)
    ax.invert_xaxis()
    ax.set_title(title)
    ax.legend()
    return save_figure(fig, path)


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out, write as PNG and free a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120))
    finally:
        plt.close(fig)
    return path


def plot_verdicts(per_policy: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str,
                  judging: Judging = Judging()) -> Path:
    """E% with its 95 % interval (paired by seed) for every policy and precision against
    fp32, the 5 % tolerance as a band: what the tables' verdict columns say, at a glance.
    One row of points per policy; each precision its own marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quarl.verdict import TOLERANCE

    names = list(per_policy)
    precisions = list(dict.fromkeys(r["precision"] for rs in per_policy.values() for r in rs
                                    if r["precision"] != "fp32"))
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(names) * max(1, len(precisions)) ** 0.5))
    offsets = np.linspace(-0.25, 0.25, len(precisions)) if len(precisions) > 1 else [0.0]
    for j, precision in enumerate(precisions):
        ys, es, lows, highs = [], [], [], []
        for i, name in enumerate(names):
            by = {r["precision"]: r for r in per_policy[name]}
            if precision not in by or "fp32" not in by:
                continue
            v = paired_verdict(by["fp32"], by[precision], judging)
            if v is None or not v.relative:  # no E to draw where fp32's mean cannot be told from 0
                continue
            e = round(v.e, 2)  # as the tables print it
            ys.append(i + offsets[j])
            es.append(e)
            lows.append(e - round(v.low, 2))
            highs.append(round(v.high, 2) - e)
        ax.errorbar(es, ys, xerr=[lows, highs], fmt="o", capsize=3, label=precision)
    ax.axvspan(-TOLERANCE, TOLERANCE, color="g", alpha=0.08, label=f"within {TOLERANCE:.0f} %")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("E, % of fp32's return lost (95 % interval, paired by seed)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)
