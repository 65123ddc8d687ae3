"""The range a verdict assumes an episode's return can take, and what that insures against.

A confidence sequence for bounded returns (:mod:`quarl.verdict.betting`) is only as honest
as its bounds: they say how much one unseen bad episode could cost. Three sources, in this
order:

- **Given** (``--return-range LO:HI``): every return in ``[LO, HI]``, exactly. A return
  outside it refuses the verdict (:class:`ReturnsOutsideRange`), never clipped.
- **The env's own definition** (:data:`ENV_RETURN_BOUNDS`): where every step's reward and
  the episode's length are fixed by the env (CartPole: +1 a step for at most 500 steps),
  no episode can leave ``[lo, hi]``, and the verdict uses exactly that range: an Acrobot
  policy that times out at -500 once in 100 episodes is insured against before it is seen.
  Returns outside it mean a wrapper rescaled the rewards: the insured rule below applies.
- **Insured** (every other env, MuJoCo, Box2D and Atari among them): an unseen episode may
  lose, against fp32's episode on the same seed, up to ``insure`` mean returns (the larger
  of the two policies', in size) beyond the worst paired loss seen (or beyond a tie, if
  every pair seen lost), gain as much beyond the best gain, and either policy's return may
  leave the seen extremes of both by as much. The
  default, :data:`DEFAULT_INSURE` = 1 mean return, is what a policy that fails outright
  costs where returns are mostly positive (it scores about nothing): the largest
  quantized-only losses in quarl's measured pools are 1.03 mean returns (a HalfCheetah that
  falls), 0.93 (LunarLander) and 0.98 (CartPole). A failure that costs more and is rarer
  than the episodes played can fool it: pass ``--insure K`` (docs/ptq.md's table says what
  each K insures against and what it costs in episodes).

The range is computed at every prefix of the episodes (in the order played) and the widest
is used, so it only widens as episodes arrive, and a verdict is always re-judged, over all
its episodes, under the widest range any of them implied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

ENV_RETURN_BOUNDS: dict[str, tuple[float, float]] = {
    # +1 per step, at most 500 (v1) / 200 (v0) steps
    "CartPole-v1": (0.0, 500.0),
    "CartPole-v0": (0.0, 200.0),
    # -1 per step until the goal, at most 200 / 500 steps
    "MountainCar-v0": (-200.0, 0.0),
    "Acrobot-v1": (-500.0, 0.0),
    # -(theta^2 + 0.1 theta_dot^2 + 0.001 u^2) >= -(pi^2 + 0.1 * 8^2 + 0.001 * 2^2) per step, 200 steps
    "Pendulum-v1": (-200 * (np.pi**2 + 6.4 + 0.004), 0.0),
    # -0.1 a^2 per step (a clipped to [-1, 1]) for at most 999 steps, +100 once at the goal
    "MountainCarContinuous-v0": (-99.9, 100.0),
    # a game to 21 points
    "ALE/Pong-v5": (-21.0, 21.0),
    "PongNoFrameskip-v4": (-21.0, 21.0),
}

DEFAULT_INSURE = 1.0
"""Mean returns an unseen failure may cost beyond the worst paired loss seen (``--insure``)."""
MAX_INSURE = 1000.0

Source = Literal["given", "env", "insured"]


class ReturnsOutsideRange(ValueError):
    """A return lies outside the range the user gave: the verdict is refused, not clipped
    (the commands turn it into their one-line error)."""


@dataclass(frozen=True)
class ReturnRange:
    """What a verdict assumes possible: fp32's returns in ``[f_lo, f_hi]``, the quantized
    policy's in ``[q_lo, q_hi]`` and the paired differences ``fp32 - quantized`` of one seed
    in ``[d_lo, d_hi]``, and where that came from."""

    f_lo: float
    f_hi: float
    d_lo: float
    d_hi: float
    q_lo: float
    q_hi: float
    source: Source
    """``given`` (``--return-range``), ``env`` (the env's definition) or ``insured``."""
    insure: float | None = None
    """For ``insured``: the mean returns an unseen failure may cost beyond the worst seen."""

    def as_tuple(self) -> tuple[float, float, float, float, float, float]:
        return self.f_lo, self.f_hi, self.d_lo, self.d_hi, self.q_lo, self.q_hi

    def label(self) -> str:
        """What the range is and insures, short enough for a table column: ``env 0:500``,
        ``given -200:0`` or ``insure 1: -310:560`` (the returns' range it implies)."""
        lo, hi = min(self.f_lo, self.q_lo), max(self.f_hi, self.q_hi)
        span = f"{_short(lo)}:{_short(hi)}"
        if self.source == "insured":
            return f"insure {_short(self.insure or 0.0)}: {span}"
        return f"{self.source} {span}"

    def insures(self) -> str:
        """One sentence: what a verdict under this range is insured against."""
        if self.source == "env":
            return "every return the env allows (its defined range)"
        if self.source == "given":
            return "every return in the given --return-range"
        k = self.insure or 0.0
        return (f"an unseen failure costing up to {_short(k)} mean return{'s' if k != 1 else ''} beyond the worst "
                "paired loss seen (--insure)")


def _short(value: float) -> str:
    """``500``, ``-3254.7``, ``1.2e+04``: a bound as a person reads it."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1e5 or abs(value) < 1e-2:
        return f"{value:.2g}"
    return f"{value:.5g}" if abs(value) >= 1000 else f"{value:.4g}"


def parse_range(text: str) -> tuple[float, float]:
    """``"LO:HI"`` -> (lo, hi); a clear ValueError otherwise."""
    parts = text.split(":")
    try:
        lo, hi = (float(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"--return-range {text!r} must be LO:HI, two finite numbers with LO < HI (e.g. 0:500)")
    return lo, hi


def check_insure(insure: float) -> float:
    """``--insure K``: a finite number of mean returns, 0..:data:`MAX_INSURE`."""
    if not (isinstance(insure, (int, float)) and math.isfinite(insure) and 0 <= insure <= MAX_INSURE):
        raise ValueError(f"--insure {insure!r}: allowed a number of mean returns from 0 to {MAX_INSURE:g} "
                         f"(default {DEFAULT_INSURE:g})")
    return float(insure)


Ranges = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""Per row: (f_lo, f_hi, d_lo, d_hi, q_lo, q_hi)."""


def _given(rows: int, given: tuple[float, float], fp32: np.ndarray, quant: np.ndarray) -> Ranges:
    lo, hi = float(given[0]), float(given[1])
    bad = np.concatenate([fp32[(fp32 < lo) | (fp32 > hi)], quant[(quant < lo) | (quant > hi)]])
    if bad.size:
        raise ReturnsOutsideRange(f"a return of {bad[0]:g} lies outside --return-range {lo:g}:{hi:g}: the verdict "
                                  "needs a range every return lies in (widen it, or leave it out)")
    full = np.full(rows, lo), np.full(rows, hi)
    return full[0], full[1], np.full(rows, lo - hi), np.full(rows, hi - lo), full[0].copy(), full[1].copy()


def _inside_env(fp32: np.ndarray, quant: np.ndarray, env_id: str | None) -> np.ndarray:
    """Per row: whether the env defines a range and every return lies within it."""
    known = ENV_RETURN_BOUNDS.get(env_id or "")
    if known is None:
        return np.zeros(fp32.shape[0], bool)
    lo, hi = known
    inside = ((np.minimum(fp32.min(axis=1), quant.min(axis=1)) >= lo)
              & (np.maximum(fp32.max(axis=1), quant.max(axis=1)) <= hi))
    return np.asarray(inside, bool)


def _insured(fp32: np.ndarray, quant: np.ndarray, insure: float) -> Ranges:
    """The insured rule at every prefix, the widest kept (rows x episodes in). Either policy
    may play as the other does, so both returns share one range, and the paired differences'
    range holds 0 (a tie) whatever was seen."""
    t = np.arange(1, fp32.shape[1] + 1)
    margin = insure * np.maximum(np.abs(np.cumsum(fp32, axis=1) / t), np.abs(np.cumsum(quant, axis=1) / t))
    diff = fp32 - quant
    both_lo, both_hi = np.minimum(fp32, quant), np.maximum(fp32, quant)

    def low(a: np.ndarray, tie: bool = False) -> np.ndarray:
        seen = np.minimum.accumulate(a, axis=1)
        return np.asarray(np.min((np.minimum(seen, 0.0) if tie else seen) - margin, axis=1), np.float64)

    def high(a: np.ndarray, tie: bool = False) -> np.ndarray:
        seen = np.maximum.accumulate(a, axis=1)
        return np.asarray(np.max((np.maximum(seen, 0.0) if tie else seen) + margin, axis=1), np.float64)

    r_lo, r_hi = low(both_lo), high(both_hi)
    return r_lo, r_hi, low(diff, tie=True), high(diff, tie=True), r_lo.copy(), r_hi.copy()


def ranges(fp32: np.ndarray, quant: np.ndarray, env_id: str | None = None, given: tuple[float, float] | None = None,
           insure: float = DEFAULT_INSURE) -> Ranges:
    """(f_lo, f_hi, d_lo, d_hi, q_lo, q_hi), one each per row of (rows x episodes) paired
    returns in the order played: ``given`` exactly (a return outside it raises
    :class:`ReturnsOutsideRange`); else the env's defined range where every return lies in
    it; else the insured rule (see the module docstring)."""
    fp32 = np.atleast_2d(np.asarray(fp32, np.float64))
    quant = np.atleast_2d(np.asarray(quant, np.float64))
    rows = fp32.shape[0]
    if given is not None:
        return _given(rows, given, fp32, quant)
    out = _insured(fp32, quant, insure)
    inside = _inside_env(fp32, quant, env_id)
    if not inside.any():
        return out
    lo, hi = ENV_RETURN_BOUNDS[str(env_id)]
    env = (lo, hi, lo - hi, hi - lo, lo, hi)
    f_lo, f_hi, d_lo, d_hi, q_lo, q_hi = (np.where(inside, value, mine) for value, mine in zip(env, out, strict=True))
    return f_lo, f_hi, d_lo, d_hi, q_lo, q_hi


def return_range(fp32: np.ndarray, quant: np.ndarray, env_id: str | None = None,
                 given: tuple[float, float] | None = None, insure: float = DEFAULT_INSURE) -> ReturnRange:
    """:func:`ranges` for one sample of paired returns, with its source."""
    f = np.asarray(fp32, np.float64)[None]
    q = np.asarray(quant, np.float64)[None]
    f_lo, f_hi, d_lo, d_hi, q_lo, q_hi = (float(v[0]) for v in ranges(f, q, env_id, given, insure))
    source: Source = "given" if given is not None else "env" if _inside_env(f, q, env_id)[0] else "insured"
    return ReturnRange(f_lo, f_hi, d_lo, d_hi, q_lo, q_hi, source, insure if source == "insured" else None)
