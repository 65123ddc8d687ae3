"""Results written as they are computed, one JSON object per line, so a long run that is
killed loses at most the cell it was in and resumes where it stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from quarl.file_schema import Record, parse_record

RESULTS_CAP = 256 << 20
"""A results log of 256 MB holds ~50,000 records of 1,000 episodes: more is not one of quarl's."""


_Measured = Annotated[float, Field(allow_inf_nan=True)]
"""A return as measured: an env's rewards may be infinite (read back as they were written)."""
_Cost = Annotated[float, Field(ge=0)]


class EvalFields(Record):
    """What one evaluation measured, as a file holds it (:class:`quarl.eval_record.EvalRecord`'s
    fields, typed): a ``results.jsonl`` line and a study store's row are checked with it."""

    model_config = ConfigDict(extra="allow")  # the cell's key and identity, matched by equality
    env_id: str
    mean: _Measured
    std: _Measured
    returns: list[_Measured]
    lengths: list[Annotated[int, Field(ge=0)]]
    quant: dict[str, Any] | None
    steps_per_s: _Cost | None
    latency_us: _Cost | None
    model_bytes: Annotated[int, Field(ge=0)] | None
    build_s: _Cost | None
    endings: list[str] | None = None
    acting: str | None = None
    sticky_actions: Annotated[float, Field(ge=0, lt=1)] | None = None


class StoredCell(EvalFields):
    """A ``results.jsonl`` line: the cell's key fields (any, matched by equality), whose policy
    it is, what was measured (:class:`EvalFields`) and the provenance."""

    algo: str | None = None
    checkpoint: str | None = None
    provenance: dict[str, Any] | None = None


class ResultsLog:
    """Append-only JSON-lines file of records (dicts)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> list[dict[str, Any]]:
        return [record for _, record in self._records()]

    def _records(self) -> list[tuple[int, dict[str, Any]]]:
        """(line number, record) of each line that holds a JSON object."""
        from quarl.limits import read_capped  # imports numpy and torch: the study store imports this module

        if not self.path.exists():
            return []
        records = []
        text = read_capped(self.path, RESULTS_CAP, "a results log").decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # a line cut short by a kill: recompute that cell
                continue
            if isinstance(record, dict):  # a line that is no record (edited by hand) is no cell either
                records.append((number, record))
        return records

    def find(self, **key: Any) -> dict[str, Any] | None:
        """The last record whose fields equal ``key``, checked as a :class:`StoredCell` (one
        line naming the file, the line and the field when it does not fit; it is returned
        as stored)."""
        for number, record in reversed(self._records()):
            if all(record.get(k) == v for k, v in key.items()):
                parse_record(StoredCell, record, f"{self.path} line {number}")
                return record
        return None

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=_plain) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
