"""Train a Stable-Baselines3 agent with the RL Zoo's hyperparameters, optionally with
quantization-aware training and mixed precision, and save it as an RL Zoo run folder
that :func:`quarl.checkpoints.load_checkpoint` reads back as is::

    OUT/ALGO/ENV_N/ENV.zip                  final weights (fp32 master copy)
    OUT/ALGO/ENV_N/ENV/config.yml, args.yml the zoo entry used, the run's arguments
    OUT/ALGO/ENV_N/ENV/vecnormalize.pkl     when the zoo normalizes observations
    OUT/ALGO/ENV_N/ENV/qat.json             QAT runs: bits, scheme, monitored ranges
    OUT/ALGO/ENV_N/rl_model_N_steps.zip     periodic checkpoints, named as the RL Zoo names them
                                            (``--resume`` starts there; replay buffer, normalization
                                            and QAT state beside them as .npz / .json)
    OUT/ALGO/ENV_N/best_model.zip           the best periodic evaluation (not for QAT runs)
    OUT/ALGO/ENV_N/tb/                      TensorBoard (rollout/, train/, eval/, qat/ keys)
    OUT/ALGO/ENV_N/evaluations.npz          periodic evaluations (SB3's EvalCallback)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import yaml
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback

from quarl.core.atomic import check_folder, owned_folder, write_atomic
from quarl.core.errors import QuarlError, StoppedRun
from quarl.core.validate import digits
from quarl.envs import EnvSpec, check_env_id, gym_packages, make_env
from quarl.quant.qat import plain_layers
from quarl.quantization.config import QATConfig, QATState
from quarl.training.buffer_memory import check_buffer_memory
from quarl.training.callbacks import REWARD_LINES, CheckpointEvery, RollingReward
from quarl.training.guard import NonFiniteGuard, NonFiniteTraining, non_finite_state, raise_if_non_finite
from quarl.training.hyperparams import TRAINERS, Hyperparams, trainer
from quarl.training.mixed_precision import TRAIN_PRECISIONS, enable_mixed_precision
from quarl.training.periodic_saves import Checkpointer, latest_checkpoint, run_checkpoints
from quarl.training.qat_sb3 import QATCallback, read_qat_state, write_qat_state
from quarl.training.resume import RUN_SETTINGS, RunSettings, check_checkpoint_step, resume_from, resumed_hyperparams
from quarl.training.train_setup import TrainSetup, prepare
from quarl.training.vec_env import training_vec_env

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """One training run."""

    algo: str
    """a2c, ppo, dqn, ddpg, td3 or sac."""
    env_id: str
    """A gymnasium id (Atari ids get the zoo's Atari wrappers and frame stack)."""
    timesteps: int | None = None
    """Env steps; None: the zoo's n_timesteps for this env."""
    seed: int = 0
    out: Path = Path("runs")
    """Run folders go to OUT/ALGO/ENV_N."""
    precision: str = "fp32"
    """Gradient updates in fp32, bf16 or fp16 (autocast, fp32 master weights)."""
    qat: QATConfig | None = None
    """Quantization-aware training, or None for plain training."""
    hyperparams: Hyperparams = field(default_factory=dict)
    """Overrides of the zoo's entry (e.g. {"n_envs": 4}): literals, as ``--hp`` parses them."""
    eval_freq: int = 10_000
    """Evaluate every this many env steps (0: never)."""
    eval_episodes: int = 5
    checkpoint_freq: int = 0
    """Checkpoint every this many env steps; 0: a tenth of the run."""
    save_replay: bool = True
    """Off-policy checkpoints include the replay buffer (resume continues it)."""
    tensorboard: bool = True
    trust_pickle: bool = False
    """Resume from a checkpoint written by an older quarl (replay / normalization pickles)."""
    progress_bar: bool = False
    on_progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    """Where the rolling training return goes, a line per tenth of the budget (default: the
    ``quarl`` logger at INFO)."""
    run_dir: Path | None = None
    """Explicit run folder (overrides OUT/ALGO/ENV_N)."""


def check_algo_env(algo: str, env_id: str) -> gym.spaces.Space[Any]:
    """Validate the pair and return the env's action space (one line on a bad pair)."""
    actions = trainer(algo).actions
    check_env_id(env_id)
    probe = make_env(EnvSpec(env_id))
    space = probe.action_space
    probe.close()
    multi = isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
    if multi and actions != "both":
        raise QuarlError(f"{algo} does not take {type(space).__name__} actions ({env_id}): use ppo, a2c or trpo")
    if actions == "discrete" and not isinstance(space, gym.spaces.Discrete):
        raise QuarlError(f"{algo} needs discrete actions but {env_id} has {space}: use ppo, a2c, sac, td3 or ddpg")
    if actions == "continuous" and not isinstance(space, gym.spaces.Box):
        raise QuarlError(f"{algo} needs continuous actions but {env_id} has {space}: use ppo, a2c or dqn")
    if not multi and not isinstance(space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise QuarlError(f"{env_id} has action space {space}: quarl trains on Discrete, Box, MultiDiscrete and "
                         "MultiBinary actions")
    return space


def run_folder(config: TrainConfig, resume: bool) -> Path:
    """OUT/ALGO/ENV_N: the next free N for a new run, the latest unfinished one to resume."""
    if config.run_dir is not None:
        return Path(config.run_dir)
    check_folder(config.out, config.algo)  # OUT/ALGO a link: refused before anything is trained, not written through
    base = Path(config.out) / config.algo
    name = config.env_id.replace("/", "_")
    ids = sorted(int(p.name.rsplit("_", 1)[1]) for p in base.glob(f"{name}_*") if digits(p.name.rsplit("_", 1)[1]))
    if resume:  # the newest run that has a checkpoint (a start that failed leaves an empty folder)
        with_checkpoint = [i for i in ids if run_checkpoints(base / f"{name}_{i}")]
        if not with_checkpoint:
            raise QuarlError(f"nothing to resume: no {config.algo} {config.env_id} run with a checkpoint under "
                             f"{config.out}")
        return base / f"{name}_{with_checkpoint[-1]}"
    return base / f"{name}_{(ids[-1] if ids else 0) + 1}"


def _total(algo: str, env_id: str, timesteps: int | None, setup: TrainSetup) -> int:
    total = timesteps if timesteps is not None else setup.n_timesteps
    if total is None:
        raise QuarlError(f"the RL Zoo has no {algo} budget for {env_id}: pass --timesteps")
    if total < 1:
        raise QuarlError(f"--timesteps {total} must be at least 1")
    return int(total)


def resolve_timesteps(algo: str, env_id: str, timesteps: int | None, overrides: Hyperparams | None = None) -> int:
    """The training length: ``timesteps`` or the zoo's budget (validating algo and env)."""
    setup = prepare(algo, env_id, check_algo_env(algo, env_id), overrides)
    return _total(algo, env_id, timesteps, setup)


@dataclass
class TrainResult:
    run_dir: Path
    timesteps: int
    resumed_from: int
    """Env steps already done when this call started (0 for a fresh run)."""
    model: BaseAlgorithm | None = field(default=None, repr=False)
    """The trained SB3 model (QAT wrappers still in place; its envs are closed)."""


def _plan(config: TrainConfig, resume: bool) -> tuple[TrainConfig, TrainSetup, int]:
    """The run's config (a resumed run's own --hp), its zoo setup and budget, each checked
    in one line before anything is built."""
    if config.precision not in TRAIN_PRECISIONS:
        raise QuarlError(f"unknown training precision {config.precision!r}: allowed {', '.join(TRAIN_PRECISIONS)}")
    stored = None  # the settings file a resumed run's --hp were read from
    if resume:
        run_dir = run_folder(config, True)
        hyperparams = resumed_hyperparams(config.hyperparams, run_dir)
        stored = run_dir / RUN_SETTINGS if hyperparams and not config.hyperparams else None
        config = dataclasses.replace(config, hyperparams=hyperparams)
    action_space = check_algo_env(config.algo, config.env_id)
    if config.qat is not None and TRAINERS[config.algo].qat_refused:
        raise QuarlError(TRAINERS[config.algo].qat_refused)
    try:
        setup = prepare(config.algo, config.env_id, action_space, config.hyperparams)
    except QuarlError as exc:
        if stored is None:
            raise
        raise QuarlError(f"{stored} (the --hp this run started with): {exc}") from None
    total = _total(config.algo, config.env_id, config.timesteps, setup)
    if config.qat is not None and config.qat.quant_delay >= total:
        raise QuarlError(
            f"quant delay {config.qat.quant_delay} is not below the training length {total}: "
            "nothing would be trained quantized (allowed 0..{})".format(total - 1)
        )
    return config, setup, total


def _start(config: TrainConfig, run_dir: Path, total: int, resume: bool) -> tuple[int, Path] | None:
    """(step, zip) of the checkpoint a resumed run continues from, checked against the run;
    None for a new run."""
    if not resume:
        return None
    final_zip = run_dir / f"{config.env_id.replace('/', '_')}.zip"
    if final_zip.exists():
        raise QuarlError(f"{run_dir} already finished ({final_zip.name} exists): nothing to resume")
    found = run_checkpoints(run_dir)
    if not found:
        raise QuarlError(f"{run_dir} has no checkpoint to resume from: train it again without --resume")
    check_checkpoint_step(*found[-1], total, config.algo)
    return found[-1]


def _open_env(config: TrainConfig, setup: TrainSetup) -> VecEnv:
    """The training envs, their buffers priced against the machine before SB3 allocates
    them (and before the run folder exists)."""
    env = training_vec_env(setup, setup.n_envs, config.seed, training=True)
    try:
        check_buffer_memory(config.algo, setup, env.observation_space, env.action_space, config.hyperparams)
    except QuarlError:
        env.close()
        raise
    return env


def _build_model(config: TrainConfig, setup: TrainSetup, env: VecEnv, run_dir: Path, start: tuple[int, Path] | None
                 ) -> tuple[BaseAlgorithm, int, QATState | None]:
    """(model, env steps done, the QAT state to restore) of a new run, or of one resumed
    from checkpoint ``start``."""
    algo_cls = TRAINERS[config.algo].algo_class()
    tb = str(run_dir / "tb") if config.tensorboard else None
    model = algo_cls(setup.policy, env, seed=config.seed, verbose=0, device="cpu", tensorboard_log=tb,
                     **setup.model_kwargs)
    if start is None:
        return model, 0, None
    done, path = start
    resume_from(model, path, done, config.trust_pickle)
    qat_file = Path(f"{str(path)[: -len('.zip')]}.qat.json")
    qat_restore = read_qat_state(qat_file, config.qat) if config.qat is not None and qat_file.exists() else None
    log.info("resuming %s from step %d", run_dir, done)
    return model, done, qat_restore


def _callbacks(config: TrainConfig, setup: TrainSetup, run_dir: Path, total: int, checkpointer: Checkpointer,
               qat_restore: QATState | None) -> list[BaseCallback]:
    callbacks: list[BaseCallback] = []
    if config.qat is not None:
        callbacks.append(QATCallback(config.qat, restore=qat_restore))
    callbacks.append(CheckpointEvery(config.checkpoint_freq or max(total // 10, 1), checkpointer))
    callbacks.append(RollingReward(max(total // REWARD_LINES, 1), config.on_progress or log.info))
    if config.eval_freq > 0:
        eval_env = training_vec_env(setup, 1, config.seed + 1000, training=False)
        callbacks.append(
            EvalCallback(
                eval_env,
                n_eval_episodes=config.eval_episodes,
                eval_freq=max(config.eval_freq // setup.n_envs, 1),
                log_path=str(run_dir),
                # best_model.zip, as rl_zoo3.enjoy --load-best wants it; not for QAT, whose mid-run
                # save would hold wrapped layer names
                best_model_save_path=None if config.qat is not None else str(run_dir),
                deterministic=True,
                verbose=0,
            )
        )
    return callbacks


def _learn(model: BaseAlgorithm, config: TrainConfig, env: VecEnv, run_dir: Path, total: int,
           start: tuple[int, Path] | None, guard: NonFiniteGuard, checkpointer: Checkpointer) -> None:
    """SB3's ``learn`` for the rest of the budget: a checkpoint on Ctrl-C; a NaN or inf ends
    the run in one line naming the last good checkpoint."""
    try:
        try:
            model.learn(
                total_timesteps=total - (start[0] if start else 0),
                callback=guard,
                reset_num_timesteps=start is None,
                progress_bar=config.progress_bar,
                tb_log_name=config.algo.upper(),
            )
        except KeyboardInterrupt:
            checkpointer.save(model)
            raise
        except (ValueError, RuntimeError) as exc:  # torch's argument checks on NaN logits, inside SB3's train()
            raise_if_non_finite(model, exc)
            raise
        bad = non_finite_state(model)
        if bad:
            raise NonFiniteTraining(int(model.num_timesteps), bad)
    except NonFiniteTraining as exc:
        env.close()
        last = latest_checkpoint(run_dir)
        kept = (f"the last good checkpoint is {last[1].name} (step {last[0]:,}): --resume continues from it"
                if last else "no checkpoint was written before it")
        raise (StoppedRun if last else QuarlError)(f"{exc}; {kept}") from None


def _save_run(config: TrainConfig, setup: TrainSetup, run_dir: Path, total: int, model: BaseAlgorithm) -> None:
    """The run folder's final files, every one atomic and the final zip last (it marks the
    run finished): a full disk leaves the run resumable."""
    env_name = config.env_id.replace("/", "_")
    config_dir = owned_folder(run_dir, env_name)
    saved = {k: v for k, v in setup.raw.items()}
    saved.update(n_envs=setup.n_envs, n_timesteps=total, policy=setup.policy)
    write_atomic(config_dir / "config.yml", yaml.safe_dump(saved, sort_keys=True))
    args = {"algo": config.algo, "env": config.env_id, "seed": config.seed, "precision": config.precision,
            "n_timesteps": total, "qat": asdict(config.qat) if config.qat else None,
            "env_kwargs": dict(setup.env_spec.env_kwargs) or None,  # rl_zoo3.enjoy reads it
            # the modules that registered a custom env (--gym-packages), as rl_zoo3 writes them: a command loading the
            # run imports them only when named again (or trusted), and says so
            "gym_packages": list(gym_packages())}
    write_atomic(config_dir / "args.yml", yaml.safe_dump(args, sort_keys=True))
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        write_atomic(config_dir / "vecnormalize.pkl", lambda tmp: vecnorm.save(str(tmp)))
    if config.qat is not None:
        write_qat_state(config_dir / "qat.json", model.policy, config.qat)
    with plain_layers(model.policy):
        write_atomic(run_dir / f"{env_name}.zip", model.save)


def train(config: TrainConfig, resume: bool = False) -> TrainResult:
    """Train (or continue the latest unfinished run with ``resume``) and save the run."""
    import torch

    config, setup, total = _plan(config, resume)
    run_dir = run_folder(config, resume)
    start = _start(config, run_dir, total, resume)
    torch.manual_seed(config.seed)
    env = _open_env(config, setup)
    if config.run_dir is None:  # OUT/ALGO/ENV_N made by quarl: no part of it a link
        owned_folder(config.out, config.algo, run_dir.name)
    else:  # a run folder the caller named: followed, as any --out is
        owned_folder(run_dir)
    if start is None:  # what --resume continues with, written before the first step (a stopped run has no args.yml)
        RunSettings(config.hyperparams, total).write(run_dir)
    model, done, qat_restore = _build_model(config, setup, env, run_dir, start)
    enable_mixed_precision(model, config.precision)
    checkpointer = Checkpointer(run_dir, config.qat, config.save_replay)
    guard = NonFiniteGuard(_callbacks(config, setup, run_dir, total, checkpointer, qat_restore))
    _learn(model, config, env, run_dir, total, start, guard, checkpointer)
    _save_run(config, setup, run_dir, total, model)
    env.close()
    return TrainResult(run_dir=run_dir, timesteps=int(model.num_timesteps), resumed_from=done, model=model)
