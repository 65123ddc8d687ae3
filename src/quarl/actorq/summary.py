"""What one ActorQ run measured: :class:`ActorQSummary`, written as ``OUT/summary.json``
and read back by ``actorq compare``, ``actorq model`` and the loader of ActorQ policies."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import ConfigDict, Field, JsonValue, field_validator, with_config
from typing_extensions import TypedDict

from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_json, parse_record, record_of
from quarl.core.limits import read_capped
from quarl.core.provenance import Provenance, whole_provenance

if TYPE_CHECKING:  # the config module reads the algorithm registry; a summary needs only its JSON's type
    from quarl.actorq.config import ConfigJSON

SUMMARY_CAP = 16 << 20
"""Bytes an ActorQ summary.json may have (quarl writes a few kilobytes)."""

WINDOW = 10
"""Evaluations in the running mean that time-to-reward uses (as the paper)."""


def running_means(evals: Sequence[Sequence[float]]) -> np.ndarray:
    """The running mean over the last :data:`WINDOW` evaluations, after each evaluation."""
    v = np.array([e[2] for e in evals], dtype=float)
    return np.array([v[max(0, i - WINDOW + 1) : i + 1].mean() for i in range(len(v))])


_Count = Annotated[int, Field(ge=0)]
_Rate = Annotated[float, Field(ge=0)]
_Measured = Annotated[float, Field(allow_inf_nan=True)]
"""A return or a ratio as measured: an env's rewards may be infinite, an empty mean NaN."""


_PART = ConfigDict(extra="allow", strict=True)
"""A JSON object inside a summary: its fields typed, and kept where another quarl version
wrote more of them."""


@with_config(_PART)
class MachineInfo(TypedDict, total=False):
    """A summary's ``machine`` (:func:`quarl.actorq.machine.describe_machine`)."""

    cpu: str
    """The CPU model."""
    cores: int | None
    """``os.cpu_count()``: None where Python could not tell."""
    gpu: str | None
    """The first CUDA device's name; None without one."""


@with_config(_PART)
class Energy(TypedDict, total=False):
    """A summary's ``energy``: codecarbon's measurement or estimate of the whole run
    (:func:`quarl.actorq.machine.stop_energy`), or ``available: False`` (and the ``error``)."""

    available: bool
    energy_kwh: float
    cpu_energy_kwh: float
    ram_energy_kwh: float
    co2_kg: float
    country: str
    method: str
    """``measured (RAPL)`` or how it was estimated."""
    error: str
    """Why tracking failed (``available`` False)."""


@with_config(_PART)
class ActorQuant(TypedDict, total=False):
    """A summary's ``actor_quant``: how the actors' network was quantized
    (:func:`quarl.actorq.actor_precisions.actor_quant`)."""

    precision: str
    wire_bits: int
    """A float precision: the width its weights were sent at."""
    mode: str
    """An int precision: the ONNX Runtime mode the actors ran."""
    fp32_layers: list[int]
    """An int precision: the layers kept in fp32."""


class ActorQRunConfig(Record):
    """The part of a summary's ``config`` that loading the run's policy needs."""

    model_config = ConfigDict(extra="allow")
    algo: str
    env_id: str


class ActorQRunRecord(Record):
    """A summary as the loader of ActorQ policies reads it: its config's algo and env (a
    run of any quarl version; the measurements are left as they are)."""

    model_config = ConfigDict(extra="allow")
    config: ActorQRunConfig

    @field_validator("config", mode="before")
    @classmethod
    def _a_mapping(cls, config: Any) -> Any:
        if not isinstance(config, dict):
            raise ValueError("not an ActorQ summary (no config with algo and env_id)")
        return config


def read_summary_json(path: Path) -> Any:
    """The JSON object of an ActorQ ``summary.json`` (at most :data:`SUMMARY_CAP` bytes)."""
    return parse_json(read_capped(Path(path), SUMMARY_CAP, "an ActorQ summary.json"), path)


@dataclass(frozen=True)
class ActorQSummary:
    """One run. Times in seconds; ``*_ms_per_step`` per env step over all actors."""

    config: ConfigJSON
    """The run's :class:`~quarl.actorq.config.ActorQConfig` as JSON."""
    machine: MachineInfo
    """CPU model, cores, GPU."""
    target_reward: float | None
    reached: bool
    """The running mean of evaluations reached ``target_reward`` within the budget."""
    time_to_reward_s: _Rate | None
    elapsed_s: _Rate
    final_running_mean: _Measured | None
    evals: Sequence[Annotated[Sequence[_Measured], Field(min_length=3, max_length=4)]]
    """[seconds, weight version, mean return, env steps] per evaluation, at the weights'
    snapshot (see :func:`running_means`; runs stored by older quarl versions lack the env steps)."""
    env_steps: _Count
    learner_steps: _Count
    env_steps_per_s: _Rate
    learner_steps_per_s: _Rate
    actor_env_steps_per_s: dict[str, _Rate]
    """By actor index."""
    actor_ms_per_step: dict[str, _Rate]
    """Actor time per part: inference, env, pull, deserialize, load."""
    actor_time_share: dict[str, float]
    """Share of the actors' wall time per part, waiting on the rate limiter and Ray's dispatch included."""
    actor_busy_ms_per_step: _Rate
    actor_wall_ms_per_step: _Rate
    """An actor's wall time per step when not held by the rate limiter (Ray's dispatch included)."""
    evaluator_busy_s: _Rate | None
    coordinator_ms_per_step: _Rate
    """The coordinator's CPU beyond learner steps (receiving chunks, replay, logging)."""
    learner_ms_per_step: _Rate
    env_steps_at_target: _Count | None
    learner_time_share: dict[str, float]
    """``learning`` and ``waiting`` shares of the run's wall time."""
    learner_busy_s: _Rate
    weight_versions: _Count
    pulls: _Count
    loads: _Count
    """Pulls that installed new weights (a pull of an unchanged version loads nothing)."""
    restarts: _Count
    actor_nodes: dict[str, str | list[str]]
    """Ray nodes each actor index ran on, in order (``local`` in process; a single node in
    runs of quarl before restarts were followed)."""
    episodes: _Count
    broadcast: dict[str, float]
    """The last broadcast: bytes, build seconds, version."""
    energy: Energy
    """codecarbon's measurement or estimate (``available``, ``energy_kwh``, ``co2_kg``, ``method``)."""
    actor_quant: ActorQuant = field(default_factory=lambda: ActorQuant())
    """How the actors' network was quantized (part of what a stored run is; absent before quarl 0.x stored it)."""
    provenance: Provenance | None = None
    """The software and machine that made it (:func:`quarl.core.provenance.provenance`); None
    in a summary stored without a whole one (written as ``{}``, as quarl wrote a missing one)."""
    machine_busy_cores: _Rate | None = None
    """Cores the driver's machine kept busy on average (every process on it: Ray's daemons
    and the OS too); None in runs of quarl before it was recorded."""
    steady_env_steps_per_s: _Rate | None = None
    """Env steps per second once every actor had returned its first chunk (worker start-up,
    env creation and the first weight pull left out); None for a run too short to tell, or
    stored by a quarl before it was measured. ``env_steps_per_s`` counts from the start."""
    mismatch: dict[str, _Measured] | None = None
    """impala: the actors' policy mu against the learner's pi on the states the actors met,
    averaged over learner steps: ``kl`` (KL(mu || pi) per state), ``rho_mean``, ``rho_std``
    and ``rho_clipped`` (the importance ratios pi / mu and the share above rho-bar), and
    ``policy_lag`` (the learner's weight version minus the one the actors acted with)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``summary.json`` holds."""
        data = dataclasses.asdict(self)
        if self.provenance is None:
            data["provenance"] = {}
        return data

    @property
    def actor_precision(self) -> str:
        return str(self.config["actor_precision"])

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "summary") -> ActorQSummary:
        """A summary from its JSON object, checked as an :data:`ActorQSummaryRecord`
        (one line naming ``where`` and the field); the values are kept as stored."""
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise QuarlError(f"{where} is not an ActorQ summary.json")
        missing = sorted(required - set(data))
        if missing:
            raise QuarlError(f"{where} lacks {', '.join(missing[:4])}: it was written by an older quarl; rerun it")
        known = {k: v for k, v in data.items() if k in names}  # fields of other quarl versions are left out
        parse_record(ActorQSummaryRecord, known, where)
        if "provenance" in known:
            known["provenance"] = whole_provenance(known["provenance"])
        return cls(**known)

    @classmethod
    def read(cls, path: Path) -> ActorQSummary:
        try:
            data = read_summary_json(path)  # not JSON: one line naming the file
        except OSError:
            raise QuarlError(f"{path} is not an ActorQ summary.json") from None
        return cls.from_json(data, str(path))

    def write(self, path: Path) -> None:
        from quarl.core.atomic import write_atomic

        write_atomic(Path(path), json.dumps(self.to_json(), indent=1))


_JSON_OBJECT = dict[str, _Measured | JsonValue]
"""A JSON object as stored (an old config's non-finite number included)."""
ActorQSummaryRecord = record_of("ActorQSummaryRecord", ActorQSummary, base=Record, names={"ConfigJSON": _JSON_OBJECT},
                                types={"config": _JSON_OBJECT, "provenance": _JSON_OBJECT,
                                       "broadcast": dict[str, float | None]})  # a build time not measured: null
"""``summary.json`` as read back: :class:`ActorQSummary`'s fields, typed and checked as its
annotations say (counts whole and non-negative, times and rates finite and non-negative,
returns as measured); its config and provenance any JSON object (a provenance that is not
a whole :class:`Provenance` is read as None). Made from the dataclass: one definition."""
