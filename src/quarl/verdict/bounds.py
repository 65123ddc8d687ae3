"""The range a verdict assumes an episode's return can take, and why.

A confidence sequence for bounded returns (:mod:`quarl.verdict.betting`) is only as honest
as its bounds: they say how much one unseen bad episode could cost. Two sources:

- **The env's own definition** (:data:`ENV_RETURN_BOUNDS`): where every step's reward and
  the episode's length are fixed by the env (CartPole: +1 a step for at most 500 steps),
  no episode can leave ``[lo, hi]``. These clip the rule below; they never widen it.
- **What was seen, widened** (every other env, MuJoCo and Atari among them): an unseen
  episode is assumed to lose, against fp32's episode on the same seed, no more than one
  mean return (the larger of the two policies', in size) beyond the worst paired loss
  seen (nor to gain more than that beyond the best gain), and fp32's own return to stay
  within that of its extremes. A quantized policy that fails outright loses about one mean return, so a
  first failure is within the range before it is seen. It is an assumption, not a fact:
  a failure that costs more than that and is rarer than the episodes played can still
  fool it, and the coverage harness (:mod:`quarl.verdict.coverage`) measures how often it
  does on real return pools. Bounds computed anew at every look only widen, so earlier
  looks are re-judged under the wider range.

A user who knows better (a reward clipped by a wrapper, a task with a known best score)
passes ``--return-range LO:HI`` and the verdict uses exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ReturnRange:
    """What a verdict assumes possible: fp32's returns in ``[f_lo, f_hi]`` and the paired
    differences ``fp32 - quantized`` of one seed in ``[d_lo, d_hi]``, and where that came
    from."""

    f_lo: float
    f_hi: float
    d_lo: float
    d_hi: float
    source: str
    """``seen`` (the returns played, widened), ``seen, within the env's`` (also clipped to
    the env's definition) or ``user``."""

    def as_tuple(self) -> tuple[float, float, float, float]:
        return self.f_lo, self.f_hi, self.d_lo, self.d_hi


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


def ranges(fp32: np.ndarray, quant: np.ndarray, env_id: str | None = None,
           given: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(f_lo, f_hi, d_lo, d_hi), one each per row of (rows x episodes) paired returns: given
    returns ``[lo, hi]`` as is (differences in ``[lo - hi, hi - lo]``); else what was seen,
    each end widened by the larger mean return of the two policies (in size), clipped to the env's definition where
    :data:`ENV_RETURN_BOUNDS` knows it and every return seen lies within it."""
    fp32, quant = np.atleast_2d(fp32), np.atleast_2d(quant)
    rows = fp32.shape[0]
    if given is not None:
        lo, hi = float(given[0]), float(given[1])
        return np.full(rows, lo), np.full(rows, hi), np.full(rows, lo - hi), np.full(rows, hi - lo)
    diff = fp32 - quant
    margin = np.maximum(np.abs(fp32.mean(axis=1)), np.abs(quant.mean(axis=1)))
    f_lo, f_hi = fp32.min(axis=1) - margin, fp32.max(axis=1) + margin
    d_lo, d_hi = diff.min(axis=1) - margin, diff.max(axis=1) + margin
    known = ENV_RETURN_BOUNDS.get(env_id or "")
    if known is not None:
        lo, hi = known
        inside = (np.minimum(fp32.min(axis=1), quant.min(axis=1)) >= lo) & (
            np.maximum(fp32.max(axis=1), quant.max(axis=1)) <= hi)  # else a wrapper rescaled the rewards
        f_lo, f_hi = np.where(inside, np.maximum(f_lo, lo), f_lo), np.where(inside, np.minimum(f_hi, hi), f_hi)
        d_lo = np.where(inside, np.maximum(d_lo, lo - hi), d_lo)
        d_hi = np.where(inside, np.minimum(d_hi, hi - lo), d_hi)
    return f_lo, f_hi, d_lo, d_hi


def return_range(fp32: np.ndarray, quant: np.ndarray, env_id: str | None = None,
                 given: tuple[float, float] | None = None) -> ReturnRange:
    """:func:`ranges` for one sample of paired returns, with its source."""
    f_lo, f_hi, d_lo, d_hi = (float(v[0]) for v in ranges(np.asarray(fp32, np.float64)[None],
                                                              np.asarray(quant, np.float64)[None], env_id, given))
    if given is not None:
        source = "user"
    elif env_id in ENV_RETURN_BOUNDS and f_lo >= ENV_RETURN_BOUNDS[env_id][0] and f_hi <= ENV_RETURN_BOUNDS[env_id][1]:
        source = "seen, within the env's"
    else:
        source = "seen"
    return ReturnRange(f_lo, f_hi, d_lo, d_hi, source)
