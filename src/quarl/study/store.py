"""The study's results store: one SQLite row per evaluated cell, committed as soon as
the cell finishes, so a killed study loses at most the cells in flight."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from quarl.errors import QuarlError
from quarl.measure import json_fields, sql_columns

BUSY_TIMEOUT_S = 120.0
"""How long a write waits for a store another process holds before it fails."""

KEY = ("checkpoint", "policy_sha256", "precision", "config_key", "seed", "episodes", "max_steps")
"""What identifies a cell: the same key is never evaluated twice."""

_COLUMNS = {
    "checkpoint": "TEXT NOT NULL",
    "policy_sha256": "TEXT NOT NULL",  # the policy's content (Policy.fingerprint)
    "precision": "TEXT NOT NULL",
    "config_key": "TEXT NOT NULL",  # the quantization config as run, and the result format
    "seed": "INTEGER NOT NULL",
    "episodes": "INTEGER NOT NULL",
    "max_steps": "INTEGER NOT NULL",  # 0: the env's own limit
    "policy": "TEXT NOT NULL",
    "algo": "TEXT NOT NULL",
    **sql_columns(),  # what the evaluation measured: quarl.measure.EvalRecord, one definition
    "wall_s": "REAL",
    "host": "TEXT",
    "provenance": "TEXT",  # JSON: package versions, CPU model and flags
    "finished_at": "TEXT NOT NULL",
}
_JSON = (*json_fields(), "provenance")
TABLE = "cells_v2"
"""Versioned with the key: a store written by an older quarl keeps its old table, unread."""


class StudyStore:
    """``results`` table of a study database (created on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and not self.path.is_file():
            raise QuarlError(f"{self.path} is not a regular file: refused as a study store")
        try:
            # a store another study holds is waited for (bounded), never given up on with a computed cell in hand
            self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
            self.db.execute("PRAGMA journal_mode=WAL")  # readers (a report) never block the writer
            columns = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS.items())
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} ({columns}, PRIMARY KEY ({', '.join(KEY)}))")
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({TABLE})")}
            for name, kind in _COLUMNS.items():  # a store from an earlier quarl gains the newer nullable columns
                if name not in have and "NOT NULL" not in kind:
                    self.db.execute(f"ALTER TABLE {TABLE} ADD COLUMN {name} {kind}")
            self.db.commit()
            self.db.execute("BEGIN IMMEDIATE")  # can this run write here? asked before any cell is computed
            self.db.rollback()
        except sqlite3.DatabaseError as exc:
            raise QuarlError(f"{self.path} cannot be written as a study store ({exc}): refused before computing "
                             "anything; fix its permissions or pass another --out") from None

    def done(self) -> set[tuple]:
        """Keys of the cells already stored."""
        return set(self.db.execute(f"SELECT {', '.join(KEY)} FROM {TABLE}").fetchall())

    def insert(self, record: dict[str, Any]) -> None:
        row = {k: json.dumps(record.get(k)) if k in _JSON else record.get(k) for k in _COLUMNS}
        names = ", ".join(row)
        with self.db:  # one transaction per cell: committed when it returns
            self.db.execute(f"INSERT OR REPLACE INTO {TABLE} ({names}) VALUES ({', '.join('?' * len(row))})",
                            list(row.values()))

    def records(self) -> list[dict[str, Any]]:
        cursor = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} ORDER BY rowid")
        out = []
        for values in cursor.fetchall():
            record = dict(zip(_COLUMNS, values))
            for k in _JSON:
                record[k] = json.loads(record[k])
            out.append(record)
        return out

    def close(self) -> None:
        self.db.close()
