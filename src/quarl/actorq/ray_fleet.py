"""The fleet on Ray: the only ActorQ module that uses Ray (started or joined by
:mod:`quarl.core.ray_cluster`).

One Ray actor per ActorQ actor (one CPU each, spread over the cluster's nodes), one for
the parameter broadcaster and one for the evaluator. Without ``--address`` a local Ray
starts with one slot per actor plus the learner; with it, quarl joins that cluster.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from quarl.actorq.acting import Actor, ActorResult, Broadcaster, EnvInfo
from quarl.actorq.config import ActorQConfig
from quarl.actorq.fleet import ActorFailure, Evaluator
from quarl.core.errors import QuarlError
from quarl.core.ray_cluster import free_cpus, start_ray

log = logging.getLogger(__name__)


class RemoteActor:
    """An :class:`Actor` living in a Ray worker; it pulls from the broadcaster actor."""

    def __init__(self, config: ActorQConfig, info: EnvInfo, index: int, broadcaster: Any) -> None:
        import ray

        os.environ["OMP_NUM_THREADS"] = "1"
        self.actor = Actor(config, info, index, lambda version: ray.get(broadcaster.pull.remote(version)))

    def run(self, steps: int) -> ActorResult:
        import ray

        result = self.actor.run(steps)
        result.node = ray.get_runtime_context().get_node_id()
        return result

    def pid(self) -> int:
        return os.getpid()


class RayFleet:
    def __init__(self, config: ActorQConfig, info: EnvInfo) -> None:
        import ray

        self.ray = ray
        self.config, self.info = config, info
        self.owns_ray = start_ray(config.address, max(os.cpu_count() or 1, config.actors + 1))
        free = free_cpus(ray)
        if free < config.actors:
            if self.owns_ray:
                ray.shutdown()
            where = f"the Ray cluster at {config.address}" if config.address else "the local Ray"
            raise QuarlError(f"{where} has {free:g} free CPUs and --actors {config.actors} needs one each: "
                             "add nodes (or --num-cpus) or ask for fewer --actors")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # the broadcaster and the evaluator live on the driver's node: a worker node that
        # leaves takes only actors with it, and those are restarted elsewhere
        self.node = ray.get_runtime_context().get_node_id()
        here = NodeAffinitySchedulingStrategy(self.node, soft=False)
        # Ray's handles (``handle.method.remote(...)``), untyped: its stubs know no remote methods
        self.broadcaster: Any = (ray.remote(Broadcaster).options(num_cpus=0, scheduling_strategy=here)
                                 .remote(config, info))
        self.evaluator: Any = ray.remote(Evaluator).options(num_cpus=0, scheduling_strategy=here).remote(config, info)
        # SPREAD: on a cluster, actors go to different nodes rather than filling one
        self.actor_cls = ray.remote(num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")(RemoteActor)
        self.actors = [self._start(i) for i in range(config.actors)]
        self.pending: dict[Any, int] = {}
        self.publishing: Any = None
        self.queued: tuple[int, dict[str, np.ndarray]] | None = None
        self.eval_ref: Any = None
        self.eval_meta: tuple[int, float] | None = None
        self.done_evals: list[tuple[int, float, float]] = []
        self.next_capacity_check = 0.0

    def _start(self, index: int) -> Any:
        return self.actor_cls.remote(self.config, self.info, index, self.broadcaster)

    def publish(self, version: int, weights: dict[str, np.ndarray]) -> None:
        # latest wins: at most one publish in flight, the learner never waits for it
        if self.publishing is not None and not self.ray.wait([self.publishing], timeout=0)[0]:
            self.queued = (version, weights)
            return
        self.publishing = self.broadcaster.publish.remote(version, weights)
        self.queued = None

    def submit(self, index: int, steps: int) -> None:
        self.pending[self.actors[index].run.remote(steps)] = index

    def _check_capacity(self) -> None:
        """A node that leaves takes its CPUs along: when the cluster can no longer hold one
        CPU per actor, the restarted actors would wait forever, so stop in one line."""
        import time

        if time.monotonic() < self.next_capacity_check:
            return
        self.next_capacity_check = time.monotonic() + 5.0
        cpus = float(self.ray.cluster_resources().get("CPU", 0.0))
        if cpus < self.config.actors:
            raise QuarlError(f"the Ray cluster lost nodes: {cpus:g} CPUs are left for --actors {self.config.actors}; "
                             "the last checkpoint is in OUT (rerun with --resume on a cluster with room)")

    def ready(self, timeout_s: float) -> list[ActorResult | ActorFailure]:
        self._check_capacity()
        if self.queued is not None:
            self.publish(*self.queued)
        self._poll_eval()
        if not self.pending:
            return []
        done, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout_s)
        out: list[ActorResult | ActorFailure] = []
        failed: set[int] = set()
        for ref in done:
            if ref not in self.pending:  # dropped by a restart of its actor
                continue
            index = self.pending.pop(ref)
            try:
                out.append(self.ray.get(ref))
            except self.ray.exceptions.RayError as exc:
                if index not in failed:  # its queued chunks fail with it: one failure, one restart
                    failed.add(index)
                    out.append(ActorFailure(index, type(exc).__name__))
        return out

    def restart(self, index: int) -> None:
        self.pending = {ref: i for ref, i in self.pending.items() if i != index}
        try:
            self.ray.kill(self.actors[index])
        except Exception:  # already gone
            pass
        self.actors[index] = self._start(index)

    def kill(self, index: int) -> None:
        """Kill an actor's process (fault-tolerance tests)."""
        self.ray.kill(self.actors[index], no_restart=True)

    def evaluator_idle(self) -> bool:
        self._poll_eval()
        return self.eval_ref is None

    def evaluate(self, version: int, weights: dict[str, np.ndarray], at_s: float) -> None:
        if self.evaluator_idle():  # one evaluation at a time
            self.eval_ref = self.evaluator.evaluate.remote(weights)
            self.eval_meta = (version, at_s)

    def _poll_eval(self) -> None:
        if self.eval_ref is not None and self.eval_meta is not None and self.ray.wait([self.eval_ref], timeout=0)[0]:
            version, at_s = self.eval_meta
            self.done_evals.append((version, float(self.ray.get(self.eval_ref)), at_s))
            self.eval_ref = None

    def evaluations(self) -> list[tuple[int, float, float]]:
        self._poll_eval()
        out, self.done_evals = self.done_evals, []
        return out

    def broadcast_stats(self) -> dict[str, float]:
        """The broadcaster's last build; empty (missing, never zeros) when it cannot be asked."""
        try:
            stats: dict[str, float] = self.ray.get(self.broadcaster.get_stats.remote(), timeout=30)
            return stats
        except Exception as exc:  # the broadcaster died or its node left
            log.warning("the broadcaster's stats could not be read (%s): stored as missing", exc.__class__.__name__)
            return {}

    def evaluator_busy_s(self) -> float | None:
        """The evaluator's busy seconds; None (missing, never zero) when it cannot be asked."""
        try:
            return float(self.ray.get(self.evaluator.busy.remote(), timeout=30))
        except Exception as exc:
            log.warning("the evaluator's busy time could not be read (%s): stored as missing", exc.__class__.__name__)
            return None

    def close(self) -> None:
        for handle in [*self.actors, self.broadcaster, self.evaluator]:
            try:
                self.ray.kill(handle)
            except Exception:
                pass
        if self.owns_ray:
            self.ray.shutdown()
