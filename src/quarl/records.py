"""Results written as they are computed, one JSON object per line, so a long run that is
killed loses at most the cell it was in and resumes where it stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from quarl.limits import read_capped

RESULTS_CAP = 256 << 20
"""A results log of 256 MB holds ~50,000 records of 1,000 episodes: more is not one of quarl's."""


class ResultsLog:
    """Append-only JSON-lines file of records (dicts)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records = []
        text = read_capped(self.path, RESULTS_CAP, "a results log").decode("utf-8", errors="replace")
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill: recompute that cell
                continue
            if isinstance(record, dict):  # a line that is no record (edited by hand) is no cell either
                records.append(record)
        return records

    def find(self, **key: Any) -> dict[str, Any] | None:
        """The last record whose fields equal ``key``."""
        for record in reversed(self.load()):
            if all(record.get(k) == v for k, v in key.items()):
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
