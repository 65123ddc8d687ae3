"""The steps of the ``quarl`` commands that are neither parsing nor printing: the training
plan and the evaluation after it, what ``ptq`` plays for a recovered policy, export and
bench with their calibration, and the files ``bench`` and ``study`` write. Each takes
checked values and returns what it made (and where), so a test calls it without typer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from quarl.core import validate
from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.table import Row

if TYPE_CHECKING:  # each step imports what it runs when it runs (the CLI imports this module)
    from quarl.envs import EnvSpec
    from quarl.policies.base import Policy
    from quarl.policies.onnx_artifact import SidecarJson
    from quarl.quantization.config import ParseOptions
    from quarl.training.sb3_train import TrainConfig
    from quarl.verdict import Judging

POST_TRAINING_SEED_OFFSET = 100_000
"""``quarl train``'s closing evaluation plays seeds ``seed + 100000 + i``: never the seeds
its periodic evaluations or a later ``ptq`` (seed + i) play first."""
POST_TRAINING_MAX_ENVS = 8


def train_config(algo: str, env_id: str, timesteps: int | None, seed: int, out: Path, precision: str,
                 qat_bits: int | None, quant_delay: int | None, hyperparams: Sequence[str], eval_freq: int,
                 eval_episodes: int, checkpoint_freq: int, trust_pickle: bool = False,
                 on_progress: Callable[[str], None] | None = None) -> TrainConfig:
    """One ``quarl train`` run, every option checked (one line for a bad one) and the
    budget resolved (the RL Zoo's where ``timesteps`` is None); QAT's delay defaults to half
    the budget."""
    from quarl.envs import check_env_id
    from quarl.training.hyperparams import trainer

    validate.timesteps(timesteps)
    validate.seed(seed)
    validate.out_folder(out)
    validate.count(eval_episodes, 1, "--eval-episodes")
    validate.count(eval_freq, 0, "--eval-freq")
    validate.count(checkpoint_freq, 0, "--checkpoint-freq")
    overrides = validate.hyperparams(list(hyperparams))
    trainer(algo.lower())  # the algorithm and the env id before Stable-Baselines3 and torch load: a typo answers at once
    check_env_id(env_id)
    if qat_bits is not None:
        validate.bit_widths(str(qat_bits))
        validate.count(quant_delay, 0, "--quant-delay")
    elif quant_delay is not None:
        raise QuarlError("--quant-delay needs --qat-bits")
    from quarl.quantization.config import QATConfig
    from quarl.training.sb3_train import TrainConfig, resolve_timesteps

    total = resolve_timesteps(algo.lower(), env_id, timesteps, overrides)
    qat = None
    if qat_bits is not None:
        qat = QATConfig(bits=qat_bits, quant_delay=quant_delay if quant_delay is not None else total // 2)
    return TrainConfig(algo.lower(), env_id, timesteps=total, seed=seed, out=out, precision=precision, qat=qat,
                       hyperparams=overrides, eval_freq=eval_freq, eval_episodes=eval_episodes,
                       checkpoint_freq=checkpoint_freq, progress_bar=True, trust_pickle=trust_pickle,
                       on_progress=on_progress)


@dataclass(frozen=True)
class TrainedScore:
    """A finished run folder evaluated as ``ptq`` would load it."""

    run_dir: Path
    precision: str
    mean: float
    std: float
    episodes: int


def evaluate_trained(run_dir: Path, episodes: int, seed: int) -> TrainedScore:
    """The run folder ``train`` wrote, loaded as any checkpoint is and played for
    ``episodes`` episodes on seeds of its own (:data:`POST_TRAINING_SEED_OFFSET`)."""
    from quarl.checkpoints import load_checkpoint
    from quarl.evaluation.episodes import evaluate

    ckpt = load_checkpoint(run_dir)
    if ckpt.env_spec is None:  # a run folder quarl trained names its env
        raise QuarlError(f"{run_dir} names no env: it is not a run folder quarl train wrote")
    result = evaluate(ckpt.policy, ckpt.env_spec, episodes=episodes, seed=seed + POST_TRAINING_SEED_OFFSET,
                      n_envs=min(episodes, POST_TRAINING_MAX_ENVS))
    return TrainedScore(run_dir, ckpt.policy.precision, result.mean, result.std, episodes)


def recovered_cells(checkpoint: Path, env_spec: EnvSpec, stochastic: bool, trust_pickle: bool,
                    payload: object = None) -> tuple[dict[str, Policy], str | None]:
    """What ``ptq`` plays instead of quantizing where ``checkpoint`` is a policy ``quarl
    recover`` wrote: fp32 is the ORIGINAL policy and the recovered precision its real
    kernel (cell label -> acting policy), with that precision; ``({}, None)`` otherwise.
    ``payload``: what loading ``checkpoint`` read besides its policy (a recovered folder's
    checked record: the folder is not read and hashed again)."""
    from quarl.evaluation.episodes import acting
    from quarl.recovery.folder import RecoveredFolder, load_recovered

    checked = payload if isinstance(payload, RecoveredFolder) else None
    recovered = load_recovered(checkpoint, trust_pickle, checked)
    if recovered is None:
        return {}, None
    return ({"fp32": acting(recovered.original, env_spec, stochastic),
             recovered.precision: acting(recovered.kernel, env_spec, stochastic)}, recovered.precision)


@dataclass(frozen=True)
class Exported:
    onnx: Path
    sidecar: Path
    meta: SidecarJson
    """The sidecar as written."""


def export_checkpoint(policy: Policy, env_spec: EnvSpec, precision: str, out: Path, max_steps: int | None = None,
                      portable: bool = False, **options: Unpack[ParseOptions]) -> Exported:
    """``policy`` at ``precision`` as OUT/policy.onnx and its sidecar OUT/policy.json: every
    precision but fp32 calibrates on the calibration seeds' states (episodes cut at
    ``max_steps``), and an automatic int mode is judged on the calibration episodes."""
    from quarl.deploy import export_policy
    from quarl.evaluation.calibration import calibration_inputs, calibration_returns
    from quarl.policies.onnx_artifact import ARTIFACT_NAME
    from quarl.quantization.config import QuantConfig

    config = QuantConfig.parse(precision, **options)  # an unknown label refused in one line
    validate.count(max_steps, 1, "--max-steps", unset="")
    calibration = None if config.precision == "fp32" else calibration_inputs(policy, env_spec, max_steps)
    returns = calibration_returns(env_spec, max_steps)
    stem = out / ARTIFACT_NAME
    meta = export_policy(policy, config, stem, calibration, env_spec, returns, portable=portable)
    return Exported(stem.with_suffix(".onnx"), stem.with_suffix(".json"), meta)


def bench_checkpoint(policy: Policy, env_spec: EnvSpec, precisions: Sequence[str], batches: Sequence[int],
                     budget_s: float, as_exported: bool = False) -> list[Row]:
    """Latency rows of ``policy`` at each precision (an exported model: as exported, alone),
    timed on the calibration seeds' states; int modes chosen as ``ptq`` chooses them."""
    from quarl.deploy import bench_precisions
    from quarl.evaluation.calibration import calibration_inputs, calibration_returns

    inputs = calibration_inputs(policy, env_spec)
    if as_exported:
        return bench_precisions(policy, inputs, [], batches, budget_s, as_exported=True)
    return bench_precisions(policy, inputs, precisions, batches, budget_s, calibration_returns(env_spec))


def write_bench(rows: Sequence[Row], out: Path, checkpoint: Path, policy: Policy) -> list[Path]:
    """bench.csv / .md / .json and provenance.json (what was timed, on what) in ``out``."""
    from quarl.core.provenance import provenance
    from quarl.evaluation.reports import write_rows

    written = write_rows(rows, out, "bench")
    record = {"checkpoint": str(checkpoint), "policy_sha256": policy.fingerprint(), **provenance()}
    write_atomic(out / "provenance.json", json.dumps(record, indent=1))
    return [*written, out / "provenance.json"]


def write_study_report(records: Sequence[Mapping[str, Any]], precisions: Sequence[str], out: Path,
                       seeds: int, judging: Judging | None = None) -> list[Row]:
    """The study's table (table.csv / .md / .json) and study.png in ``out``; returns the rows
    (verdicts under ``judging``, the default :class:`quarl.verdict.Judging` where None)."""
    from quarl.evaluation.reports import write_rows
    from quarl.study.report import plot_study, study_table
    from quarl.verdict import Judging

    rows = study_table(records, precisions, judging or Judging())
    write_rows(rows, out, "table")
    plot_study(records, precisions, out / "study.png", f"{len(rows)} agents, {seeds} seeds")
    return rows


def file_label(precision: str) -> str:
    """A policy's precision as a file name part: ``int8 (onnx)`` -> ``int8-onnx``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", precision).strip("-")


def episode_rows(returns: Iterable[float], lengths: Iterable[int], seed: int) -> list[Row]:
    """``play``'s table: each episode with the seed it played, its return and length."""
    return [{"episode": i, "seed": seed + i, "return": round(float(r), 2), "length": int(n)}
            for i, (r, n) in enumerate(zip(returns, lengths))]
