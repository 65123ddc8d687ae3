"""An RL Zoo run folder (``ppo/CartPole-v1_1``): which zip a command takes, the config
files beside it (``config.yml``, ``args.yml``, ``env_kwargs.yml``, read by the safe YAML
loader as typed records) and the env they describe."""

from __future__ import annotations

import logging
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict

from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_record
from quarl.envs import MAX_FRAME_STACK, EnvSpec, current_env_id, import_named_by_file, wrapper_names
from quarl.policies.safe_load import load_zoo_yaml
from quarl.policies.sb3 import algos

log = logging.getLogger(__name__)


CHECKPOINT_ZIP = re.compile(r"rl_model_(\d+)_steps\.zip")


def pick_zip(folder: Path, load_best: bool = False, load_checkpoint: int | None = None,
             load_last_checkpoint: bool = False) -> Path:
    """The zip of an RL Zoo run folder a command takes, chosen as ``rl_zoo3.enjoy`` chooses:
    ``best_model.zip`` (``load_best``), ``rl_model_N_steps.zip`` (``load_checkpoint=N``),
    the latest of those (``load_last_checkpoint``), else the final model: the one zip that
    is neither (``best_model.zip`` where there is no other). Two final models are refused
    with their names: a folder is one policy."""
    folder = Path(folder)
    if sum([load_best, load_checkpoint is not None, load_last_checkpoint]) > 1:
        raise QuarlError("--load-best, --load-checkpoint and --load-last-checkpoint pick one zip each: give one")
    if not folder.is_dir():
        if load_best or load_checkpoint is not None or load_last_checkpoint:
            raise QuarlError(f"--load-best / --load-checkpoint / --load-last-checkpoint pick a zip of a run folder; "
                             f"{folder} is not a folder")
        return folder
    checkpoints = {int(m.group(1)): p for p in folder.glob("rl_model_*_steps.zip")
                   if (m := CHECKPOINT_ZIP.fullmatch(p.name))}
    if load_best:
        if not (folder / "best_model.zip").is_file():
            raise QuarlError(f"--load-best: {folder} has no best_model.zip (it is written by training with evaluation)")
        return folder / "best_model.zip"
    if load_checkpoint is not None:
        if load_checkpoint not in checkpoints:
            have = ", ".join(str(n) for n in sorted(checkpoints)) or "none"
            raise QuarlError(f"--load-checkpoint {load_checkpoint}: {folder} has no "
                             f"rl_model_{load_checkpoint}_steps.zip (checkpoints: {have})")
        return checkpoints[load_checkpoint]
    if load_last_checkpoint:
        if not checkpoints:
            raise QuarlError(f"--load-last-checkpoint: {folder} has no rl_model_N_steps.zip checkpoint")
        return checkpoints[max(checkpoints)]
    finals = sorted(p for p in folder.glob("*.zip") if p.name != "best_model.zip" and p not in checkpoints.values())
    if len(finals) > 1:
        raise QuarlError(f"{folder} holds {len(finals)} policies ({', '.join(p.name for p in finals)}): a run folder "
                         f"is one policy; name the zip to use (e.g. {finals[0]})")
    finals = finals or sorted(folder.glob("best_model.zip"))
    if not finals:
        raise QuarlError(f"{folder} holds no .zip checkpoint: expected an RL Zoo run folder like ppo/CartPole-v1_1")
    return finals[0]


def zoo_files(path: Path) -> tuple[Path, Path | None, str | None]:
    """(zip, config folder, algo named by the folder above the run) for a zoo run folder
    or a zip (maybe inside one)."""
    if path.is_dir():
        zip_path = pick_zip(path)
    elif path.suffix == ".zip" or path.is_file():
        zip_path = path
    else:
        raise QuarlError(f"checkpoint {str(path)!r} does not exist")
    folder = zip_path.parent
    env_name = zip_path.stem
    config_dir = folder / env_name if (folder / env_name / "config.yml").exists() else None
    if config_dir is None and zip_path.suffix == ".zip":
        # best_model.zip, rl_model_N_steps.zip (or a renamed zip) inside a run folder: its ENV/ holds the
        # statistics the agent was trained with, as rl_zoo3 --load-best / --load-checkpoint finds them
        found = sorted(d for d in folder.iterdir() if d.is_dir() and (d / "config.yml").is_file())
        if len(found) > 1:
            raise QuarlError(f"{zip_path} sits beside {len(found)} RL Zoo config folders "
                             f"({', '.join(d.name for d in found)}): cannot tell which is its own")
        config_dir = found[0] if found else None
    algo_dir = folder.parent.name.lower()
    return zip_path, config_dir, algo_dir if algo_dir in algos() else None



MAX_EPISODE_STEPS_KWARG = 10**6
"""``max_episode_steps`` in a folder's env kwargs at most: 9x the Atari cap of 108,000 frames
(27,000 steps), 1,000x a MuJoCo episode; 10^12 made one evaluation episode endless."""


def _steps(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= MAX_EPISODE_STEPS_KWARG):
        raise ValueError(f"max_episode_steps={reprlib.repr(value)} must be a whole number in "
                         f"1..{MAX_EPISODE_STEPS_KWARG:,}")
    return value


class EnvKwargs(Record):
    """An env's keyword arguments (``env_kwargs.yml``, or ``env_kwargs`` of ``args.yml``): the
    one quarl acts on typed, the others passed to the env as they are."""

    model_config = ConfigDict(extra="allow")
    max_episode_steps: Annotated[int | None, BeforeValidator(_steps)] = None


def _frame_stack(value: Any) -> Any:
    if not value:  # the zoo's "no stacking" as rl_zoo3 reads it
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FRAME_STACK:
        raise ValueError(f"frame_stack={reprlib.repr(value)} must be a whole number in 1..{MAX_FRAME_STACK}")
    return value


class ZooConfig(Record):
    """The fields of an RL Zoo ``config.yml`` (the run's hyperparameters) the loader reads;
    the others are the algorithm's, left as they are."""

    model_config = ConfigDict(extra="allow")
    policy_kwargs: str | dict[str, Any] | None = None
    """Python literal text (``dict(net_arch=[64, 64])``) or a mapping."""
    normalize: bool | str | dict[str, Any] | None = None
    """VecNormalize: ``True``, or its options (a mapping, or its text)."""
    env_wrapper: str | list[Any] | dict[str, Any] | None = None
    frame_stack: Annotated[int | None, BeforeValidator(_frame_stack)] = None
    """Frames stacked (absent, or a falsy value: 1)."""


class ZooArgs(Record):
    """The fields of an RL Zoo ``args.yml`` (the command line of the run) the loader reads."""

    model_config = ConfigDict(extra="allow")
    env: str | None = None
    env_kwargs: EnvKwargs | None = None
    gym_packages: list[str] | str | None = None


def read_zoo_config(path: Path) -> ZooConfig:
    """``config.yml`` (read by the safe YAML loader) as a :class:`ZooConfig`."""
    return parse_record(ZooConfig, load_zoo_yaml(path), path)


def _env_kwargs(raw: Any, record: EnvKwargs | None) -> dict[str, Any]:
    """The env kwargs as the file holds them (a :class:`EnvKwargs` checked them)."""
    return dict(raw) if record is not None and isinstance(raw, dict) else {}


def zoo_env_spec(config_dir: Path, env_name: str, config: ZooConfig) -> EnvSpec:
    """The env of a zoo config folder: ``args.yml``'s env and env kwargs (``env_kwargs.yml``
    over them), the config's wrappers and frame stack."""
    env_kwargs: dict[str, Any] = {}
    args_file = config_dir / "args.yml"
    raw_args = load_zoo_yaml(args_file) if args_file.exists() else {}
    args = parse_record(ZooArgs, raw_args, args_file)
    if raw_args.get("env_kwargs"):  # as rl_zoo3.enjoy reads them; env_kwargs.yml (quarl's) over them
        env_kwargs = _env_kwargs(raw_args["env_kwargs"], args.env_kwargs)
    kwargs_file = config_dir / "env_kwargs.yml"
    if kwargs_file.exists():
        raw_kwargs = load_zoo_yaml(kwargs_file) or {}
        env_kwargs.update(_env_kwargs(raw_kwargs, parse_record(EnvKwargs, raw_kwargs, kwargs_file)))
    env_id = env_name
    if raw_args:
        env_id = args.env if args.env is not None else env_name
        packages = args.gym_packages or []
        if packages:  # rl_zoo3 records the modules that register the agent's custom env: imported only if allowed
            log.info("importing %s (gym_packages of %s)", ", ".join(map(str, packages)), args_file)
            import_named_by_file(packages if isinstance(packages, list) else [packages], f"{args_file} gym_packages",
                                 "which this run was trained with")
    return EnvSpec(
        env_id=current_env_id(env_id),
        env_kwargs=env_kwargs,
        wrappers=wrapper_names(config.env_wrapper),
        frame_stack=config.frame_stack or 1,
    )

