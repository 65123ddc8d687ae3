"""Every piece of the fleet in this process: actors run their chunks one after the other
when the coordinator asks for finished work. For tests and debugging (``--local``)."""

from __future__ import annotations

import numpy as np

from quarl.actorq.acting import Actor, ActorResult, Broadcaster, EnvInfo
from quarl.actorq.config import ActorQConfig
from quarl.actorq.fleet import ActorFailure, Evaluator


class LocalFleet:
    node = "local"

    def __init__(self, config: ActorQConfig, info: EnvInfo) -> None:
        self.config, self.info = config, info
        self.broadcaster = Broadcaster(config, info)
        self.actors = [self._actor(i) for i in range(config.actors)]
        self.pending: list[tuple[int, int]] = []
        self.evaluator = Evaluator(config, info)
        self.done_evals: list[tuple[int, float, float]] = []

    def _actor(self, index: int) -> Actor:
        return Actor(self.config, self.info, index, self.broadcaster.pull)

    def publish(self, version: int, weights: dict[str, np.ndarray]) -> None:
        self.broadcaster.publish(version, weights)

    def submit(self, index: int, steps: int) -> None:
        self.pending.append((index, steps))

    def ready(self, timeout_s: float) -> list[ActorResult | ActorFailure]:
        out: list[ActorResult | ActorFailure] = []
        pending, self.pending = self.pending, []
        for index, steps in pending:
            try:
                out.append(self.actors[index].run(steps))
            except Exception as exc:  # an actor that breaks is replaced, as on Ray
                out.append(ActorFailure(index, repr(exc)))
        return out

    def restart(self, index: int) -> None:
        self.pending = [(i, s) for i, s in self.pending if i != index]
        self.actors[index].close()
        self.actors[index] = self._actor(index)

    def evaluator_idle(self) -> bool:
        return True  # evaluations run to the end inside evaluate()

    def evaluate(self, version: int, weights: dict[str, np.ndarray], at_s: float) -> None:
        self.done_evals.append((version, self.evaluator.evaluate(weights), at_s))

    def evaluations(self) -> list[tuple[int, float, float]]:
        out, self.done_evals = self.done_evals, []
        return out

    def broadcast_stats(self) -> dict[str, float]:
        return dict(self.broadcaster.stats)

    def evaluator_busy_s(self) -> float:
        return self.evaluator.busy_s

    def close(self) -> None:
        for actor in self.actors:
            actor.close()
