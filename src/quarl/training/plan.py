"""``quarl train`` from its options: one run's :class:`~quarl.training.sb3_train.TrainConfig`,
every option checked first (one line for a bad one), and the finished run folder evaluated
as ``ptq`` would load it, on seeds of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quarl.core import validate
from quarl.core.errors import QuarlError

if TYPE_CHECKING:  # the CLI imports this module before a run: SB3 and torch load when it runs
    from quarl.policies.checkpoint import Checkpoint
    from quarl.training.sb3_train import TrainConfig

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
    # the algorithm and the env id before Stable-Baselines3 and torch load: a typo answers at once
    trainer(algo.lower())
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


def evaluate_trained(run: Checkpoint, episodes: int, seed: int) -> TrainedScore:
    """The run folder ``train`` wrote, loaded as any checkpoint is (``run``, by the caller:
    :func:`quarl.checkpoints.load_checkpoint` knows every format) and played for ``episodes``
    episodes on seeds of its own (:data:`POST_TRAINING_SEED_OFFSET`)."""
    from quarl.evaluation.episodes import evaluate

    if run.env_spec is None:  # a run folder quarl trained names its env
        raise QuarlError(f"{run.path} names no env: it is not a run folder quarl train wrote")
    result = evaluate(run.policy, run.env_spec, episodes=episodes, seed=seed + POST_TRAINING_SEED_OFFSET,
                      n_envs=min(episodes, POST_TRAINING_MAX_ENVS))
    return TrainedScore(run.path, run.policy.precision, result.mean, result.std, episodes)
