"""What an ActorQ run writes as it goes: each finished actor chunk counted into the
:class:`~quarl.actorq.run_state.RunState` (and TensorBoard), ``OUT/evals.csv``,
``OUT/actor_nodes.json`` and the :class:`Progress` line a caller prints."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarl.actorq.acting import ActorResult
from quarl.actorq.run_state import RunState
from quarl.actorq.summary import running_means
from quarl.core.atomic import write_atomic


@dataclass(frozen=True)
class Progress:
    """One progress line: where the run stands (``quarl actorq run`` prints it every 2 s)."""

    t_s: float
    env_steps: int
    env_steps_per_s: float
    learner_steps: int
    learner_steps_per_s: float
    last_eval: float
    """The last evaluation's mean return (NaN before the first)."""
    running_mean: float | None
    target: float | None
    version: int
    metrics: dict[str, float] = field(default_factory=dict)
    """The learner's last step (losses, and impala's mismatch)."""


def progress(state: RunState, at_s: float, metrics: Mapping[str, float], target: float | None) -> Progress:
    return Progress(
        t_s=round(at_s, 1),
        env_steps=state.env_steps,
        env_steps_per_s=state.env_steps / max(at_s, 1e-9),
        learner_steps=state.learner_steps,
        learner_steps_per_s=state.learner_steps / max(at_s, 1e-9),
        last_eval=state.evals[-1][2] if state.evals else float("nan"),
        running_mean=state.running_mean(),
        target=target,
        version=state.version,
        metrics=dict(metrics),
    )


def account(state: RunState, result: ActorResult, tb: Any) -> bool:
    """Adds a finished chunk; True when the actor ran on a node it was not on before."""
    nodes = state.actor_nodes.setdefault(result.index, [])
    moved = not nodes or nodes[-1] != result.node
    if moved:
        nodes.append(result.node)
    state.env_steps += result.steps
    state.actor_steps[result.index] = state.actor_steps.get(result.index, 0) + result.steps
    for k, v in result.times.items():
        state.actor_times[k] = state.actor_times.get(k, 0.0) + v
    state.pulls += result.pulls
    state.loads += result.loads
    state.episodes += len(result.episode_returns)
    for r in result.episode_returns:
        state.last_returns.append(r)
        tb.add_scalar(f"actor/{result.index}/return", r, state.env_steps)
    state.last_returns = state.last_returns[-20:]
    if result.steps:
        for k, v in result.times.items():
            tb.add_scalar(f"time/{k}_ms_per_step", 1000 * v / result.steps, state.env_steps)
    return moved


def write_nodes(out: Path, driver_node: str, state: RunState) -> None:
    """OUT/actor_nodes.json, rewritten as actors move: where each actor has run."""
    write_atomic(out / "actor_nodes.json",
                 json.dumps({"driver_node": driver_node, "actors": {str(k): v for k, v in state.actor_nodes.items()}}))


def write_evals(out: Path, state: RunState) -> None:
    """OUT/evals.csv, rewritten after each evaluation."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["t_s", "version", "return", "running_mean", "env_steps"])
    for (t, v, m, *steps), running in zip(state.evals, running_means(state.evals), strict=True):
        w.writerow([round(t, 3), v, round(m, 3), round(float(running), 3), *steps])
    write_atomic(out / "evals.csv", buf.getvalue())
