"""A study's table and plot, made from its stored records alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from quarl.core.table import Row
from quarl.evaluation.reports import (
    layer_indices,
    paired_decision,
    paper_table,
    relative_error,
    save_figure,
    write_rows,
)
from quarl.verdict import Decision, Judging


def _labels(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """checkpoint -> "algo env", with its path's last two parts where two agents share it
    (the zoo's ppo/CartPole-v1_1 and the paper's ppo2/CartPole-v1.pkl)."""
    names = {r["checkpoint"]: r["policy"] for r in records}
    count: defaultdict[str, int] = defaultdict(int)
    for name in names.values():
        count[name] += 1
    return {c: n if count[n] == 1 else f"{n} ({Path(c).parent.name}/{Path(c).name})" for c, n in names.items()}


def _by_policy(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[int, float]]]:
    """policy label -> precision -> seed -> mean return."""
    labels = _labels(records)
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        out[labels[r["checkpoint"]]][r["precision"]][r["seed"]] = r["mean"]
    return out


def _returns_by_policy(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """policy label -> precision -> every episode's return, in (seed, episode) order, so two
    precisions' lists pair episode by episode (the interval of E is paired by seed)."""
    labels = _labels(records)
    cells: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        cells[labels[r["checkpoint"]]][r["precision"]][r["seed"]] = list(r.get("returns") or [])
    return {policy: {p: [x for s in sorted(seeds) for x in seeds[s]] for p, seeds in by_precision.items()}
            for policy, by_precision in cells.items()}


def _per_policy(records: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """policy label -> one record per precision: the mean over seeds, every episode's return
    in (seed, episode) order, the env (whose own range judges the verdicts)."""
    grouped = _by_policy(records)
    episodes = _returns_by_policy(records)
    labels = _labels(records)
    env_of = {labels[r["checkpoint"]]: r.get("env_id") for r in records}
    return {policy: [{"precision": p, "mean": float(np.mean(list(seeds.values()))),
                      "returns": episodes[policy][p], "env_id": env_of.get(policy)}
                     for p, seeds in by_precision.items()]
            for policy, by_precision in grouped.items()}


def undecided(records: Sequence[Mapping[str, Any]], precisions: Sequence[str],
              judging: Judging = Judging()) -> set[tuple[str, str]]:
    """(checkpoint, precision) of every verdict against fp32 that is undecided (the
    :class:`quarl.verdict.Decision` itself, never its label parsed back)."""
    by_label = {label: checkpoint for checkpoint, label in _labels(records).items()}
    out: set[tuple[str, str]] = set()
    for policy, cells in _per_policy(records).items():
        by_precision = {c["precision"]: c for c in cells}
        base = by_precision.get("fp32")
        for p in precisions:
            if p == "fp32" or base is None or p not in by_precision:
                continue
            if paired_decision(base, by_precision[p], judging) == Decision.UNDECIDED:
                out.add((by_label[policy], p))
    return out


def study_table(records: Sequence[Mapping[str, Any]], precisions: Sequence[str],
                judging: Judging = Judging()) -> list[Row]:
    """The paper's layout (``policy fp32 fp16 E_fp16 int8 E_int8 ...``), each return the
    mean over evaluation seeds, plus the number of seeds."""
    labels = _labels(records)
    grouped = _by_policy(records)
    rows = paper_table(_per_policy(records), list(dict.fromkeys(["fp32", *precisions])), judging)
    modes: dict[str, dict[str, str]] = defaultdict(dict)
    costs: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        quant = r.get("quant")
        if quant:
            mode = quant["mode"].split("-", 1)[1]
            layers = quant.get("fp32_layers") or []
            modes[labels[r["checkpoint"]]][r["precision"]] = mode + (f" (fp32 {layer_indices(layers)})"
                                                                     if layers else "")
        if r.get("latency_us") is not None and r.get("model_bytes") is not None:
            costs[labels[r["checkpoint"]]][r["precision"]].append((r["model_bytes"], r["latency_us"]))
    for row in rows:
        policy = str(row["policy"])
        row["seeds"] = len(grouped[policy]["fp32"])
        if modes.get(policy):
            row["int modes"] = ", ".join(f"{p}: {m}" for p, m in modes[policy].items())
        for precision, measured in costs.get(policy, {}).items():  # each engine's size and batch-1 speed
            row[f"{precision} kB"] = round(float(np.mean([b for b, _ in measured])) / 1000, 1)
            row[f"{precision} us"] = round(float(np.median([us for _, us in measured])), 1)
    return rows


def plot_study(records: Sequence[Mapping[str, Any]], precisions: Sequence[str], path: Path, title: str) -> Path:
    """E% (reward lost against fp32, per seed) for each precision: one marker per policy
    (side by side, not joined: precisions are categories), mean and min..max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [p for p in dict.fromkeys(precisions) if p != "fp32"]
    fig, ax = plt.subplots(figsize=(7, 4))
    policies = sorted(_by_policy(records).items())
    width = 0.7 / max(len(policies), 1)
    for k, (policy, by_precision) in enumerate(policies):
        base = by_precision.get("fp32", {})
        xs, mean, low, high = [], [], [], []
        for i, p in enumerate(labels):
            errors = [relative_error(base[s], r) for s, r in by_precision.get(p, {}).items() if s in base]
            if errors:
                xs.append(i - 0.35 + width * (k + 0.5))
                mean.append(np.mean(errors))
                low.append(np.mean(errors) - min(errors))
                high.append(max(errors) - np.mean(errors))
        if xs:
            ax.errorbar(xs, mean, yerr=[low, high], marker="o", capsize=2, linestyle="none", label=policy)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("precision")
    ax.set_ylabel("E% = (R_fp32 - R_q) / |R_fp32|")
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:  # a study of fp32 alone has no E to plot
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def write_study_report(records: Sequence[Mapping[str, Any]], precisions: Sequence[str], out: Path,
                       seeds: int, judging: Judging | None = None) -> list[Row]:
    """The study's table (table.csv / .md / .json) and study.png in ``out``; returns the rows
    (verdicts under ``judging``, the default :class:`quarl.verdict.Judging` where None)."""
    rows = study_table(records, precisions, judging or Judging())
    write_rows(rows, out, "table")
    plot_study(records, precisions, out / "study.png", f"{len(rows)} agents, {seeds} seeds")
    return rows
