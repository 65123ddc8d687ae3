"""``quarl actorq compare``: the same ActorQ configuration once per actor precision and
repeat, one after the other on the same machine (precisions alternating), then the paper's table, the
convergence plot, the runtime breakdown and the energy comparison.

Each finished run leaves ``OUT/PRECISION/repN/summary.json``; a rerun skips those, so an
interrupted comparison resumes.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from quarl.actorq.config import ActorQConfig
from quarl.actorq.coordinator import OnProgress
from quarl.actorq.summary import ActorQSummary, running_means
from quarl.actorq.system import run_actorq
from quarl.core.table import Row
from quarl.evaluation.reports import save_figure, write_rows

log = logging.getLogger(__name__)

PARTS = ("inference", "env", "pull", "deserialize", "load")
SHARES = (*PARTS, "other", "rate_limit", "dispatch")
"""Parts of the actors' wall time (:func:`quarl.actorq.summarize.actor_shares`)."""


class Comparison(NamedTuple):
    table: list[Row]
    """One row per precision: time to reward, speedup and its spread, throughput, energy."""
    breakdown: list[Row]
    """One row per precision: the share of the actors' wall time each part took."""


def run_compare(
    base: ActorQConfig,
    precisions: Sequence[str],
    repeats: int,
    out: Path,
    on_run: Callable[[str, int], None] | None = None,
    on_progress: OnProgress | None = None,
) -> Comparison:
    if base.eval_every_steps is None:
        log.warning("evaluations every %g s add the same delay to every fleet's time to reward, which pulls the "
                    "speedup toward 1: --eval-freq N compares the fleets at the same learning progress",
                    base.eval_every_s)
    summaries: dict[str, list[ActorQSummary]] = {p: [] for p in precisions}
    # precisions interleaved within each repeat: a machine whose speed drifts over the hour
    # (this VM's does) then slows both sides alike
    for rep in range(repeats):
        for precision in precisions:
            run_out = out / precision / f"rep{rep}"
            done = run_out / "summary.json"
            config = replace(base, actor_precision=precision, seed=base.seed + rep, out=run_out)
            if done.exists():
                _check_same_run(done, config)
                log.info("%s rep %d: reusing %s", precision, rep, done)
            else:
                if on_run:
                    on_run(precision, rep)
                run_actorq(config, on_progress=on_progress)
            summaries[precision].append(ActorQSummary.read(done))
    rows = compare_rows(summaries)
    write_rows(rows, out, "compare")
    shares = breakdown_rows(summaries)
    write_rows(shares, out, "breakdown")
    actors = f"{base.actors} actor{'s' if base.actors > 1 else ''}"
    plot_convergence(summaries, out / "convergence.png",
                     f"{base.algo} {base.env_id}: {actors}, policy {'x'.join(map(str, base.policy_layers))}")
    plot_breakdown(summaries, out / "breakdown.png")
    plot_energy(summaries, out / "energy.png")
    return Comparison(rows, shares)


def _check_same_run(summary_path: Path, config: ActorQConfig) -> None:
    """A finished run is reused only for the configuration it ran (never another target,
    policy or address's result)."""
    from quarl.actorq.actor_precisions import actor_quant
    from quarl.core.errors import QuarlError

    summary = ActorQSummary.read(summary_path)
    stored = summary.config
    if summary.actor_quant and summary.actor_quant != actor_quant(config):  # absent in older summaries
        raise QuarlError(f"{summary_path.parent} holds a run whose actors were quantized otherwise "
                         f"({summary.actor_quant}): use another --out")
    from quarl.actorq.config import current_json

    wanted = config.to_json()
    stored = current_json(stored)  # an older summary held every algorithm's options
    ignore = {"out", "address", "local", "max_minutes"}  # where and how long, not what
    differ = sorted(k for k in wanted if k not in ignore and json.dumps(stored.get(k)) != json.dumps(wanted[k]))
    if differ:
        raise QuarlError(f"{summary_path.parent} holds a run of another configuration ({', '.join(differ[:4])} "
                         "differ): use another --out")


def _mean_std(values: list[float | None]) -> tuple[float, float]:
    vals = [v for v in values if v is not None]
    if not vals:
        return math.nan, math.nan
    return float(np.mean(vals)), float(np.std(vals))


def paired_speedups(base: list[ActorQSummary], runs: list[ActorQSummary]) -> list[float]:
    """Time-to-reward ratios of repeat k of the first precision to repeat k of another (the
    same seed), over the repeats that both reached."""
    return [b.time_to_reward_s / r.time_to_reward_s for b, r in zip(base, runs, strict=True)
            if b.reached and r.reached and b.time_to_reward_s is not None and r.time_to_reward_s]


def compare_rows(summaries: dict[str, list[ActorQSummary]]) -> list[Row]:
    """One row per precision: reward, time to reward (mean over the runs that reached the
    target, and over all runs with the others at their whole budget), speedup over the
    first precision and its range over paired repeats (same seed), env steps to the
    target, actor steps/s, bytes per broadcast, energy."""
    rows: list[Row] = []
    base_t = base_all = None
    first = next(iter(summaries.values()))
    for precision, runs in summaries.items():
        paired = paired_speedups(first, runs)
        ttr, ttr_sd = _mean_std([r.time_to_reward_s for r in runs])
        reached = sum(bool(r.reached) for r in runs)
        # a run that did not reach the target counts at its whole budget (a lower bound)
        ttr_all, _ = _mean_std([r.time_to_reward_s if r.reached else r.elapsed_s for r in runs])
        if base_t is None:
            base_t, base_all = ttr, ttr_all
        reward, _ = _mean_std([r.final_running_mean for r in runs])
        steps, _ = _mean_std([sum(r.actor_env_steps_per_s.values()) / max(len(r.actor_env_steps_per_s), 1)
                              for r in runs])
        energy = [r.energy for r in runs if r.energy.get("available")]
        rows.append({
            "actor_precision": precision,
            "reward": round(reward, 2),
            "target": runs[0].target_reward,
            "reached": f"{reached}/{len(runs)}",
            "time_to_reward_s": round(ttr, 1),
            "time_std_s": round(ttr_sd, 1),
            "speedup": round(base_t / ttr, 2) if ttr and not math.isnan(ttr) and base_t else math.nan,
            "time_all_runs_s": round(ttr_all, 1),
            "speedup_all_runs": round(base_all / ttr_all, 2) if ttr_all and base_all else math.nan,
            "speedup_min": round(min(paired), 2) if paired else math.nan,
            "speedup_max": round(max(paired), 2) if paired else math.nan,
            "env_steps_to_target": int(np.mean([r.env_steps_at_target for r in runs
                                                if r.env_steps_at_target] or [0])),
            # learner steps taken (to the target, when reached) and their rate: a faster
            # time to reward at the same rate means fewer steps were needed, i.e. run-to-run
            # variance of learning rather than faster acting
            "learner_steps": int(np.mean([r.learner_steps for r in runs])),
            "learner_steps_per_s": round(float(np.mean([r.learner_steps_per_s for r in runs])), 2),
            "actor_steps_per_s": round(steps, 1),
            # all actors together once started (worker start-up, env creation and the first pull left out)
            "steady_env_steps_per_s": _mean_known([r.steady_env_steps_per_s for r in runs], 1),
            "inference_ms": round(float(np.mean([r.actor_ms_per_step.get("inference", 0) for r in runs])), 3),
            "broadcast_bytes": int(np.mean([r.broadcast.get("bytes", 0) for r in runs])),
            "energy_wh": round(1000 * float(np.mean([e["energy_kwh"] for e in energy])), 3) if energy else math.nan,
            "co2_g": round(1000 * float(np.mean([e["co2_kg"] for e in energy])), 3) if energy else math.nan,
            **_mismatch_columns(runs),
        })
    return rows


def _mean_known(values: list[float | None], digits: int) -> float:
    """Mean of the values measured (NaN where none was: older runs, or too short)."""
    known = [v for v in values if v is not None]
    return round(float(np.mean(known)), digits) if known else math.nan


def _mismatch_columns(runs: list[ActorQSummary]) -> dict[str, float]:
    """impala: the actors' policy against the learner's (mean over the runs), and the env
    steps to the target's spread, which says whether a difference is more than run to run."""
    measured = [r.mismatch for r in runs if r.mismatch]
    if not measured:
        return {}
    to_target = [r.env_steps_at_target for r in runs if r.env_steps_at_target]
    return {"env_steps_std": int(np.std(to_target)) if to_target else 0,
            **{k: float(f"{np.mean([m[k] for m in measured]):.4g}") for k in measured[0]}}


def breakdown_rows(summaries: dict[str, list[ActorQSummary]]) -> list[Row]:
    """One row per precision (means over repeats): actor env steps/s, the share of the
    actors' wall time in each part (env step, inference, pull, deserialize, load, their own
    loop, waiting on the rate limiter, Ray's dispatch) and the learner's busy share."""
    rows: list[Row] = []
    for precision, runs in summaries.items():
        rows.append({
            "actor_precision": precision,
            "actor_steps_per_s": round(float(np.mean([np.mean(list(r.actor_env_steps_per_s.values()) or [0.0])
                                                      for r in runs])), 1),
            **{part: round(float(np.mean([r.actor_time_share.get(part, math.nan) for r in runs])), 3)
               for part in SHARES},
            "learner_busy": round(float(np.mean([r.learner_time_share.get("learning", math.nan) for r in runs])), 3),
        })
    return rows


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_convergence(summaries: dict[str, list[ActorQSummary]], path: Path, title: str) -> Path:
    """Running mean of evaluations against wall-clock time (left) and against env steps
    (right, when the runs recorded them): mean and min..max over repeats. Same curves on
    the right and apart on the left: the actors' speed, not what was learned per step."""
    plt = _plt()
    by_steps = all(len(e) > 3 for runs in summaries.values() for r in runs for e in r.evals)
    fig, axes = plt.subplots(1, 2 if by_steps else 1, figsize=(11 if by_steps else 6.5, 4), squeeze=False)
    for ax, column, label in ((axes[0][0], 0, "wall-clock time (s)"), (axes[0][-1], 3, "env steps"))[: 1 + by_steps]:
        for precision, runs in summaries.items():
            _band(ax, [(np.array([e[column] for e in r.evals], dtype=float), running_means(r.evals))
                       for r in runs if r.evals], f"{precision} actors")
        target = next(iter(summaries.values()))[0].target_reward
        if target is not None:
            ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel(label)
        ax.set_ylabel("eval return (running mean of 10)")
        ax.legend()
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def _band(ax: Any, curves: list[tuple[np.ndarray, np.ndarray]], label: str) -> None:
    """The mean of ``curves`` (x, y) on a common grid, with their min..max shaded."""
    if not curves:
        return
    grid = np.linspace(0, max(x[-1] for x, _ in curves), 100)
    ys = np.array([np.interp(grid, x, y, left=np.nan, right=y[-1]) for x, y in curves])
    with warnings.catch_warnings():  # before a run's first evaluation its curve is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(ys, axis=0)
        lo, hi = np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)
    line, = ax.plot(grid, mean, label=label)
    if len(curves) > 1:
        ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)


def plot_breakdown(summaries: dict[str, list[ActorQSummary]], path: Path) -> Path:
    """Stacked bars per precision: ms per actor env step by part (left) and the share of
    the actors' wall time each part took, waiting on the rate limiter included (right)."""
    plt = _plt()
    fig, (ax, share_ax) = plt.subplots(1, 2, figsize=(9, 4))
    names = list(summaries)
    bottom = np.zeros(len(names))
    for part in PARTS:
        vals = np.array([np.mean([r.actor_ms_per_step.get(part, 0.0) for r in runs]) for runs in summaries.values()])
        ax.bar(names, vals, bottom=bottom, label=part)
        bottom += vals
    ax.set_ylabel("ms per actor env step")
    ax.set_title("actor time per env step")
    ax.legend(fontsize=8)
    bottom = np.zeros(len(names))
    for part in SHARES:
        vals = np.array([np.mean([r.actor_time_share.get(part, 0.0) for r in runs])
                         for runs in summaries.values()])
        share_ax.bar(names, 100 * vals, bottom=bottom, label=part.replace("rate_limit", "waiting (rate limiter)"))
        bottom += 100 * vals
    share_ax.set_ylabel("% of actor wall time")
    share_ax.set_ylim(0, 100)
    share_ax.set_title("where the actors' time went")
    share_ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, path)


def plot_energy(summaries: dict[str, list[ActorQSummary]], path: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.5))
    names = list(summaries)
    for ax, key, label in ((axes[0], "energy_kwh", "energy (Wh)"), (axes[1], "co2_kg", "CO2 (g)")):
        vals = [1000 * np.mean([r.energy.get(key, np.nan) for r in runs]) for runs in summaries.values()]
        ax.bar(names, vals, color=["tab:blue", "tab:orange", "tab:green", "tab:red"][: len(names)])
        ax.set_title(label)
    method = next(iter(summaries.values()))[0].energy.get("method", "unavailable")
    fig.suptitle(f"whole run, codecarbon: {method}", fontsize=9)
    return save_figure(fig, path)
