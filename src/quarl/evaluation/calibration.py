"""Calibration: the seeds reserved for it and the data the quantizers calibrate on.

Calibration plays fp32 rollouts of the fixed seeds :data:`CALIBRATION_SEEDS`, never the
evaluation's, whatever the command and its seed, so ptq, study, demo, export, recovery and
the API choose a policy's int mode from the same data. :func:`calibrate_if_needed` is the
one place that decides whether a config calibrates at all; :func:`calibration_inputs` gives
the states, :func:`calibration_returns` the closed-loop check of the automatic int choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from quarl.core.errors import QuarlError
from quarl.envs import EnvJson, EnvSpec
from quarl.evaluation.episodes import evaluate
from quarl.policies.base import Policy
from quarl.quantization import precisions as registry
from quarl.quantization.config import QuantConfig

CALIBRATION_SIZE = 256
CALIBRATION_SEED_OFFSET = 10_000
CALIBRATION_SEEDS = range(CALIBRATION_SEED_OFFSET, CALIBRATION_SEED_OFFSET + 200)
"""Reserved for calibration: states from 10,000..10,007, the sequential test's episodes from
10,100 on (at most 64). Evaluation seeds (``seed .. seed + episodes - 1``) may not enter it."""
DISTILLATION_SEEDS = range(20_000, 30_000)
"""Reserved for quantization-aware distillation (:mod:`quarl.recovery`): the teacher's and
the student's episodes (20,000 on) and their held-out episodes (29,000 on). Evaluation
seeds may not enter it either."""
RESERVED_SEEDS = {"calibration": CALIBRATION_SEEDS, "distillation": DISTILLATION_SEEDS}

CALIBRATION_EPISODE_STEPS = 1000
"""Calibration episodes are cut here: a whole MuJoCo episode, a paired comparison for the
rest (fp32 and the candidate are cut alike), and an untrained Atari policy that never
serves does not play for 27k steps per candidate."""
CALIBRATION_STEPS = 20_000
"""The sequential test of a mode plays at most about this many steps per policy: 64
episodes of a short game, 20 of a 1000-step MuJoCo episode (never fewer than 16)."""
SEQUENTIAL_CAPS = (16, 64)


class CalibrationKey(TypedDict):
    """What calibration episodes are (:meth:`CalibrationEpisodes.cache_key`): part of a stored int
    mode choice's key."""

    env: EnvJson
    first_seed: int
    max_steps: int
    steps: int
    caps: list[int]


class CalibrationEpisodes:
    """Per-episode returns of a policy on calibration episodes ``CALIBRATION_SEED_OFFSET +
    100 + i`` (apart from evaluation's and from the calibration states' seeds), played on
    demand: ``episodes(policy, n)`` gives the first ``n``,
    playing only those not played yet. The automatic int choice's sequential test
    (:func:`quarl.verdict.sequential_keeps`) asks for more only while undecided, up to
    :meth:`episode_cap`. The first policy asked (fp32, the reference of every candidate)
    is kept for the whole run, the last candidate until another is asked."""

    def __init__(self, env_spec: EnvSpec, max_steps: int | None = None) -> None:
        self.env_spec = env_spec
        self.first = CALIBRATION_SEED_OFFSET + 100
        self.max_steps = min(max_steps or CALIBRATION_EPISODE_STEPS, CALIBRATION_EPISODE_STEPS)
        self._reference: tuple[Policy, list[float], list[int]] | None = None
        self._last: tuple[Policy, list[float], list[int]] | None = None

    def _played(self, policy: Policy) -> tuple[list[float], list[int]]:
        if self._reference is None:
            self._reference = (policy, [], [])
        if self._reference[0] is policy:
            return self._reference[1], self._reference[2]
        if self._last is None or self._last[0] is not policy:
            self._last = (policy, [], [])
        return self._last[1], self._last[2]

    def __call__(self, policy: Policy, n: int) -> np.ndarray:
        returns, lengths = self._played(policy)
        if len(returns) < n:
            more = n - len(returns)
            result = evaluate(policy, self.env_spec, episodes=more, seed=self.first + len(returns),
                              n_envs=min(more, 32), max_steps=self.max_steps)
            returns.extend(result.returns.tolist())
            lengths.extend(result.lengths.tolist())
        return np.asarray(returns[:n], np.float64)

    def cache_key(self) -> CalibrationKey:
        """What these episodes are, for the stored int mode choice (:mod:`quarl.quantization.choice_cache`)."""
        return {"env": self.env_spec.to_json(default=str), "first_seed": self.first, "max_steps": self.max_steps,
                "steps": CALIBRATION_STEPS, "caps": list(SEQUENTIAL_CAPS)}

    def episode_cap(self, policy: Policy, first: int = 4) -> int:
        """How many episodes the sequential test may play: :data:`CALIBRATION_STEPS` over
        the mean length of ``policy``'s first episodes, within :data:`SEQUENTIAL_CAPS`."""
        self(policy, first)
        lengths = self._played(policy)[1][:first]
        low, high = SEQUENTIAL_CAPS
        return int(np.clip(CALIBRATION_STEPS // max(float(np.mean(lengths)), 1.0), low, high))


def calibration_returns(env_spec: EnvSpec, max_steps: int | None = None) -> CalibrationEpisodes:
    """The closed-loop check of the automatic int choice: see :class:`CalibrationEpisodes`."""
    return CalibrationEpisodes(env_spec, max_steps)


def calibration_inputs(policy: Policy, env_spec: EnvSpec, max_steps: int | None = None) -> np.ndarray:
    """Preprocessed observations (network inputs) from fp32 rollouts on the fixed
    calibration seeds: calibration for int8 CNNs and activation ranges, inputs for timing.
    Greedy rollouts, whether the policy is evaluated greedily or by sampling (the int mode a
    policy gets does not depend on how a command plays it)."""
    result = evaluate(
        policy.greedy(),
        env_spec,
        episodes=8,
        seed=CALIBRATION_SEED_OFFSET,
        n_envs=8,
        # every 16th step of 8 envs is kept: past 16 x CALIBRATION_SIZE / 8 steps nothing more
        # would be (an untrained Atari policy that never serves would otherwise play for 27k)
        max_steps=min(max_steps or 2 * CALIBRATION_SIZE, 2 * CALIBRATION_SIZE),
        keep_observations=CALIBRATION_SIZE,
        keep_every=16,
    )
    if result.observations is None:
        raise QuarlError(f"no observations to calibrate on: {env_spec.env_id} episodes ended at once")
    return result.observations


@dataclass(frozen=True)
class Calibration:
    """What a config quantizes with: calibration states (None where it needs none) and the
    calibration episodes that judge the automatic int modes."""

    inputs: np.ndarray | None
    returns: CalibrationEpisodes


def calibrate_if_needed(policy: Policy, env_spec: EnvSpec, config: QuantConfig, max_steps: int | None = None,
                        inputs: np.ndarray | None = None, returns: CalibrationEpisodes | None = None) -> Calibration:
    """The calibration ``config`` quantizes ``policy`` with: states from
    :func:`calibration_inputs` where the precision calibrates (activation ranges, every real
    int mode: :func:`quarl.quantization.precisions.needs_calibration`), else none; episodes from
    :func:`calibration_returns` (played only when asked). ``inputs`` / ``returns`` already
    computed for this policy and env (a run's earlier cells) are reused, never recomputed."""
    if inputs is None and registry.needs_calibration(config):
        inputs = calibration_inputs(policy, env_spec, max_steps)
    return Calibration(inputs, returns if returns is not None else calibration_returns(env_spec, max_steps))
