"""What recovery writes to its files, typed: ``recovery.json`` (:class:`RecoveryJson`, the
judge's tests and the stages' report in it) and the state after each round (:class:`RecoveryState`).

These are JSON objects (and, for the state, the plain containers ``torch.save`` writes), so
they are TypedDicts: the dicts that are written are the dicts that are passed around, and
``quarl.recover`` / ``run_recover`` return :class:`RecoveryJson` as the dict recovery.json
holds. Read back, they are checked first (:class:`quarl.recovery.folder.RecoveryRecord`,
:class:`quarl.recovery.dagger.RecoveryStateRecord`)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

import torch


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


class RoundJson(TypedDict):
    """One :class:`quarl.recovery.dagger.RoundStats` as a state or recovery.json holds it."""

    round: int
    states: int
    new_states: int
    loss: float
    agreement: float
    played_return: float
    wall_s: float
    calibration_verdict: str


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
    kernel: dict[str, Any]
    """:meth:`quarl.quant.student.KernelSpec.to_dict`."""
    original: OriginalJson
    recovered: RecoveredJson
    env: dict[str, Any]
    """The :class:`quarl.envs.EnvSpec`'s fields (``dataclasses.asdict``)."""
    config: dict[str, Any]
    """The :class:`quarl.recovery.config.RecoverConfig`'s fields (``dataclasses.asdict``)."""
    automatic_choice: dict[str, Any] | None
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
    provenance: dict[str, Any]
    """:func:`quarl.core.provenance.provenance`."""
    files: dict[str, str]
    """SHA-256 of every file of the folder, relative to it (:func:`quarl.recovery.folder.folder_files`)."""


class RecoveryState(TypedDict):
    """``OUT/.recover/state.pt``: the run after a round (:func:`quarl.recovery.dagger._save_state`),
    plain tensors and containers so that it loads with ``weights_only``."""

    format: int
    teacher: str
    spec: dict[str, Any]
    config: dict[str, Any]
    student: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    """``torch.optim.Optimizer.state_dict()``."""
    states: torch.Tensor
    heldout: torch.Tensor
    history: list[RoundJson]
    best_agreement: float
    best_round: int
    best_student: dict[str, torch.Tensor]
    updates: int
    seeds: list[int]
    target: float
