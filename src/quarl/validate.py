"""One validator per kind of value a command takes, used at the CLI boundary: each returns
the value (converted) or raises :class:`~quarl.errors.QuarlError` with one line naming the
option, the bad value and what is allowed (the CLI exits with status 2)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from quarl.errors import QuarlError

MAX_SEED = 2**31 - 1 - 200_000
"""Seeds leave room for the evaluation (seed + i) and study (100000 s + i) offsets within a
31-bit seed."""
MAX_TIMESTEPS = 10**10
"""Beyond any training a quarl user runs (the paper's Atari agents: 10M steps)."""
EMPTY = "\0"
"""What :func:`out_option` gives for ``--out ''`` (a Path cannot tell '' from '.')."""


def digits(text: str) -> bool:
    """Whether ``text`` is ASCII digits only: ``str.isdigit`` also takes "²" (which ``int``
    refuses) and other scripts' digits."""
    return bool(text) and text.isascii() and text.isdigit()


def finite(value: float, option: str) -> float:
    if not math.isfinite(value):
        raise QuarlError(f"{option} {value} must be a finite number")
    return value


def at_least(value: int, minimum: int, option: str) -> int:
    if value < minimum:
        raise QuarlError(f"{option} {value} must be at least {minimum}")
    return value


def in_range(value: int, low: int, high: int, option: str) -> int:
    if not low <= value <= high:
        raise QuarlError(f"{option} {value} is out of range: allowed {low}..{high}")
    return value


def seed(value: int, option: str = "--seed") -> int:
    return in_range(value, 0, MAX_SEED, option)


def timesteps(value: int | None, option: str = "--timesteps") -> int | None:
    return None if value is None else in_range(value, 1, MAX_TIMESTEPS, option)


def out_option(raw: str | Path) -> Path:
    """typer's parser for ``--out`` (and its default): keeps an empty value recognizable
    (see :data:`EMPTY`)."""
    raw = str(raw)
    return Path(EMPTY if not raw.strip() else raw)


def out_folder(path: Path | None, option: str = "--out") -> Path | None:
    """A folder results go to: not empty, not an existing file, and writable (created
    here, so a folder that cannot be made fails now, before any work)."""
    if path is None:
        return None
    if str(path) == EMPTY:
        raise QuarlError(f"{option} '' is empty: give a folder (results go there)")
    if path.exists() and not path.is_dir():
        raise QuarlError(f"{option} {path} is a file: give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise QuarlError(f"{option} {path} cannot be created: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise QuarlError(f"{option} {path} is not writable")
    return path
