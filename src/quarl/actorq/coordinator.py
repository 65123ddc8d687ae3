"""The coordinator loop of one ActorQ run (:class:`Coordinator`), pass by pass::

    until the running mean of evaluations reaches the target, or the budget is spent:
        receive finished actor chunks into replay; restart an actor that died
        submit chunks to idle actors while the rate limiter allows inserts
        learner steps while the rate limiter allows samples; publish every push_period
        start an evaluation when one is due (every eval_every_s, or eval_every_steps env steps)
        collect finished evaluations; the time to reward when the running mean reaches the target
        a progress line every 2 s; a checkpoint every checkpoint_every_s; the caller's on_tick

It holds no process of its own: the fleet (:mod:`quarl.actorq.fleet`) runs the actors,
the broadcaster and the evaluator; :func:`quarl.actorq.system.run_actorq` sets it up and
writes what it leaves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quarl.actorq.acting import ActorResult
from quarl.actorq.algorithms import Algorithm, Learner, Metrics
from quarl.actorq.config import ActorQConfig
from quarl.actorq.fleet import ActorFailure, Fleet
from quarl.actorq.replay import Batch, Limiter, PrioritizedReplay, Store
from quarl.actorq.run_log import Progress, account, progress, write_evals, write_nodes
from quarl.actorq.run_state import MISMATCH_KEYS, RunState
from quarl.actorq.snapshot import non_finite_metric, save_checkpoint
from quarl.core.errors import QuarlError

log = logging.getLogger(__name__)

QUEUE_DEPTH = 2
"""Chunks queued per actor."""
LEARNER_SLICE_S = 0.02
"""Learner time between two polls of the actors (at least one step)."""
MAX_RESTARTS_PER_ACTOR = 5

OnProgress = Callable[[RunState, Progress], None]
OnTick = Callable[[RunState, Fleet], "bool | None"]


def max_restarts(config: ActorQConfig) -> int:
    """Actor deaths a run survives (restarting each actor) before it stops: enough for nodes
    that leave a cluster, not for a bug that kills every chunk."""
    return MAX_RESTARTS_PER_ACTOR * config.actors


@dataclass
class Clock:
    """Seconds since the run started (a resumed run goes on from its elapsed time)."""

    started: float

    @classmethod
    def resumed_at(cls, elapsed_s: float) -> Clock:
        return cls(time.perf_counter() - elapsed_s)

    def __call__(self) -> float:
        return time.perf_counter() - self.started


@dataclass
class Parts:
    """What a run is made of: the pieces the coordinator drives."""

    config: ActorQConfig
    algorithm: Algorithm
    learner: Learner
    replay: Store
    limiter: Limiter
    state: RunState
    out: Path
    target: float | None

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def checkpoint(self, at_s: float) -> None:
        """The run as it stands at ``at_s`` into ``OUT/checkpoint.pt``."""
        self.state.elapsed_s = at_s
        save_checkpoint(self.checkpoint_path, self.learner, self.replay, self.limiter, self.state, self.config)


def split_metrics(metrics: Metrics) -> tuple[dict[str, float], np.ndarray | None]:
    """A learner step's numbers, and the new priorities of its rows (prioritized replay) or None."""
    numbers: dict[str, float] = {}
    priority = None
    for name, value in metrics.items():
        if name == "priority":
            priority = np.asarray(value)
        else:
            numbers[name] = float(value)
    return numbers, priority


class Coordinator:
    """One run's loop over its :class:`Parts` and fleet, TensorBoard writer ``tb`` and clock."""

    def __init__(self, parts: Parts, fleet: Fleet, tb: Any, now: Clock, on_progress: OnProgress | None = None,
                 on_tick: OnTick | None = None) -> None:
        self.parts, self.fleet, self.tb, self.now = parts, fleet, tb, now
        self.config, self.state = parts.config, parts.state
        self.on_progress, self.on_tick = on_progress, on_tick
        self.learner_s = 0.0
        """Seconds spent in learner steps (the summary's learner share)."""
        self.metrics: dict[str, float] = {}
        """The last learner step's numbers (its losses; impala's mismatch and policy lag)."""
        self.untrained: int | None = None
        self.in_flight: dict[int, int] = {}
        self.idle_since: dict[int, float] = {}
        self.next_eval = self.next_line = self.next_ckpt = 0.0
        self.next_eval_steps = self.eval_env_steps = 0

    def begin(self) -> None:
        """Publish the first weights; every actor idle from now, every timer starts now."""
        state, now = self.state, self.now
        state.version += 1
        self.fleet.publish(state.version, self.parts.learner.weights())
        self.untrained = state.version if state.learner_steps == 0 else None  # the initial weights' version
        # each actor has up to QUEUE_DEPTH chunks queued, so it starts the next one while the
        # coordinator is still busy with learner steps (no idle round trip per chunk)
        self.in_flight = {i: 0 for i in range(self.config.actors)}
        self.idle_since = {i: now() for i in self.in_flight}
        self.next_eval = self.next_line = now()
        self.next_ckpt = self.next_eval + self.config.checkpoint_every_s
        self.next_eval_steps = self.eval_env_steps = state.env_steps

    def run(self) -> None:
        """:meth:`begin`, then pass after pass until the target or the budget."""
        state = self.state
        self.begin()
        while self.budget_left():
            self.receive()
            self.submit()
            self.learn()
            self.start_evaluation()
            self.collect_evaluations()
            reached = state.time_to_reward_s is not None
            if reached or self.now() >= self.next_line:  # the last line shows the mean that reached the target
                self.report()
            if reached:
                break
            if self.now() >= self.next_ckpt:
                self.parts.checkpoint(self.now())
                self.next_ckpt = self.now() + self.config.checkpoint_every_s
            if self.on_tick and self.on_tick(state, self.fleet):
                break

    def budget_left(self) -> bool:
        config = self.config
        return self.now() < config.max_minutes * 60 and (config.max_env_steps is None
                                                        or self.state.env_steps < config.max_env_steps)

    def receive(self) -> None:
        """Finished chunks into replay; a dead actor restarted (up to :func:`max_restarts`)."""
        limiter = self.parts.limiter
        for result in self.fleet.ready(timeout_s=0.0 if limiter.can_sample(self.config.batch_size) else 0.02):
            if isinstance(result, ActorFailure):
                self.restart(result)
            else:
                self.accept(result)

    def restart(self, failure: ActorFailure) -> None:
        state = self.state
        state.restarts += 1
        if state.restarts > max_restarts(self.config):  # a bug, not a lost node: restarting would loop
            self.parts.checkpoint(self.now())
            path = self.parts.checkpoint_path
            raise QuarlError(f"actors died {state.restarts} times, the last: actor {failure.index}, "
                             f"{failure.error}; stopped (what was learnt is in {path}, --resume "
                             "continues once the cause is fixed)")
        log.warning("actor %d died (%s): restarting it", failure.index, failure.error)
        self.fleet.restart(failure.index)  # drops the dead actor's other queued chunks
        self.in_flight[failure.index] = 0
        self.idle_since[failure.index] = self.now()

    def accept(self, result: ActorResult) -> None:
        state = self.state
        if account(state, result, self.tb):
            write_nodes(self.parts.out, self.fleet.node, state)
        if state.steady_from_s is None and len(state.actor_steps) >= self.config.actors:
            state.steady_from_s, state.env_steps_at_steady = self.now(), state.env_steps
        state.actor_wall_s += result.wall_s
        self.in_flight[result.index] = max(0, self.in_flight[result.index] - 1)
        if self.in_flight[result.index] == 0:
            self.idle_since[result.index] = self.now()
        if result.batch is not None:
            n = self.parts.replay.insert(result.batch)
            self.parts.limiter.inserted(n)

    def submit(self) -> None:
        """First one chunk for every actor, then a second, while the limiter allows inserts."""
        limiter, chunk = self.parts.limiter, self.config.chunk_steps
        for depth in range(QUEUE_DEPTH):
            for index in self.in_flight:
                queued = sum(self.in_flight.values())
                if self.in_flight[index] == depth and limiter.can_insert(chunk * (queued + 1)):
                    self.fleet.submit(index, chunk)
                    if depth == 0:
                        self.state.actor_wait_s += self.now() - self.idle_since.pop(index, self.now())
                    self.in_flight[index] += 1

    def learn(self) -> None:
        """Learner steps while the limiter allows samples (on Ray, back to the actors'
        results after a slice; in-process actors wait anyway)."""
        t = time.perf_counter()
        for _ in range(32):
            if not self.parts.limiter.can_sample(self.config.batch_size) or (
                    not self.config.local and time.perf_counter() - t > LEARNER_SLICE_S):
                break
            self.learn_step()
        self.learner_s += time.perf_counter() - t

    def learn_step(self) -> None:
        from quarl.training.guard import NonFiniteTraining

        parts, state, unrolls = self.parts, self.state, self.parts.algorithm.unrolls
        batch = parts.replay.sample(self.config.batch_size)
        reported = parts.learner.step(batch)
        bad = non_finite_metric(reported)
        if bad:  # stop before the weights reach the actors or a checkpoint (training's guard)
            raise NonFiniteTraining(state.env_steps, f"{bad} at learner step {state.learner_steps + 1:,}")
        metrics, priority = split_metrics(reported)
        if priority is not None:
            if isinstance(parts.replay, PrioritizedReplay) and isinstance(batch, Batch) and batch.index is not None:
                parts.replay.update_priorities(batch.index, priority)
        if unrolls:  # how old the actors' weights were, in versions
            metrics["policy_lag"] = float(state.version - np.mean(getattr(batch, "version")))
            state.add_mismatch(metrics)
        parts.limiter.sampled(len(batch) if unrolls else self.config.batch_size)
        state.learner_steps += 1
        if state.learner_steps % self.config.push_period == 0:
            state.version += 1
            self.fleet.publish(state.version, parts.learner.weights())
        self.metrics = metrics

    def start_evaluation(self) -> None:
        """Every eval_every_s a busy evaluator skips a slot; spaced in env steps, it delays
        the evaluation to a later pass. The weights are copied only for one that starts."""
        config, state = self.config, self.state
        due = state.env_steps >= self.next_eval_steps if config.eval_every_steps else self.now() >= self.next_eval
        if due and not config.eval_every_steps:
            self.next_eval = self.now() + config.eval_every_s
        if due and self.fleet.evaluator_idle():
            self.fleet.evaluate(state.version, self.parts.learner.weights(), self.now())
            self.eval_env_steps = state.env_steps  # one evaluation in flight at a time
            self.next_eval_steps = state.env_steps + (config.eval_every_steps or 0)

    def collect_evaluations(self) -> None:
        """Finished evaluations into evals.csv and TensorBoard; the time to reward once the
        running mean (of the last WINDOW evaluations, fewer at the start) reaches the target."""
        state, target = self.state, self.parts.target
        for version, mean, at_s in self.fleet.evaluations():
            state.evals.append((at_s, version, mean, self.eval_env_steps))
            write_evals(self.parts.out, state)
            running = state.running_mean()
            self.tb.add_scalar("eval/return", mean, state.env_steps)
            self.tb.add_scalar("eval/running_mean", running, state.env_steps)
            if target is not None and state.time_to_reward_s is None and running is not None and running >= target:
                if version == self.untrained:
                    raise QuarlError(f"--target-reward {target:g} is met by the untrained policy (its first "
                                     f"evaluation returned {mean:.1f}): time to reward would measure nothing; "
                                     "use a higher target")
                state.time_to_reward_s = at_s
                state.env_steps_at_target = state.env_steps

    def report(self) -> None:
        """A progress line to TensorBoard and the caller's ``on_progress``."""
        state = self.state
        line = progress(state, self.now(), self.metrics, self.parts.target)
        self.tb.add_scalar("learner/steps_per_s", line.learner_steps_per_s, state.env_steps)
        self.tb.add_scalar("actor/env_steps_per_s", line.env_steps_per_s, state.env_steps)
        for k, v in self.metrics.items():
            self.tb.add_scalar(f"{'mismatch' if k in MISMATCH_KEYS else 'learner'}/{k}", v, state.env_steps)
        if self.on_progress:
            self.on_progress(state, line)
        self.next_line = self.now() + 2.0
