"""An ActorQ run's :class:`~quarl.actorq.summary.ActorQSummary`, made from what the
coordinator counted (:class:`~quarl.actorq.run_state.RunState`) and measured."""

from __future__ import annotations

from quarl.actorq.actor_precisions import actor_quant
from quarl.actorq.config import ActorQConfig
from quarl.actorq.machine import describe_machine
from quarl.actorq.run_state import RunState
from quarl.actorq.summary import ActorQSummary, Energy
from quarl.core.provenance import provenance


def steady_rate(state: RunState) -> float | None:
    """Env steps per second after start-up (:attr:`RunState.steady_from_s`); None when the
    run ended before every actor had reported or too soon after (under a second)."""
    if state.steady_from_s is None or state.elapsed_s - state.steady_from_s < 1.0:
        return None
    return (state.env_steps - state.env_steps_at_steady) / (state.elapsed_s - state.steady_from_s)


def actor_shares(state: RunState, actors: int) -> dict[str, float]:
    """Fraction of the actors' wall time (elapsed x actors) in each part; "other" is the
    actor loop's own overhead, "rate_limit" idle with nothing queued because the rate limiter
    held inserts back, "dispatch" the rest: Ray's scheduling and transfers, start-up."""
    total = max(state.elapsed_s * actors, 1e-9)
    shares = {k: v / total for k, v in state.actor_times.items()}
    shares["other"] = max(0.0, state.actor_wall_s - sum(state.actor_times.values())) / total
    shares["rate_limit"] = state.actor_wait_s / total
    shares["dispatch"] = max(0.0, 1 - sum(shares.values()))
    return shares


def make_summary(config: ActorQConfig, target: float | None, state: RunState, broadcast: dict[str, float],
                 energy: Energy, learner_s: float) -> ActorQSummary:
    """The run's summary: its identity, what it reached, its counts, rates and costs per step,
    and energy."""
    steps = max(state.env_steps, 1)
    elapsed = max(state.elapsed_s, 1e-9)
    return ActorQSummary(
        config=config.to_json(),
        machine=describe_machine(),
        provenance=provenance(),
        target_reward=target,
        reached=state.time_to_reward_s is not None,
        time_to_reward_s=state.time_to_reward_s,
        elapsed_s=state.elapsed_s,
        final_running_mean=state.running_mean(),
        evals=state.evals,
        env_steps=state.env_steps,
        learner_steps=state.learner_steps,
        actor_quant=actor_quant(config),
        evaluator_busy_s=state.evaluator_busy_s,
        env_steps_at_target=state.env_steps_at_target,
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
        env_steps_per_s=state.env_steps / elapsed,
        steady_env_steps_per_s=steady_rate(state),
        learner_steps_per_s=state.learner_steps / elapsed,
        actor_env_steps_per_s={str(i): n / elapsed for i, n in state.actor_steps.items()},
        actor_ms_per_step={k: 1000 * v / steps for k, v in state.actor_times.items()},
        actor_time_share=actor_shares(state, config.actors),
        actor_busy_ms_per_step=1000 * state.actor_wall_s / steps,
        # an actor's wall time per step when not held by the rate limiter (Ray's dispatch included)
        actor_wall_ms_per_step=1000 * max(state.elapsed_s * config.actors - state.actor_wait_s, 0.0) / steps,
        machine_busy_cores=state.machine_busy_s / elapsed,
        # the coordinator's CPU beyond learner steps (receiving chunks, replay, logging), per env step
        coordinator_ms_per_step=1000 * max(state.driver_cpu_s - learner_s, 0.0) / steps,
        learner_ms_per_step=1000 * learner_s / max(state.learner_steps, 1),
        learner_time_share={"learning": learner_s / elapsed, "waiting": 1 - learner_s / elapsed},
    )
