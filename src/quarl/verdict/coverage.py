"""Measured error rates of a verdict: resample pools of real paired returns.

A pool holds paired per-episode returns of an agent at fp32 and at one quantized precision
(hundreds of episodes on the same seeds, ``tests/data/return_pools``). Drawing ``N``
episode pairs from it with replacement is sampling from a population whose E is known:
the pool's own. For each method and ``N`` the harness counts

- **coverage**: how often the stated 95 % interval holds the pool's E;
- **wrong**: how often a *decided* verdict is wrong: *keeps* where the pool's E is above
  the tolerance, *loses* where it is below;
- **decided**: how often the verdict decides at all;

and the same for the deciding schedule (play ``first`` episodes, then look after every
:data:`quarl.verdict.CHUNK` more while undecided, up to ``cap``: the repeated looks ``ptq``
makes by default), with the median episodes it took to decide. Methods: ``cs``, quarl's
confidence sequence (:mod:`quarl.verdict.betting`, with the return range of
:mod:`quarl.verdict.bounds`; its decisions one-sided); ``bca``, the paired BCa bootstrap
quarl used before; ``t``, a t-interval on the paired differences.

Besides the real pools, :func:`synthetic_pools` builds pools a verdict can fail on: rare
large failures (1 episode in 30, 100 or 300 costing 1, 3, 6 or 20 mean returns), Acrobot
time-outs and Pendulum failed swing-ups on real fp32 returns, identical play and small noise.
:meth:`Pool.covered` says whether a pool lies within what the verdict insures against
(``--insure``): the harness's pass lines hold for covered pools; the others show what an
uninsured failure does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quarl.verdict import CHUNK, CONFIDENCE, TOLERANCE
from quarl.verdict.baselines import bca_interval, t_interval
from quarl.verdict.betting import decisions, e_bounds
from quarl.verdict.bounds import DEFAULT_INSURE, ENV_RETURN_BOUNDS, ranges

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
    failure_cost: float | None = None
    """Synthetic pools: what the quantized-only failure costs, in mean returns (None: real)."""

    @property
    def e(self) -> float:
        """The pool's E, percent: the truth the resampled verdicts are judged against."""
        base = float(self.fp32.mean())
        return 100.0 * (base - float(self.quant.mean())) / abs(base)

    def covered(self, insure: float = DEFAULT_INSURE) -> bool:
        """Whether the verdict's range insures against this pool's worst episode: the env
        defines its range, or the largest paired loss lies within ``insure`` mean returns of
        the losses that are not rare (the 95th percentile: a sample of 60 has most likely seen one)."""
        lo_hi = ENV_RETURN_BOUNDS.get(self.env_id)
        if lo_hi is not None and min(self.fp32.min(), self.quant.min()) >= lo_hi[0] and max(
                self.fp32.max(), self.quant.max()) <= lo_hi[1]:
            return True
        diff = self.fp32 - self.quant
        scale = max(abs(float(self.fp32.mean())), abs(float(self.quant.mean())))
        return bool(diff.max() <= np.quantile(diff, 0.95) + insure * scale)


def _with_failures(name: str, env_id: str, fp32: np.ndarray, quant: np.ndarray, every: int, failed: np.ndarray,
                   rng: np.random.Generator, cost: float | None) -> Pool:
    """``quant`` with exactly one episode in ``every`` (random places) replaced by ``failed``."""
    quant = quant.copy()
    where = rng.choice(len(quant), len(quant) // every, replace=False)
    quant[where] = failed[where]
    return Pool(name, env_id, "synthetic", fp32, quant, cost)


def synthetic_pools(size: int = 3000, seed: int = 0, real: Sequence[Pool] = ()) -> list[Pool]:
    """Pools a verdict can be fooled by (see the module docstring). fp32 returns ~ N(100, 10)
    where no env is named (no defined range: the verdict insures); the Acrobot and Pendulum
    pools replay the real pools' fp32 returns (``real``: :func:`load_pools`), where present."""
    rng = np.random.default_rng(seed)
    base = 100 + 10 * rng.standard_normal(size)
    pools = [Pool("identical", "", "synthetic", base, base.copy(), 0.0),
             Pool("noise E 1 sd 2", "", "synthetic", base, base - 1 - 2 * rng.standard_normal(size), 0.0),
             Pool("noise E 2.5 sd 2", "", "synthetic", base, base - 2.5 - 2 * rng.standard_normal(size), 0.0),
             Pool("noise E 2.5 sd 10", "", "synthetic", base, base - 2.5 - 10 * rng.standard_normal(size), 0.0)]
    clean = base - 0.5 * rng.standard_normal(size)  # near-identical play, then rare failures
    for every in (30, 100, 300):
        for cost in (1.0, 3.0, 6.0, 20.0):
            pools.append(_with_failures(f"1 in {every} costs {cost:g}", "", base, clean, every, base - cost * 100, rng,
                                        cost))
    by_env = {p.env_id: p for p in real}
    for env_id, failed in (("Acrobot-v1", -500.0), ("Pendulum-v1", -1300.0)):
        if env_id in by_env:
            f = by_env[env_id].fp32
            cost = (float(np.mean(f)) - failed) / abs(float(np.mean(f)))
            what = "times out" if env_id == "Acrobot-v1" else "never swings up"
            pools.append(_with_failures(f"{env_id} {what} 1 in 100", env_id, f, f.copy(), 100, np.full(len(f), failed),
                                        rng, cost))
    return pools


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
            pools.append(Pool(str(data.get("pool", path.stem)), str(data["env_id"]), precision, fp32[:len(quant)],
                              quant))
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
    median_to_decide: float = math.nan
    """The deciding schedule: median episodes at which it decided (inf: most never did)."""


def intervals(method: str, f: np.ndarray, q: np.ndarray, env_id: str | None,
              insure: float = DEFAULT_INSURE) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per row of paired samples (rows x N) by ``method``, two-sided 95 %."""
    if method == "cs":
        return e_bounds(f, q, ranges(f, q, env_id, insure=insure))
    one: Callable[[np.ndarray, np.ndarray], tuple[float, float, float]]
    if method == "bca":
        def one(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
            return bca_interval(a, b, resamples=999)
    elif method == "t":
        one = t_interval
    else:
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    ends = np.array([one(a, b)[1:] for a, b in zip(f, q, strict=True)])
    return ends[:, 0], ends[:, 1]


def _verdicts(method: str, f: np.ndarray, q: np.ndarray, env_id: str | None, insure: float, tolerance: float,
              low: np.ndarray | None = None, high: np.ndarray | None = None) -> np.ndarray:
    """+1 keeps, -1 loses, 0 undecided per row: ``cs`` by its one-sided tests, the others by
    where their interval lies (a NaN interval: undecided)."""
    if method == "cs":
        return decisions(f, q, tolerance, ranges(f, q, env_id, insure=insure), 1 - CONFIDENCE)
    if low is None or high is None:
        low, high = intervals(method, f, q, env_id, insure)
    with np.errstate(invalid="ignore"):
        return np.where(high < tolerance, 1, np.where(low > tolerance, -1, 0))


def _rates(pool: Pool, low: np.ndarray, high: np.ndarray, verdict: np.ndarray, episodes: np.ndarray,
           tolerance: float, median: float = math.nan) -> Rates:
    truth = pool.e
    with np.errstate(invalid="ignore"):
        covered = (low <= truth) & (truth <= high)
    wrong = ((verdict == 1) & (truth > tolerance)) | ((verdict == -1) & (truth < tolerance))
    return Rates(float(covered.mean()), float(wrong.mean()), float((verdict != 0).mean()), len(low),
                 float(episodes.mean()), median)


def fixed_n(pool: Pool, method: str, n: int, draws: int, seed: int = 0, tolerance: float = TOLERANCE,
            insure: float = DEFAULT_INSURE) -> Rates:
    """Rates at ``n`` paired episodes drawn with replacement, ``draws`` times."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pool.fp32), (draws, n))
    f, q = pool.fp32[idx], pool.quant[idx]
    low, high = intervals(method, f, q, pool.env_id, insure)
    verdict = _verdicts(method, f, q, pool.env_id, insure, tolerance, low, high)
    return _rates(pool, low, high, verdict, np.full(draws, n), tolerance)


def schedule(first: int, cap: int, chunk: int = CHUNK) -> list[int]:
    """The looks of the deciding schedule: ``first``, then every ``chunk`` more, up to ``cap``."""
    looks = [min(first, cap)]
    while looks[-1] < cap:
        looks.append(min(looks[-1] + chunk, cap))
    return looks


def sequential(pool: Pool, method: str, first: int, cap: int, draws: int, seed: int = 0,
               tolerance: float = TOLERANCE, insure: float = DEFAULT_INSURE, chunk: int = CHUNK) -> Rates:
    """Rates of the deciding schedule: each draw is a stream of ``cap`` pairs, judged at
    every look of :func:`schedule` until it decides; the interval and verdict are those of
    the look it stopped at. Its median episodes to decide count a stream that never did as
    infinite."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pool.fp32), (draws, cap))
    f, q = pool.fp32[idx], pool.quant[idx]
    verdict = np.zeros(draws, np.int64)
    played = np.zeros(draws, np.int64)
    open_ = np.ones(draws, bool)
    for look in schedule(first, cap, chunk):
        rows = np.flatnonzero(open_)
        if not len(rows):
            break
        v = _verdicts(method, f[rows, :look], q[rows, :look], pool.env_id, insure, tolerance)
        verdict[rows], played[rows] = v, look
        open_[rows] = v == 0
    low, high = np.full(draws, math.nan), np.full(draws, math.nan)
    for look in np.unique(played):  # the interval each stream stopped with
        rows = np.flatnonzero(played == look)
        low[rows], high[rows] = intervals(method, f[rows, :look], q[rows, :look], pool.env_id, insure)
    median = float(np.median(np.where(verdict != 0, played, np.inf)))
    return _rates(pool, low, high, verdict, played, tolerance, median)


def table(pools: Sequence[Pool], methods: Sequence[str] = METHODS, sizes: Sequence[int] = SIZES, draws: int = 400,
          first: int = 20, cap: int = 640, seed: int = 0, insure: float = DEFAULT_INSURE,
          on_cell: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """One row per (pool, method): the pool, its E, whether ``insure`` covers it, then
    ``cov@N / wrong@N`` per size and for the deciding schedule (``seq``), percent, and the
    schedule's median episodes to decide."""
    rows: list[dict[str, object]] = []
    for pool in pools:
        for method in methods:
            row: dict[str, object] = {"pool": f"{pool.name} {pool.precision}", "E%": round(pool.e, 2),
                                      "covered": "yes" if pool.covered(insure) else "no", "method": method}
            for n in sizes:
                r = fixed_n(pool, method, n, draws, seed, TOLERANCE, insure)
                row[f"cov@{n}"] = round(100 * r.coverage, 1)
                row[f"wrong@{n}"] = round(100 * r.wrong, 1)
            r = sequential(pool, method, first, cap, draws if method != "bca" else max(draws // 4, 50), seed,
                           insure=insure)
            row["cov@seq"], row["wrong@seq"] = round(100 * r.coverage, 1), round(100 * r.wrong, 1)
            row["decided@seq"], row["episodes@seq"] = round(100 * r.decided, 1), round(r.episodes, 1)
            row["median@seq"] = r.median_to_decide if math.isinf(r.median_to_decide) else round(r.median_to_decide)
            rows.append(row)
            if on_cell:
                on_cell(f"{pool.name} {pool.precision} {method}")
    return rows
