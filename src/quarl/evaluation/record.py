"""What one evaluation measured (:class:`EvalRecord`) and a ptq / sweep cell's record
(:class:`CellRecord`): one definition for ``results.jsonl``, the study's SQLite columns and
the tables. Records stay typed between modules and become dicts only where a file is
written (``to_dict``) or read back (``from_dict``).

Imports nothing heavy (no torch, gymnasium, ONNX Runtime or numpy): the study store and
the reports read records without loading an evaluator.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, TypedDict

from pydantic import ConfigDict, Field

from quarl.core.file_schema import Record, record_of
from quarl.core.provenance import Provenance, StoredProvenance

if TYPE_CHECKING:  # the schema imports nothing heavy: these modules import torch and gymnasium
    from quarl.envs import EnvJson
    from quarl.quant.summary import QuantSummary
    from quarl.quantization.config import QuantConfigJson

RESULT_FORMAT = 14
"""Part of every stored cell's key: bumped when the same command would store a different number
or meaning for the same cell, so finished cells of an older format are evaluated anew
(CONTRIBUTING, "When to bump the result format"; CHANGELOG.md lists each format's change)."""


Measured = Annotated[float, Field(allow_inf_nan=True)]
"""A return as measured: an env's rewards may be infinite (read back as they were written)."""
Cost = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


@dataclass(frozen=True)
class EvalRecord:
    """What evaluating one policy at one precision measured. ``ptq`` / ``sweep`` append it
    (with its key) to ``results.jsonl``, the study stores it as SQLite columns
    (:func:`sql_columns`), the tables read it."""

    env_id: str
    mean: Measured
    std: Measured
    returns: list[Measured]
    """Per-episode returns (rounded to 4 digits), episode i reset with seed ``seed + i``."""
    lengths: list[Count]
    quant: QuantSummary | None
    """A real int cell's mode, fp32 layers, agreement with fp32 and every mode tried."""
    steps_per_s: Cost | None
    latency_us: Cost | None
    """Batch-1 engine call, rough (``quarl bench`` measures properly)."""
    model_bytes: Count | None
    build_s: Cost | None
    """Seconds to quantize (calibration and the automatic mode choice included)."""
    endings: list[str] | None = None
    """Per episode, a digest of how it ended (:func:`quarl.evaluation.episodes.ending`): equal digests
    are replays of one game (older records have none)."""
    acting: str | None = None
    """``sampled`` (the policy drew its actions, :func:`quarl.evaluation.episodes.acting`) or
    ``greedy`` (older records have none: greedy)."""
    sticky_actions: Annotated[float, Field(ge=0, lt=1)] | None = None
    """The env's sticky-action probability where one was set (:func:`quarl.envs.with_sticky_actions`)."""

    def to_dict(self) -> dict[str, Any]:  # JSON: a results.jsonl line's measured fields, a study row's columns
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> EvalRecord:
        """The measured fields of a record read back from a file (other keys are ignored;
        fields an older record lacks take their defaults)."""
        return cls(**{f.name: stored[f.name] for f in dataclasses.fields(cls) if f.name in stored})


AS_STORED = {"QuantSummary": dict[str, Any]}
""":class:`EvalRecord`'s annotation names as a file holds them (a TypedDict is a JSON object):
the records made from it import nothing heavy to resolve them."""


class _CellLine(Record):
    """What a ``results.jsonl`` line holds besides the measurements: whose policy it is, its provenance."""

    model_config = ConfigDict(extra="allow")  # the cell's key and identity, matched by equality
    algo: str | None = None
    checkpoint: str | None = None
    provenance: StoredProvenance | None = None


StoredCell = record_of("StoredCell", EvalRecord, base=_CellLine, names=AS_STORED)
"""A ``results.jsonl`` line as read back: the cell's key fields (any, matched by equality), whose
policy it is and its provenance, and what was measured: :class:`EvalRecord`'s fields, typed and
checked as its annotations say (made from it: one definition)."""


_SQL_TYPES: dict[type, str] = {str: "TEXT", float: "REAL", int: "INTEGER"}
"""SQLite type of a field's base type; any other (a list, a dict, a TypedDict, a record) is
stored as JSON text."""


@dataclass(frozen=True)
class Column:
    """A SQLite column made from a record's field."""

    sql: str
    """Its type, ``NOT NULL`` unless the field may be None."""
    json: bool
    """Stored as JSON text (a list, a dict, a record)."""


def columns_of(shape: type, flatten: Mapping[str, type] | None = None) -> dict[str, Column]:
    """The SQLite columns of the dataclass ``shape``'s fields, in order, from their resolved
    annotations (a field named in ``flatten`` stands for that dataclass's columns)."""
    columns = {}
    hints = typing.get_type_hints(shape, localns=AS_STORED)
    for f in dataclasses.fields(shape):
        if f.name in (flatten or {}):
            columns.update(columns_of((flatten or {})[f.name]))
            continue
        hint = hints[f.name]
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        kinds = {_SQL_TYPES.get(typing.get_origin(a) or a, "JSON") for a in args if a is not type(None)}
        (kind,) = kinds  # one kind of column per field
        columns[f.name] = Column(("TEXT" if kind == "JSON" else kind) + ("" if type(None) in args else " NOT NULL"),
                                 kind == "JSON")
    return columns


def sql_columns() -> dict[str, str]:
    """SQLite column types of :class:`EvalRecord`'s fields (lists and dicts as JSON text;
    a field that may be None is a nullable column)."""
    return {name: column.sql for name, column in columns_of(EvalRecord).items()}


def json_fields() -> tuple[str, ...]:
    """:class:`EvalRecord` fields stored as JSON text."""
    return tuple(name for name, column in columns_of(EvalRecord).items() if column.json)


class SettingsKey(TypedDict):
    """The evaluation settings a stored cell was played with (``EvalSettings.key``)."""

    episodes: int
    seed: int
    max_steps: int | None


class KeyExtras(TypedDict, total=False):
    """Fields a sweep or the QAT study adds to its cells' keys (``Cell.extra``)."""

    bits: int
    scheme: str
    granularity: str
    activations: bool
    method: str
    """The QAT study's column: ``fp32``, ``ptq``, ``ptq_act`` or ``qat``."""
    real_int8: bool
    timesteps: int
    quant_delay: int
    train_seed: int


class CellKey(KeyExtras, SettingsKey):
    """What a stored ptq / sweep record must match to be reused
    (:func:`quarl.evaluation.cells.cell_key`), as it reads back from JSON."""

    precision: str
    policy_sha256: str
    config: QuantConfigJson
    env: EnvJson
    format: int
    runtime: NotRequired[dict[str, str]]
    """A real int cell's runtime and CPU."""


class RowView(Mapping[str, Any]):
    """A typed record that also reads as the row its file holds (``record["mean"]``), which is
    what the tables take, from this run or from a file alike: ``_row``, built once."""

    @cached_property
    def _row(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        return self._row[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)


@dataclass(frozen=True)
class CellRecord(RowView):
    """One ptq / sweep / QAT-study cell: its key (what a stored record must match to be
    reused, :func:`quarl.evaluation.cells.cell_key`), whose policy it is, what was measured and where.
    ``reused``: read back from ``results.jsonl`` instead of evaluated (never written).

    Read it by attribute (``record.result.mean``, ``record.precision``); it also reads as
    the row ``results.jsonl`` holds (``record["mean"]``, with ``"reused": True`` on a reused
    one), which is what the tables take, from this run or from a file alike."""

    key: CellKey
    algo: str
    checkpoint: str | None
    """The policy's path as given (not part of the key: a moved file is the same policy)."""
    result: EvalRecord
    provenance: Provenance | StoredProvenance | None
    """Package versions, CPU model and flags of the run that measured it (a reused record's as
    stored; None where it holds none)."""
    reused: bool = False

    @property
    def precision(self) -> str:
        return str(self.key["precision"])

    @property
    def episodes(self) -> int:
        """Episodes played (deciding may have joined more than the key's first ones)."""
        return len(self.result.returns)

    @cached_property
    def _row(self) -> dict[str, Any]:
        """:meth:`to_dict` with ``"reused": True`` on a reused record (never written)."""
        return {**self.to_dict(), "reused": True} if self.reused else self.to_dict()

    def joined(self, more: CellRecord) -> CellRecord:
        """This cell's episodes followed by ``more``'s (the next seeds): one record, whose
        mean and std are over both (``decide``: a verdict played on)."""
        import numpy as np  # here: the schema itself imports nothing heavy

        first, then = self.result, more.result
        returns = [*first.returns, *then.returns]
        endings = None if first.endings is None or then.endings is None else [*first.endings, *then.endings]
        result = dataclasses.replace(first, returns=returns, lengths=[*first.lengths, *then.lengths], endings=endings,
                                     mean=float(np.mean(returns)), std=float(np.std(returns)))
        return dataclasses.replace(self, key={**self.key, "episodes": len(returns)}, result=result)

    def to_dict(self) -> dict[str, Any]:  # JSON: the results.jsonl line
        """The line ``results.jsonl`` holds: key, identity, measurements, provenance (in
        that order, as every quarl since format 2 wrote it)."""
        return {**self.key, "algo": self.algo, "checkpoint": self.checkpoint, **self.result.to_dict(),
                "provenance": self.provenance}

    @classmethod
    def from_stored(cls, key: CellKey, stored: Mapping[str, Any], algo: str, checkpoint: str | None) -> CellRecord:
        """A record read back from ``results.jsonl`` (checked as a
        :class:`StoredCell`) whose fields matched ``key``, with this run's
        identity (``algo``, ``checkpoint``)."""
        return cls(key, algo, checkpoint, EvalRecord.from_dict(stored), stored.get("provenance") or None, reused=True)

