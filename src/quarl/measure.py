"""Measuring one policy at one precision, shared by ``ptq``, ``sweep``, ``study``, the
QAT study, ``export`` and the Python API.

- :class:`EvalSettings`: episodes and seeds (episode i resets with ``seed + i``);
- calibration on fp32 rollouts of the fixed seeds :data:`CALIBRATION_SEEDS`, never the
  evaluation's, whatever the command and its seed, so ptq, study, demo, export and the API
  choose a policy's int mode from the same data (:func:`calibration_inputs`,
  :func:`calibration_returns`);
- :class:`EvalRecord`: what one evaluation measured, one definition for ``results.jsonl``,
  the study's SQLite columns and the tables;
- :func:`run_cells`: evaluate cells, appending each record as it finishes and reusing a
  stored record only when its key (:func:`cell_key`: the policy's content, the config as
  this CPU runs it, env, settings, :data:`RESULT_FORMAT`) matches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from quarl.envs import EnvSpec, sticky_probability
from quarl import parallel
from quarl.errors import QuarlError
from quarl.evaluation import evaluate
from quarl.policies.base import Policy, greedy
from quarl.provenance import provenance
from quarl.quant import precisions as registry
from quarl.quant.api import quantize
from quarl.quant.config import QuantConfig
from quarl.quant.modes import runtime_key
from quarl.records import ResultsLog
from quarl.timing import median_us

log = logging.getLogger(__name__)

LATENCY_BUDGET_S = 0.05
"""Batch-1 latency of each cell's engine is timed this long (a rough figure beside the
returns; ``quarl bench`` measures properly)."""
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
RESULT_FORMAT = 14
"""Bumped when what a stored record means changes (2: fp32 in PyTorch, int modes, content keys;
3: static int8 left to CNNs and checked on states it was not fit to, closed-loop fallback;
4: every env acts at batch 1, so fp32 equals SB3 on chaotic envs whatever n_envs;
5: int modes chosen in registry order unless 1.5x faster: the same choice run after run;
6: an int mode must also keep fp32's return on calibration episodes;
7: an MLP's input layer stays fp32 in the automatic int modes;
8: a later int mode must also save 50 us per call, and modes are timed interleaved;
9: an Atari episode is a whole game scored as the RL Zoo's player scores it;
10: an int mode keeps fp32's return by a paired sequential test on 4..16 calibration episodes;
11: ...doubling them up to a budget of ~20k steps (16..64 episodes);
12: calibration seeds are fixed (10,000..10,199) whatever the evaluation's seed;
13: a CNN tries every fp32-layer option of the convolution modes before the MatMul modes;
14: the fastest agreeing int mode wins (5 % and 2 us margins), and the choice is stored)."""
Progress = Callable[[str, int], None]
"""Called with (cell label, episodes finished so far in that cell)."""


@dataclass(frozen=True)
class EvalRecord:
    """What evaluating one policy at one precision measured. ``ptq`` / ``sweep`` append it
    (with its key) to ``results.jsonl``, the study stores it as SQLite columns
    (:func:`sql_columns`), the tables read it."""

    env_id: str
    mean: float
    std: float
    returns: list
    """Per-episode returns (rounded to 4 digits), episode i reset with seed ``seed + i``."""
    lengths: list
    quant: dict | None
    """A real int cell's mode, fp32 layers, agreement with fp32 and every mode tried."""
    steps_per_s: float | None
    latency_us: float | None
    """Batch-1 engine call, rough (``quarl bench`` measures properly)."""
    model_bytes: int | None
    build_s: float | None
    """Seconds to quantize (calibration and the automatic mode choice included)."""
    endings: list | None = None
    """Per episode, a digest of how it ended (:func:`quarl.evaluation.ending`): equal digests
    are replays of one game (older records have none)."""
    acting: str | None = None
    """``sampled`` (the policy drew its actions, :func:`quarl.evaluation.acting`) or
    ``greedy`` (older records have none: greedy)."""
    sticky_actions: float | None = None
    """The env's sticky-action probability where one was set (:func:`quarl.envs.with_sticky_actions`)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SQL = {"str": "TEXT NOT NULL", "float": "REAL NOT NULL", "list": "TEXT NOT NULL", "dict | None": "TEXT",
        "float | None": "REAL", "int | None": "INTEGER", "list | None": "TEXT",
        "str | None": "TEXT"}


def sql_columns() -> dict[str, str]:
    """SQLite column types of :class:`EvalRecord`'s fields (lists and dicts as JSON text)."""
    return {f.name: _SQL[str(f.type)] for f in dataclasses.fields(EvalRecord)}


def json_fields() -> tuple[str, ...]:
    """:class:`EvalRecord` fields stored as JSON text."""
    return tuple(f.name for f in dataclasses.fields(EvalRecord) if str(f.type).split(" ")[0] in ("list", "dict"))


MAX_EPISODE_STEPS = 10**9
"""--max-steps at most: past it a cut means nothing (and a study's SQLite integer overflows at 2**63)."""


@dataclass(frozen=True)
class EvalSettings:
    """How every cell is evaluated (the same for all precisions of a run)."""

    episodes: int = 20
    """Episodes per precision; episode i is reset with seed ``seed + i``."""
    seed: int = 0
    n_envs: int = 32
    """Envs stepped side by side (the policy acts on their batch)."""
    max_steps: int | None = None
    """Cut episodes longer than this (None: the env's own limit)."""
    workers: int = 1
    """Processes playing the episodes side by side (:mod:`quarl.parallel`); the returns are
    those of a serial run, so this is not part of a cell's key."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise QuarlError(f"episodes={self.episodes} must be at least 1")
        for what, reserved in RESERVED_SEEDS.items():
            first, last = reserved[0], reserved[-1]
            if self.seed <= last and self.seed + self.episodes > first:
                raise QuarlError(f"evaluation seeds {self.seed}..{self.seed + self.episodes - 1} would reach the {what} "
                                 f"seeds {first}..{last}: choose a seed and episodes that stay below {first} or start "
                                 f"above {last}")
        if self.max_steps is not None and not 1 <= self.max_steps <= MAX_EPISODE_STEPS:
            raise QuarlError(f"max steps {self.max_steps} must be in 1..{MAX_EPISODE_STEPS:,} (or unset)")

    def key(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "seed": self.seed, "max_steps": self.max_steps}


@dataclass
class Cell:
    """One configuration to evaluate."""

    label: str
    config: QuantConfig
    extra: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None
    """Evaluate this policy as it is (e.g. a QAT-trained one) instead of quantizing."""


def cell_key(policy: Policy, env_spec: EnvSpec, cell: Cell, settings: EvalSettings, fingerprint: str) -> dict[str, Any]:
    """What a stored record must match to be reused (see the module docstring), as it
    reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps({
        "precision": cell.label,
        **cell.extra,
        **settings.key(),
        "policy_sha256": fingerprint if cell.policy is None else cell.policy.fingerprint(),
        "config": dataclasses.asdict(cell.config.resolved()),
        "env": dataclasses.asdict(env_spec),
        "format": RESULT_FORMAT,
        **({"runtime": runtime_key()} if registry.get(cell.config.precision).real_int else {}),
    }))


@contextlib.contextmanager
def output_lock(out_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``OUT/.lock`` for the length of a run: a second run on the same folder fails
    at once with one line instead of interleaving its cells and tables (``wait``: it waits
    for the first, as a study's cells sharing one recovered folder do)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise QuarlError(f"{out_dir} is being written by another quarl run: wait for it or pass another --out") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_cells(
    policy: Policy,
    env_spec: EnvSpec,
    cells: Sequence[Cell],
    settings: EvalSettings,
    log_file: ResultsLog,
    progress: Progress | None,
    source: str | None = None,
) -> list[dict[str, Any]]:
    """Evaluate each cell, or reuse its stored record; a reused record carries
    ``"reused": True`` (in memory only). Every record says whose it is: ``algo``,
    ``env_id``, ``policy_sha256`` and ``checkpoint`` (``source``, the path as given; not
    part of the key: a moved file is the same policy)."""
    identity = {"algo": policy.algo, "checkpoint": source}
    records: list[dict[str, Any]] = []
    calibration: np.ndarray | None = None
    returns = calibration_returns(env_spec, settings.max_steps)  # fp32's played once per run
    fingerprint = policy.fingerprint()
    for cell in cells:
        key = cell_key(policy, env_spec, cell, settings, fingerprint)
        done = log_file.find(**key)
        if done is not None:
            log.info("%s: reusing the result in %s", cell.label, log_file.path)
            records.append({**done, **identity, "reused": True})
            if progress:
                progress(cell.label, settings.episodes)
            continue
        finished = [0]

        def on_episode(_ep: int, _ret: float, label: str = cell.label) -> None:
            finished[0] += 1
            if progress:
                progress(label, finished[0])

        if cell.policy is None and calibration is None and registry.needs_calibration(cell.config):
            calibration = calibration_inputs(policy, env_spec, settings.max_steps)
        record = {**key, **identity, **evaluate_config(policy, env_spec, cell.config, settings, calibration, on_episode,
                                                       quantized=cell.policy, returns=returns), "provenance": provenance()}
        log_file.append(record)
        records.append(record)
    return records


def evaluate_config(
    policy: Policy,
    env_spec: EnvSpec,
    config: QuantConfig,
    settings: EvalSettings,
    calibration: np.ndarray | None = None,
    on_episode: Callable[[int, float], None] | None = None,
    quantized: Policy | None = None,
    returns: CalibrationEpisodes | None = None,
) -> dict[str, Any]:
    """Quantize ``policy`` with ``config`` (or take ``quantized`` as it is) and evaluate
    it: the fields of one result record. ``returns`` (default: a fresh
    :func:`calibration_returns`) judges the automatic int modes on calibration episodes."""
    started = time.perf_counter()
    if quantized is None:
        if calibration is None and registry.needs_calibration(config):
            calibration = calibration_inputs(policy, env_spec, settings.max_steps)
        returns = returns or calibration_returns(env_spec, settings.max_steps)
        quantized = quantize(policy, config, calibration=calibration, returns=returns)
    build_s = time.perf_counter() - started
    one = np.zeros((1, *policy.input_shape), np.float32)
    latency_us = median_us(quantized.forward, calibration[:1] if calibration is not None else one, LATENCY_BUDGET_S)
    result = parallel.evaluate(quantized, env_spec, episodes=settings.episodes, seed=settings.seed,
                               n_envs=settings.n_envs, max_steps=settings.max_steps, on_episode=on_episode,
                               workers=settings.workers)
    return EvalRecord(
        env_id=env_spec.env_id,
        mean=result.mean,
        std=result.std,
        returns=[round(float(r), 4) for r in result.returns],
        lengths=result.lengths.tolist(),
        quant=quantized.meta.get("quant"),
        steps_per_s=result.steps_per_s,
        latency_us=latency_us,
        model_bytes=quantized.size_bytes(),
        build_s=build_s,
        endings=result.endings,
        acting="sampled" if quantized.stochastic else "greedy",
        sticky_actions=sticky_probability(env_spec),
    ).to_dict()


CALIBRATION_EPISODE_STEPS = 1000
"""Calibration episodes are cut here: a whole MuJoCo episode, a paired comparison for the
rest (fp32 and the candidate are cut alike), and an untrained Atari policy that never
serves does not play for 27k steps per candidate."""


CALIBRATION_STEPS = 20_000
"""The sequential test of a mode plays at most about this many steps per policy: 64
episodes of a short game, 20 of a 1000-step MuJoCo episode (never fewer than 16)."""
SEQUENTIAL_CAPS = (16, 64)


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
            result = evaluate(policy, self.env_spec, episodes=more, seed=self.first + len(returns), n_envs=min(more, 32),
                              max_steps=self.max_steps)
            returns.extend(result.returns.tolist())
            lengths.extend(result.lengths.tolist())
        return np.asarray(returns[:n], np.float64)

    def cache_key(self) -> dict[str, Any]:
        """What these episodes are, for the stored int mode choice (:mod:`quarl.quant.choice_cache`)."""
        return {"env": dataclasses.asdict(self.env_spec), "first_seed": self.first, "max_steps": self.max_steps,
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
        greedy(policy),
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
