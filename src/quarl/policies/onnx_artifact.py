"""An exported policy (``quarl export``: ``NAME.onnx`` + ``NAME.json``) loaded back as a
Policy, so that the file a user deploys is the file quarl evaluates (``quarl ptq
NAME.onnx``). The sidecar says how to feed the model and read its output, and which env it
acts in; the model runs on ONNX Runtime exactly as exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from quarl.envs import EnvSpec
from quarl.errors import QuarlError
from quarl.policies.base import HEADS, ObsNormalizer, Policy
from quarl.quant.backends.onnxruntime import OrtEngine

SIDECAR_FORMAT = "quarl-policy/1"


class OnnxNetwork(nn.Module):
    """A model run by ONNX Runtime, as a module: its bytes are its state (so the policy's
    fingerprint is the file's content) and it is immutable (a copy is itself)."""

    def __init__(self, model: bytes, per_row: bool) -> None:
        super().__init__()
        self.register_buffer("model_bytes", torch.frombuffer(bytearray(model), dtype=torch.uint8))
        self.engine = OrtEngine(model, per_row=per_row)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.engine(x.detach().float().numpy()))

    def __deepcopy__(self, memo: dict) -> "OnnxNetwork":
        return self


def _space(entry: Any, what: str) -> gym.spaces.Space:
    if not isinstance(entry, dict) or entry.get("type") not in ("discrete", "box"):
        raise QuarlError(f"the sidecar's {what} is missing or unreadable")
    if entry["type"] == "discrete":
        return gym.spaces.Discrete(int(entry["n"]))
    shape = tuple(int(d) for d in entry["shape"])

    def bound(values: list, fill: float) -> np.ndarray:
        return np.array([fill if v is None else float(v) for v in values], np.float32).reshape(shape)

    return gym.spaces.Box(bound(entry["low"], -np.inf), bound(entry["high"], np.inf), shape, np.float32)


def is_artifact(path: Path) -> bool:
    return path.suffix == ".onnx"


def load_artifact(path: Path) -> tuple[Policy, EnvSpec | None]:
    """The policy of ``NAME.onnx`` (with ``NAME.json`` beside it) and its env, if named."""
    from quarl.quant.modes import MODES

    meta_path = path.with_suffix(".json")
    if not meta_path.exists():
        raise QuarlError(f"{path} has no sidecar {meta_path.name} (written by quarl export): cannot tell how to feed it")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        raise QuarlError(f"{meta_path} is corrupt: not JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != SIDECAR_FORMAT:
        raise QuarlError(f"{meta_path} is not a quarl sidecar (format {SIDECAR_FORMAT!r})")
    if meta.get("head") not in HEADS:
        raise QuarlError(f"{meta_path}: unknown action head {meta.get('head')!r}")
    mode = (meta.get("quant") or {}).get("mode")
    per_row = bool(mode in MODES and MODES[mode].per_row)
    try:
        network = OnnxNetwork(path.read_bytes(), per_row)
    except Exception as exc:  # ONNX Runtime raises its own types for a bad file
        raise QuarlError(f"{path} is not a loadable ONNX model ({exc.__class__.__name__})") from None
    norm = meta.get("obs_normalizer")
    policy = Policy(
        network=network,
        observation_space=_space(meta.get("observation_space"), "observation space"),
        action_space=_space(meta.get("action_space"), "action space"),
        head=meta["head"],
        algo=str(meta.get("algo", "unknown")),
        obs_normalizer=None if norm is None else ObsNormalizer(np.asarray(norm["mean"], np.float64),
                                                               np.asarray(norm["var"], np.float64),
                                                               float(norm["clip"]), float(norm["epsilon"])),
        scale_images=bool(meta.get("scale_images")),
        n_quantiles=int(meta.get("n_quantiles") or 0),
        precision=f"{meta.get('precision', 'onnx')} (onnx)",
    )
    if isinstance(meta.get("quant"), dict):  # the mode export chose, shown beside the returns
        policy.meta["quant"] = meta["quant"]
    env = meta.get("env")
    spec = None
    if isinstance(env, dict):
        spec = EnvSpec(env["env_id"], env.get("env_kwargs") or {}, tuple(env.get("wrappers") or ()),
                       int(env.get("frame_stack") or 1))
    return policy, spec
