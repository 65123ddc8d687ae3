"""The intervals quarl used before its confidence sequence, kept to be measured against it
(:mod:`quarl.verdict.coverage`): a paired BCa bootstrap of E (quarl's interval until
2026-11) and a t-interval on the paired differences. Neither is valid under repeated looks,
and neither can see a failure its sample does not hold."""

from __future__ import annotations

import math
import warnings

import numpy as np


def _e_statistic(fp32: np.ndarray, quant: np.ndarray, axis: int = -1) -> np.ndarray:
    base = np.mean(fp32, axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(100.0 * (base - np.mean(quant, axis=axis)) / np.abs(base), np.float64)


def bca_interval(fp32: np.ndarray, quant: np.ndarray, confidence: float = 0.95,
             resamples: int = 4999, seed: int = 0, games: np.ndarray | None = None) -> tuple[float, float, float]:
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


def t_interval(fp32: np.ndarray, quant: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """(E, low, high): Student's t on the paired differences ``f - q``, fp32's mean taken as
    known (``E +- t sd(d) / sqrt(n) / |mean f|``, percent). One episode: no interval (NaN)."""
    from scipy.stats import t as student

    f = np.asarray(fp32, np.float64)
    q = np.asarray(quant, np.float64)
    base = abs(float(f.mean()))
    if base == 0:
        return math.nan, math.nan, math.nan
    e = 100.0 * float((f - q).mean()) / base
    n = len(f)
    if n < 2:
        return e, math.nan, math.nan
    half = float(student.ppf(0.5 + confidence / 2, n - 1)) * 100.0 * float(np.std(f - q, ddof=1)) / math.sqrt(n) / base
    return e, e - half, e + half
