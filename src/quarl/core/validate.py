"""One validator per kind of value a command takes, used at the CLI boundary: each returns
the value (converted) or raises :class:`~quarl.core.errors.QuarlError` with one line naming the
option, the bad value and what is allowed (the CLI exits with status 2). Comma lists,
precisions, ``--hp`` pairs and evaluation settings are parsed here too, so that a test (or
another front end) checks them without typer. Imports stay light: what a validator needs
from the rest of quarl is imported when it runs."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from quarl.core.errors import QuarlError

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


def shown(text: str, keep: int = 24) -> str:
    """``text`` as a one-line message shows a value: its repr, cut after ``keep`` characters
    with its length said (a 5,000-digit value is not echoed whole)."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text):,} characters)"


def whole(raw: str, option: str, low: int, high: int, allowed: str | None = None) -> int:
    """A whole number given as text (an environment variable, a camera id): ASCII digits
    within ``low..high`` (``allowed`` says it otherwise), else one line naming ``option``.
    A number longer than ``high`` is refused by its length: Python's ``int`` refuses
    5,000 digits with a ValueError (past 4,300) and takes seconds on millions."""
    text = raw.strip()
    if not digits(text):
        raise QuarlError(f"{option}={shown(text)} is not a whole number")
    if len(text.lstrip("0")) > len(str(high)) or not low <= int(text) <= high:
        raise QuarlError(f"{option}={shown(text)} is out of range: allowed {allowed or f'{low:,}..{high:,}'}")
    return int(text)


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


def out_folder(path: Path | None, option: str = "--out", create: bool = True) -> Path | None:
    """A folder results go to: not empty, not an existing file, and writable (created
    here, so a folder that cannot be made fails now, before any work; ``create=False``:
    only the first two, before anything heavy loads)."""
    if path is None:
        return None
    if str(path) == EMPTY:
        raise QuarlError(f"{option} '' is empty: give a folder (results go there)")
    if path.exists() and not path.is_dir():
        raise QuarlError(f"{option} {path} is a file: give a folder")
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise QuarlError(f"{option} {path} cannot be created: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise QuarlError(f"{option} {path} is not writable")
    return path


def count(value: int | None, minimum: int, option: str, unset: str | None = None) -> int | None:
    """An optional count: None (unset) or at least ``minimum``; ``unset`` says what unset
    means where the message should tell (``""``: just "or unset")."""
    if value is not None and value < minimum:
        note = "" if unset is None else f" (or unset{': ' + unset if unset else ''})"
        raise QuarlError(f"{option} {value} must be at least {minimum}{note}")
    return value


# ---------------------------------------------------------------- comma lists

MAX_LIST_ITEMS = 256
"""Distinct items of a comma list option (--bits has 15 values, --precisions a few dozen)."""


def items(text: str, option: str, unique: bool = True) -> list[str]:
    """The items of a comma list, in order; a set of values (``unique``: bits, precisions,
    seeds...) counts a repeated one once, a sequence (layer widths) keeps every item."""
    found = [t.strip() for t in text.split(",") if t.strip()]
    if unique:
        found = list(dict.fromkeys(found))
    if not found:
        raise QuarlError(f"{option} is empty: give a comma-separated list")
    if len(found) > MAX_LIST_ITEMS:
        raise QuarlError(f"{option} lists {len(found):,} distinct items: at most {MAX_LIST_ITEMS}")
    return found


MIN_BITS, MAX_BITS = 2, 16
"""The widths the quantizer takes (:mod:`quarl.quant.primitives` reads them from here, so a
width is checked without loading torch)."""


def bit_widths(text: str) -> list[int]:
    """--bits: widths the quantizer takes (2..16), each at most once: a repeated width, or
    more widths than exist (10,000 entries ran ten thousand evaluations), is one line."""
    listed = [t.strip() for t in text.split(",") if t.strip()]
    if not listed:
        raise QuarlError("--bits is empty: give a comma-separated list")
    most = MAX_BITS - MIN_BITS + 1
    if len(listed) > most:
        raise QuarlError(f"--bits lists {len(listed):,} widths: at most {most} (each of {MIN_BITS}..{MAX_BITS} once)")
    widths: list[int] = []
    for item in listed:
        if not digits(item) or not MIN_BITS <= int(item) <= MAX_BITS:
            raise QuarlError(f"bits {item!r} is out of range: allowed integers {MIN_BITS}..{MAX_BITS}")
        if int(item) in widths:
            raise QuarlError(f"--bits lists {int(item)} twice: each width at most once (allowed integers "
                             f"{MIN_BITS}..{MAX_BITS})")
        widths.append(int(item))
    return widths


def unknown_precision(label: str, allowed: str) -> QuarlError:
    """The line refusing a label --precisions does not take (``allowed``: what it takes, as
    :func:`quarl.quantization.config.allowed_precisions` says it), with a hint for ``int3`` and the like."""
    text = label.strip().lower()
    hint = f" ({text} has no real kernel: sim{text[3:]} simulates it)" if text.startswith("int") and digits(text[3:]) \
        else ""
    return QuarlError(f"unknown precision {label!r}{hint}: allowed {allowed}")


def layer_widths(text: str, option: str = "--policy-layers") -> tuple[int, ...]:
    """--policy-layers (or ``option``): hidden widths, every one kept (2048,2048 is two layers)."""
    widths = items(text, option, unique=False)
    if not all(digits(w) and int(w) > 0 for w in widths):
        raise QuarlError(f"{option} {text!r} must be positive integers, e.g. 2048,2048,2048")
    return tuple(int(w) for w in widths)


def positive_ints(text: str, option: str) -> list[int]:
    """A comma list of distinct positive integers (actor counts, wire widths)."""
    numbers = []
    for item in items(text, option):
        if not digits(item) or int(item) < 1:
            raise QuarlError(f"{option}: {item!r} is not a positive integer")
        numbers.append(int(item))
    return numbers


def seed_list(text: str, option: str = "--seeds") -> list[int]:
    seeds = []
    for item in items(text, option):
        if not digits(item):
            raise QuarlError(f"{option}: {item!r} is not a non-negative integer")
        seeds.append(seed(int(item), option))
    return seeds


MAX_BENCH_BATCH = 65_536


def batch_sizes(text: str) -> list[int]:
    sizes = []
    for item in items(text, "--batches"):
        if not digits(item) or not 1 <= int(item) <= MAX_BENCH_BATCH:
            raise QuarlError(f"batch size {item!r} must be an integer in 1..{MAX_BENCH_BATCH}")
        sizes.append(int(item))
    return sizes


# ---------------------------------------------------------------- precisions










# ---------------------------------------------------------------- evaluation and runs

MAX_N_ENVS = 1024
"""Envs side by side per process: each holds an emulator or a physics model in memory."""
MAX_DECIDE_EPISODES = 100_000
"""--decide-episodes at most: beyond it a verdict near the 5 % line is a fact, not a plan."""
MAX_REPEATS = 100
MAX_BENCH_BUDGET_S = 600.0
"""Seconds of timing per bench cell: a larger value (or inf) is a typo, not a wish."""


def eval_values(episodes: int, seed_value: int, n_envs: int) -> None:
    """The plain evaluation values (``--episodes``, ``--seed``, ``--n-envs``), checked without
    importing anything heavy (a bad value answers at once)."""
    if episodes < 1:
        raise QuarlError(f"--episodes {episodes} must be at least 1")
    if not 1 <= n_envs <= MAX_N_ENVS:
        raise QuarlError(f"--n-envs {n_envs} must be in 1..{MAX_N_ENVS}")
    seed(seed_value)


MAX_WORKERS = 256


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def check_workers(workers: int, option: str = "--workers") -> int:
    if not 1 <= workers <= MAX_WORKERS:
        raise QuarlError(f"{option} {workers} must be in 1..{MAX_WORKERS} (this machine has {usable_cores()} cores)")
    return workers


def workers(value: int | None) -> int:
    """--workers, else $QUARL_WORKERS, else this machine's cores; checked."""
    if value is None:
        raw = os.environ.get("QUARL_WORKERS", "")
        value = whole(raw, "QUARL_WORKERS", 1, MAX_WORKERS) if raw else usable_cores()
    return check_workers(value)


MAX_DECIDE_MINUTES = 7 * 24 * 60
"""--decide-minutes at most: a week."""


def decide_episodes(value: int | None, episodes: int | None = None, default: int = 0) -> int:
    """--decide-episodes: 0 (off) or a cap on the episodes a verdict may play (a cap at or
    below ``--episodes`` plays nothing more); not given: ``$QUARL_DECIDE_EPISODES``, else
    ``default``."""
    name = "--decide-episodes"
    if value is None:
        raw = os.environ.get("QUARL_DECIDE_EPISODES", "").strip()
        value, name = ((whole(raw, "QUARL_DECIDE_EPISODES", 0, MAX_DECIDE_EPISODES,
                              f"0 (off) to {MAX_DECIDE_EPISODES:,}"), "QUARL_DECIDE_EPISODES") if raw
                       else (default, name))
    if not 0 <= value <= MAX_DECIDE_EPISODES:
        raise QuarlError(f"{name} {value} must be 0 (off) to {MAX_DECIDE_EPISODES:,}")
    return value


def decide_minutes(value: float) -> float | None:
    """--decide-minutes: the wall-clock budget for deciding, in minutes (0: no limit); the
    budget in seconds, or None."""
    if not (math.isfinite(value) and 0 <= value <= MAX_DECIDE_MINUTES):
        raise QuarlError(f"--decide-minutes {value} must be 0 (no limit) to {MAX_DECIDE_MINUTES:,}")
    return value * 60 if value else None


def repeats(value: int) -> int:
    at_least(value, 1, "--repeats")
    if value > MAX_REPEATS:
        raise QuarlError(f"--repeats {value:,} is more runs than a comparison needs: at most {MAX_REPEATS}")
    return value


def bench_budget(value: float) -> float:
    if not 0 < value <= MAX_BENCH_BUDGET_S:
        raise QuarlError(f"--budget {value} must be a positive number of seconds, at most {MAX_BENCH_BUDGET_S:g}")
    return value


def bandwidth_gbps(value: float | None) -> float | None:
    if value is not None and not 0 < value < float("inf"):
        raise QuarlError(f"--bandwidth-gbps {value} must be a finite number above 0")
    return value


# ---------------------------------------------------------------- train


def hyperparams(pairs: list[str]) -> dict[str, Any]:
    """--hp KEY=VALUE pairs (or the RL Zoo's KEY:VALUE), each value a literal (never
    evaluated): Python's (``1e-3``, ``dict(net_arch=[64, 64])``, names kept as text) or
    YAML's (``true``, ``null``)."""
    import yaml

    from quarl.core.literals import parse_literal

    def literal(text: str) -> Any:
        value = parse_literal(text)
        return yaml.safe_load(text) if isinstance(value, str) and value == text.strip() else value

    out = {}
    for item in pairs:
        eq, colon = item.find("="), item.find(":")
        sep = "=" if eq >= 0 and (colon < 0 or eq < colon) else ":"  # the first separator splits
        key, found, value = item.partition(sep)
        if not found or not key.strip():
            raise QuarlError(f"--hp {item!r} is not KEY=VALUE or KEY:VALUE (e.g. --hp n_envs=4)")
        out[key.strip()] = literal(value)
    return out


def algo_and_env(algo: str | None, env_id: str | None, algo_opt: str | None,
                 env_opt: str | None) -> tuple[str, str]:
    """ALGO ENV as arguments or as the RL Zoo's --algo / --env, not both differently."""
    pairs = (("algorithm", "--algo", algo, algo_opt), ("env id", "--env", env_id, env_opt))
    out = []
    for what, option, positional, named in pairs:
        if positional is not None and named is not None and positional != named:
            raise QuarlError(f"{what} given twice: {positional!r} and {option} {named!r}")
        value = positional if positional is not None else named
        if value is None:
            raise QuarlError(f"no {what}: give it as an argument or with {option} (e.g. quarl train ppo CartPole-v1)")
        out.append(value)
    return out[0], out[1]


def video_size(text: str | None) -> tuple[int, int] | None:
    """``--video-size WIDTHxHEIGHT`` (e.g. 640x480) as (width, height); None when not given."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*", text)
    if not match:
        raise QuarlError(f"--video-size {text!r} is not WIDTHxHEIGHT (e.g. 640x480)")
    width, height = int(match.group(1)[:9]), int(match.group(2)[:9])  # a 9-digit side is out of range already
    if not (16 <= width <= 4096 and 16 <= height <= 4096):
        raise QuarlError(f"--video-size {text!r}: each side must be 16..4096 pixels")
    return width, height
