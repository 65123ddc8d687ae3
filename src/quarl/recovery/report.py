"""What recovery writes to its files, typed: ``recovery.json`` (:class:`RecoveryJson`, the
judge's tests and the stages' report in it), a DAgger round as both files hold it
(:class:`RoundJson`, and :class:`RoundStats` in memory) and the state after each round
(:class:`RecoveryState`).

These are JSON objects (and, for the state, the plain containers ``torch.save`` writes), so
they are TypedDicts: the dicts that are written are the dicts that are passed around, and
``quarl.recover`` / ``run_recover`` return :class:`RecoveryJson` as the dict recovery.json
holds. A round and the state are each defined once, here: their TypedDicts carry the
checks a file read back must pass (pydantic validates the TypedDict itself:
:func:`quarl.recovery.dagger.read_state`, :class:`quarl.recovery.folder.RecoveryRecord`'s
rounds), so a field added to one is added to what is written, read and checked.
:class:`RoundStats` holds :class:`RoundJson`'s fields as attributes (the same names, types
and order: mypy checks :meth:`RoundStats.to_dict` / :meth:`RoundStats.from_dict` both
ways, ``tests/test_recovery_files.py`` the rest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

import torch
from pydantic import ConfigDict, Field, JsonValue, RootModel, with_config
from typing_extensions import TypedDict  # pydantic validates only typing_extensions' TypedDict on Python 3.11

from quarl.core.provenance import Provenance
from quarl.envs import EnvJson
from quarl.quant.precisions import QuantSummary

FILE_CHECKS = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
"""What :class:`quarl.core.file_schema.Record` asks of a record read from a file: strict
types, finite numbers, no field the writer never writes."""

Count = Annotated[int, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]
Seconds = Annotated[float, Field(ge=0)]
AnyReturn = Annotated[float, Field(allow_inf_nan=True)]
"""A mean return: may be infinite or NaN (an env's own reward), never refused."""
JsonObject = dict[str, JsonValue]
"""Another object's JSON form recorded as it was (the kernel spec, the options): any JSON
values, nothing else."""


class TestOutcome(TypedDict):
    """A paired sequential test as recovery.json records it (:func:`quarl.recovery.judge._outcome`):
    E and its interval in percent, the two means over the episodes it played; only
    ``verdict`` (and ``kept``, ``same``) where no test ran."""

    verdict: str
    kept: NotRequired[bool]
    same: NotRequired[bool]
    e: NotRequired[float | None]
    low: NotRequired[float | None]
    high: NotRequired[float | None]
    episodes: NotRequired[int]
    seeds: NotRequired[list[int]]
    means: NotRequired[list[float]]


class StageReport(TypedDict):
    """One stage of :func:`quarl.recovery.workflow.recover_stages` (distill, more rounds, the fine-tune)."""

    stage: str
    rounds: int
    agreement: float
    against_ptq: TestOutcome
    written: str
    """``ptq`` or the stage whose student would be written after this stage."""
    against_fp32: TestOutcome
    wall_s: float
    steps: NotRequired[int]
    """The fine-tune's env steps."""


class BudgetReport(TypedDict):
    rounds: int
    rounds_played: int
    finetune_steps: int
    minutes: float


FinetuneNote = TypedDict("FinetuneNote", {
    "steps": int,
    "skipped": NotRequired[str],
    "wall_s": NotRequired[float | None],
    "from": NotRequired[Literal["ptq", "distilled"]],
})
"""The fine-tune stage: its steps, and why it was skipped or how long it took and what it started from."""


class RecoveryReport(TypedDict):
    """What was written and why the run ended, as recovery.json records it
    (:func:`quarl.recovery.workflow.recover_stages`)."""

    shipped: Literal["ptq", "student"]
    shipped_stage: str | None
    stopped: Literal["kept", "budget"]
    against_ptq: TestOutcome
    against_fp32: TestOutcome
    stages: list[StageReport]
    budget: BudgetReport
    total_s: float
    finetune: NotRequired[FinetuneNote]


class Shipped(TypedDict):
    """What recovery.json says of a folder written from a bare result (no :class:`RecoveryReport`)."""

    shipped: Literal["ptq", "student"]
    stopped: Literal["kept", "budget"]


@with_config(FILE_CHECKS)
class RoundJson(TypedDict):
    """One DAgger round as a state (``history``) or recovery.json (``rounds``) holds it: the
    one definition of a round's fields and of what a round read back must hold."""

    round: Count
    states: Count
    """States in the aggregated set after this round."""
    new_states: Count
    loss: float
    agreement: Share
    """Held-out agreement of the real kernel built from the student with the teacher."""
    played_return: AnyReturn
    """Mean return of the episodes played this round (the teacher's in round 0)."""
    wall_s: Seconds
    calibration_verdict: NotRequired[str]
    """The calibration test's verdict where the round reached its target ('' where none ran;
    always written)."""


@dataclass
class RoundStats:
    """One round in memory: :class:`RoundJson`'s fields as attributes, in its order with its
    checks (``tests/test_recovery_files.py`` holds the two equal; :meth:`to_dict` and
    :meth:`from_dict` convert, mypy checking every field both ways)."""

    round: Count
    states: Count
    new_states: Count
    loss: float
    agreement: Share
    played_return: AnyReturn
    wall_s: Seconds
    calibration_verdict: str = ""

    def to_dict(self) -> RoundJson:
        return {"round": self.round, "states": self.states, "new_states": self.new_states, "loss": self.loss,
                "agreement": self.agreement, "played_return": self.played_return, "wall_s": self.wall_s,
                "calibration_verdict": self.calibration_verdict}

    @classmethod
    def from_dict(cls, round_: RoundJson) -> RoundStats:
        return cls(**round_)


class OriginalJson(TypedDict):
    path: str
    zip_sha256: str
    policy_sha256: str
    algo: str


class RecoveredJson(TypedDict):
    zip_sha256: str
    onnx_sha256: str
    export: str


class RecoveryJson(TypedDict):
    """``ENV/recovery.json`` of a recovered folder (:func:`quarl.recovery.folder.write_recovered`).
    The report's fields (:class:`RecoveryReport`) are all there where recover_stages ran;
    a folder written from a bare result has ``shipped`` and ``stopped`` only."""

    format: int
    precision: str
    kernel: JsonObject
    """:meth:`quarl.quant.student.KernelSpec.to_dict`."""
    original: OriginalJson
    recovered: RecoveredJson
    env: EnvJson
    """The :class:`quarl.envs.EnvSpec` (:meth:`~quarl.envs.EnvSpec.to_json`)."""
    config: JsonObject
    """The :class:`quarl.recovery.config.RecoverConfig`'s fields (``dataclasses.asdict``)."""
    automatic_choice: QuantSummary | None
    """The automatic choice's quant record (:func:`quarl.recovery.dagger.pick_spec`), less what it tried."""
    shipped: Literal["ptq", "student"]
    shipped_stage: NotRequired[str | None]
    stopped: Literal["kept", "budget"]
    against_ptq: NotRequired[TestOutcome]
    against_fp32: NotRequired[TestOutcome]
    stages: NotRequired[list[StageReport]]
    budget: NotRequired[BudgetReport]
    total_s: NotRequired[float]
    finetune: NotRequired[FinetuneNote]
    distill_stopped: str
    best_round: int
    target_agreement: float
    ptq_agreement: float
    agreement: float
    labelled_states: int
    heldout_states: int
    updates: int
    wall_s: float
    seeds: list[int]
    rounds: list[RoundJson]
    provenance: Provenance
    """:func:`quarl.core.provenance.provenance`."""
    files: dict[str, str]
    """SHA-256 of every file of the folder, relative to it (:func:`quarl.recovery.folder.folder_files`)."""


@with_config(ConfigDict(**FILE_CHECKS, arbitrary_types_allowed=True))
class RecoveryState(TypedDict):
    """``OUT/.recover/state.pt``: the run after a round (:func:`quarl.recovery.dagger._save_state`),
    plain tensors and containers so that it loads with ``weights_only``; the one definition
    of what the file holds and of what it must hold to be read back
    (:func:`quarl.recovery.dagger.read_state`; its tensors' shapes and counts are checked
    against the run it would continue by :func:`quarl.recovery.resume.check_resume`)."""

    format: Literal[1]
    teacher: str
    spec: JsonObject
    """:meth:`quarl.quant.student.KernelSpec.to_dict` (compared with the run's own)."""
    config: JsonObject
    """The :class:`quarl.recovery.config.RecoverConfig`'s fields (compared with the run's own)."""
    student: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    """``torch.optim.Optimizer.state_dict()``, torch's own container of tensors and settings."""
    states: torch.Tensor
    heldout: torch.Tensor
    history: list[RoundJson]
    best_agreement: float
    best_round: Annotated[int, Field(ge=-1)]
    best_student: dict[str, torch.Tensor]
    updates: Count
    seeds: list[int]
    target: float


StateFile = RootModel[RecoveryState]
"""state.pt read back: :class:`RecoveryState` checked (for :func:`quarl.core.file_schema.parse_record`)."""
