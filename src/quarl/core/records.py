"""Results written as they are computed, one JSON object per line, so a long run that is
killed loses at most the cell it was in and resumes where it stopped."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quarl.core.file_schema import parse_record

log = logging.getLogger("quarl")

RESULTS_CAP = 256 << 20
"""A results log of 256 MB holds ~50,000 records of 1,000 episodes: more is not one of quarl's."""


STORED_DIGITS_TOLERANCE = 1e-4
"""Returns are stored rounded to 4 digits, the mean and std from the unrounded ones: they
agree within this (plus 1e-9 of their size)."""


def disagreement(fields: Mapping[str, Any]) -> str | None:
    """Why a stored result is not what its own returns say (None: it is): no returns, a
    return that is not finite, a mean or std that is not theirs, lengths of another count.
    Such a record is never reused as it is (a fabricated mean of 123.45 was shown as *keeps*)."""
    returns, mean, std, lengths = (fields.get(k) for k in ("returns", "mean", "std", "lengths"))
    if not isinstance(returns, list) or not returns:
        return "it holds no returns"
    for i, value in enumerate(returns):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"return {i} is {value!r}, not a finite number"
    n = len(returns)
    want_mean = math.fsum(returns) / n
    want_std = math.sqrt(math.fsum((r - want_mean) ** 2 for r in returns) / n)
    for name, stored, want in (("mean", mean, want_mean), ("std", std, want_std)):
        if isinstance(stored, bool) or not isinstance(stored, (int, float)) or not math.isfinite(stored) or \
                abs(stored - want) > STORED_DIGITS_TOLERANCE + 1e-9 * abs(want):
            return f"its {name} {stored!r} is not the {name} of its {n} returns ({want:.4f})"
    if isinstance(lengths, list) and len(lengths) != n:
        return f"it holds {len(lengths)} episode lengths for {n} returns"
    return None


class ResultsLog:
    """Append-only JSON-lines file of records (dicts): quarl's own file, never a symbolic
    link or a named pipe (refused in one line when the log is opened)."""

    def __init__(self, path: Path) -> None:
        from quarl.core.atomic import check_owned

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # before any cell is computed: a link's target is another file (results appended to the user's), a pipe blocks
        check_owned(self.path)

    def load(self) -> list[dict[str, Any]]:
        return [record for _, record in self._records()]

    def _records(self) -> list[tuple[int, dict[str, Any]]]:
        """(line number, record) of each line that holds a JSON object."""
        from quarl.core.limits import read_capped  # imports numpy and torch: the study store imports this module

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

    def find(self, check: type[BaseModel], **key: Any) -> dict[str, Any] | None:
        """The last record whose fields equal ``key``, checked as a ``check`` (the record its
        writer reads back, e.g. :class:`quarl.evaluation.record.StoredCell`: one line naming the
        file, the line and the field when it does not fit; it is returned as stored); None (the cell is
        evaluated again, and its new record appended) when its mean or std is not that of its own returns,
        or a return is not finite."""
        for number, record in reversed(self._records()):
            if all(record.get(k) == v for k, v in key.items()):
                parse_record(check, record, f"{self.path} line {number}")
                why = disagreement(record)
                if why:
                    log.warning("%s line %d: %s: not reused, evaluated again", self.path, number, why)
                    return None
                return record
        return None

    def append(self, record: dict[str, Any]) -> None:
        """One line, whole or not at all (a full disk cuts the log back and is one line)."""
        from quarl.core.atomic import append_line

        append_line(self.path, json.dumps(record, default=_plain))


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
