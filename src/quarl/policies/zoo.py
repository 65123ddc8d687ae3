"""The Stable-Baselines3 zip / RL Zoo run folder format (``ppo/CartPole-v1_1``, ``x.zip``):
the claim of any existing path no other format takes, so it is registered first (asked
last). Nothing from the zip is executed: the weights come from ``policy.pth`` through
``torch.load(weights_only=True)``, the spaces and policy keyword arguments from the
readable fields of the ``data`` JSON (never its cloudpickled blobs), the network from the
state dict's names and shapes (:mod:`quarl.policies.sb3`)."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path
from typing import Any

import torch
from pydantic import JsonValue

from quarl.core.errors import QuarlError
from quarl.core.file_schema import MAX_JSON_DEPTH, check_depth
from quarl.core.limits import check_tensors, load_torch, open_zip, read_zip_entry, torch_file_cap
from quarl.core.literals import parse_literal
from quarl.policies.base import ObsNormalizer
from quarl.policies.checkpoint import Checkpoint
from quarl.policies.file_kind import not_a_policy
from quarl.policies.safe_load import load_vecnormalize
from quarl.policies.sb3 import (
    MAX_ABS_LOG_STD,
    PolicyKwargs,
    algo_from_data,
    build_policy,
    layout_of,
    policy_class_name,
    state_noise,
)
from quarl.policies.sb3_spaces import space_from_json
from quarl.policies.zoo_folder import ZooConfig, read_zoo_config, zoo_env_spec, zoo_files

log = logging.getLogger(__name__)

QAT_FILE = "qat.json"
"""Written by quantization-aware training next to config.yml; a folder holding one is the
QAT format's (registered by :mod:`quarl.training.qat_loader`)."""


def _read_zip(path: Path) -> tuple[dict[str, JsonValue], dict[str, torch.Tensor]]:
    """The zip's ``data`` entry (a JSON object, as SB3 wrote it) and its state dict, checked."""
    try:
        with open_zip(path, "a Stable-Baselines3 checkpoint") as archive:
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise QuarlError(f"{path} is not a Stable-Baselines3 checkpoint: it lacks 'data' or 'policy.pth'")
            data = json.loads(read_zip_entry(archive, "data", str(path)))
            raw = read_zip_entry(archive, "policy.pth", str(path))
    except zipfile.BadZipFile:
        raise QuarlError(f"{path} is not a Stable-Baselines3 checkpoint: not a zip file (corrupt or "
                         "truncated?)") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise QuarlError(f"{path} is corrupt: its 'data' entry is not JSON") from None
    except RecursionError:  # deeper than Python's stack
        raise QuarlError(f"{path} is corrupt: its 'data' entry is JSON nested more than {MAX_JSON_DEPTH} deep: refused "
                         f"(at most {MAX_JSON_DEPTH})") from None
    check_depth(data, f"{path} is corrupt: its 'data' entry")  # before anything walks it
    if not isinstance(data, dict):
        raise QuarlError(f"{path} is corrupt: its 'data' entry is a JSON {type(data).__name__}, not an object")
    sd = load_torch(raw, torch_file_cap(), "an SB3 policy", f"{path}: policy.pth",
                    lambda error: f"{path}: policy.pth cannot be read as plain tensors ({error})")
    if not isinstance(sd, dict):
        raise QuarlError(f"{path}: policy.pth holds a {type(sd).__name__}, not a state dict of tensors")
    check_tensors(sd, f"{path} policy.pth")  # before any copy or layer is built from the shapes it claims
    return data, {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def _policy_kwargs(data: dict[str, JsonValue], config: ZooConfig) -> dict[str, Any]:
    """The policy keyword arguments: the config's (Python literal text or a mapping), then the
    zip's readable ones over them."""
    out: dict[str, Any] = {}
    text = config.policy_kwargs
    if isinstance(text, str):
        parsed = parse_literal(text)
        out.update(parsed if isinstance(parsed, dict) else {})
    elif isinstance(text, dict):
        out.update(text)
    saved = data.get("policy_kwargs")
    for key, value in (saved if isinstance(saved, dict) else {}).items():
        if not key.startswith(":"):
            out[key] = parse_literal(value) if isinstance(value, str) else value
    return out



def detect(path: Path) -> bool:
    """Any existing path: a zoo run folder, a zip, or a file none of the other formats
    takes (refused in one line by :func:`load`)."""
    return path.exists()


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """The checkpoint of a zoo run folder or an SB3 zip; a folder holding QAT state is
    refused here (its format acts with the trained quantizers: it is registered from
    :mod:`quarl.training`, which :mod:`quarl.checkpoints` imports)."""
    reason = not_a_policy(path)
    if reason is not None:  # a text file, an export's sidecar: said as such, not as a broken zip
        raise QuarlError(reason)
    _, config_dir, _ = zoo_files(path)
    if config_dir is not None and (config_dir / QAT_FILE).exists():
        raise QuarlError(f"{config_dir / QAT_FILE}: a quantization-aware trained run, acted with by the QAT format "
                         "that quarl.training registers: load it with quarl.checkpoints.load_checkpoint")
    return load_zoo(path, trust_pickle)


def load_zoo(path: Path, trust_pickle: bool = False, zip_override: Path | None = None) -> Checkpoint:
    """The fp32 policy of an RL Zoo run folder (``ppo/CartPole-v1_1``) or an SB3 zip, with its
    env from the folder's config files (``None`` for a bare zip) and its VecNormalize
    statistics. ``zip_override``: read the weights from this zip instead, with the folder's
    zoo files (a recovered folder's original policy, acting in its folder's env)."""
    zip_path, config_dir, zoo_algo = zoo_files(path)
    data, sd = _read_zip(zip_override or zip_path)
    config = read_zoo_config(config_dir / "config.yml") if config_dir else ZooConfig()
    obs_space = space_from_json(data.get("observation_space"), "observation space")
    act_space = space_from_json(data.get("action_space"), "action space")
    raw_kwargs = _policy_kwargs(data, config)
    if policy_class_name(data) == "ARSLinearPolicy":  # ARS's linear policy clips; its MLP squashes
        raw_kwargs.setdefault("squash_output", False)
    kwargs = PolicyKwargs.read(raw_kwargs)
    algo = zoo_algo or algo_from_data(data, layout_of(sd).name)
    policy = build_policy(sd, obs_space, act_space, kwargs, algo=algo)
    log_std = sd.get("log_std")
    if policy.head == "clip" and isinstance(log_std, torch.Tensor) and log_std.shape == policy.action_space.shape:
        # a diagonal Gaussian's state-independent log std (A2C / PPO / TRPO; gSDE's is a matrix): what
        # predict(deterministic=False) samples with; an absurd one would overflow (NaN / inf: check_tensors refused)
        if float(log_std.abs().max()) > MAX_ABS_LOG_STD:
            raise QuarlError(f"{zip_override or zip_path}: policy.pth's log_std {log_std.tolist()} is not finite "
                             f"within +-{MAX_ABS_LOG_STD}")
        policy.meta["log_std"] = [float(v) for v in log_std.reshape(-1)]
    policy.noise = state_noise(sd, kwargs, policy, str(zip_override or zip_path))
    rate = data.get("exploration_rate")
    if policy.head in ("argmax", "quantile_argmax") and isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0:
        policy.meta["exploration_rate"] = float(rate)  # what SB3's predict(deterministic=False) explores with

    env_spec = None
    if config_dir is not None:
        env_spec = zoo_env_spec(config_dir, config_dir.name, config)
        if config.normalize:
            stats_path = config_dir / "vecnormalize.pkl"
            if not stats_path.exists():
                raise QuarlError(f"{config_dir} says normalize=True but has no vecnormalize.pkl")
            stats = load_vecnormalize(stats_path, trust_pickle=trust_pickle, obs_shape=policy.input_shape)
            if stats.norm_obs:
                policy.obs_normalizer = ObsNormalizer(stats.mean, stats.var, stats.clip_obs, stats.epsilon)
    log.info("loaded %s %s policy from %s", algo, type(policy.action_space).__name__, path)
    return Checkpoint(policy=policy, env_spec=env_spec, algo=algo, path=path)
