"""What the coordinator tracks of one ActorQ run (:class:`RunState`), and the same
counters as a checkpoint holds them, read back and checked (:data:`RunStateRecord`, made
from the dataclass)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, ValidationInfo, field_validator

from quarl.actorq.summary import WINDOW, running_means
from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_record, record_of

MISMATCH_KEYS = ("kl", "rho_mean", "rho_std", "rho_clipped", "policy_lag")
"""What impala measures of the actors' policy against the learner's, averaged over the run."""


MAX_COUNT = 10**15
"""A count a run can reach (env steps, learner steps, versions...): a crafted -1e18 or 1e30
would never reach, or always pass, a budget."""
MAX_SECONDS = 1e9


def _count(value: int, info: ValidationInfo) -> int:
    if not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{info.field_name}={value!r} is not a count of this run (0..10^15): refused")
    return value


def _seconds(value: float, info: ValidationInfo) -> float:
    if not 0 <= value < MAX_SECONDS:
        raise ValueError(f"{info.field_name}={value!r} is not a duration (0..10^9 s): refused")
    return value


Count = Annotated[int, AfterValidator(_count)]
Seconds = Annotated[float, AfterValidator(_seconds)]


@dataclass
class RunState:
    """What the coordinator tracks (also what a checkpoint restores)."""

    env_steps: Count = 0
    learner_steps: Count = 0
    version: Count = 0
    elapsed_s: Seconds = 0.0
    evals: list[tuple[float, int, float, int]] = field(default_factory=list)
    """(seconds since start, weight version, mean return, env steps), at the weights' snapshot."""
    time_to_reward_s: Seconds | None = None
    env_steps_at_target: Count | None = None
    actor_times: dict[str, Seconds] = field(default_factory=dict)
    actor_steps: dict[int, Count] = field(default_factory=dict)
    actor_wait_s: Seconds = 0.0
    """Actor seconds spent idle, finished and waiting for the rate limiter to allow inserts."""
    evaluator_busy_s: Seconds | None = 0.0
    """None where the fleet could not tell (stored as missing, never as zero)."""
    driver_cpu_s: Seconds = 0.0
    """CPU seconds of this process (learner steps, and the coordinator's own work)."""
    machine_busy_s: Seconds = 0.0
    """CPU seconds the whole machine was busy (every process), for the scaling model."""
    actor_wall_s: Seconds = 0.0
    """Actor seconds inside their chunks (the parts in actor_times plus loop overhead)."""
    actor_nodes: dict[int, list[str]] = field(default_factory=dict)
    """Nodes each actor has run on, in order (a restart after its node left adds one)."""
    steady_from_s: Seconds | None = None
    """When every actor had returned its first chunk (start-up over: workers started, envs
    made, first weights pulled); steady-state rates count from here."""
    env_steps_at_steady: Count = 0
    restarts: Count = 0
    pulls: Count = 0
    loads: Count = 0
    episodes: Count = 0
    last_returns: list[float] = field(default_factory=list)

    mismatch_sums: dict[str, float] = field(default_factory=dict)
    """impala: sums over learner steps of the actor / learner mismatch (KL, ratios, lag)."""

    def add_mismatch(self, metrics: dict[str, float]) -> None:
        for k in MISMATCH_KEYS:
            self.mismatch_sums[k] = self.mismatch_sums.get(k, 0.0) + float(metrics[k])
        self.mismatch_sums["steps"] = self.mismatch_sums.get("steps", 0.0) + 1

    def mismatch(self) -> dict[str, float] | None:
        steps = self.mismatch_sums.get("steps", 0.0)
        return {k: self.mismatch_sums[k] / steps for k in MISMATCH_KEYS} if steps else None

    def running_mean(self) -> float | None:
        if not self.evals:
            return None
        return float(running_means(self.evals[-WINDOW:])[-1])


class _RunStateChecks(Record):
    @field_validator("evals", mode="before", check_fields=False)
    @classmethod
    def _rows_as_tuples(cls, rows: Any) -> Any:
        return [tuple(row) if isinstance(row, list) else row for row in rows] if isinstance(rows, list) else rows


RunStateRecord = record_of("RunStateRecord", RunState, base=_RunStateChecks,
                           required=("env_steps", "learner_steps", "version", "elapsed_s"),
                           types={"evals": list[tuple[float, int, float, int] | tuple[float, int, float]]})
"""A checkpoint's :class:`RunState`, as read back, made from the dataclass: the counters a run
needs are there, counts are non-negative whole numbers, durations non-negative seconds (an
older run's evaluations without their env steps included)."""


def check_state(path: Path, raw: Any) -> RunState:
    """The checkpoint's counters as a :class:`RunState` (a :class:`RunStateRecord` first:
    one line naming the field that does not fit)."""
    if not isinstance(raw, dict) or not raw:
        raise QuarlError(f"{path} does not hold an ActorQ run state: start afresh (no --resume)")
    record = parse_record(RunStateRecord, raw, path)
    return RunState(**{f.name: getattr(record, f.name) for f in dataclasses.fields(RunState) if f.name in raw})
