"""The ActorQ run: a full-precision learner in this process, quantized actors and a
parameter broadcaster in a fleet (Ray, or this process with ``local=True``).

Coordinator loop::

    publish(version 0); start every actor on a chunk of env steps
    until the running mean of evaluations reaches the target, or time is up:
        insert finished actor chunks into replay; restart an actor that died
        restart idle actors while the rate limiter allows inserts
        learner steps while the rate limiter allows samples; publish every push_period
        evaluate the learner's fp32 policy every eval_every_s (a busy evaluator skips one),
            or every eval_every_steps env steps (a busy evaluator delays one); own envs
        checkpoint every checkpoint_every_s; log to TensorBoard; print a progress line

Everything measured goes to ``OUT/summary.json``, ``OUT/evals.csv`` and ``OUT/tb``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable

import numpy as np
import torch
from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, field_validator

from quarl.actorq.acting import ActorResult, EnvInfo, actor_quant, env_info
from quarl.actorq.config import ActorQConfig
from quarl.actorq.fleet import ActorFailure, Fleet
from quarl.actorq.algorithms import get_algorithm, make_learner
from quarl.actorq.replay import QueueLimiter, RateLimiter, Replay, UnrollQueue
from quarl.actorq.summary import WINDOW, ActorQSummary, running_means
from quarl.errors import QuarlError, StoppedRun
from quarl.file_schema import Record, parse_record
from quarl.provenance import provenance

log = logging.getLogger(__name__)

MISMATCH_KEYS = ("kl", "rho_mean", "rho_std", "rho_clipped", "policy_lag")
"""What impala measures of the actors' policy against the learner's, averaged over the run."""
QUEUE_DEPTH = 2
"""Chunks queued per actor."""
LEARNER_SLICE_S = 0.02
"""Learner time between two polls of the actors (at least one step)."""


@dataclass
class RunState:
    """What the coordinator tracks (also what a checkpoint restores)."""

    env_steps: int = 0
    learner_steps: int = 0
    version: int = 0
    elapsed_s: float = 0.0
    evals: list[tuple[float, int, float, int]] = field(default_factory=list)
    """(seconds since start, weight version, mean return, env steps), at the weights' snapshot."""
    time_to_reward_s: float | None = None
    env_steps_at_target: int | None = None
    actor_times: dict[str, float] = field(default_factory=dict)
    actor_steps: dict[int, int] = field(default_factory=dict)
    actor_wait_s: float = 0.0
    """Actor seconds spent idle, finished and waiting for the rate limiter to allow inserts."""
    evaluator_busy_s: float | None = 0.0
    """None where the fleet could not tell (stored as missing, never as zero)."""
    driver_cpu_s: float = 0.0
    """CPU seconds of this process (learner steps, and the coordinator's own work)."""
    machine_busy_s: float = 0.0
    """CPU seconds the whole machine was busy (every process), for the scaling model."""
    actor_wall_s: float = 0.0
    """Actor seconds inside their chunks (the parts in actor_times plus loop overhead)."""
    actor_nodes: dict[int, list[str]] = field(default_factory=dict)
    """Nodes each actor has run on, in order (a restart after its node left adds one)."""
    steady_from_s: float | None = None
    """When every actor had returned its first chunk (start-up over: workers started, envs
    made, first weights pulled); steady-state rates count from here."""
    env_steps_at_steady: int = 0
    restarts: int = 0
    pulls: int = 0
    loads: int = 0
    episodes: int = 0
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


def _target(config: ActorQConfig, info: EnvInfo) -> float | None:
    if config.target_reward is not None:
        return config.target_reward
    return info.reward_threshold


def make_replay(config: ActorQConfig) -> Replay | UnrollQueue:
    """The algorithm's replay or unroll queue (its registry entry)."""
    return get_algorithm(config.algo).make_replay(config)


def make_limiter(config: ActorQConfig, replay: Replay | UnrollQueue) -> RateLimiter | QueueLimiter:
    """The algorithm's rate limiter between inserts and samples (its registry entry)."""
    return get_algorithm(config.algo).make_limiter(config, replay)


def make_fleet(config: ActorQConfig, info: EnvInfo) -> Fleet:
    if config.local:
        from quarl.actorq.local_fleet import LocalFleet

        return LocalFleet(config, info)
    from quarl.actorq.ray_fleet import RayFleet

    return RayFleet(config, info)


def run_actorq(
    config: ActorQConfig,
    resume: bool = False,
    on_progress: Callable[[RunState, dict[str, Any]], None] | None = None,
    on_tick: Callable[[RunState, Fleet], bool | None] | None = None,
) -> ActorQSummary:
    """Train until the target reward or the time budget; return the summary. ``on_tick(state,
    fleet)`` is called once per pass of the loop; returning True ends the run there, as a
    spent budget would (a caller's own stopping rule)."""
    from quarl.training.guard import NonFiniteTraining

    torch.set_num_threads(1)
    algorithm = get_algorithm(config.algo)
    info = env_info(config)
    target = _target(config, info)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    learner = make_learner(config, info.obs_dim, info.act_dim, info.discrete)
    replay = make_replay(config)
    limiter = make_limiter(config, replay)
    state = RunState()
    ckpt_path = out / "checkpoint.pt"
    if resume:
        state = _restore(ckpt_path, learner, replay, limiter, config)
        log.info("resumed from %s at %.0f s, %d learner steps", ckpt_path, state.elapsed_s, state.learner_steps)
    from torch.utils.tensorboard import SummaryWriter

    fleet = make_fleet(config, info)  # first: a cluster that cannot be reached fails before anything is written
    tb = SummaryWriter(str(out / "tb"))
    energy = _energy_tracker(out)
    started = time.perf_counter() - state.elapsed_s
    cpu_started = time.process_time()
    machine_started = _machine_busy_s()
    now = lambda: time.perf_counter() - started  # noqa: E731
    try:
        state.version += 1
        fleet.publish(state.version, learner.weights())
        untrained = state.version if state.learner_steps == 0 else None  # the initial weights' version
        # each actor has up to QUEUE_DEPTH chunks queued, so it starts the next one while the
        # coordinator is still busy with learner steps (no idle round trip per chunk)
        in_flight = {i: 0 for i in range(config.actors)}
        idle_since = {i: now() for i in in_flight}
        next_eval = next_ckpt = next_line = now()
        next_eval_steps = eval_env_steps = state.env_steps
        next_ckpt += config.checkpoint_every_s
        learner_t, metrics = 0.0, {}
        while now() < config.max_minutes * 60 and (config.max_env_steps is None
                                                    or state.env_steps < config.max_env_steps):
            for result in fleet.ready(timeout_s=0.0 if limiter.can_sample(config.batch_size) else 0.02):
                if isinstance(result, ActorFailure):
                    state.restarts += 1
                    if state.restarts > max_restarts(config):  # a bug, not a lost node: restarting would loop
                        state.elapsed_s = now()
                        _checkpoint(ckpt_path, learner, replay, limiter, state, config)
                        raise QuarlError(f"actors died {state.restarts} times, the last: actor {result.index}, "
                                         f"{result.error}; stopped (what was learnt is in {ckpt_path}, --resume "
                                         "continues once the cause is fixed)")
                    log.warning("actor %d died (%s): restarting it", result.index, result.error)
                    fleet.restart(result.index)  # drops the dead actor's other queued chunks
                    in_flight[result.index] = 0
                    idle_since[result.index] = now()
                    continue
                if _account(state, result, tb, now()):
                    _write_nodes(out, fleet.node, state)
                if state.steady_from_s is None and len(state.actor_steps) >= config.actors:
                    state.steady_from_s, state.env_steps_at_steady = now(), state.env_steps
                state.actor_wall_s += result.wall_s
                in_flight[result.index] = max(0, in_flight[result.index] - 1)
                if in_flight[result.index] == 0:
                    idle_since[result.index] = now()
                if result.batch is not None:
                    n = replay.insert(result.batch)
                    limiter.inserted(n)
            for depth in range(QUEUE_DEPTH):  # first one chunk for every actor, then a second
                for index in in_flight:
                    queued = sum(in_flight.values())
                    if in_flight[index] == depth and limiter.can_insert(config.chunk_steps * (queued + 1)):
                        fleet.submit(index, config.chunk_steps)
                        if depth == 0:
                            state.actor_wait_s += now() - idle_since.pop(index, now())
                        in_flight[index] += 1
            t = time.perf_counter()
            for _ in range(32):
                # on Ray, back to the actors' results after a slice (in-process actors wait anyway)
                if not limiter.can_sample(config.batch_size) or (
                        not config.local and time.perf_counter() - t > LEARNER_SLICE_S):
                    break
                batch = replay.sample(config.batch_size)
                metrics = learner.step(batch)
                bad = non_finite_metric(metrics)
                if bad:  # stop before the weights reach the actors or a checkpoint (training's guard)
                    raise NonFiniteTraining(state.env_steps, f"{bad} at learner step {state.learner_steps + 1:,}")
                if "priority" in metrics:
                    replay.update_priorities(batch.index, metrics.pop("priority"))
                if algorithm.unrolls:  # how old the actors' weights were, in versions
                    metrics["policy_lag"] = float(state.version - np.mean(batch.version))
                    state.add_mismatch(metrics)
                limiter.sampled(len(batch) if algorithm.unrolls else config.batch_size)
                state.learner_steps += 1
                if state.learner_steps % config.push_period == 0:
                    state.version += 1
                    fleet.publish(state.version, learner.weights())
            learner_t += time.perf_counter() - t
            due = state.env_steps >= next_eval_steps if config.eval_every_steps else now() >= next_eval
            if due and not config.eval_every_steps:
                next_eval = now() + config.eval_every_s  # a busy evaluator skips this slot
            # (spaced in env steps, a busy evaluator delays it to a later pass); the weights
            # are copied only for an evaluation that starts
            if due and fleet.evaluator_idle():
                fleet.evaluate(state.version, learner.weights(), now())
                eval_env_steps = state.env_steps  # one evaluation in flight at a time
                next_eval_steps = state.env_steps + (config.eval_every_steps or 0)
            for at_s_version in fleet.evaluations():
                version, mean, at_s = at_s_version
                state.evals.append((at_s, version, mean, eval_env_steps))
                _write_eval(out, state)
                tb.add_scalar("eval/return", mean, state.env_steps)
                tb.add_scalar("eval/running_mean", state.running_mean(), state.env_steps)
                # the running mean covers the last WINDOW evaluations (fewer at the start)
                if target is not None and state.time_to_reward_s is None and state.running_mean() >= target:
                    if version == untrained:
                        raise QuarlError(f"--target-reward {target:g} is met by the untrained policy (its first "
                                         f"evaluation returned {mean:.1f}): time to reward would measure nothing; "
                                         "use a higher target")
                    state.time_to_reward_s = at_s
                    state.env_steps_at_target = state.env_steps
            reached = state.time_to_reward_s is not None
            if reached or now() >= next_line:  # the last line shows the mean that reached the target
                line = _progress(state, learner_t, now(), metrics, target)
                tb.add_scalar("learner/steps_per_s", line["learner_steps_per_s"], state.env_steps)
                tb.add_scalar("actor/env_steps_per_s", line["env_steps_per_s"], state.env_steps)
                for k, v in metrics.items():
                    tb.add_scalar(f"{'mismatch' if k in MISMATCH_KEYS else 'learner'}/{k}", v, state.env_steps)
                if on_progress:
                    on_progress(state, line)
                next_line = now() + 2.0
            if reached:
                break
            if now() >= next_ckpt:
                state.elapsed_s = now()
                _checkpoint(ckpt_path, learner, replay, limiter, state, config)
                next_ckpt = now() + config.checkpoint_every_s
            if on_tick and on_tick(state, fleet):
                break
    except KeyboardInterrupt:  # Ctrl-C at any time, the first second included: what was learnt is kept
        state.elapsed_s = now()
        _checkpoint(ckpt_path, learner, replay, limiter, state, config)
        raise
    except NonFiniteTraining as exc:  # nothing non-finite is saved: the last good checkpoint stays as it was
        kept = (f"the last good checkpoint {ckpt_path} is kept (--resume continues from it once the cause is fixed)"
                if ckpt_path.exists() else "no checkpoint was written before it")
        raise (StoppedRun if ckpt_path.exists() else QuarlError)(f"ActorQ {exc}; {kept}") from None
    finally:
        state.elapsed_s = now()
        broadcast = fleet.broadcast_stats()
        state.evaluator_busy_s = fleet.evaluator_busy_s()
        state.driver_cpu_s += time.process_time() - cpu_started
        state.machine_busy_s += _machine_busy_s() - machine_started
        fleet.close()
        emissions = _stop_energy(energy)
        tb.close()
    _checkpoint(ckpt_path, learner, replay, limiter, state, config)
    torch.save({k: v.cpu() for k, v in learner.policy_network().state_dict().items()}, out / "policy.pt")
    summary = _summary(config, info, target, state, broadcast, emissions, learner_t)
    summary.write(out / "summary.json")
    return summary


def _account(state: RunState, result: ActorResult, tb: Any, at_s: float) -> bool:
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


def _write_nodes(out: Path, driver_node: str, state: RunState) -> None:
    """OUT/actor_nodes.json, rewritten as actors move: where each actor has run."""
    tmp = out / "actor_nodes.json.tmp"
    tmp.write_text(json.dumps({"driver_node": driver_node, "actors": {str(k): v for k, v in state.actor_nodes.items()}}))
    tmp.replace(out / "actor_nodes.json")


def _progress(state: RunState, learner_t: float, at_s: float, metrics: dict, target: float | None) -> dict[str, Any]:
    last = state.evals[-1][2] if state.evals else float("nan")
    line = {
        "t_s": round(at_s, 1),
        "env_steps": state.env_steps,
        "env_steps_per_s": state.env_steps / max(at_s, 1e-9),
        "learner_steps": state.learner_steps,
        "learner_steps_per_s": state.learner_steps / max(at_s, 1e-9),
        "last_eval": last,
        "running_mean": state.running_mean(),
        "target": target,
        "version": state.version,
        **metrics,
    }
    return line


def _write_eval(out: Path, state: RunState) -> None:
    with (out / "evals.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "version", "return", "running_mean", "env_steps"])
        for (t, v, m, *steps), running in zip(state.evals, running_means(state.evals)):
            w.writerow([round(t, 3), v, round(m, 3), round(float(running), 3), *steps])


def non_finite_tensor(value: Any, name: str) -> str | None:
    """The first floating tensor (or float) in a nest of dicts and lists holding NaN or
    inf, named by its keys (``learner.q.0.weight``), or None."""
    if isinstance(value, torch.Tensor):
        return name if value.is_floating_point() and not bool(torch.isfinite(value).all()) else None
    if isinstance(value, float):
        return None if np.isfinite(value) else name
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        bad = non_finite_tensor(item, f"{name}.{key}")
        if bad:
            return bad
    return None


def non_finite_metric(metrics: dict[str, Any]) -> str | None:
    """The first loss a learner step reported that is NaN or inf, or None."""
    for key, value in metrics.items():
        if "loss" in key and isinstance(value, (int, float, np.floating)) and not np.isfinite(value):
            return f"the learner's {key} ({float(value)!r})"
    return None


def _checkpoint(path: Path, learner: Any, replay: Replay, limiter: RateLimiter, state: RunState,
                config: ActorQConfig) -> None:
    """The run as it stands, written atomically; never a learner holding NaN or inf (the
    previous checkpoint stays: :class:`NonFiniteTraining`)."""
    from quarl.training.guard import NonFiniteTraining

    bad = non_finite_tensor(learner.state_dict(), "learner")
    if bad:
        raise NonFiniteTraining(state.env_steps, f"{bad} (learner step {state.learner_steps:,})")
    blob = {"learner": learner.state_dict(), "state": _plain(state.__dict__),
            "limiter": (int(limiter.inserts), int(limiter.samples)),
            "replay": replay.state() if config.checkpoint_replay else None, "config": config.to_json()}
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)  # a kill during the save leaves the previous checkpoint intact


def _plain(value: Any) -> Any:
    """Containers of Python numbers (numpy scalars made plain), as weights_only loading wants."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


RESUME_MAY_CHANGE = frozenset({"max_minutes", "max_env_steps", "target_reward", "eval_every_s", "eval_every_steps",
                               "eval_episodes", "checkpoint_every_s", "out", "local", "address", "learner_device",
                               "actors"})
"""Options a resumed run may set otherwise (its budget, its evaluation, where it runs); any
other difference from the checkpoint's config is refused: it would be another run."""


def _check_resumed_config(path: Path, saved: Any, config: ActorQConfig) -> None:
    if not isinstance(saved, dict):
        raise QuarlError(f"{path} holds no run config: it was not written by quarl actorq; start afresh (no --resume)")
    now = config.to_json()
    differ = sorted(k for k in now if k not in RESUME_MAY_CHANGE and k in saved and saved[k] != now[k]
                    and not (isinstance(saved[k], list) and tuple(saved[k]) == tuple(now[k] or ())))
    if differ:
        k = differ[0]
        raise QuarlError(f"{path} was written by a run with {k}={saved[k]!r}, this one has {now[k]!r}"
                         + (f" (and {len(differ) - 1} other option(s): {', '.join(differ[1:4])})" if differ[1:] else "")
                         + ": resume with the same options, or give another --out")


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


_Count = Annotated[int, AfterValidator(_count)]
_Seconds = Annotated[float, AfterValidator(_seconds)]


class RunStateRecord(Record):
    """A checkpoint's :class:`RunState`, as read back: the counters a run needs are there,
    counts are non-negative whole numbers, durations non-negative seconds."""

    env_steps: _Count
    learner_steps: _Count
    version: _Count
    elapsed_s: _Seconds
    evals: list[tuple[float, int, float, int] | tuple[float, int, float]] = []
    time_to_reward_s: _Seconds | None = None
    env_steps_at_target: _Count | None = None
    actor_times: dict[str, _Seconds] = {}
    actor_steps: dict[int, _Count] = {}
    actor_wait_s: _Seconds = 0.0
    evaluator_busy_s: _Seconds | None = 0.0
    driver_cpu_s: _Seconds = 0.0
    machine_busy_s: _Seconds = 0.0
    actor_wall_s: _Seconds = 0.0
    actor_nodes: dict[int, list[str]] = {}
    steady_from_s: _Seconds | None = None
    env_steps_at_steady: _Count = 0
    restarts: _Count = 0
    pulls: _Count = 0
    loads: _Count = 0
    episodes: _Count = 0
    last_returns: list[float] = []
    mismatch_sums: dict[str, float] = {}

    @field_validator("evals", mode="before")
    @classmethod
    def _rows_as_tuples(cls, rows: Any) -> Any:
        return [tuple(row) if isinstance(row, list) else row for row in rows] if isinstance(rows, list) else rows


class ReplayStateRecord(Record):
    """What :meth:`Replay.state` saved (the queue of an on-policy run saves only its size)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    data: dict[str, torch.Tensor] | None = None
    size: _Count
    cursor: _Count = 0
    tree: torch.Tensor | None = None
    max_priority: float | None = Field(None, ge=0)


def _check_state(path: Path, raw: Any) -> RunState:
    """The checkpoint's counters as a :class:`RunState` (a :class:`RunStateRecord` first:
    one line naming the field that does not fit)."""
    if not isinstance(raw, dict) or not raw:
        raise QuarlError(f"{path} does not hold an ActorQ run state: start afresh (no --resume)")
    record = parse_record(RunStateRecord, raw, path)
    return RunState(**{f.name: getattr(record, f.name) for f in dataclasses.fields(RunState) if f.name in raw})


def _restore_replay(path: Path, blob: dict, replay: Replay, limiter: RateLimiter) -> None:
    """The saved replay and rate limiter, checked before either is touched: a size within
    the replay's capacity and the arrays it holds, the limiter's two counts."""
    saved = parse_record(ReplayStateRecord, blob["replay"], f"{path}: replay")
    capacity = getattr(replay, "capacity", None)
    rows = {int(t.shape[0]) if t.dim() else 0 for t in (saved.data or {}).values()}
    if saved.data is not None and (len(rows) != 1 or (capacity is not None and rows != {capacity})
                                   or saved.size > min(rows) or saved.cursor >= min(rows)):
        raise QuarlError(f"{path}: replay: field size: {saved.size} transitions (cursor {saved.cursor}) in arrays of "
                         f"{sorted(rows)} rows, this run's replay holds {capacity}: refused")
    counts = blob.get("limiter")
    if not (isinstance(counts, (tuple, list)) and len(counts) == 2
            and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_COUNT for c in counts)):
        raise QuarlError(f"{path}: field limiter: {counts!r:.60} is not two counts (inserts, samples): refused")
    size = saved.size
    for name, tensor in [*(saved.data or {}).items(), ("tree", saved.tree)]:
        rows = tensor if tensor is None or name == "tree" or not tensor.dim() else tensor[:size]
        if rows is not None and rows.is_floating_point() and not bool(torch.isfinite(rows).all()):
            bad = ~torch.isfinite(rows.reshape(len(rows), -1) if rows.dim() else rows.reshape(1, 1))
            row = int(torch.nonzero(bad.any(1))[0][0])
            raise QuarlError(f"{path}: replay: {name} holds NaN or inf (row {row}): refused, nothing learnt from "
                             "it (start afresh without --resume)")
    try:
        replay.load_state(blob["replay"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise QuarlError(f"{path}: replay: does not fit this run's replay ({exc.__class__.__name__}): refused") \
            from None
    limiter.inserts, limiter.samples = counts


def _restore(path: Path, learner: Any, replay: Replay, limiter: RateLimiter, config: ActorQConfig) -> RunState:

    if not path.exists():
        raise QuarlError(f"nothing to resume: {path} does not exist")
    from quarl.limits import check_file_size, model_file_cap

    check_file_size(path, 2 * model_file_cap(), "an ActorQ checkpoint")  # the learner's weights and its replay
    try:  # tensors, numbers and strings only: nothing in the file can run code
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a foreign or crafted file
        raise QuarlError(f"{path} is not an ActorQ checkpoint of plain tensors ({exc.__class__.__name__}): refused") \
            from None
    if not isinstance(blob, dict):
        raise QuarlError(f"{path} is not an ActorQ checkpoint: start afresh (no --resume)")
    _check_resumed_config(path, blob.get("config"), config)
    bad = non_finite_tensor(blob.get("learner"), "learner")
    if bad:  # a diverged learner is not a run to continue
        raise QuarlError(f"{path}: {bad} holds NaN or inf: refused (a diverged learner's checkpoint; start afresh "
                         "without --resume)")
    try:
        learner.load_state_dict(blob["learner"])
    except (RuntimeError, KeyError, TypeError, ValueError, AssertionError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        why = next((line for line in lines if line.startswith(("size mismatch", "Missing key", "Unexpected key"))),
                   lines[0])
        raise QuarlError(f"{path} does not fit this run's learner (other --algo or --policy-layers?): "
                         f"{why[:300]}") from None
    state = _check_state(path, blob.get("state"))
    if blob.get("replay") is not None:
        _restore_replay(path, blob, replay, limiter)
    state.time_to_reward_s = state.env_steps_at_target = None
    return state


def _energy_tracker(out: Path) -> Any:
    try:
        from codecarbon import OfflineEmissionsTracker

        logging.getLogger("codecarbon").setLevel(logging.ERROR)

        tracker = OfflineEmissionsTracker(country_iso_code=os.environ.get("QUARL_COUNTRY", "USA"), output_dir=str(out),
                                          log_level="error", save_to_file=False, measure_power_secs=5)
        tracker.start()
        return tracker
    except Exception as exc:  # energy is a report, never a reason to stop training
        log.warning("energy tracking unavailable: %s", exc)
        return None


def _stop_energy(tracker: Any) -> dict[str, Any]:
    if tracker is None:
        return {"available": False}
    try:
        kg = tracker.stop()
        data = tracker.final_emissions_data
        rapl = any(Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj"))
        readable = rapl and all(os.access(p, os.R_OK) for p in Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj"))
        return {
            "available": True,
            "energy_kwh": float(data.energy_consumed),
            "cpu_energy_kwh": float(data.cpu_energy),
            "ram_energy_kwh": float(data.ram_energy),
            "co2_kg": float(kg or 0.0),
            "country": data.country_iso_code,
            "method": "measured (RAPL)" if readable else "estimated (codecarbon: CPU TDP x load, RAM by size)",
        }
    except Exception as exc:
        log.warning("energy tracking failed: %s", exc)
        return {"available": False, "error": str(exc)}


MAX_RESTARTS_PER_ACTOR = 5


def max_restarts(config: ActorQConfig) -> int:
    """Actor deaths a run survives (restarting each actor) before it stops: enough for nodes
    that leave a cluster, not for a bug that kills every chunk."""
    return MAX_RESTARTS_PER_ACTOR * config.actors


def _steady_rate(state: RunState) -> float | None:
    """Env steps per second after start-up (:attr:`RunState.steady_from_s`); None when the
    run ended before every actor had reported or too soon after (under a second)."""
    if state.steady_from_s is None or state.elapsed_s - state.steady_from_s < 1.0:
        return None
    return (state.env_steps - state.env_steps_at_steady) / (state.elapsed_s - state.steady_from_s)


def _summary(config: ActorQConfig, info: EnvInfo, target: float | None, state: RunState, broadcast: dict,
             energy: dict, learner_s: float) -> ActorQSummary:
    steps = max(state.env_steps, 1)
    per_step_ms = {k: 1000 * v / steps for k, v in state.actor_times.items()}
    return ActorQSummary(
        config=config.to_json(),
        machine=_machine(),
        provenance=provenance(),
        target_reward=target,
        reached=state.time_to_reward_s is not None,
        time_to_reward_s=state.time_to_reward_s,
        elapsed_s=state.elapsed_s,
        final_running_mean=state.running_mean(),
        evals=state.evals,
        env_steps=state.env_steps,
        learner_steps=state.learner_steps,
        env_steps_per_s=state.env_steps / max(state.elapsed_s, 1e-9),
        steady_env_steps_per_s=_steady_rate(state),
        learner_steps_per_s=state.learner_steps / max(state.elapsed_s, 1e-9),
        actor_env_steps_per_s={str(i): n / max(state.elapsed_s, 1e-9) for i, n in state.actor_steps.items()},
        actor_ms_per_step=per_step_ms,
        actor_quant=actor_quant(config),
        actor_time_share=_actor_shares(state, config.actors),
        actor_busy_ms_per_step=1000 * state.actor_wall_s / steps,
        # an actor's wall time per step when not held by the rate limiter (Ray's dispatch included)
        actor_wall_ms_per_step=1000 * max(state.elapsed_s * config.actors - state.actor_wait_s, 0.0) / steps,
        evaluator_busy_s=state.evaluator_busy_s,
        machine_busy_cores=state.machine_busy_s / max(state.elapsed_s, 1e-9),
        # the coordinator's CPU beyond learner steps (receiving chunks, replay, logging), per env step
        coordinator_ms_per_step=1000 * max(state.driver_cpu_s - learner_s, 0.0) / steps,
        learner_ms_per_step=1000 * learner_s / max(state.learner_steps, 1),
        env_steps_at_target=state.env_steps_at_target,
        learner_time_share={"learning": learner_s / max(state.elapsed_s, 1e-9),
                            "waiting": 1 - learner_s / max(state.elapsed_s, 1e-9)},
        learner_busy_s=learner_s,
        weight_versions=state.version,
        pulls=state.pulls,
        loads=state.loads,
        restarts=state.restarts,
        actor_nodes={str(k): v for k, v in state.actor_nodes.items()},
        episodes=state.episodes,
        broadcast=broadcast,
        energy=energy,
        mismatch=state.mismatch(),
    )


def _actor_shares(state: RunState, actors: int) -> dict[str, float]:
    """Fraction of the actors' wall time (elapsed x actors) in each part; "other" is the
    actor loop's own overhead, "rate_limit" idle with nothing queued because the rate limiter
    held inserts back, "dispatch" the rest: Ray's scheduling and transfers, start-up."""
    total = max(state.elapsed_s * actors, 1e-9)
    shares = {k: v / total for k, v in state.actor_times.items()}
    shares["other"] = max(0.0, state.actor_wall_s - sum(state.actor_times.values())) / total
    shares["rate_limit"] = state.actor_wait_s / total
    shares["dispatch"] = max(0.0, 1 - sum(shares.values()))
    return shares


def _machine_busy_s() -> float:
    """CPU seconds this machine has been busy since boot, all cores and processes."""
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def _machine() -> dict[str, Any]:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
