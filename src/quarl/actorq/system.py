"""The ActorQ run: a full-precision learner in this process, quantized actors and a
parameter broadcaster in a fleet (Ray, or this process with ``local=True``).

:func:`run_actorq` in named steps: set up the run's parts (restored with ``--resume``),
start the fleet, TensorBoard and the meters, drive the coordinator loop
(:mod:`quarl.actorq.coordinator`: acting, learning, evaluation, checkpoints), close
what it started, then write the last checkpoint, ``policy.pt`` and the summary.

Everything measured goes to ``OUT/summary.json``, ``OUT/evals.csv`` and ``OUT/tb``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quarl.actorq.acting import EnvInfo, env_info
from quarl.actorq.algorithms import get_algorithm, make_learner
from quarl.actorq.config import ActorQConfig
from quarl.actorq.coordinator import Clock, Coordinator, OnProgress, OnTick, Parts
from quarl.actorq.fleet import Fleet
from quarl.actorq.machine import machine_busy_s, start_energy, stop_energy
from quarl.actorq.run_state import RunState
from quarl.actorq.snapshot import restore
from quarl.actorq.summarize import make_summary
from quarl.actorq.summary import ActorQSummary, Energy
from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError, StoppedRun

log = logging.getLogger(__name__)


def make_fleet(config: ActorQConfig, info: EnvInfo) -> Fleet:
    """The actors, broadcaster and evaluator: in this process (``local``) or on Ray."""
    if config.local:
        from quarl.actorq.local_fleet import LocalFleet

        return LocalFleet(config, info)
    from quarl.actorq.ray_fleet import RayFleet

    return RayFleet(config, info)


def run_actorq(
    config: ActorQConfig,
    resume: bool = False,
    on_progress: OnProgress | None = None,
    on_tick: OnTick | None = None,
) -> ActorQSummary:
    """Train until the target reward or the time budget; return the summary. ``on_tick(state,
    fleet)`` is called once per pass of the loop; returning True ends the run there, as a
    spent budget would (a caller's own stopping rule)."""
    from torch.utils.tensorboard import SummaryWriter

    from quarl.training.guard import NonFiniteTraining

    torch.set_num_threads(1)
    parts, info = set_up(config, resume)
    fleet = make_fleet(config, info)  # first: a cluster that cannot be reached fails before anything is written
    tb = SummaryWriter(str(parts.out / "tb"))
    meters = Meters.start(parts.out)
    clock = Clock.resumed_at(parts.state.elapsed_s)
    coordinator = Coordinator(parts, fleet, tb, clock, on_progress, on_tick)
    try:
        coordinator.run()
    except KeyboardInterrupt:  # Ctrl-C at any time, the first second included: what was learnt is kept
        parts.checkpoint(clock())
        raise
    except NonFiniteTraining as exc:  # nothing non-finite is saved: the last good checkpoint stays as it was
        raise stopped(exc, parts.checkpoint_path) from None
    finally:
        parts.state.elapsed_s = clock()
        broadcast, energy = meters.stop(parts.state, fleet)
        tb.close()
    return finish(parts, broadcast, energy, coordinator.learner_s)


def set_up(config: ActorQConfig, resume: bool) -> tuple[Parts, EnvInfo]:
    """The env checked against the algorithm, the output folder, the learner, its replay and
    rate limiter, and the run's counters (from ``OUT/checkpoint.pt`` with ``resume``)."""
    algorithm = get_algorithm(config.algo)
    info = env_info(config)
    target = config.target_reward if config.target_reward is not None else info.reward_threshold
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    learner = make_learner(config, info.obs_dim, info.act_dim, info.discrete)
    replay = algorithm.make_replay(config)
    limiter = algorithm.make_limiter(config, replay)
    parts = Parts(config, algorithm, learner, replay, limiter, RunState(), out, target)
    if resume:
        parts.state = restore(parts.checkpoint_path, learner, replay, limiter, config)
        log.info("resumed from %s at %.0f s, %d learner steps", parts.checkpoint_path, parts.state.elapsed_s,
                 parts.state.learner_steps)
    return parts, info


@dataclass
class Meters:
    """What the summary measures beside the loop: energy, this process's CPU, the machine's."""

    energy: Any
    cpu_started: float
    machine_started: float

    @classmethod
    def start(cls, out: Path) -> Meters:
        return cls(start_energy(out), time.process_time(), machine_busy_s())

    def stop(self, state: RunState, fleet: Fleet) -> tuple[dict[str, float], Energy]:
        """Read the fleet's last numbers, close it; returns (broadcast stats, energy)."""
        broadcast = fleet.broadcast_stats()
        state.evaluator_busy_s = fleet.evaluator_busy_s()
        state.driver_cpu_s += time.process_time() - self.cpu_started
        state.machine_busy_s += machine_busy_s() - self.machine_started
        fleet.close()
        return broadcast, stop_energy(self.energy)


def stopped(exc: Exception, checkpoint: Path) -> QuarlError:
    """A non-finite learner as one line, saying whether a good checkpoint is kept."""
    kept = (f"the last good checkpoint {checkpoint} is kept (--resume continues from it once the cause is fixed)"
            if checkpoint.exists() else "no checkpoint was written before it")
    return (StoppedRun if checkpoint.exists() else QuarlError)(f"ActorQ {exc}; {kept}")


def finish(parts: Parts, broadcast: dict[str, float], energy: Energy, learner_s: float) -> ActorQSummary:
    """The last checkpoint, the learner's policy network (``OUT/policy.pt``) and ``OUT/summary.json``."""
    parts.checkpoint(parts.state.elapsed_s)
    network = parts.learner.policy_network()
    weights = {k: v.cpu() for k, v in network.state_dict().items()}
    write_atomic(parts.out / "policy.pt", lambda tmp: torch.save(weights, tmp))
    summary = make_summary(parts.config, parts.target, parts.state, broadcast, energy, learner_s)
    summary.write(parts.out / "summary.json")
    return summary
