"""Cells: one policy evaluated at one configuration, keyed on content, run one after the
other into an output folder one run at a time.

- :class:`EvalSettings`: episodes and seeds (episode i resets with ``seed + i``);
- :func:`config_identity`: the config as this CPU runs it, the result format and (real int)
  the runtime: the one rule both cell keys are built on, ptq's :func:`cell_key` (a dict
  stored in ``results.jsonl``) and the study's :func:`quarl.study.grid.config_key` (a hash
  in SQLite);
- :func:`output_lock`: one run at a time per output folder;
- :func:`evaluate_config`: quantize and evaluate one config (an :class:`EvalRecord`);
- :func:`evaluate_cells`: evaluate cells, appending each record as it finishes and reusing
  a stored record only when its key matches (:class:`CellRecord` s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quarl.core.atomic import open_owned
from quarl.core.errors import QuarlError
from quarl.core.provenance import provenance
from quarl.core.records import ResultsLog
from quarl.core.timing import median_us
from quarl.envs import EnvSpec, sticky_probability
from quarl.evaluation import parallel
from quarl.evaluation.calibration import RESERVED_SEEDS, CalibrationEpisodes, calibrate_if_needed
from quarl.evaluation.record import RESULT_FORMAT, CellKey, CellRecord, EvalRecord, KeyExtras, SettingsKey, StoredCell
from quarl.policies.base import Policy
from quarl.quant import modes
from quarl.quantization import precisions as registry
from quarl.quantization.api import quantize
from quarl.quantization.config import QuantConfig, QuantConfigJson

log = logging.getLogger(__name__)

LATENCY_BUDGET_S = 0.05
"""Batch-1 latency of each cell's engine is timed this long (a rough figure beside the
returns; ``quarl bench`` measures properly)."""
MAX_EPISODE_STEPS = 10**9
"""--max-steps at most: past it a cut means nothing (and a study's SQLite integer overflows at 2**63)."""
Progress = Callable[[str, int], None]
"""Called with (cell label, episodes finished so far in that cell)."""


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
    """Processes playing the episodes side by side (:mod:`quarl.evaluation.parallel`); the returns are
    those of a serial run, so this is not part of a cell's key."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise QuarlError(f"episodes={self.episodes} must be at least 1")
        for what, reserved in RESERVED_SEEDS.items():
            first, last = reserved[0], reserved[-1]
            if self.seed <= last and self.seed + self.episodes > first:
                last_seed = self.seed + self.episodes - 1
                raise QuarlError(f"evaluation seeds {self.seed}..{last_seed} would reach the {what} "
                                 f"seeds {first}..{last}: choose a seed and episodes that stay below {first} or start "
                                 f"above {last}")
        if self.max_steps is not None and not 1 <= self.max_steps <= MAX_EPISODE_STEPS:
            raise QuarlError(f"max steps {self.max_steps} must be in 1..{MAX_EPISODE_STEPS:,} (or unset)")

    def key(self) -> SettingsKey:
        return {"episodes": self.episodes, "seed": self.seed, "max_steps": self.max_steps}


@dataclass
class Cell:
    """One configuration to evaluate."""

    label: str
    config: QuantConfig
    extra: KeyExtras = field(default_factory=lambda: KeyExtras())
    """More fields of the cell's key (a sweep's width and scheme, the QAT study's method)."""
    policy: Policy | None = None
    """Evaluate this policy as it is (e.g. a QAT-trained one) instead of quantizing."""


@dataclass(frozen=True)
class ConfigIdentity:
    """What a config is as this machine runs it: every stored result is keyed on it."""

    config: QuantConfigJson
    """The config resolved for this CPU (``QuantConfig.resolved``), as plain fields."""
    format: int
    """:data:`quarl.evaluation.record.RESULT_FORMAT`."""
    runtime: dict[str, str] | None
    """A real int config's runtime and CPU (:func:`quarl.quant.modes.runtime_key`): its
    kernels differ from one to another. None for the others."""


def config_identity(config: QuantConfig) -> ConfigIdentity:
    """The part of every cell key that says what ran: see :class:`ConfigIdentity`."""
    runtime = modes.runtime_key() if registry.get(config.precision).real_int else None
    return ConfigIdentity(config.resolved().to_json(), RESULT_FORMAT, runtime)


def cell_key(env_spec: EnvSpec, cell: Cell, settings: EvalSettings, fingerprint: str) -> CellKey:
    """What a stored ptq / sweep record must match to be reused: the cell's label and extra
    fields, the settings, the policy's content (``fingerprint``, or the cell's own policy's),
    :func:`config_identity` and the env, as it reads back from JSON (tuples become lists)."""
    identity = config_identity(cell.config)
    key: CellKey = json.loads(json.dumps({
        "precision": cell.label,
        **cell.extra,
        **settings.key(),
        "policy_sha256": fingerprint if cell.policy is None else cell.policy.fingerprint(),
        "config": identity.config,
        "env": dataclasses.asdict(env_spec),
        "format": identity.format,
        **({"runtime": identity.runtime} if identity.runtime is not None else {}),
    }))
    return key


@contextlib.contextmanager
def output_lock(out_dir: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``OUT/.lock`` for the length of a run: a second run on the same folder fails
    at once with one line instead of interleaving its cells and tables (``wait``: it waits
    for the first, as a study's cells sharing one recovered folder do). A link or a named
    pipe at ``OUT/.lock`` is refused in one line (:func:`quarl.core.atomic.open_owned`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # never truncated, never through a link, never a named pipe (it blocked the open): the lock is quarl's own file
    fd = open_owned(out_dir / ".lock", os.O_RDWR | os.O_CREAT, "a lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise QuarlError(f"{out_dir} is being written by another quarl run: wait for it or pass another "
                             "--out") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def evaluate_cells(
    policy: Policy,
    env_spec: EnvSpec,
    cells: Sequence[Cell],
    settings: EvalSettings,
    log_file: ResultsLog,
    progress: Progress | None,
    source: str | None = None,
    built: dict[str, tuple[Policy, float]] | None = None,
) -> list[CellRecord]:
    """Evaluate each cell, or reuse its stored record (``reused``); each is appended to
    ``log_file`` as it finishes. Every record says whose it is: ``algo``, ``env_id``,
    ``policy_sha256`` and ``checkpoint`` (``source``, the path as given; not part of the
    key: a moved file is the same policy). ``built``: (quantized policy, its latency) by
    cell label, filled as cells are quantized and taken from on later calls (``decide``'s
    chunks of the next seeds: quantized once, and their latency measured once, by the first)."""
    records: list[CellRecord] = []
    inputs: np.ndarray | None = None
    returns = CalibrationEpisodes(env_spec, settings.max_steps)  # fp32's played once per run
    fingerprint = policy.fingerprint()
    for cell in cells:
        key = cell_key(env_spec, cell, settings, fingerprint)
        done = log_file.find(StoredCell, **key)
        if done is not None:
            log.info("%s: reusing the result in %s", cell.label, log_file.path)
            records.append(CellRecord.from_stored(key, done, policy.algo, source))
            if progress:
                progress(cell.label, settings.episodes)
            continue
        finished = [0]

        def on_episode(_ep: int, _ret: float, label: str = cell.label, finished: list[int] = finished) -> None:
            finished[0] += 1
            if progress:
                progress(label, finished[0])

        ready, latency = (built or {}).get(cell.label, (cell.policy, None))
        if ready is None:  # a cell evaluated as it is never calibrates
            inputs = calibrate_if_needed(policy, env_spec, cell.config, settings.max_steps, inputs, returns).inputs
        result = evaluate_config(policy, env_spec, cell.config, settings, inputs, on_episode, quantized=ready,
                                 returns=returns, latency_us=latency, built=built, label=cell.label)
        record = CellRecord(key, policy.algo, source, result, provenance())
        log_file.append(record.to_dict())
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
    latency_us: float | None = None,
    built: dict[str, tuple[Policy, float]] | None = None,
    label: str = "",
) -> EvalRecord:
    """Quantize ``policy`` with ``config`` (or take ``quantized`` as it is) and evaluate
    it. ``calibration`` / ``returns``: a run's calibration states and episodes, computed
    here where needed and not given (:func:`quarl.evaluation.calibration.calibrate_if_needed`).
    ``latency_us``: measured already (a later chunk of a cell), else measured here;
    ``built``: where the quantized policy and its latency are kept under ``label``."""
    started = time.perf_counter()
    if quantized is None:
        calibrated = calibrate_if_needed(policy, env_spec, config, settings.max_steps, calibration, returns)
        calibration = calibrated.inputs
        quantized = quantize(policy, config, calibration=calibration, returns=calibrated.returns)
    build_s = time.perf_counter() - started
    one = np.zeros((1, *policy.input_shape), np.float32)
    if latency_us is None:
        latency_us = median_us(quantized.forward, calibration[:1] if calibration is not None else one,
                               LATENCY_BUDGET_S)
    if built is not None:
        built[label] = (quantized, latency_us)
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
    )
