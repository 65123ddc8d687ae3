"""An exported policy (``quarl export``: ``NAME.onnx`` + ``NAME.json``) loaded back as a
Policy, so that the file a user deploys is the file quarl evaluates (``quarl ptq
NAME.onnx``). The sidecar says how to feed the model and read its output, and which env it
acts in; the model runs on ONNX Runtime exactly as exported."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator
from torch import nn
from typing_extensions import TypedDict

from quarl.core.atomic import reading_published
from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, field_error, parse_json, parse_record
from quarl.core.limits import model_file_cap, read_capped
from quarl.envs import EnvSpec
from quarl.policies.base import HEADS, ObsNormalizer, Policy, check_outputs
from quarl.policies.checkpoint import Checkpoint
from quarl.policies.onnx_graph import check_graph
from quarl.quant.backends.onnxruntime import OrtEngine
from quarl.quant.summary import is_quant_summary

SIDECAR_FORMAT = "quarl-policy/1"
SidecarJson = dict[str, Any]
"""A sidecar as its JSON object (:meth:`SidecarRecord.written`)."""
SIDECAR_CAP = 64 * 2**20
"""Bytes a sidecar may have (quarl writes a few kilobytes; an image policy's observation
bounds make it larger)."""


class OnnxNetwork(nn.Module):
    """A model run by ONNX Runtime, as a module: its bytes are its state (so the policy's
    fingerprint is the file's content) and it is immutable (a copy is itself)."""

    def __init__(self, model: bytes, per_row: bool) -> None:
        super().__init__()
        self.register_buffer("model_bytes", torch.frombuffer(bytearray(model), dtype=torch.uint8))
        self.engine = OrtEngine(model, per_row=per_row)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.engine(x.detach().float().numpy()))

    def __deepcopy__(self, memo: dict[int, object]) -> OnnxNetwork:
        return self


MAX_INPUT_VALUES = 10**7
"""An observation larger than this (40 MB of float32) is not one a sidecar describes."""


def _number(value: Any, what: str, low: float | None = None, inclusive: bool = False) -> float:
    """A finite number (above ``low``, or at least ``low`` when ``inclusive``), or the
    problem naming the field (a ValueError: the record puts it in its one line)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"{what} {value!r} is not a finite number")
    if low is not None and not (value >= low if inclusive else value > low):
        raise ValueError(f"{what} {value!r} must be {'>=' if inclusive else '>'} {low}")
    return float(value)


def _count(value: Any, what: str, least: int = 1, most: int = MAX_INPUT_VALUES) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{what} {value!r} is not a whole number in {least}..{most}")
    return value


def _checked(check: Callable[[Any], Any]) -> Any:
    return BeforeValidator(check)


class SpaceRecord(Record):
    """A space as ``quarl export`` describes it (see :func:`quarl.export.artifact.sidecar`): the
    fields its ``type`` uses, each checked (sizes whole and bounded, bounds finite or
    ``null`` for an unbounded side)."""

    what: ClassVar[str] = "space"
    type: Literal["discrete", "box", "multi_discrete", "multi_binary"]
    n: int | None = None
    nvec: list[int] | None = None
    shape: list[int] | None = None
    low: list[float | None] | None = None
    high: list[float | None] | None = None

    @model_validator(mode="after")
    def _fits_its_type(self) -> SpaceRecord:
        what = self.what
        if self.type in ("discrete", "multi_binary"):
            _count(self.n, f"{what} size", most=1024 if self.type == "multi_binary" else MAX_INPUT_VALUES)
        elif self.type == "multi_discrete":
            if self.nvec is None or not 1 <= len(self.nvec) <= 1024:
                raise ValueError(f"{what} nvec {str(self.nvec)[:80]!r} is not a list of 1 to 1024 sizes")
            for v in self.nvec:
                _count(v, f"{what} nvec")
        else:
            if not self.shape:
                raise ValueError(f"{what} shape {self.shape!r} is not a list of sizes")
            for d in self.shape:
                _count(d, f"{what} shape")
            _count(math.prod(self.shape), f"{what} size")
            for side, values in (("low", self.low), ("high", self.high)):
                if values is None or len(values) != math.prod(self.shape):
                    raise ValueError(f"{what} {side} bounds do not match its shape {tuple(self.shape)}")
        return self

    def space(self) -> gym.spaces.Space[Any]:
        if self.type == "discrete":
            return gym.spaces.Discrete(int(self.n or 0))
        if self.type == "multi_binary":
            return gym.spaces.MultiBinary(int(self.n or 0))
        if self.type == "multi_discrete":
            return gym.spaces.MultiDiscrete(list(self.nvec or ()))
        shape = tuple(self.shape or ())

        def bound(values: list[float | None] | None, fill: float) -> np.ndarray:
            return np.array([fill if v is None else v for v in values or ()], np.float32).reshape(shape)

        return gym.spaces.Box(bound(self.low, -np.inf), bound(self.high, np.inf), shape, np.float32)


class ObservationSpaceRecord(SpaceRecord):
    what: ClassVar[str] = "observation space"


class ActionSpaceRecord(SpaceRecord):
    what: ClassVar[str] = "action space"


def _space(entry: Any, what: str) -> gym.spaces.Space[Any]:
    """The space a sidecar's ``entry`` describes (``what``: ``"action space"`` or
    ``"observation space"``), or one line naming the field."""
    record_type = ActionSpaceRecord if what == "action space" else ObservationSpaceRecord
    return parse_record(record_type, entry, f"the sidecar's {what}").space()


NORMALIZER_FORMULA = "clip((obs - mean) / sqrt(var + epsilon), -clip, clip)"


class InputRecord(Record):
    """The model's input."""

    name: str
    shape: list[int | None]
    """``None`` first: any batch size."""
    dtype: str


class PortableCheck(TypedDict):
    """A ``--portable`` model against the ONNX Runtime one (:func:`quarl.export.artifact.write_artifact`)."""

    max_abs_diff: float
    action_agreement: float


class NormalizerRecord(Record):
    """SB3's VecNormalize statistics, applied before the model's float32 input."""

    model_config = ConfigDict(extra="allow")
    mean: list[Annotated[float, _checked(lambda v: _number(v, "obs_normalizer mean"))]]
    var: list[Annotated[float, _checked(lambda v: _number(v, "obs_normalizer var", 0.0, inclusive=True))]]
    clip: Annotated[float, _checked(lambda v: _number(v, "obs_normalizer clip", 0.0))] = Field(
        None, validate_default=True)
    epsilon: Annotated[float, _checked(lambda v: _number(v, "obs_normalizer epsilon", 0.0))] = Field(
        None, validate_default=True)
    dtype: str = "float64"
    """What the statistics are applied in: SB3's VecNormalize computes in float64, before the
    cast to the model's float32 input (documentation for other runtimes)."""
    formula: str = NORMALIZER_FORMULA


class EnvRecord(Record):
    """The env the export acts in (:class:`quarl.envs.EnvSpec` as JSON)."""

    env_id: str
    env_kwargs: dict[str, Any] | None = None
    wrappers: list[Any] | None = None
    frame_stack: int | None = None


class SidecarRecord(Record):
    """``NAME.json``, the one definition of quarl's export sidecar: how to feed the policy's
    ONNX model and read its output, what the model is and where it came from. Written by
    :func:`quarl.export.artifact.write_artifact` (its fields in this order), read back by
    :func:`read_sidecar` (a field an older quarl did not write takes its default; fields of
    other writers are kept as they are)."""

    model_config = ConfigDict(extra="allow")
    format: str
    algo: str = "unknown"
    precision: str = "onnx"
    input: InputRecord | None = None
    observation_space: ObservationSpaceRecord
    action_space: ActionSpaceRecord
    head: str
    n_quantiles: Annotated[int, _checked(lambda v: _count(v or 0, "n_quantiles", least=0, most=10_000))] = 0
    scale_images: bool | None = None
    obs_normalizer: NormalizerRecord | None = None
    exploration_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    """A Q-head's epsilon when it samples (SB3's predict(deterministic=False))."""
    onnx: str | None = None
    """The model's file name, beside the sidecar."""
    onnx_bytes: int | None = None
    ops: dict[str, list[str]] | None = None
    """The operators the model uses, by domain (``ai.onnx``: standard ONNX)."""
    opsets: dict[str, int] | None = None
    runtimes: str | None = None
    """Which runtimes run it: a ``com.microsoft`` operator (MatMulNBits) runs in ONNX Runtime only."""
    onnx_sha256: str | None = None
    env: EnvRecord | None = None
    policy_sha256: str | None = None
    """The exported policy's content (``Policy.fingerprint``)."""
    provenance: dict[str, object] | None = None
    acting: Literal["sampled", "greedy"] = "greedy"
    """How the exported policy was judged and is meant to act (the default of ptq / play on it)."""
    portable: dict[str, PortableCheck] | None = None
    """``--portable``: per way of running it (``fp32_arithmetic``, ``onnxruntime_default``)."""
    quant: dict[str, Any] | None = None
    """The int mode's summary (a :class:`~quarl.quant.summary.QuantSummary` but ``tried``)."""

    @classmethod
    def written(cls, **fields: Any) -> SidecarJson:
        """The JSON object quarl writes from ``fields`` (the writer's own values, unchecked:
        reading checks them), in this model's field order, without the fields not given."""
        return cls.model_construct(**fields).model_dump(exclude_unset=True, warnings=False)

    @field_validator("head")
    @classmethod
    def _known_head(cls, head: str) -> str:
        if head not in HEADS:
            raise ValueError(f"unknown action head {head!r}")
        return head


def read_sidecar(meta_path: Path) -> SidecarRecord:
    """``NAME.json`` as a :class:`SidecarRecord`, its observation normalizer of the
    observation's size: one line naming the file and the field otherwise."""
    meta = parse_json(read_capped(meta_path, SIDECAR_CAP, "a quarl sidecar"), meta_path)
    if not isinstance(meta, dict) or meta.get("format") != SIDECAR_FORMAT:
        raise QuarlError(f"{meta_path} is not a quarl sidecar (format {SIDECAR_FORMAT!r})")
    record = parse_record(SidecarRecord, meta, meta_path)
    norm = record.obs_normalizer
    n = math.prod(record.observation_space.space().shape or ())
    for name in ("mean", "var"):
        values = getattr(norm, name) if norm is not None else None
        if values is not None and len(values) != n:
            raise field_error(meta_path, f"obs_normalizer.{name}",
                              f"obs_normalizer {name} has {len(values)} values; the observation has {n}")
    return record


ARTIFACT_NAME = "policy"
"""``quarl export --out DIR`` writes ``DIR/policy.onnx`` and ``DIR/policy.json``."""


def is_artifact(path: Path) -> bool:
    return path.suffix == ".onnx" or (path.is_dir() and (path / f"{ARTIFACT_NAME}.onnx").is_file())


@dataclass(frozen=True)
class ExportedModel:
    """The payload of a checkpoint the ``onnx`` format loaded (``checkpoint.payload_of(ExportedModel)``):
    the model file and its sidecar, as read and checked once. A command that treats an export
    apart (evaluated as it is, never re-quantized) asks for it instead of sniffing the path."""

    model: Path
    """``NAME.onnx``."""
    sidecar: SidecarRecord
    """``NAME.json`` as read."""


def load_artifact(path: Path) -> tuple[Policy, EnvSpec | None]:
    """The policy of ``NAME.onnx`` (with ``NAME.json`` beside it), or of an export folder
    holding ``policy.onnx``, and its env, if named."""
    policy, spec, _ = _load_export(path)
    return policy, spec


def _load_export(path: Path) -> tuple[Policy, EnvSpec | None, ExportedModel]:
    from quarl.quant.modes import MODES

    if path.is_dir():
        path = path / f"{ARTIFACT_NAME}.onnx"
    meta_path = path.with_suffix(".json")
    with reading_published(path.parent):  # the model and the sidecar of one export (quarl.core.atomic.write_all_atomic)
        if not meta_path.exists():
            raise QuarlError(f"{path} has no sidecar {meta_path.name} (written by quarl export): cannot tell how to "
                             "feed it")
        meta = read_sidecar(meta_path)
        model = read_capped(path, model_file_cap(), "an ONNX model")
    quant = meta.quant or None
    if quant is not None and not is_quant_summary(quant):
        raise field_error(meta_path, "quant",
                          "not an int mode's summary (a mode name, its fp32 layers and measurements)")
    mode = quant["mode"] if quant is not None else None
    per_row = bool(mode is not None and mode in MODES and MODES[mode].per_row)
    digest = meta.onnx_sha256
    if digest is not None and digest != hashlib.sha256(model).hexdigest():
        raise QuarlError(f"{path} is not the model {meta_path.name} describes (its SHA-256 differs from the sidecar's "
                         "onnx_sha256): export again")
    observation_space = meta.observation_space.space()
    check_graph(model, path, tuple(observation_space.shape or ()))
    action_space = meta.action_space.space()
    norm = meta.obs_normalizer
    normalizer = None if norm is None else ObsNormalizer(np.array(norm.mean, np.float64),
                                                         np.array(norm.var, np.float64), norm.clip, norm.epsilon)
    try:
        network = OnnxNetwork(model, per_row)
    except Exception as exc:  # ONNX Runtime raises its own types for a bad file
        raise QuarlError(f"{path} is not a loadable ONNX model ({exc.__class__.__name__})") from None
    policy = Policy(
        network=network,
        observation_space=observation_space,
        action_space=action_space,
        head=meta.head,
        algo=meta.algo,
        obs_normalizer=normalizer,
        scale_images=bool(meta.scale_images),
        n_quantiles=meta.n_quantiles,
        precision=f"{meta.precision} (onnx)",
    )
    if quant is not None:  # the mode export chose, shown beside the returns
        policy.meta["quant"] = quant
    policy.meta["acting"] = meta.acting
    if meta.exploration_rate is not None:
        policy.meta["exploration_rate"] = meta.exploration_rate
    check_outputs(policy, str(path))
    env = meta.env
    spec = None
    if env is not None:
        try:
            spec = EnvSpec(env.env_id, env.env_kwargs or {}, tuple(env.wrappers or ()), int(env.frame_stack or 1))
        except QuarlError as exc:
            raise field_error(meta_path, "env", str(exc)) from None
    return policy, spec, ExportedModel(path, meta)


def detect(path: Path) -> bool:
    return path.exists() and is_artifact(path)


def load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """``quarl export``'s model, evaluated as exported (it holds no pickle)."""
    policy, spec, exported = _load_export(path)
    return Checkpoint(policy=policy, env_spec=spec, algo=policy.algo, path=path, payload=exported)
