"""Measured error rates of a verdict: resample pools of real paired returns.

A pool holds paired per-episode returns of an agent at fp32 and at one quantized precision
(hundreds of episodes on the same seeds, ``tests/data/return_pools``). Drawing ``N``
episode pairs from it with replacement is sampling from a population whose E is known:
the pool's own. For each method and ``N`` the harness counts

- **coverage**: how often the stated 95 % interval holds the pool's E;
- **wrong**: how often a *decided* verdict is wrong: *keeps* where the pool's E is above
  the tolerance, *loses* where it is below;
- **decided**: how often the verdict decides at all;

and the same for the deciding schedule (play ``first`` episodes, double while undecided,
up to ``cap``: the repeated looks ``ptq`` makes by default). Methods: ``cs``, quarl's
confidence sequence (:mod:`quarl.verdict.betting`, with the return range of
:mod:`quarl.verdict.bounds`); ``bca``, the paired BCa bootstrap quarl used before; ``t``,
a t-interval on the paired differences.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from quarl.verdict import TOLERANCE
from quarl.verdict.baselines import bca_interval, t_interval
from quarl.verdict.betting import e_bounds
from quarl.verdict.bounds import ranges

METHODS = ("cs", "bca", "t")
SIZES = (1, 2, 3, 5, 10, 20, 50, 100)
MAX_POOL_BYTES = 4 << 20


@dataclass(frozen=True)
class Pool:
    """Paired returns of one agent at fp32 and one quantized precision (index i: one seed)."""

    name: str
    env_id: str
    precision: str
    fp32: np.ndarray
    quant: np.ndarray

    @property
    def e(self) -> float:
        """The pool's E, percent: the truth the resampled verdicts are judged against."""
        base = float(self.fp32.mean())
        return 100.0 * (base - float(self.quant.mean())) / abs(base)


def load_pools(folder: Path) -> list[Pool]:
    """Every (agent, precision) pool in the JSON files of ``folder`` (made by
    ``benchmarks/make_return_pools.py``: ``env_id`` and ``series``, precision -> its
    ``returns`` on seeds first, first + 1...; a precision's returns pair with fp32's first
    ones)."""
    pools = []
    for path in sorted(Path(folder).glob("*.json")):
        if path.stat().st_size > MAX_POOL_BYTES:
            raise ValueError(f"{path} is over {MAX_POOL_BYTES >> 20} MB: not a pool file")
        data = json.loads(path.read_text())
        series = data["series"]
        fp32 = np.asarray(series["fp32"]["returns"], np.float64)
        for precision, record in series.items():
            if precision == "fp32":
                continue
            quant = np.asarray(record["returns"], np.float64)
            if quant.ndim != 1 or not 0 < len(quant) <= len(fp32) or not (
                    np.isfinite(fp32).all() and np.isfinite(quant).all()):
                raise ValueError(f"{path}: {precision} returns do not pair with fp32's {len(fp32)} finite ones")
            pools.append(Pool(str(data.get("pool", path.stem)), str(data["env_id"]), precision, fp32[:len(quant)], quant))
    return pools


@dataclass(frozen=True)
class Rates:
    """One cell of the harness's table."""

    coverage: float
    wrong: float
    """Wrong decided verdicts over all draws (a wrong *keeps* or *loses*)."""
    decided: float
    draws: int
    episodes: float
    """Mean paired episodes played (N, or the deciding schedule's mean)."""


def intervals(method: str, f: np.ndarray, q: np.ndarray, env_id: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per row of paired samples (rows x N) by ``method``."""
    if method == "cs":
        return e_bounds(f, q, ranges(f, q, env_id))
    one: Callable[[np.ndarray, np.ndarray], tuple[float, float, float]]
    if method == "bca":
        def one(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
            return bca_interval(a, b, resamples=999)
    elif method == "t":
        one = t_interval
    else:
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    ends = np.array([one(a, b)[1:] for a, b in zip(f, q)])
    return ends[:, 0], ends[:, 1]


def _verdicts(low: np.ndarray, high: np.ndarray, tolerance: float) -> np.ndarray:
    """+1 keeps, -1 loses, 0 undecided (a NaN interval: undecided)."""
    with np.errstate(invalid="ignore"):
        return np.where(high < tolerance, 1, np.where(low > tolerance, -1, 0))


def _rates(pool: Pool, low: np.ndarray, high: np.ndarray, episodes: np.ndarray, tolerance: float) -> Rates:
    truth = pool.e
    verdict = _verdicts(low, high, tolerance)
    with np.errstate(invalid="ignore"):
        covered = (low <= truth) & (truth <= high)
    wrong = ((verdict == 1) & (truth > tolerance)) | ((verdict == -1) & (truth < tolerance))
    return Rates(float(covered.mean()), float(wrong.mean()), float((verdict != 0).mean()), len(low),
                 float(episodes.mean()))


def fixed_n(pool: Pool, method: str, n: int, draws: int, seed: int = 0, tolerance: float = TOLERANCE) -> Rates:
    """Rates at ``n`` paired episodes drawn with replacement, ``draws`` times."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pool.fp32), (draws, n))
    low, high = intervals(method, pool.fp32[idx], pool.quant[idx], pool.env_id)
    return _rates(pool, low, high, np.full(draws, n), tolerance)


def schedule(first: int, cap: int) -> list[int]:
    """The looks of the deciding schedule: ``first``, doubled, up to ``cap``."""
    looks = [first]
    while looks[-1] < cap:
        looks.append(min(2 * looks[-1], cap))
    return looks


def sequential(pool: Pool, method: str, first: int, cap: int, draws: int, seed: int = 0,
               tolerance: float = TOLERANCE) -> Rates:
    """Rates of the deciding schedule: each draw is a stream of ``cap`` pairs, judged at
    every look of :func:`schedule` until it decides; the interval and verdict are those of
    the look it stopped at."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pool.fp32), (draws, cap))
    f, q = pool.fp32[idx], pool.quant[idx]
    low, high = np.full(draws, math.nan), np.full(draws, math.nan)
    played = np.zeros(draws)
    open_ = np.ones(draws, bool)
    for look in schedule(first, cap):
        rows = np.flatnonzero(open_)
        if not len(rows):
            break
        lo, hi = intervals(method, f[rows, :look], q[rows, :look], pool.env_id)
        low[rows], high[rows], played[rows] = lo, hi, look
        open_[rows] = _verdicts(lo, hi, tolerance) == 0
    return _rates(pool, low, high, played, tolerance)


def table(pools: Sequence[Pool], methods: Sequence[str] = METHODS, sizes: Sequence[int] = SIZES, draws: int = 400,
          first: int = 20, cap: int = 640, seed: int = 0,
          on_cell: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """One row per (pool, method): the pool, its E, then ``cov@N / wrong@N`` per size and
    for the deciding schedule (``seq``), percent."""
    rows: list[dict[str, object]] = []
    for pool in pools:
        for method in methods:
            row: dict[str, object] = {"pool": f"{pool.name} {pool.precision}", "E%": round(pool.e, 2),
                                      "method": method}
            for n in sizes:
                r = fixed_n(pool, method, n, draws, seed, TOLERANCE)
                row[f"cov@{n}"] = round(100 * r.coverage, 1)
                row[f"wrong@{n}"] = round(100 * r.wrong, 1)
            r = sequential(pool, method, first, cap, draws if method != "bca" else max(draws // 4, 50), seed)
            row["cov@seq"], row["wrong@seq"] = round(100 * r.coverage, 1), round(100 * r.wrong, 1)
            row["decided@seq"], row["episodes@seq"] = round(100 * r.decided, 1), round(r.episodes, 1)
            rows.append(row)
            if on_cell:
                on_cell(f"{pool.name} {pool.precision} {method}")
    return rows
