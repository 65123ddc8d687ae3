"""The study's results store: one SQLite row per evaluated cell (:class:`StudyRecord`),
committed as soon as the cell finishes, so a killed study loses at most the cells in flight.
Imports nothing heavy: a report reads a store without loading an evaluator."""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_json, parse_record, record_of
from quarl.core.provenance import Provenance, StoredProvenance
from quarl.core.records import disagreement
from quarl.evaluation.record import AS_STORED, EvalRecord, RowView, columns_of

log = logging.getLogger("quarl")

BUSY_TIMEOUT_S = 120.0
"""How long a write waits for a store another process holds before it fails."""

@dataclass(frozen=True)
class StudyKey:
    """What identifies a study cell (a planned one, :class:`quarl.study.grid.StudyCell`, and a
    stored one, :class:`StudyRecord`): the same key is never evaluated twice."""

    checkpoint: str
    policy_sha256: str
    """The policy's content (``Policy.fingerprint``)."""
    precision: str
    config_key: str
    """Hash of the quantization config as run, and the result format."""
    seed: int
    episodes: Annotated[int, Field(ge=0)]
    max_steps: Annotated[int, Field(ge=0)]
    """0: the env's own limit."""

    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in KEY)


KEY = tuple(f.name for f in fields(StudyKey))
"""The key's columns, in order."""


@dataclass(frozen=True)
class StudyRecord(StudyKey, RowView):
    """One study cell as its row holds it: the cell's key (:class:`StudyKey`), whose policy it is,
    what was measured, where and when. Read it by attribute (``record.result.mean``); it also
    reads as its row (``record["mean"]``), as the tables take it. Its row's columns and the
    check of a row read back (:data:`StudyRow`) are made from these fields."""

    policy: str
    """``"algo env"``, the table's label."""
    algo: str
    result: EvalRecord
    wall_s: Annotated[float, Field(ge=0)] | None
    host: str | None
    provenance: Provenance | StoredProvenance | None
    """JSON: package versions, CPU model and flags."""
    finished_at: str
    """UTC, ISO 8601 to the second."""

    @cached_property
    def _row(self) -> dict[str, Any]:
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:  # JSON (SQLite): the row
        """The row as a dict, in the table's column order (the result's fields in its place)."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: w for k, v in row.items() for k, w in (self.result.to_dict().items() if k == "result" else [(k, v)])}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> StudyRecord:  # JSON (SQLite): a row checked as a StudyRow
        own = {f.name: row[f.name] for f in fields(cls) if f.name != "result"}  # a row holds every column
        return cls(**own, result=EvalRecord.from_dict(row))


StudyRow = record_of("StudyRow", StudyRecord, base=Record, flatten={"result": EvalRecord},
                     types={"provenance": StoredProvenance | None}, names=AS_STORED)
"""A row as the store reads it back (its JSON columns parsed), checked before it becomes a
:class:`StudyRecord`: made from its fields (the result's laid flat)."""

_COLUMNS = {name: column.sql for name, column in columns_of(StudyRecord, {"result": EvalRecord}).items()}
_JSON = tuple(name for name, column in columns_of(StudyRecord, {"result": EvalRecord}).items() if column.json)
TABLE = "cells_v2"
"""Versioned with the key: a store written by an older quarl keeps its old table, unread."""


FULL_BELOW = 1 << 20
"""Free bytes under which a failed SQLite write is said to be a full disk (SQLite reports
SQLITE_FULL for its database and WAL, but a disk I/O error for its shared-memory file)."""


def _disk_full(exc: sqlite3.DatabaseError, folder: Path) -> str | None:
    """``the disk is full (N KB free)`` where ``exc`` is SQLite running out of space, else None."""
    import shutil

    name = str(getattr(exc, "sqlite_errorname", ""))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if name == "SQLITE_FULL" or (name.startswith("SQLITE_IOERR") and free < FULL_BELOW):
        return f"the disk is full ({free // 1024:,} KB free)"
    return None


class StudyStore:
    """``results`` table of a study database (created on first use)."""

    def __init__(self, path: Path) -> None:
        from quarl.core.atomic import check_owned

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for own in (self.path, *(Path(f"{self.path}{suffix}") for suffix in ("-wal", "-shm", "-journal"))):
            check_owned(own)  # SQLite follows a link: it would write another database (or file) than the study's
        if self.path.exists() and not self.path.is_file():
            raise QuarlError(f"{self.path} is not a regular file: refused as a study store")
        new = not self.path.exists()
        try:
            # a store another study holds is waited for (bounded), never given up on with a computed cell in hand
            self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
            self.db.execute("PRAGMA journal_mode=WAL")  # readers (a report) never block the writer
            columns = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS.items())
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} ({columns}, PRIMARY KEY ({', '.join(KEY)}))")
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({TABLE})")}
            missing = [name for name, kind in _COLUMNS.items() if name not in have and "NOT NULL" in kind]
            if missing:  # a table of this name that another program (or a hand) made
                self.db.close()
                raise QuarlError(f"{self.path} holds a {TABLE} table of another schema (no column {missing[0]}): not "
                                 "a quarl study store; pass another --out")
            for name, kind in _COLUMNS.items():  # a store from an earlier quarl gains the newer nullable columns
                if name not in have and "NOT NULL" not in kind:
                    self.db.execute(f"ALTER TABLE {TABLE} ADD COLUMN {name} {kind}")
            self.db.commit()
            self.db.execute("BEGIN IMMEDIATE")  # can this run write here? asked before any cell is computed
            # a write that changes nothing: a store opened read-only (a 0444 file) fails here, not at the first cell
            try:
                self.db.execute(f"DELETE FROM {TABLE} WHERE 0")
            finally:
                self.db.rollback()
        except sqlite3.DatabaseError as exc:
            full = _disk_full(exc, self.path.parent)
            if new:  # a store this call began holds nothing: none of it is left behind
                if hasattr(self, "db"):
                    self.db.close()
                for leftover in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                    leftover.unlink(missing_ok=True)
            if full:
                raise QuarlError(f"{self.path} cannot be written as a study store: {full}; refused before computing "
                                 "anything: free space or pass another --out") from None
            if not isinstance(exc, sqlite3.OperationalError):  # "file is not a database", "... is malformed"
                raise QuarlError(f"{self.path} is not a SQLite study store, or a corrupt one ({exc}): refused before "
                                 "computing anything; move it away or pass another --out") from None
            raise QuarlError(f"{self.path} cannot be written as a study store ({exc}): refused before computing "
                             "anything; fix its permissions or pass another --out") from None

    def done(self) -> set[tuple[Any, ...]]:
        """Keys of the cells already stored whose mean and std are those of their own finite
        returns (:func:`quarl.core.records.disagreement`): any other row is evaluated again and
        replaced, never reused as it is."""
        measured = ("mean", "std", "returns", "lengths")
        try:
            rows = self.db.execute(f"SELECT rowid, {', '.join(KEY)}, {', '.join(measured)} FROM {TABLE}").fetchall()
        except sqlite3.DatabaseError as exc:
            raise QuarlError(f"{self.path} cannot be read as a study store ({exc}): move it away or pass another "
                             "--out") from None
        keys = set()
        for rowid, *values in rows:
            key, fields = tuple(values[:len(KEY)]), dict(zip(measured, values[len(KEY):], strict=True))
            try:
                for name in ("returns", "lengths"):
                    fields[name] = json.loads(fields[name]) if isinstance(fields[name], (str, bytes)) else None
            except (ValueError, RecursionError):
                fields["returns"] = None
            why = disagreement(fields)
            if why:
                log.warning("%s (%s row %d): %s: evaluated again", self.path, TABLE, rowid, why)
                continue
            keys.add(key)
        return keys

    def insert(self, record: StudyRecord) -> None:
        fields = record.to_dict()
        row = {k: json.dumps(fields[k]) if k in _JSON else fields[k] for k in _COLUMNS}
        names = ", ".join(row)
        try:
            with self.db:  # one transaction per cell: committed when it returns
                self.db.execute(f"INSERT OR REPLACE INTO {TABLE} ({names}) VALUES ({', '.join('?' * len(row))})",
                                list(row.values()))
        except sqlite3.DatabaseError as exc:  # a full disk, or a store damaged or made read-only while the study ran
            full = _disk_full(exc, self.path.parent)
            if full:  # SQLite rolled the cell back: the store is as it was before it
                raise QuarlError(f"{self.path} cannot store the cell: {full}; the cells stored before it are kept: "
                                 "free space and run the study again to continue from them") from None
            raise QuarlError(f"{self.path} cannot store the cell ({exc}): the cells stored before it are kept; fix "
                             "the store or pass another --out") from None

    def records(self) -> list[StudyRecord]:
        """Every row, oldest first, each checked as a :class:`StudyRow` (one line naming the
        store, the row and the column when one does not fit)."""
        try:
            stored = self.db.execute(f"SELECT rowid, {', '.join(_COLUMNS)} FROM {TABLE} ORDER BY rowid").fetchall()
        except sqlite3.DatabaseError as exc:
            raise QuarlError(f"{self.path} cannot be read as a study store ({exc}): move it away or pass another "
                             "--out") from None
        out = []
        for rowid, *values in stored:
            row = dict(zip(_COLUMNS, values, strict=True))
            where = f"{self.path} ({TABLE} row {rowid})"
            for k in _JSON:
                if row[k] is None:  # a column an older quarl's store gained after this row: absent
                    continue
                if not isinstance(row[k], (str, bytes)):
                    raise QuarlError(f"{where}: field {k}: a JSON column holds {type(row[k]).__name__} {row[k]!r}")
                row[k] = parse_json(row[k], f"{where} column {k}")
            parse_record(StudyRow, row, where)
            why = disagreement(row)
            if why:  # never shown as it is: the next run of the study evaluates it again
                log.warning("%s: %s: left out", where, why)
                continue
            out.append(StudyRecord.from_dict(row))
        return out

    def close(self) -> None:
        self.db.close()
