"""Train a Stable-Baselines3 agent with the RL Zoo's hyperparameters, optionally with
quantization-aware training and mixed precision, and save it as an RL Zoo run folder
that :func:`quarl.policies.sb3.load_checkpoint` reads back as is::

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
import json
import logging
import re
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import yaml
from pydantic import ConfigDict, Field

from quarl.envs import EnvSpec, check_env_id, make_env
from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError, StoppedRun
from quarl.core.file_schema import Record, check_depth, parse_json, parse_record
from quarl.core.validate import digits
from quarl.quant.config import QATConfig
from quarl.training.guard import NonFiniteGuard, NonFiniteTraining, non_finite_state, raise_if_non_finite
from quarl.training.hyperparams import TRAINERS, TrainSetup, check_buffer_memory, prepare
from quarl.training.mixed_precision import TRAIN_PRECISIONS, enable_mixed_precision

log = logging.getLogger(__name__)

CHECKPOINT_STEM = "rl_model_{}_steps"
"""What ``rl_zoo3.enjoy --load-checkpoint N`` opens, in the run folder."""
_CKPT = re.compile(r"rl_model_(\d+)_steps\.zip")
_OLD_DIR, _OLD_CKPT = "checkpoints", re.compile(r"step_(\d+)\.zip")
"""Where quarl before 0.2 kept checkpoints (still resumed from)."""


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
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Overrides of the zoo's entry (e.g. {"n_envs": 4})."""
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


def check_algo_env(algo: str, env_id: str) -> gym.spaces.Space:
    """Validate the pair and return the env's action space (one line on a bad pair)."""
    if algo not in TRAINERS:
        raise QuarlError(f"unknown algorithm {algo!r}: allowed {', '.join(TRAINERS)}")
    actions = TRAINERS[algo].actions
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


def _vec_env(setup: TrainSetup, n_envs: int, seed: int, training: bool):
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize, VecTransposeImage

    spec = setup.env_spec

    def builder(rank: int) -> Callable[[], gym.Env]:
        def build() -> gym.Env:
            # the one make_env (its family's kwargs and observation adapter); Atari trains with
            # life loss ending episodes and clipped rewards, Monitor inside sees whole games
            env = make_env(spec, training=True, stack_frames=False, on_made=Monitor)
            env.action_space.seed(seed + rank)
            return env
        return build

    venv = DummyVecEnv([builder(rank) for rank in range(n_envs)])
    venv.seed(seed)
    if spec.frame_stack > 1:
        venv = VecFrameStack(venv, spec.frame_stack)
    if is_image_space(venv.observation_space) and not is_image_space_channels_first(venv.observation_space):
        venv = VecTransposeImage(venv)  # what SB3 does to the training env; the eval env must match it
    if setup.normalize is not None:
        kwargs = dict(setup.normalize)
        if not training:
            kwargs.update(training=False, norm_reward=False)
        venv = VecNormalize(venv, **kwargs)
    return venv


def _checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, zip) of the run's complete checkpoints, oldest first (an older quarl's too)."""
    found = [(int(m.group(1)), p) for p in run_dir.glob("rl_model_*_steps.zip") if (m := _CKPT.fullmatch(p.name))]
    old = run_dir / _OLD_DIR
    found += [(int(m.group(1)), p) for p in old.glob("step_*.zip") if (m := _OLD_CKPT.fullmatch(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, zip) of the run's newest complete checkpoint, or None."""
    found = _checkpoints(Path(run_dir))
    return found[-1] if found else None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``train(..., resume=True)`` can continue this run."""
    return bool(_checkpoints(Path(run_dir)))


def run_folder(config: TrainConfig, resume: bool) -> Path:
    """OUT/ALGO/ENV_N: the next free N for a new run, the latest unfinished one to resume."""
    if config.run_dir is not None:
        return Path(config.run_dir)
    base = Path(config.out) / config.algo
    name = config.env_id.replace("/", "_")
    ids = sorted(int(p.name.rsplit("_", 1)[1]) for p in base.glob(f"{name}_*") if digits(p.name.rsplit("_", 1)[1]))
    if resume:  # the newest run that has a checkpoint (a start that failed leaves an empty folder)
        with_checkpoint = [i for i in ids if _checkpoints(base / f"{name}_{i}")]
        if not with_checkpoint:
            raise QuarlError(f"nothing to resume: no {config.algo} {config.env_id} run with a checkpoint under "
                             f"{config.out}")
        return base / f"{name}_{with_checkpoint[-1]}"
    return base / f"{name}_{(ids[-1] if ids else 0) + 1}"


# Checkpoints are read back without unpickling anything: the model's weights and optimizer
# state through SB3's set_parameters (torch.load(weights_only=True)), the replay buffer and
# the normalization statistics as plain numpy arrays (np.load(allow_pickle=False)).
_REPLAY_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")
_RMS = ("obs_rms", "ret_rms")


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    write_atomic(path, lambda tmp: np.savez(tmp, **arrays))


ARRAYS_CAP = 1 << 30
"""Bytes a checkpoint's array file may have, and its arrays may inflate to all together."""


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint's ``.npz``, read without unpickling; every array's header
    is read first, and the sizes it claims (and the zip's inflated sizes) must fit
    :data:`ARRAYS_CAP` all together before any array is allocated."""
    from numpy.lib import format as npy

    from quarl.core.limits import check_file_size, open_regular

    check_file_size(path, ARRAYS_CAP, "a checkpoint's arrays")
    try:
        with open_regular(path, "a checkpoint's arrays") as fh, zipfile.ZipFile(fh) as archive:
            claimed = 0
            for info in archive.infolist():
                with archive.open(info) as member:
                    version = npy.read_magic(member)
                    if version not in ((1, 0), (2, 0)):
                        raise QuarlError(f"{path}: array {info.filename!r} has .npy format {version}: refused (quarl "
                                         "writes 1.0)")
                    read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read_header(member)  # the header only: nothing allocated yet
                if dtype.hasobject:
                    raise QuarlError(f"{path}: array {info.filename!r} holds Python objects: refused")
                claimed += max(info.file_size, int(np.prod(shape, dtype=np.float64)) * dtype.itemsize)
                if claimed > ARRAYS_CAP:
                    raise QuarlError(f"{path}: array {info.filename!r} brings the arrays to {claimed:,} bytes, more than "
                                     f"the {ARRAYS_CAP:,} allowed: refused")
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
    except QuarlError:
        raise
    except Exception as exc:  # zipfile, zlib and numpy raise many types for a foreign or truncated file
        raise QuarlError(f"{path} is not a quarl checkpoint array file ({exc.__class__.__name__}): refused") from None


class ReplayPosition(Record):
    """Where a saved replay buffer writes next, and whether it wrapped around."""

    pos: int = Field(ge=0)
    full: bool


def _scalar(arrays: dict[str, np.ndarray], key: str) -> Any:
    """A 0-d array's value as a Python scalar (missing, or an array of another shape, as is:
    the record refuses it by name)."""
    value = arrays.get(key)
    return value.item() if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "biuf" \
        else (value.tolist() if isinstance(value, np.ndarray) else value)


def replay_arrays(buffer: Any) -> dict[str, np.ndarray]:
    arrays = {k: getattr(buffer, k) for k in _REPLAY_FIELDS if isinstance(getattr(buffer, k, None), np.ndarray)}
    return arrays | {"pos": np.array(buffer.pos), "full": np.array(buffer.full)}


def load_replay(buffer: Any, arrays: dict[str, np.ndarray], source: str | Path = "the saved replay buffer") -> None:
    """Restore ``buffer`` from :func:`replay_arrays`' arrays: each of the buffer's shape and
    finite, the position a :class:`ReplayPosition` inside the buffer."""
    pos, full = _scalar(arrays, "pos"), _scalar(arrays, "full")
    if isinstance(pos, int) and not isinstance(pos, bool) and isinstance(full, bool) \
            and not 0 <= pos < buffer.buffer_size:
        raise QuarlError(f"{source}: field pos: the saved replay buffer's position {pos!r} (full {full!r}) is not one in "
                         f"a buffer of {buffer.buffer_size}: refused (a transition past it would never be sampled)")
    position = parse_record(ReplayPosition, {"pos": pos, "full": full}, source)
    for key in _REPLAY_FIELDS:
        if key in arrays:
            if getattr(buffer, key).shape != arrays[key].shape:
                raise QuarlError(f"{source}: field {key}: the saved replay buffer's {key} has shape {arrays[key].shape}, "
                                 f"this run's {getattr(buffer, key).shape}: resume with the settings the run started with")
            if arrays[key].dtype.kind == "f" and not bool(np.isfinite(arrays[key]).all()):
                raise QuarlError(f"{source}: field {key}: holds NaN or inf: refused (it would train the weights to NaN)")
    for key in _REPLAY_FIELDS:
        if key in arrays:
            setattr(buffer, key, arrays[key].astype(getattr(buffer, key).dtype, copy=False))
    buffer.pos, buffer.full = position.pos, position.full


def vecnormalize_arrays(venv: Any) -> dict[str, np.ndarray]:
    out = {}
    for name in _RMS:
        rms = getattr(venv, name)
        out |= {f"{name}.mean": rms.mean, f"{name}.var": rms.var, f"{name}.count": np.array(rms.count)}
    return out


def load_vecnormalize_arrays(venv: Any, arrays: dict[str, np.ndarray], source: str | Path = "the saved normalization"
                             ) -> None:
    """Restore ``venv``'s running statistics: each of this env's shape, finite, variances
    >= 0 and a count > 0, or one line naming the file and the field."""
    for name in _RMS:
        rms = getattr(venv, name)
        for part in ("mean", "var", "count"):
            key = f"{name}.{part}"
            value = arrays.get(key)
            want = np.shape(getattr(rms, part))
            if not isinstance(value, np.ndarray) or value.shape != want or value.dtype.kind not in "fiu":
                got = "missing" if value is None else f"{getattr(value, 'dtype', type(value).__name__)} {np.shape(value)}"
                raise QuarlError(f"{source}: field {key}: {got}, this run's statistics are numbers of shape {want}: "
                                 "refused")
            if not bool(np.isfinite(value).all()) or (part != "mean" and bool((value < 0).any())) \
                    or (part == "count" and not float(value) > 0):
                raise QuarlError(f"{source}: field {key}: {value.reshape(-1)[:4].tolist()} is not a "
                                 f"{'finite mean' if part == 'mean' else 'finite value > 0' if part == 'count' else 'finite variance >= 0'}: refused")
    for name in _RMS:
        rms = getattr(venv, name)
        rms.mean, rms.var = arrays[f"{name}.mean"].astype(np.float64), arrays[f"{name}.var"].astype(np.float64)
        rms.count = float(arrays[f"{name}.count"])


class _Checkpointer:
    """Saves the model (plain layers), replay buffer, normalization and QAT state; keeps
    the last two checkpoints. Files are written under a temporary name and renamed, so a
    kill never leaves a half-written checkpoint that looks complete."""

    def __init__(self, run_dir: Path, qat: QATConfig | None, save_replay: bool) -> None:
        self.folder = run_dir
        self.qat = qat
        self.save_replay = save_replay

    def save(self, model: Any) -> Path:
        from quarl.quant.qat import plain_layers
        from quarl.training.qat_sb3 import write_qat_state

        step = int(model.num_timesteps)
        bad = non_finite_state(model)
        if bad:  # the last good checkpoint stays the newest one
            raise NonFiniteTraining(step, bad)
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / CHECKPOINT_STEM.format(step)
        if self.save_replay and getattr(model, "replay_buffer", None) is not None:
            _save_arrays(Path(f"{stem}.replay.npz"), replay_arrays(model.replay_buffer))
        vecnorm = model.get_vec_normalize_env()
        if vecnorm is not None:
            _save_arrays(Path(f"{stem}.vecnormalize.npz"), vecnormalize_arrays(vecnorm))
        if self.qat is not None:
            write_qat_state(Path(f"{stem}.qat.json"), model.policy, self.qat)
        with plain_layers(model.policy):  # the .zip appears last: it marks the checkpoint complete
            write_atomic(Path(f"{stem}.zip"), model.save)
        for _, old in _checkpoints(self.folder)[:-2]:
            for f in old.parent.glob(old.name.removesuffix(".zip") + ".*"):
                f.unlink()
        log.info("checkpoint at step %d: %s", step, stem)
        return Path(f"{stem}.zip")


class CheckpointData(Record):
    """The fields of an SB3 zip's ``data`` entry that resuming and fine-tuning read (SB3
    saves dozens more, left as they are)."""

    model_config = ConfigDict(extra="allow")
    num_timesteps: int = Field(ge=0)
    policy_class: dict[str, Any] | None = None


def read_checkpoint_data(path: Path, what: str = "a training checkpoint") -> tuple[CheckpointData, dict[str, Any]]:
    """(typed record, raw object) of the ``data`` entry of SB3 zip ``path``."""
    from quarl.core.limits import open_zip, read_zip_entry

    with open_zip(path, what) as archive:
        if "data" not in archive.namelist():
            raise QuarlError(f"{path} is not a Stable-Baselines3 checkpoint (no data entry): refused as {what}")
        raw = parse_json(read_zip_entry(archive, "data", str(path)), f"{path}:data")
    check_depth(raw, f"{path}:data")  # fine-tuning walks its policy_kwargs recursively
    return parse_record(CheckpointData, raw, f"{path}:data"), raw


_POLICY_MODULE = re.compile(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\.policies")


def saved_algorithm(data: dict[str, Any]) -> str | None:
    """The algorithm whose ``save`` wrote this ``data`` entry, from its policy class's module
    and the hyperparameters it keeps (PPO's clip range, TRPO's conjugate-gradient steps), or
    None where the policy class is not one of SB3's or sb3-contrib's."""
    from quarl.policies.sb3 import _algo_from_data

    module = (data.get("policy_class") or {}).get("__module__") if isinstance(data.get("policy_class"), dict) else None
    match = _POLICY_MODULE.fullmatch(module) if isinstance(module, str) else None
    if match is None:
        return None
    # A2C, PPO and TRPO share SB3's ActorCriticPolicy (module ...common.policies)
    return _algo_from_data(data, "ppo" if match.group(1) == "common" else match.group(1))


def check_algorithm(path: Path, data: dict[str, Any], algo: str, doing: str) -> None:
    """One line when the zip at ``path`` was saved by another algorithm than ``algo`` (an
    A2C zip resumed as PPO loaded RMSprop's state into Adam: KeyError 'betas' mid-run)."""
    saved = saved_algorithm(data)
    if saved is not None and saved != algo:
        raise QuarlError(f"{path} was saved by {saved}, not {algo}: {doing} it as {saved}, or give a {algo} checkpoint")


def _check_checkpoint_step(step: int, path: Path, total: int, algo: str | None = None) -> None:
    """The checkpoint was saved by ``algo``; the step its name claims must be the step its
    model was saved at (SB3's ``num_timesteps`` in the zip) and within the run's budget: a
    copy renamed ``rl_model_99999999999_steps.zip`` had the run end "finished" without
    training."""
    record, raw = read_checkpoint_data(path)
    if algo is not None:
        check_algorithm(path, raw, algo, "resume")
    saved = record.num_timesteps
    if saved != step:
        raise QuarlError(f"{path.name} says step {step:,} but its model was saved at step {saved}: not this run's "
                         "checkpoint; remove it to resume from the one before")
    if step > total:
        raise QuarlError(f"{path.name} is at step {step:,}, past this run's {total:,} steps: resume with -n {step} or "
                         "more, or train anew")


def _resume_from(model: Any, path: Path, done: int, trust_pickle: bool) -> None:
    """Weights, optimizer state, replay buffer and normalization of checkpoint ``path``,
    read with nothing unpickled (see the note above :class:`_Checkpointer`); the pickles of
    an older checkpoint only with ``trust_pickle``."""
    stem = str(path)[: -len(".zip")]
    try:
        model.set_parameters(str(path), exact_match=True, device="cpu")
    except Exception as exc:  # a foreign or unsafe zip
        raise QuarlError(f"{path} cannot be read as plain tensors ({exc.__class__.__name__}): refused") from None
    model.num_timesteps = done
    vecnorm = model.get_vec_normalize_env()
    for kind, target in (("replay", getattr(model, "replay_buffer", None)), ("vecnormalize", vecnorm)):
        npz, pkl = Path(f"{stem}.{kind}.npz"), Path(f"{stem}.{kind}.pkl")
        if target is None:
            continue
        if npz.exists():
            arrays = _load_arrays(npz)
            (load_replay if kind == "replay" else load_vecnormalize_arrays)(target, arrays, npz)
        elif pkl.exists():
            if not trust_pickle:
                raise QuarlError(f"{pkl} (an older quarl's checkpoint) needs unpickling: refused; pass --trust-pickle "
                                 "if you trust this file")
            if kind == "replay":
                model.load_replay_buffer(str(pkl))
            else:
                import pickle

                load_vecnormalize_arrays(target, vecnormalize_arrays(pickle.loads(pkl.read_bytes())))  # noqa: S301


REWARD_LINES = 10
"""Lines of rolling training reward a run prints (one per tenth of its budget)."""


def _RollingReward(every: int, say: Callable[[str], None]):  # noqa: N802 - builds a BaseCallback subclass lazily (SB3 imports on demand)
    """A callback that logs, every ``every`` steps, the mean return of the last (up to 100)
    training episodes (SB3's ``ep_info_buffer``, what its ``rollout/ep_rew_mean`` shows), so
    a run says how it is learning while it learns."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RollingReward(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next = every

        def _on_training_start(self) -> None:
            self.next = (self.num_timesteps // every + 1) * every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                self.next = (self.num_timesteps // every + 1) * every
                episodes = [info["r"] for info in self.model.ep_info_buffer or []]
                if episodes:
                    say(f"step {self.num_timesteps:,}: mean training return {float(np.mean(episodes)):.2f} over the "
                        f"last {len(episodes)} episodes")
            return True

    return RollingReward()


def _callbacks(config: TrainConfig, setup: TrainSetup, run_dir: Path, total: int, checkpointer: _Checkpointer,
               qat_restore: dict | None) -> list:
    from stable_baselines3.common.callbacks import BaseCallback, EvalCallback

    callbacks: list = []
    if config.qat is not None:
        from quarl.training.qat_sb3 import QATCallback

        callbacks.append(QATCallback(config.qat, restore=qat_restore))
    n_envs = setup.n_envs
    every = config.checkpoint_freq or max(total // 10, 1)

    class Checkpoint(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next = 0

        def _on_training_start(self) -> None:
            self.next = (self.num_timesteps // every + 1) * every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                checkpointer.save(self.model)
                self.next = (self.num_timesteps // every + 1) * every
            return True

    callbacks.append(Checkpoint())
    callbacks.append(_RollingReward(max(total // REWARD_LINES, 1), config.on_progress or log.info))
    if config.eval_freq > 0:
        eval_env = _vec_env(setup, 1, config.seed + 1000, training=False)
        callbacks.append(
            EvalCallback(
                eval_env,
                n_eval_episodes=config.eval_episodes,
                eval_freq=max(config.eval_freq // n_envs, 1),
                log_path=str(run_dir),
                # best_model.zip, as rl_zoo3.enjoy --load-best wants it; not for QAT, whose mid-run
                # save would hold wrapped layer names
                best_model_save_path=None if config.qat is not None else str(run_dir),
                deterministic=True,
                verbose=0,
            )
        )
    return callbacks


def _total(algo: str, env_id: str, timesteps: int | None, setup: TrainSetup) -> int:
    total = timesteps if timesteps is not None else setup.n_timesteps
    if total is None:
        raise QuarlError(f"the RL Zoo has no {algo} budget for {env_id}: pass --timesteps")
    if total < 1:
        raise QuarlError(f"--timesteps {total} must be at least 1")
    return int(total)


def resolve_timesteps(algo: str, env_id: str, timesteps: int | None, overrides: dict[str, Any] | None = None) -> int:
    """The training length: ``timesteps`` or the zoo's budget (validating algo and env)."""
    setup = prepare(algo, env_id, check_algo_env(algo, env_id), overrides)
    return _total(algo, env_id, timesteps, setup)


@dataclass
class TrainResult:
    run_dir: Path
    timesteps: int
    resumed_from: int
    """Env steps already done when this call started (0 for a fresh run)."""
    model: Any = field(default=None, repr=False)
    """The trained SB3 model (QAT wrappers still in place; its envs are closed)."""


RUN_SETTINGS = "quarl-train.json"
"""A run's --hp and budget, written when it starts: --resume continues with them."""


def _with_run_settings(config: TrainConfig, run_dir: Path) -> TrainConfig:
    """``config`` with the run's own --hp where none are given (one line where other ones
    are: a resumed run keeps the settings it started with); runs from before the file
    existed resume as given."""
    path = run_dir / RUN_SETTINGS
    if not path.is_file():
        return config
    from quarl.core.limits import read_capped

    stored = parse_json(read_capped(path, 1 << 20, "a run's settings"), path)
    if not isinstance(stored, dict) or not isinstance(stored.get("hyperparams", {}), dict):
        raise QuarlError(f"{path}: not a run's settings (remove it to resume with the options given)")
    hyperparams = stored.get("hyperparams") or {}
    if not config.hyperparams:
        if hyperparams:
            log.warning("note: resuming %s with the --hp it started with: %s", run_dir,
                        ", ".join(f"{k}={v}" for k, v in sorted(hyperparams.items())))
        return dataclasses.replace(config, hyperparams=dict(hyperparams))
    given = json.loads(json.dumps(config.hyperparams, default=str))
    if given != hyperparams:
        raise QuarlError(f"{run_dir} started with --hp {json.dumps(hyperparams, sort_keys=True)}, not "
                         f"{json.dumps(given, sort_keys=True)}: resume without --hp (its own are used) or start a new run")
    return config


def train(config: TrainConfig, resume: bool = False) -> TrainResult:
    """Train (or continue the latest unfinished run with ``resume``) and save the run."""
    import torch

    from quarl.quant.qat import plain_layers
    from quarl.training.qat_sb3 import read_qat_state, write_qat_state

    if config.precision not in TRAIN_PRECISIONS:
        raise QuarlError(f"unknown training precision {config.precision!r}: allowed {', '.join(TRAIN_PRECISIONS)}")
    if resume:
        config = _with_run_settings(config, run_folder(config, True))
    action_space = check_algo_env(config.algo, config.env_id)
    if config.qat is not None and TRAINERS[config.algo].qat_refused:
        raise QuarlError(TRAINERS[config.algo].qat_refused)
    setup = prepare(config.algo, config.env_id, action_space, config.hyperparams)
    total = _total(config.algo, config.env_id, config.timesteps, setup)
    if config.qat is not None and config.qat.quant_delay >= total:
        raise QuarlError(
            f"quant delay {config.qat.quant_delay} is not below the training length {total}: "
            "nothing would be trained quantized (allowed 0..{})".format(total - 1)
        )

    run_dir = run_folder(config, resume)
    env_name = config.env_id.replace("/", "_")
    final_zip = run_dir / f"{env_name}.zip"
    if resume and final_zip.exists():
        raise QuarlError(f"{run_dir} already finished ({final_zip.name} exists): nothing to resume")
    start = _checkpoints(run_dir)[-1] if resume and _checkpoints(run_dir) else None
    if resume and start is None:
        raise QuarlError(f"{run_dir} has no checkpoint to resume from: train it again without --resume")
    if start is not None:
        _check_checkpoint_step(*start, total, config.algo)
    torch.manual_seed(config.seed)
    env = _vec_env(setup, setup.n_envs, config.seed, training=True)
    try:  # the buffers priced against the machine before SB3 allocates them (and before the run folder exists)
        check_buffer_memory(config.algo, setup, env.observation_space, env.action_space, config.hyperparams)
    except QuarlError:
        env.close()
        raise
    run_dir.mkdir(parents=True, exist_ok=True)
    if start is None:  # what --resume continues with, written before the first step (a stopped run has no args.yml)
        write_atomic(run_dir / RUN_SETTINGS, json.dumps({"hyperparams": config.hyperparams, "timesteps": total},
                                                        default=str, sort_keys=True))

    algo_cls = TRAINERS[config.algo].algo_class()
    tb = str(run_dir / "tb") if config.tensorboard else None
    qat_restore = None
    if start is None:
        model = algo_cls(setup.policy, env, seed=config.seed, verbose=0, device="cpu", tensorboard_log=tb,
                         **setup.model_kwargs)
        done = 0
    else:
        done, path = start
        stem = str(path)[: -len(".zip")]
        model = algo_cls(setup.policy, env, seed=config.seed, verbose=0, device="cpu", tensorboard_log=tb,
                         **setup.model_kwargs)
        _resume_from(model, Path(path), done, config.trust_pickle)
        if config.qat is not None and Path(f"{stem}.qat.json").exists():
            qat_restore = read_qat_state(Path(f"{stem}.qat.json"), config.qat)
        log.info("resuming %s from step %d", run_dir, done)
    enable_mixed_precision(model, config.precision)
    checkpointer = _Checkpointer(run_dir, config.qat, config.save_replay)
    guard = NonFiniteGuard(_callbacks(config, setup, run_dir, total, checkpointer, qat_restore))
    try:
        try:
            model.learn(
                total_timesteps=total - done,
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

    # every file atomic, the final zip last (it marks the run finished): a full disk leaves the run resumable
    config_dir = run_dir / env_name
    config_dir.mkdir(exist_ok=True)
    saved = {k: v for k, v in setup.raw.items()}
    saved.update(n_envs=setup.n_envs, n_timesteps=total, policy=setup.policy)
    write_atomic(config_dir / "config.yml", yaml.safe_dump(saved, sort_keys=True))
    args = {"algo": config.algo, "env": config.env_id, "seed": config.seed, "precision": config.precision,
            "n_timesteps": total, "qat": asdict(config.qat) if config.qat else None,
            "env_kwargs": dict(setup.env_spec.env_kwargs) or None}  # rl_zoo3.enjoy reads it
    write_atomic(config_dir / "args.yml", yaml.safe_dump(args, sort_keys=True))
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        write_atomic(config_dir / "vecnormalize.pkl", lambda tmp: vecnorm.save(str(tmp)))
    if config.qat is not None:
        write_qat_state(config_dir / "qat.json", model.policy, config.qat)
    with plain_layers(model.policy):
        write_atomic(final_zip, model.save)
    env.close()
    return TrainResult(run_dir=run_dir, timesteps=int(model.num_timesteps), resumed_from=done, model=model)
