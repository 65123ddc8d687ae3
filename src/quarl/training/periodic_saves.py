"""A training run's periodic saves (its checkpoints): ``rl_model_N_steps.zip`` in the run folder (what
``rl_zoo3.enjoy --load-checkpoint N`` opens), the replay buffer, normalization statistics
(:mod:`quarl.training.checkpoint_arrays`) and QAT state beside it; the ``data`` entry of an
SB3 zip read as a typed record, and the algorithm that saved it."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, JsonValue
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, check_depth, parse_json, parse_record
from quarl.quant.qat import plain_layers
from quarl.quantization.config import QATConfig
from quarl.training.checkpoint_arrays import replay_arrays, save_arrays, vecnormalize_arrays
from quarl.training.guard import NonFiniteTraining, non_finite_state
from quarl.training.qat_sb3 import write_qat_state

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

log = logging.getLogger(__name__)

CHECKPOINT_STEM = "rl_model_{}_steps"
"""What ``rl_zoo3.enjoy --load-checkpoint N`` opens, in the run folder."""
_CKPT = re.compile(r"rl_model_(\d+)_steps\.zip")
_OLD_DIR, _OLD_CKPT = "checkpoints", re.compile(r"step_(\d+)\.zip")
"""Where quarl before 0.2 kept checkpoints (still resumed from)."""


def run_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, zip) of the run's complete checkpoints, oldest first (an older quarl's too)."""
    found = [(int(m.group(1)), p) for p in run_dir.glob("rl_model_*_steps.zip") if (m := _CKPT.fullmatch(p.name))]
    old = run_dir / _OLD_DIR
    found += [(int(m.group(1)), p) for p in old.glob("step_*.zip") if (m := _OLD_CKPT.fullmatch(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, zip) of the run's newest complete checkpoint, or None."""
    found = run_checkpoints(Path(run_dir))
    return found[-1] if found else None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``train(..., resume=True)`` can continue this run."""
    return bool(run_checkpoints(Path(run_dir)))


class Checkpointer:
    """Saves the model (plain layers), replay buffer, normalization and QAT state; keeps
    the last two checkpoints. Files are written under a temporary name and renamed, so a
    kill never leaves a half-written checkpoint that looks complete."""

    def __init__(self, run_dir: Path, qat: QATConfig | None, save_replay: bool) -> None:
        self.folder = run_dir
        self.qat = qat
        self.save_replay = save_replay

    def save(self, model: BaseAlgorithm) -> Path:
        step = int(model.num_timesteps)
        bad = non_finite_state(model)
        if bad:  # the last good checkpoint stays the newest one
            raise NonFiniteTraining(step, bad)
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / CHECKPOINT_STEM.format(step)
        if self.save_replay and isinstance(model, OffPolicyAlgorithm) and model.replay_buffer is not None:
            save_arrays(Path(f"{stem}.replay.npz"), replay_arrays(model.replay_buffer))
        vecnorm = model.get_vec_normalize_env()
        if vecnorm is not None:
            save_arrays(Path(f"{stem}.vecnormalize.npz"), vecnormalize_arrays(vecnorm))
        if self.qat is not None:
            write_qat_state(Path(f"{stem}.qat.json"), model.policy, self.qat)
        with plain_layers(model.policy):  # the .zip appears last: it marks the checkpoint complete
            write_atomic(Path(f"{stem}.zip"), model.save)
        for _, old in run_checkpoints(self.folder)[:-2]:
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


def read_checkpoint_data(path: Path, what: str = "a training checkpoint"
                         ) -> tuple[CheckpointData, dict[str, JsonValue]]:
    """(typed record, raw JSON object) of the ``data`` entry of SB3 zip ``path`` (the raw
    object for the fields the record leaves as SB3 wrote them)."""
    from quarl.core.limits import open_zip, read_zip_entry

    with open_zip(path, what) as archive:
        if "data" not in archive.namelist():
            raise QuarlError(f"{path} is not a Stable-Baselines3 checkpoint (no data entry): refused as {what}")
        raw = parse_json(read_zip_entry(archive, "data", str(path)), f"{path}:data")
    check_depth(raw, f"{path}:data")  # fine-tuning walks its policy_kwargs recursively
    return parse_record(CheckpointData, raw, f"{path}:data"), raw


_POLICY_MODULE = re.compile(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\.policies")


def saved_algorithm(data: dict[str, JsonValue]) -> str | None:
    """The algorithm whose ``save`` wrote this ``data`` entry, from its policy class's module
    and the hyperparameters it keeps (PPO's clip range, TRPO's conjugate-gradient steps), or
    None where the policy class is not one of SB3's or sb3-contrib's."""
    from quarl.policies.sb3 import algo_from_data

    policy_class = data.get("policy_class")
    module = policy_class.get("__module__") if isinstance(policy_class, dict) else None
    match = _POLICY_MODULE.fullmatch(module) if isinstance(module, str) else None
    if match is None:
        return None
    # A2C, PPO and TRPO share SB3's ActorCriticPolicy (module ...common.policies)
    return algo_from_data(data, "ppo" if match.group(1) == "common" else match.group(1))


def check_algorithm(path: Path, data: dict[str, JsonValue], algo: str, doing: str) -> None:
    """One line when the zip at ``path`` was saved by another algorithm than ``algo`` (an
    A2C zip resumed as PPO loaded RMSprop's state into Adam: KeyError 'betas' mid-run)."""
    saved = saved_algorithm(data)
    if saved is not None and saved != algo:
        raise QuarlError(f"{path} was saved by {saved}, not {algo}: {doing} it as {saved}, or give a {algo} checkpoint")
