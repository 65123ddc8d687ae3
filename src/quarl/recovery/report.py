"""What recovery writes to its files, typed: ``recovery.json`` (:class:`RecoveryJson`, the
judge's tests and the stages' report in it), a DAgger round (:class:`RoundStats`, which
both files hold as its dict, :data:`RoundJson`) and the state after each round
(:class:`RecoveryState`).

These are JSON objects (and, for the state, the plain containers ``torch.save`` writes), so
they are TypedDicts: the dicts that are written are the dicts that are passed around, and
``quarl.recover`` / ``run_recover`` return :class:`RecoveryJson` as the dict recovery.json
holds. Each file is defined once, here: its TypedDict carries the checks a file read back
must pass (field constraints, literals, and the checks across fields as validators on the
annotations), and pydantic validates the TypedDict itself (:data:`RecoveryFile` for
:func:`quarl.recovery.folder.read_recovery_record`, :data:`StateFile` for
:func:`quarl.recovery.dagger.read_state`), so a field added to one is added to what is
written, read and checked. A round is defined once, as the dataclass :class:`RoundStats`
(its fields' checks in their annotations): the files hold its dict (:meth:`RoundStats.to_dict`),
and pydantic checks a round read back as a :class:`RoundStats`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, NotRequired

import torch
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    JsonValue,
    RootModel,
    Strict,
    StrictBool,
    StrictFloat,
    StrictStr,
    StringConstraints,
    with_config,
)
from typing_extensions import TypedDict  # pydantic validates only typing_extensions' TypedDict on Python 3.11

from quarl.core.provenance import Provenance
from quarl.envs import EnvJson
from quarl.quant.student import KernelSpecJson
from quarl.quant.summary import QuantSummary

FILE_CHECKS = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
"""What :class:`quarl.core.file_schema.Record` asks of a record read from a file: strict
types, finite numbers, no field the writer never writes."""

MAX_COUNT = 10**12
"""A count in recover's files (states, updates) at most: 10^12 is beyond any run, and a
count past it (10**400 read back from a crafted file) is no count to print or add to."""
# strict in themselves (as FILE_CHECKS asks), so a record whose own config must admit a dict (RoundStats) keeps them so
Count = Annotated[int, Field(ge=0, le=MAX_COUNT), Strict()]
Share = Annotated[float, Field(ge=0, le=1), Strict()]
Seconds = Annotated[float, Field(ge=0, le=1e9), Strict()]
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]
"""A seed an episode was played on (numpy and gymnasium take 32 bits)."""
RoundNumber = Annotated[int, Field(ge=0, le=1000), Strict()]
"""A round played (a run plays at most 1000: ``max_rounds``' bound)."""
AnyReturn = Annotated[float, Field(allow_inf_nan=True), Strict()]
"""A mean return: may be infinite or NaN (an env's own reward), never refused."""
JsonObject = dict[str, JsonValue]
"""Another object's JSON form recorded as it was (the options): any JSON values, nothing else."""

# what the CLI prints again when a finished recovery is reused: finite and printable
Tally = Count
Duration = Annotated[float, Field(ge=0, le=1e9)]
Number = Annotated[float, Field(ge=-1e12, le=1e12)]
"""A percentage or a mean return in recovery.json's report: finite and printable (1e308 is
neither a return nor an E)."""
Text = Annotated[str, StringConstraints(max_length=2000)]
RoundIndex = Annotated[int, Field(ge=-1, le=1000)]
"""A round of the run (-1: none, PTQ's own model)."""
Sha256 = Annotated[str, StringConstraints(pattern="^[0-9a-f]{64}$")]


class TestOutcome(TypedDict):
    """A paired sequential test as recovery.json records it (:func:`quarl.recovery.judge._outcome`):
    E and its interval in percent, the two means over the episodes it played; only
    ``verdict`` (and ``kept``, ``same``) where no test ran."""

    verdict: Text
    kept: NotRequired[bool]
    same: NotRequired[bool]
    e: NotRequired[Number | None]
    low: NotRequired[Number | None]
    high: NotRequired[Number | None]
    episodes: NotRequired[Tally]
    seeds: NotRequired[list[Seed]]
    means: NotRequired[Annotated[list[Number], Field(min_length=2, max_length=2)]]


def _counted(test: TestOutcome) -> TestOutcome:
    if "means" in test and not test.get("episodes"):
        raise ValueError("means without the episodes they were measured on")
    return test


CheckedTest = Annotated[TestOutcome, AfterValidator(_counted)]
"""A :class:`TestOutcome` whose means come with the episodes they were measured on."""


class StageReport(TypedDict):
    """One stage of :func:`quarl.recovery.workflow.recover_stages` (distill, more rounds, the fine-tune)."""

    stage: Text
    rounds: Tally
    agreement: Share
    against_ptq: CheckedTest
    written: Text
    """``ptq`` or the stage whose student would be written after this stage."""
    against_fp32: CheckedTest
    wall_s: Duration
    steps: NotRequired[Tally]
    """The fine-tune's env steps."""
    mode: NotRequired[Text]
    """The kernel this stage's student runs where it is not the run's (a repair: the mixed
    int4/int8 head, finer blocks)."""
    block_size: NotRequired[Annotated[int, Field(ge=1, le=1 << 20)]]
    """Its block size, beside ``mode``."""


class BudgetReport(TypedDict):
    rounds: Annotated[int, Field(ge=1, le=1000)]
    rounds_played: Annotated[int, Field(ge=0, le=1000)]
    finetune_steps: Tally
    minutes: Duration


def _within(budget: BudgetReport) -> BudgetReport:
    if budget["rounds_played"] > budget["rounds"]:
        raise ValueError(f"{budget['rounds_played']} rounds played of a budget of {budget['rounds']}")
    return budget


FinetuneNote = TypedDict("FinetuneNote", {
    "steps": Tally,
    "skipped": NotRequired[Text],
    "wall_s": NotRequired[Duration | None],
    "from": NotRequired[Literal["ptq", "distilled"]],
})
"""The fine-tune stage: its steps, and why it was skipped or how long it took and what it started from."""


class SizesReport(TypedDict):
    """Bytes of the ONNX models: fp32, PTQ's own model of the run's kernel, the one written."""

    fp32: Count
    ptq: Count
    shipped: Count


class RecoveryReport(TypedDict):
    """What was written and why the run ended, as recovery.json records it
    (:func:`quarl.recovery.workflow.recover_stages`)."""

    shipped: Literal["ptq", "student"]
    shipped_stage: Text | None
    ptq_mode: NotRequired[Text]
    """The run's own kernel, PTQ's (``kernel`` is what was written: the mixed int4/int8 mode
    where that repair was; absent from an older quarl's files: the same)."""
    sizes: NotRequired[SizesReport]
    stopped: Literal["kept", "budget"]
    against_ptq: CheckedTest
    against_fp32: CheckedTest
    stages: list[StageReport]
    budget: Annotated[BudgetReport, AfterValidator(_within)]
    total_s: Duration
    finetune: NotRequired[FinetuneNote]


@with_config(ConfigDict(allow_inf_nan=False, extra="forbid"))  # FILE_CHECKS but admitting a dict: each field is strict
@dataclass
class RoundStats:
    """One DAgger round: the one definition of a round's fields and of what a round read back
    must hold. A state (``history``) and recovery.json (``rounds``) hold its dict
    (:meth:`to_dict`, the fields in this order); pydantic checks a round read from either as
    this dataclass (strict fields, finite numbers, no field it does not declare)."""

    round: RoundNumber
    states: Count
    """States in the aggregated set after this round."""
    new_states: Count
    loss: StrictFloat
    agreement: Share
    """Held-out agreement of the real kernel built from the student with the teacher."""
    played_return: AnyReturn
    """Mean return of the episodes played this round (the teacher's in round 0)."""
    wall_s: Seconds
    calibration_verdict: StrictStr = ""
    """The calibration test's verdict where the round reached its target ('' where none ran;
    always written, absent from a file only where an older quarl wrote it)."""
    calibration_kept: StrictBool | None = None
    """Whether that test found fp32's return kept (a decided *keeps*, or its point estimate at
    the test's cap); None where none ran, or where a quarl before 0.2 wrote the round."""

    @property
    def kept(self) -> bool:
        """The round kept fp32's return on calibration episodes (an older round: where its
        verdict decided *keeps*)."""
        return self.calibration_verdict == "keeps" if self.calibration_kept is None else self.calibration_kept

    def to_dict(self) -> RoundJson:
        """The round as the files hold it: its fields by name, in order."""
        return dataclasses.asdict(self)


# A round as recovery.json holds it (RoundStats.to_dict): the type checker sees that dict; pydantic checks it as a
# RoundStats (the one definition) and hands back the dict, so a record read back is the record as written.
if TYPE_CHECKING:
    RoundJson = dict[str, int | float | str]
else:
    RoundJson = Annotated[RoundStats, AfterValidator(dataclasses.asdict)]


class OriginalJson(TypedDict):
    path: str
    zip_sha256: str
    policy_sha256: str
    algo: str


class RecoveredJson(TypedDict):
    zip_sha256: str
    onnx_sha256: str
    export: str


@with_config(FILE_CHECKS)
class RecoveryJson(RecoveryReport):
    """``ENV/recovery.json`` of a recovered folder (:func:`quarl.recovery.folder.write_recovered`):
    the report of :func:`quarl.recovery.workflow.recover_stages` (:class:`RecoveryReport`'s
    fields) and what was recovered, from what, how; the one definition of what the file
    holds and of what it must hold to be read back (:data:`RecoveryFile`)."""

    format: Literal[1]
    precision: Literal["int8", "int4"]
    kernel: KernelSpecJson
    original: OriginalJson
    recovered: RecoveredJson
    env: EnvJson
    """The :class:`quarl.envs.EnvSpec` (:meth:`~quarl.envs.EnvSpec.to_json`; compared with
    the run's own)."""
    config: JsonObject
    """The :class:`quarl.recovery.config.RecoverConfig`'s fields (``dataclasses.asdict``;
    compared with the run's own)."""
    automatic_choice: QuantSummary | None
    """The automatic choice's quant record (:func:`quarl.recovery.dagger.pick_spec`), less what it tried."""
    distill_stopped: Literal["target", "budget"]
    best_round: RoundIndex
    """-1: PTQ's own model; one past the last round: the fine-tuned student."""
    target_agreement: Share
    ptq_agreement: Share
    agreement: Share
    labelled_states: Tally
    heldout_states: Tally
    updates: Tally
    wall_s: Duration
    seeds: list[Seed]
    """The first and last distillation seed (none where no episode was played)."""
    rounds: list[RoundJson]
    """Each round's :meth:`RoundStats.to_dict`."""
    provenance: Provenance
    """:func:`quarl.core.provenance.provenance`."""
    files: dict[str, Sha256]
    """SHA-256 of every file of the folder, relative to it (:func:`quarl.recovery.folder.folder_files`)."""
    record_sha256: NotRequired[Sha256]
    """SHA-256 of this record's other fields (:func:`quarl.recovery.folder.record_digest`): an
    edit of recovery.json itself is refused as the manifest refuses one of another file
    (absent from an older quarl's records, which are read as they are)."""


def _consistent(record: RecoveryJson) -> RecoveryJson:
    rounds = record["rounds"]
    if record["shipped"] == "student" and not record["shipped_stage"]:
        raise ValueError("a student shipped without the stage that made it")
    if len(rounds) > record["budget"]["rounds_played"]:
        raise ValueError(f"{len(rounds)} rounds recorded of {record['budget']['rounds_played']} played")
    if [r["round"] for r in rounds] != list(range(len(rounds))):
        raise ValueError("rounds are not numbered 0, 1, ... in order")
    if record["best_round"] > len(rounds):  # a fine-tuned student is the round after the last
        raise ValueError(f"best round {record['best_round']} of {len(rounds)} rounds")
    return record


RecoveryFile = RootModel[Annotated[RecoveryJson, AfterValidator(_consistent)]]
"""recovery.json read back: :class:`RecoveryJson` checked, its report consistent (for
:func:`quarl.core.file_schema.parse_record`)."""


class OptimizerState(TypedDict):
    """``torch.optim.Adam.state_dict()`` as torch writes it: each parameter's moments by its
    index (``step``, ``exp_avg``, ``exp_avg_sq``, tensors), and its groups' settings
    (compared with this run's own by :func:`quarl.recovery.resume.check_resume`)."""

    state: dict[int, dict[str, torch.Tensor]]
    param_groups: list[dict[str, object]]


@with_config(ConfigDict(**FILE_CHECKS, arbitrary_types_allowed=True))
class RecoveryState(TypedDict):
    """``OUT/.recover/state.pt``: the run after a round (:func:`quarl.recovery.dagger._save_state`),
    plain tensors and containers so that it loads with ``weights_only``; the one definition
    of what the file holds and of what it must hold to be read back
    (:func:`quarl.recovery.dagger.read_state`; its tensors' shapes and counts are checked
    against the run it would continue by :func:`quarl.recovery.resume.check_resume`)."""

    format: Literal[1]
    teacher: str
    spec: KernelSpecJson
    """:meth:`quarl.quant.student.KernelSpec.to_dict` (compared with the run's own)."""
    config: JsonObject
    """The :class:`quarl.recovery.config.RecoverConfig`'s fields (compared with the run's own)."""
    student: dict[str, torch.Tensor]
    optimizer: OptimizerState
    states: torch.Tensor
    heldout: torch.Tensor
    history: list[RoundStats]
    """Each round played (written as its :meth:`RoundStats.to_dict`; read back as the round)."""
    best_agreement: float
    best_round: Annotated[int, Field(ge=-1)]
    best_student: dict[str, torch.Tensor]
    updates: Count
    seeds: list[Seed]
    target: float


StateFile = RootModel[RecoveryState]
"""state.pt read back: :class:`RecoveryState` checked (for :func:`quarl.core.file_schema.parse_record`)."""
