"""Post-training quantization workflows: evaluate a policy at several precisions (``ptq``),
over bit widths (``sweep``), and analyse its weights (``analyze``).

Each evaluated cell is appended to ``OUT/results.jsonl`` as soon as it finishes and is
reused when the same command runs again, so an interrupted run resumes; the tables and
plots are rebuilt from those records. A cell is keyed on what determines its numbers: the
policy's content (:meth:`Policy.fingerprint`), the full quantization config as this CPU
runs it, the env, the evaluation settings and :data:`RESULT_FORMAT`; anything else
evaluates anew. One run at a time writes to an output folder (a lock).

Calibration (int modes, static ranges, activation ranges) uses fp32 rollouts on seeds
``seed + CALIBRATION_SEED_OFFSET + i``, never on the evaluation's ``seed + i``.
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

from quarl.envs import EnvSpec
from quarl.provenance import provenance
from quarl.errors import QuarlError
from quarl.evaluation import evaluate
from quarl.policies.base import Policy
from quarl.quant.analysis import kl_by_bits, plot_histograms, plot_kl, weight_stats
from quarl.quant.api import quantize
from quarl.quant import precisions as registry
from quarl.quant.config import QuantConfig
from quarl.quant.modes import runtime_key
from quarl.records import ResultsLog
from quarl.timing import median_us
from quarl.reports import plot_sweep, ptq_rows, write_rows

log = logging.getLogger(__name__)

LATENCY_BUDGET_S = 0.05
"""Batch-1 latency of each cell's engine is timed this long (a rough figure beside the
returns; ``quarl bench`` measures properly)."""
CALIBRATION_SIZE = 256
CALIBRATION_SEED_OFFSET = 10_000
"""Calibration episodes start at ``seed + 10_000``; evaluation uses ``seed .. seed + episodes - 1``."""
RESULT_FORMAT = 8
"""Bumped when what a stored record means changes (2: fp32 in PyTorch, int modes, content keys;
3: static int8 left to CNNs and checked on states it was not fit to, closed-loop fallback;
4: every env acts at batch 1, so fp32 equals SB3 on chaotic envs whatever n_envs;
5: int modes chosen in registry order unless 1.5x faster: the same choice run after run;
6: an int mode must also keep fp32's return on calibration episodes;
7: an MLP's input layer stays fp32 in the automatic int modes;
8: a later int mode must also save 50 us per call, and modes are timed interleaved)."""
Progress = Callable[[str, int], None]
"""Called with (cell label, episodes finished so far in that cell)."""


@dataclass(frozen=True)
class EvalSettings:
    """How every cell is evaluated (the same for all precisions of a run)."""

    episodes: int = 20
    """Episodes per precision; episode i is reset with seed ``seed + i``."""
    seed: int = 0
    n_envs: int = 8
    """Envs stepped side by side (the policy acts on their batch)."""
    max_steps: int | None = None
    """Cut episodes longer than this (None: the env's own limit)."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise QuarlError(f"episodes={self.episodes} must be at least 1")
        if self.episodes >= CALIBRATION_SEED_OFFSET:
            raise QuarlError(f"episodes={self.episodes} would reach the calibration seeds: allowed < "
                             f"{CALIBRATION_SEED_OFFSET}")
        if self.max_steps is not None and self.max_steps < 1:
            raise QuarlError(f"max steps {self.max_steps} must be at least 1 (or unset)")

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
def output_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``OUT/.lock`` for the length of a run: a second run on the same folder fails
    at once with one line instead of interleaving its cells and tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
) -> list[dict[str, Any]]:
    """Evaluate each cell, or reuse its stored record; a reused record carries
    ``"reused": True`` (in memory only)."""
    records: list[dict[str, Any]] = []
    calibration: np.ndarray | None = None
    returns = calibration_returns(env_spec, settings.seed, settings.max_steps)  # fp32's played once per run
    fingerprint = policy.fingerprint()
    for cell in cells:
        key = cell_key(policy, env_spec, cell, settings, fingerprint)
        done = log_file.find(**key)
        if done is not None:
            log.info("%s: reusing the result in %s", cell.label, log_file.path)
            records.append({**done, "reused": True})
            if progress:
                progress(cell.label, settings.episodes)
            continue
        finished = [0]

        def on_episode(_ep: int, _ret: float, label: str = cell.label) -> None:
            finished[0] += 1
            if progress:
                progress(label, finished[0])

        if cell.policy is None and calibration is None and needs_calibration(policy, cell.config):
            calibration = calibration_inputs(policy, env_spec, settings.seed, settings.max_steps)
        record = {**key, **evaluate_config(policy, env_spec, cell.config, settings, calibration, on_episode,
                                           quantized=cell.policy, returns=returns), "provenance": provenance()}
        log_file.append(record)
        records.append(record)
    return records


def needs_calibration(policy: Policy, config: QuantConfig) -> bool:
    """Activation ranges are calibrated on observations, and every real int mode is
    checked (or chosen) against fp32 on them."""
    return registry.needs_calibration(config)


def evaluate_config(
    policy: Policy,
    env_spec: EnvSpec,
    config: QuantConfig,
    settings: EvalSettings,
    calibration: np.ndarray | None = None,
    on_episode: Callable[[int, float], None] | None = None,
    quantized: Policy | None = None,
    returns: Callable[[Policy], float] | None = None,
) -> dict[str, Any]:
    """Quantize ``policy`` with ``config`` (or take ``quantized`` as it is) and evaluate
    it: the fields of one result record. ``returns`` (default: a fresh
    :func:`calibration_returns`) judges the automatic int modes on calibration episodes."""
    started = time.perf_counter()
    if quantized is None:
        if calibration is None and needs_calibration(policy, config):
            calibration = calibration_inputs(policy, env_spec, settings.seed, settings.max_steps)
        returns = returns or calibration_returns(env_spec, settings.seed, settings.max_steps)
        quantized = quantize(policy, config, calibration=calibration, returns=returns)
    build_s = time.perf_counter() - started
    one = np.zeros((1, *policy.input_shape), np.float32)
    latency_us = median_us(quantized.forward, calibration[:1] if calibration is not None else one, LATENCY_BUDGET_S)
    result = evaluate(quantized, env_spec, episodes=settings.episodes, seed=settings.seed, n_envs=settings.n_envs,
                      max_steps=settings.max_steps, on_episode=on_episode)
    return {
        "quant": quantized.meta.get("quant"),
        "mean": result.mean,
        "std": result.std,
        "returns": [round(float(r), 4) for r in result.returns],
        "lengths": result.lengths.tolist(),
        "steps_per_s": result.steps_per_s,
        "latency_us": latency_us,
        "model_bytes": quantized.size_bytes(),
        "build_s": build_s,
        "env_id": env_spec.env_id,
    }


CALIBRATION_EPISODES = 4
CALIBRATION_EPISODE_STEPS = 1000
"""Calibration episodes are cut here: a whole MuJoCo episode, a paired comparison for the
rest (fp32 and the candidate are cut alike), and an untrained Atari policy that never
serves does not play for 27k steps per candidate."""


def calibration_returns(env_spec: EnvSpec, seed: int = 0, max_steps: int | None = None) -> Callable[[Policy], float]:
    """Mean return of a policy on calibration episodes ``seed + CALIBRATION_SEED_OFFSET +
    100 + i`` (apart from evaluation's and from the calibration states' seeds): the
    automatic int choice's closed-loop check."""
    first = seed + CALIBRATION_SEED_OFFSET + 100
    reference: list = []  # [policy, return] of the first policy asked: the fp32 one, asked again per int cell

    def returns(policy: Policy) -> float:
        if reference and reference[0] is policy:
            return reference[1]
        value = play(policy)
        if not reference:
            reference[:] = [policy, value]
        return value

    def play(policy: Policy) -> float:
        return evaluate(policy, env_spec, episodes=CALIBRATION_EPISODES, seed=first, n_envs=CALIBRATION_EPISODES,
                        max_steps=min(max_steps or CALIBRATION_EPISODE_STEPS, CALIBRATION_EPISODE_STEPS)).mean

    return returns


def calibration_inputs(policy: Policy, env_spec: EnvSpec, seed: int = 0, max_steps: int | None = None) -> np.ndarray:
    """Preprocessed observations (network inputs) from fp32 rollouts on seeds disjoint
    from evaluation's: calibration for int8 CNNs and activation ranges, inputs for timing."""
    result = evaluate(
        policy,
        env_spec,
        episodes=8,
        seed=seed + CALIBRATION_SEED_OFFSET,
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


def run_ptq(
    policy: Policy,
    env_spec: EnvSpec,
    precisions: Sequence[str],
    settings: EvalSettings,
    out_dir: Path,
    progress: Progress | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Evaluate each precision (fp32 first, for E); write ``ptq.{csv,md,json}``.
    ``options``: QuantConfig fields for every cell (``int8_weights``, ``block_size``...)."""
    labels = list(dict.fromkeys(["fp32", *precisions]))
    cells = [Cell(label, QuantConfig.parse(label, **options)) for label in labels]
    with output_lock(out_dir):
        records = run_cells(policy, env_spec, cells, settings, ResultsLog(out_dir / "results.jsonl"), progress)
        write_rows(ptq_rows(records), out_dir, "ptq")
    return records


def run_artifact(policy: Policy, env_spec: EnvSpec, settings: EvalSettings, out_dir: Path,
                 progress: Progress | None = None) -> list[dict[str, Any]]:
    """Evaluate an exported model as it is (one cell labelled with its precision, e.g.
    ``int8 (onnx)``); write ``ptq.{csv,md,json}``."""
    cells = [Cell(policy.precision, QuantConfig(), policy=policy)]
    with output_lock(out_dir):
        records = run_cells(policy, env_spec, cells, settings, ResultsLog(out_dir / "results.jsonl"), progress)
        write_rows(ptq_rows(records), out_dir, "ptq")
    return records


def run_sweep(
    policy: Policy,
    env_spec: EnvSpec,
    bits: Sequence[int],
    settings: EvalSettings,
    out_dir: Path,
    scheme: str = "quarl",
    granularity: str = "auto",
    progress: Progress | None = None,
    title: str = "",
    activations: bool = False,
    block_size: int = 32,
) -> list[dict[str, Any]]:
    """Evaluate fp32 and simulated n-bit weights (and layer outputs, when
    ``activations``, with ranges calibrated on fp32 rollouts) for each width; write
    ``sweep.{csv,md,json}`` and ``sweep.png``."""
    cells = [Cell("fp32", QuantConfig())]
    for n in bits:
        config = QuantConfig(precision="nbit", bits=n, scheme=scheme, granularity=granularity, activations=activations,
                             block_size=block_size)
        key = {"bits": n, "scheme": scheme, "granularity": granularity, "activations": activations}
        cells.append(Cell(config.label, config, key))
    with output_lock(out_dir):
        records = run_cells(policy, env_spec, cells, settings, ResultsLog(out_dir / "results.jsonl"), progress)
        rows = ptq_rows(records)
        for row, record in zip(rows, records):
            row["bits"] = record.get("bits", 32)
        write_rows(rows, out_dir, "sweep")
        plot_sweep(records, out_dir / "sweep.png", title or f"{policy.algo} {env_spec.env_id}: {scheme}, {granularity}")
    return records


def run_analyze(
    policy: Policy, bits: Sequence[int], out_dir: Path, scheme: str = "quarl", granularity: str = "auto", title: str = ""
) -> tuple[list[dict], list[dict]]:
    """Write ``weights.{csv,md,json}``, ``kl.{csv,md,json}``, ``histograms.png``, ``kl.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stats_rows = weight_stats(policy.network)
    kl_rows = kl_by_bits(policy.network, bits, scheme, granularity)
    write_rows([{k: _round(v) for k, v in r.items()} for r in stats_rows], out_dir, "weights")
    write_rows([{k: _round(v, 6) for k, v in r.items()} for r in kl_rows], out_dir, "kl")
    title = title or policy.algo
    plot_histograms(policy.network, out_dir / "histograms.png", f"{title}: weight distributions")
    plot_kl(kl_rows, out_dir / "kl.png", f"{title}: KL divergence of n-bit weights ({scheme})")
    return stats_rows, kl_rows


def _round(value: Any, digits: int = 4) -> Any:
    return round(value, digits) if isinstance(value, float) else value
