"""Resuming a training run: the checkpoint's step checked against its model and the run's
budget, its weights, optimizer state, replay buffer and normalization read back with nothing
unpickled, and the ``--hp`` the run started with (``quarl-train.json``) kept."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_json
from quarl.core.limits import read_capped
from quarl.training.checkpoint_arrays import (
    load_arrays,
    load_replay,
    load_vecnormalize_arrays,
    replay_arrays,
    vecnormalize_arrays,
)
from quarl.training.hyperparams import Hyperparams
from quarl.training.periodic_saves import check_algorithm, read_checkpoint_data

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.vec_env import VecNormalize

log = logging.getLogger(__name__)

RUN_SETTINGS = "quarl-train.json"
"""A run's --hp and budget, written when it starts: --resume continues with them."""
RUN_SETTINGS_CAP = 1 << 20
"""Bytes a run's settings file may have."""


@dataclass(frozen=True)
class RunSettings:
    """What a run started with (:data:`RUN_SETTINGS` in its folder)."""

    hyperparams: Hyperparams
    """Its --hp, as JSON keeps them (values of other types written as strings)."""
    timesteps: int | None = None
    """Its budget in env steps."""

    def write(self, run_dir: Path) -> None:
        write_atomic(run_dir / RUN_SETTINGS, json.dumps({"hyperparams": self.hyperparams, "timesteps": self.timesteps},
                                                        default=str, sort_keys=True))

    @classmethod
    def read(cls, run_dir: Path) -> RunSettings | None:
        """The settings of the run in ``run_dir``, None for a run from before the file existed."""
        path = run_dir / RUN_SETTINGS
        if not path.is_file():
            return None
        stored = parse_json(read_capped(path, RUN_SETTINGS_CAP, "a run's settings"), path)
        if not isinstance(stored, dict) or not isinstance(stored.get("hyperparams", {}), dict):
            raise QuarlError(f"{path}: not a run's settings (remove it to resume with the options given)")
        steps = stored.get("timesteps")
        return cls(hyperparams=dict(stored.get("hyperparams") or {}),
                   timesteps=steps if isinstance(steps, int) and not isinstance(steps, bool) else None)


def resumed_hyperparams(given: Hyperparams, run_dir: Path) -> Hyperparams:
    """The --hp a resumed run trains with: its own where none are given (one line where
    other ones are: a resumed run keeps the settings it started with); runs from before the
    settings file existed resume with ``given``."""
    settings = RunSettings.read(run_dir)
    if settings is None:
        return given
    hyperparams = settings.hyperparams
    if not given:
        if hyperparams:
            log.warning("note: resuming %s with the --hp it started with: %s", run_dir,
                        ", ".join(f"{k}={v}" for k, v in sorted(hyperparams.items())))
        return hyperparams
    as_json = json.loads(json.dumps(given, default=str))
    if as_json != hyperparams:
        raise QuarlError(f"{run_dir} started with --hp {json.dumps(hyperparams, sort_keys=True)}, not "
                         f"{json.dumps(as_json, sort_keys=True)}: resume without --hp (its own are used) or start a "
                         "new run")
    return given


def check_checkpoint_step(step: int, path: Path, total: int, algo: str | None = None) -> None:
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


def resume_from(model: BaseAlgorithm, path: Path, done: int, trust_pickle: bool) -> None:
    """Weights, optimizer state, replay buffer and normalization of checkpoint ``path``,
    read with nothing unpickled (see :mod:`quarl.training.checkpoint_arrays`); the pickles of
    an older checkpoint only with ``trust_pickle``."""
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

    stem = str(path)[: -len(".zip")]
    params = checkpoint_tensors(path, model)
    try:
        model.set_parameters(params, exact_match=True, device="cpu")
    except Exception as exc:  # a foreign or unsafe zip
        raise QuarlError(f"{path} cannot be read as plain tensors ({exc.__class__.__name__}): refused") from None
    model.num_timesteps = done
    if isinstance(model, OffPolicyAlgorithm) and model.replay_buffer is not None:
        npz, pkl = Path(f"{stem}.replay.npz"), Path(f"{stem}.replay.pkl")
        if npz.exists():
            load_replay(model.replay_buffer, load_arrays(npz), npz)
        elif pkl.exists():
            _refuse_pickle(pkl, trust_pickle)
            load_replay(model.replay_buffer, replay_arrays(_trusted_replay(pkl)), pkl)
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        npz, pkl = Path(f"{stem}.vecnormalize.npz"), Path(f"{stem}.vecnormalize.pkl")
        if npz.exists():
            load_vecnormalize_arrays(vecnorm, load_arrays(npz), npz)
        elif pkl.exists():
            _refuse_pickle(pkl, trust_pickle)
            load_vecnormalize_arrays(vecnorm, vecnormalize_arrays(_trusted_vecnormalize(pkl), pkl), pkl)


def _unpickle_trusted(pkl: Path, cap: int, what: str) -> object:
    """What ``pkl`` unpickles to (``--trust-pickle``: the user vouched for it), read at most
    ``cap`` bytes; one line where it cannot be unpickled. Its type is still checked by the
    caller: trusted code is not a trusted shape."""
    import pickle

    data = read_capped(pkl, cap, what)
    try:
        return pickle.loads(data)  # noqa: S301 - the user vouched for this file
    except Exception as exc:  # truncated, or a class that is not installed
        raise QuarlError(f"{pkl} cannot be unpickled ({exc.__class__.__name__}: {str(exc)[:100]})") from None


def _trusted_vecnormalize(pkl: Path) -> VecNormalize:
    """An older checkpoint's VecNormalize pickle, trusted: a VecNormalize (one line naming the
    type found otherwise: an int was an AttributeError traceback)."""
    from quarl.policies.safe_load import VECNORMALIZE_CAP, check_trusted_vecnormalize

    obj = _unpickle_trusted(pkl, VECNORMALIZE_CAP, "a VecNormalize pickle")
    check_trusted_vecnormalize(obj, pkl)
    return obj  # type: ignore[return-value]  # checked: a VecNormalize


def _trusted_replay(pkl: Path) -> ReplayBuffer:
    """An older checkpoint's replay buffer pickle, trusted: an SB3 ReplayBuffer (SB3's own
    load asserted it, an AssertionError traceback), its arrays then checked as a ``.npz``'s."""
    from stable_baselines3.common.buffers import ReplayBuffer

    from quarl.training.checkpoint_arrays import ARRAYS_CAP

    obj = _unpickle_trusted(pkl, ARRAYS_CAP, "a replay buffer pickle")
    if not isinstance(obj, ReplayBuffer):
        raise QuarlError(f"{pkl} holds a {type(obj).__module__}.{type(obj).__qualname__}, not a replay buffer "
                         "(stable_baselines3.common.buffers.ReplayBuffer): refused")
    return obj


def checkpoint_tensors(path: Path, model: BaseAlgorithm) -> dict[str, Any]:
    """The ``.pth`` entries of checkpoint ``path`` that SB3's ``set_parameters`` reads (its
    policy's and its optimizers' state dicts, by name), each read through
    :func:`quarl.core.limits.load_torch`: bounded by three times the tensors of ``model``'s
    policy (its weights, Adam's two moments) before torch reads a record. SB3 read the zip
    itself, and a 1 MB entry inflating to 1.2 GB was taken before any check."""
    from quarl.core.limits import load_torch, open_zip, read_zip_entry, torch_file_cap

    values = sum(int(t.numel()) for t in model.policy.state_dict().values())
    cap = torch_file_cap(3 * values)
    with open_zip(path, "a training checkpoint") as archive:
        names = [name for name in archive.namelist()  # as SB3's load_from_zip_file sorts them
                 if name.endswith(".pth") and name not in ("pytorch_variables.pth", "tensors.pth")]
        raws = {name: read_zip_entry(archive, name, str(path)) for name in names}
    params: dict[str, Any] = {}
    for name, raw in raws.items():
        state = load_torch(raw, cap, "a training checkpoint's tensors", f"{path}:{name}",
                           lambda error: f"{path} cannot be read as plain tensors ({error}): refused")
        if not isinstance(state, dict):
            raise QuarlError(f"{path}:{name}: a {type(state).__name__}, not a state dict: refused")
        params[name[: -len(".pth")]] = state
    return params


def _refuse_pickle(pkl: Path, trust_pickle: bool) -> None:
    if not trust_pickle:
        raise QuarlError(f"{pkl} (an older quarl's checkpoint) needs unpickling: refused; pass --trust-pickle "
                         "if you trust this file")
