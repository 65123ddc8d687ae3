"""Does a quantized policy keep its fp32 reward? A verdict with an interval, not one E%.

The paper's relative error ``E = (R_fp32 - R_q) / |R_fp32|`` (percent, positive: reward
lost) is estimated from episodes played by both policies on the same seeds, so its
uncertainty is taken from the *paired* differences: a bias-corrected and accelerated (BCa)
bootstrap over episodes, resampling seeds, not returns (:func:`scipy.stats.bootstrap`,
``paired=True``). Chaotic episodes (MuJoCo) vary a lot from seed to seed while both
precisions meet the same seed, so pairing narrows the interval where it can.

- **keeps**: the whole interval lies below ``tolerance`` (5 %): with 95 % confidence the
  quantized policy loses less than 5 % of fp32's return;
- **loses**: the whole interval lies above it;
- **undecided**: the interval straddles it; :attr:`Verdict.episodes_to_decide` estimates
  how many episodes in all would shrink it (as ``1 / sqrt(n)``) enough to decide.

Episodes are independent only if they are different games. A deterministic policy on an
env whose resets converge replays whole games under other seeds (measured: a PPO Breakout
agent's 30 games on v4 were 4 distinct games). Given each episode's ending digest
(:func:`quarl.evaluation.ending`), episodes that replay one game on either side are one
*game*, and the bootstrap resamples games, not episodes: copies then add no confidence.

:func:`sequential_keeps` uses the same interval as a sequential test on calibration
episodes: it plays more only while undecided.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

TOLERANCE = 5.0
"""Percent of fp32's return a quantized policy may lose and still keep it."""
CONFIDENCE = 0.95
RESAMPLES = 4999


MORE_EPISODES_SHOWN = 10
"""An undecided label gives its estimate of the episodes needed only up to this many times
the episodes played (a six-digit estimate means E lies near the line, not a plan)."""


@dataclass(frozen=True)
class Verdict:
    """E and its interval (percent), and what they say against the tolerance."""

    e: float
    low: float
    high: float
    episodes: int
    verdict: str
    """``keeps``, ``loses``, ``undecided`` or ``n/a`` (fp32's mean return is 0: no relative error)."""
    episodes_to_decide: int | None = None
    """For ``undecided``: about how many paired episodes in all would decide (None otherwise)."""
    games: int | None = None
    """Distinct games among the episodes (replays counted once); None: not known."""

    def label(self) -> str:
        """``keeps``, ``loses``, ``undecided (~N more episodes)`` (or ``undecided after N
        episodes (E near 5 %)`` where that estimate is over :data:`MORE_EPISODES_SHOWN` times
        the episodes played); ``, G distinct games`` where the episodes replay fewer games
        than there are episodes."""
        label = self.verdict
        if self.verdict == "undecided" and self.episodes_to_decide is not None:
            more = max(self.episodes_to_decide - self.episodes, 1)
            # an estimate many times the episodes played says only that E sits near the 5 % line
            label = (f"undecided (~{more} more episodes)" if more <= MORE_EPISODES_SHOWN * self.episodes
                     else f"undecided after {self.episodes} episodes (E near 5 %)")
        if self.games is not None and self.games < self.episodes:
            label += f" ({self.games} distinct games of {self.episodes})"
        return label


def games_of(fp32_endings: list[str], quant_endings: list[str]) -> np.ndarray:
    """A game index per paired episode: episodes whose fp32 episodes end alike, or whose
    quantized episodes do, are one game (joined transitively)."""
    if len(fp32_endings) != len(quant_endings):
        raise ValueError(f"paired endings must be two equal lists (got {len(fp32_endings)} and {len(quant_endings)})")
    parent = list(range(len(fp32_endings)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for side in (fp32_endings, quant_endings):
        first: dict[str, int] = {}
        for i, key in enumerate(side):
            if key in first:
                parent[root(i)] = root(first[key])
            else:
                first[key] = i
    roots = [root(i) for i in range(len(parent))]
    index = {r: k for k, r in enumerate(dict.fromkeys(roots))}
    return np.array([index[r] for r in roots], dtype=np.int64)


def relative_error(r_fp32: float, r_q: float) -> float:
    """The paper's ``E = (R_fp32 - R_q) / |R_fp32|``, in percent (positive: reward lost)."""
    if r_fp32 == 0:
        return math.nan
    return 100.0 * (r_fp32 - r_q) / abs(r_fp32)


def _e_statistic(fp32: np.ndarray, quant: np.ndarray, axis: int = -1) -> np.ndarray:
    base = np.mean(fp32, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * (base - np.mean(quant, axis=axis)) / np.abs(base)


def interval(fp32: np.ndarray, quant: np.ndarray, confidence: float = CONFIDENCE,
             resamples: int = RESAMPLES, seed: int = 0, games: np.ndarray | None = None) -> tuple[float, float, float]:
    """(E, low, high) in percent from paired per-episode returns (index i: the same seed).
    Deterministic (a fixed resampling seed). Identical differences on every episode give
    a zero-width interval; fp32 returns averaging 0 give NaNs. ``games`` (a game index per
    episode, :func:`games_of`): the bootstrap resamples games, each with its episodes'
    summed returns (E is a ratio of sums, so it is unchanged); one game replayed by every
    episode gives no interval."""
    from scipy.stats import bootstrap

    fp32 = np.asarray(fp32, np.float64)
    quant = np.asarray(quant, np.float64)
    if fp32.shape != quant.shape or fp32.ndim != 1 or len(fp32) == 0:
        raise ValueError(f"paired returns must be two equal, non-empty lists (got {fp32.shape} and {quant.shape})")
    e = float(_e_statistic(fp32, quant))
    if not math.isfinite(e):
        return math.nan, math.nan, math.nan
    if games is not None:
        if np.shape(games) != fp32.shape:
            raise ValueError(f"one game index per episode: got {np.shape(games)} for {fp32.shape} episodes")
        _, games = np.unique(games, return_inverse=True)  # any labels -> 0..G-1, no empty games
        n_games = int(games.max()) + 1
        if n_games < 2 and len(fp32) > 1:
            return e, math.nan, math.nan  # one game replayed: nothing says how another would go
        fp32 = np.bincount(games, weights=fp32, minlength=n_games)
        quant = np.bincount(games, weights=quant, minlength=n_games)
    diff = fp32 - quant
    if len(fp32) < 2 or not diff.any() or (np.ptp(diff) == 0 and np.ptp(fp32) == 0):
        return e, e, e  # every resample gives the same E: exact on these seeds
    with warnings.catch_warnings():  # a degenerate BCa is handled below, not printed
        warnings.simplefilter("ignore")
        try:
            result = bootstrap((fp32, quant), _e_statistic, paired=True, vectorized=True, confidence_level=confidence,
                               n_resamples=resamples, method="BCa", rng=np.random.default_rng(seed))
            low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        except (ValueError, FloatingPointError):
            low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high)):
        # BCa degenerates on near-constant samples, and a resample whose fp32 returns average 0
        # has no E: a percentile interval over the resamples that have one
        low, high = _percentile(fp32, quant, confidence, resamples, seed)
        if not (math.isfinite(low) and math.isfinite(high)):
            return e, math.nan, math.nan
    return e, min(low, e), max(high, e)


def _percentile(fp32: np.ndarray, quant: np.ndarray, confidence: float, resamples: int,
                seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(fp32), (resamples, len(fp32)))
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = _e_statistic(fp32[idx], quant[idx])
    stats = stats[np.isfinite(stats)]
    if len(stats) < resamples // 2:
        return math.nan, math.nan
    tail = (1 - confidence) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    return float(low), float(high)


def judge(fp32: np.ndarray, quant: np.ndarray, tolerance: float = TOLERANCE,
          confidence: float = CONFIDENCE, games: np.ndarray | None = None) -> Verdict:
    """The verdict on paired per-episode returns (see the module docstring); ``games``: a
    game index per episode (:func:`games_of`), so replays count once."""
    e, low, high = interval(fp32, quant, confidence, games=games)
    n = len(fp32)
    k = None if games is None else len(np.unique(games))
    if not math.isfinite(e):
        return Verdict(e, low, high, n, "n/a", games=k)
    if not (math.isfinite(low) and math.isfinite(high)):  # most resamples have no E (fp32 returns mostly 0)
        return Verdict(e, low, high, n, "undecided", games=k)
    if high < tolerance:
        return Verdict(e, low, high, n, "keeps", games=k)
    if low > tolerance:
        return Verdict(e, low, high, n, "loses", games=k)
    half = max(high - e, e - low)
    gap = abs(e - tolerance)
    # the interval narrows with distinct games; new episodes bring them at the rate seen so far
    need = None if gap == 0 or half == 0 else int(math.ceil(n * (half / gap) ** 2))
    return Verdict(e, low, high, n, "undecided", need, games=k)


@dataclass(frozen=True)
class Sequential:
    """The outcome of :func:`sequential_keeps`."""

    kept: bool
    verdict: Verdict
    episodes: int
    """Paired episodes played by each policy."""


def sequential_keeps(play_fp32: Callable[[int], np.ndarray], play_quant: Callable[[int], np.ndarray],
                     first: int = 4, cap: int = 16, tolerance: float = TOLERANCE) -> Sequential:
    """A paired sequential test: ``play_X(n)`` returns the first ``n`` per-episode returns
    of a policy on calibration seeds (the same seeds for both). Plays ``first`` episodes,
    then doubles them while the verdict is undecided, up to ``cap``. A keep or a loss
    stops at once; still undecided at the cap, the point estimate decides (``E <=
    tolerance``). Looking again and again makes a 95 % interval less than 95 % sure over
    the whole sequence; doubling keeps the looks few (5 from 4 to 64)."""
    n = first
    while True:
        verdict = judge(play_fp32(n), play_quant(n), tolerance)
        if verdict.verdict in ("keeps", "loses", "n/a") or n >= cap:
            break
        n = min(2 * n, cap)
    if verdict.verdict == "n/a":  # fp32 averages 0: compare absolute returns instead
        kept = float(np.mean(play_quant(n))) >= float(np.mean(play_fp32(n)))
    else:
        kept = verdict.verdict == "keeps" or (verdict.verdict == "undecided" and verdict.e <= tolerance)
    return Sequential(kept, verdict, n)
