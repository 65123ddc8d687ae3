"""Does a quantized policy keep its fp32 reward? A verdict with a measured error rate.

The paper's relative error ``E = (R_fp32 - R_q) / |R_fp32|`` (percent, positive: reward
lost) is estimated from episodes played by both policies on the same seeds. Its interval is
an **anytime-valid confidence sequence** (:mod:`quarl.verdict.betting`: Waudby-Smith &
Ramdas 2023, betting on bounded returns), so

- it holds at every episode count, one episode included (where it is wide, not zero-wide),
  and while episodes keep arriving: playing more until the verdict decides (``ptq``,
  ``study``, ``demo`` and ``recover`` do by default) does not inflate its error rate;
- it sees rare failures it has not met: returns are bounded (:mod:`quarl.verdict.bounds`),
  and until enough clean episodes exclude a failure rate that would cost 5 %, the verdict
  stays undecided.

The verdict against the tolerance (5 %), each side its own one-sided test at 95 %
(:func:`quarl.verdict.betting.decisions`: a wrong *keeps* needs E >= 5 %, a wrong *loses*
E <= 5 %, so at most one of them can be wrong and a decided verdict is wrong at most 5 % of
the time, at every look):

- **keeps**: E's one-sided 95 % upper bound lies below it: with 95 % confidence the
  quantized policy loses less than 5 % of fp32's return;
- **loses**: E's one-sided 95 % lower bound lies above it;
- **undecided**: neither; :attr:`Verdict.episodes_to_decide` says how many episodes in all
  would decide if the next ones look like those played.

The interval shown (``low``, ``high``) is two-sided 95 % (each end 97.5 %), so a *keeps* may
show a ``high`` a little above 5 %; :attr:`Verdict.bound` is the one-sided bound it decided on.
Where fp32's mean return cannot be told from 0, E (a ratio to it) means nothing and its
interval is unbounded both ways (:attr:`Verdict.relative`); the decision stands (less than 5 %
of fp32's mean lost, so about nothing) and :attr:`Verdict.loss` says it in returns: the
one-sided 95 % bound on the mean paired loss (:func:`quarl.verdict.betting.loss_bound`).
Every verdict carries the range of returns it assumed and what that insures against
(:mod:`quarl.verdict.bounds`: the env's own range where it defines one, else insured against
an unseen failure of ``--insure`` mean returns).

Its error rates are measured, not assumed: :mod:`quarl.verdict.coverage` resamples pools
of real paired returns (``tests/data/return_pools``) and counts how often the interval
misses the pool's E and how often a decided verdict is wrong, beside a BCa bootstrap and a
t-interval (``benchmarks/bench_verdict_coverage.py``; the table is in docs/ptq.md).

Episodes are independent only if they are different games. A deterministic policy on an
env whose resets converge replays whole games under other seeds. Given each episode's
ending digest (:func:`quarl.evaluation.episodes.ending`), episodes that replay one game on either
side are one *game* (:func:`games_of`), and the interval is built from one mean return per
game: copies add no confidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from quarl.verdict.betting import decisions, e_bounds, loss_bound, one_sided_bound
from quarl.verdict.bounds import (
    DEFAULT_INSURE,
    ENV_RETURN_BOUNDS,
    ReturnRange,
    ReturnsOutsideRange,
    check_insure,
    parse_range,
    return_range,
)

__all__ = ["TOLERANCE", "CONFIDENCE", "Decision", "Judging", "Verdict", "games_of", "relative_error", "interval",
           "judge", "decision", "Sequential", "sequential_keeps", "sequential_at_least", "ReturnRange",
           "ReturnsOutsideRange", "check_insure", "ENV_RETURN_BOUNDS", "DEFAULT_INSURE", "parse_range", "return_range",
           "episodes_to_decide", "CHUNK"]

TOLERANCE = 5.0
"""Percent of fp32's return a quantized policy may lose and still keep it."""
CONFIDENCE = 0.95
"""The two-sided interval's confidence; each decision is one-sided at this confidence."""
CHUNK = 10
"""Episodes between two looks when playing on until a verdict decides (``ptq``, ``study``,
``demo``, ``recover``): the confidence sequence may be looked at after every episode, and a
look every 10 decides a clean sample about 30 % sooner than doubling the episodes."""


class Decision(str, Enum):
    """What a verdict says (a ``str``: compares equal to its word)."""

    KEEPS = "keeps"
    LOSES = "loses"
    UNDECIDED = "undecided"
    NA = "n/a"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Judging:
    """How verdicts are judged (``--insure``, ``--return-range``): the range of returns
    they assume where the env defines none (:mod:`quarl.verdict.bounds`)."""

    insure: float = DEFAULT_INSURE
    """Mean returns an unseen failure may cost beyond the worst paired loss seen."""
    return_range: tuple[float, float] | None = None
    """Every return lies in ``[lo, hi]`` (the user says so); None: the env's, else insured."""

    def __post_init__(self) -> None:
        check_insure(self.insure)

MORE_EPISODES_SHOWN = 10
"""An undecided label gives its estimate of the episodes needed only up to this many times
the episodes played (a six-digit estimate means E lies near the line, not a plan)."""
PLAN_SHOWN = 2000
"""... and always up to this many (a short sample may need many times its size to exclude a failure)."""
PROJECTION_CAP = 1 << 17
"""The most episodes :func:`episodes_to_decide` looks ahead."""


@dataclass(frozen=True)
class Verdict:
    """E and its interval (percent), and what they say against the tolerance."""

    e: float
    low: float
    high: float
    episodes: int
    verdict: Decision
    """keeps, loses, undecided or n/a (fp32's mean return is 0: no relative error)."""
    episodes_to_decide: int | None = None
    """For ``undecided``: about how many paired episodes in all would decide (None otherwise,
    or where no number of episodes like these would)."""
    games: int | None = None
    """Distinct games among the episodes (replays counted once); None: not known."""
    returns: ReturnRange | None = None
    """The range of returns the interval assumed (:mod:`quarl.verdict.bounds`)."""
    bound: float = field(default=math.nan)
    """The one-sided 95 % bound the decision rests on: the upper one for *keeps* (and for
    *undecided* where E is below the tolerance), the lower one for *loses* (and above it).
    Meaningless where E is (:attr:`relative` false): read :attr:`loss` there."""
    loss: float = field(default=math.nan)
    """The same side's one-sided 95 % bound on the mean paired loss in returns (fp32's
    return minus the quantized one's, per seed; negative: the quantized policy scores more),
    from the same confidence sequence under the same range: what the decision means in
    returns where E, a ratio to fp32's mean, means nothing (:attr:`relative`)."""

    @property
    def decided(self) -> bool:
        return self.verdict in (Decision.KEEPS, Decision.LOSES)

    @property
    def relative(self) -> bool:
        """Does E mean anything here? Not where fp32's mean return cannot be told from 0:
        a ratio to it can then take any value, so its 95 % interval is unbounded on both
        sides (Fieller's case: fp32's own interval holds 0, too near 0 or too few episodes
        to tell), or a decided verdict's one-sided bound on E is infinite (the tests of E
        turn non-monotone there). A table then shows E as ``n/a (fp32 mean ~ 0)`` and the
        verdict with :attr:`loss`, its bound in returns (:meth:`label`)."""
        if not math.isfinite(self.e):
            return False
        if math.isinf(self.low) and math.isinf(self.high):
            return False
        return not (self.decided and not math.isfinite(self.bound))

    def label(self) -> str:
        """``keeps``, ``loses``, ``undecided (~N more episodes)`` (or ``undecided after N
        episodes (E near 5 %)`` where no estimate within :data:`MORE_EPISODES_SHOWN` times
        the episodes played exists); ``, G distinct games`` where the episodes replay fewer
        games than there are episodes. Where E means nothing (:attr:`relative`), a decided
        verdict names its bound in returns: ``keeps (loss <= -0.28 returns)``,
        ``loses (loss >= 12.40 returns)``."""
        label = self.verdict.value
        if self.decided and not self.relative and math.isfinite(self.loss):  # E means nothing: the bound in returns
            label += f" (loss {'<=' if self.verdict == Decision.KEEPS else '>='} {self.loss:.2f} returns)"
        if self.verdict == Decision.UNDECIDED:
            need = self.episodes_to_decide
            more = None if need is None else max(need - self.episodes, 1)
            # a short sample can ask for many times its size (it has not yet excluded a failure);
            # a long one that would need ten times more only says E sits near the line
            if more is not None and more <= max(MORE_EPISODES_SHOWN * self.episodes, PLAN_SHOWN):
                label = f"undecided (~{more} more episodes)"
            else:
                label = f"undecided after {self.episodes} episodes (E near 5 %)"
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


def _paired(fp32: np.ndarray, quant: np.ndarray, games: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Validated float arrays, one pair per game (the mean of its episodes) where ``games``
    is given, in order of first appearance."""
    fp32 = np.asarray(fp32, np.float64)
    quant = np.asarray(quant, np.float64)
    if fp32.shape != quant.shape or fp32.ndim != 1 or len(fp32) == 0:
        raise ValueError(f"paired returns must be two equal, non-empty lists (got {fp32.shape} and {quant.shape})")
    if games is None:
        return fp32, quant
    if np.shape(games) != fp32.shape:
        raise ValueError(f"one game index per episode: got {np.shape(games)} for {fp32.shape} episodes")
    _, first, inverse = np.unique(games, return_index=True, return_inverse=True)
    counts = np.bincount(inverse)
    order = np.argsort(first)  # games in the order they were first played: the sequence stays predictable
    f = (np.bincount(inverse, weights=fp32) / counts)[order]
    q = (np.bincount(inverse, weights=quant) / counts)[order]
    return f, q


def interval(fp32: np.ndarray, quant: np.ndarray, confidence: float = CONFIDENCE, games: np.ndarray | None = None,
             env_id: str | None = None, returns: tuple[float, float] | None = None,
             insure: float = DEFAULT_INSURE) -> tuple[float, float, float]:
    """(E, low, high) in percent from paired per-episode returns (index i: the same seed,
    in the order played): the two-sided confidence sequence of :mod:`quarl.verdict.betting`
    with the return range of :func:`quarl.verdict.bounds.return_range` (``returns``: a given
    one). Deterministic. fp32 returns averaging 0 give NaNs; ends beyond +-1000 % are
    infinite. ``games`` (a game index per episode, :func:`games_of`): one pair per game."""
    e, low, high, _ = _interval(fp32, quant, confidence, games, env_id, returns, insure)
    return e, low, high


def _interval(fp32: np.ndarray, quant: np.ndarray, confidence: float, games: np.ndarray | None,
              env_id: str | None, returns: tuple[float, float] | None, insure: float
              ) -> tuple[float, float, float, ReturnRange]:
    f, q = _paired(fp32, quant, games)
    e = relative_error(float(np.mean(np.asarray(fp32, np.float64))), float(np.mean(np.asarray(quant, np.float64))))
    bounds = return_range(f, q, env_id, returns, insure)
    if not math.isfinite(e):
        return math.nan, math.nan, math.nan, bounds
    low, high = e_bounds(f[None], q[None], bounds.as_tuple(), confidence)
    return e, float(low[0]), float(high[0]), bounds


def _decision(f: np.ndarray, q: np.ndarray, bounds: ReturnRange, tolerance: float, confidence: float) -> int:
    return int(decisions(f[None], q[None], tolerance, bounds.as_tuple(), 1 - confidence)[0])


def episodes_to_decide(fp32: np.ndarray, quant: np.ndarray, bounds: ReturnRange, tolerance: float = TOLERANCE,
                       confidence: float = CONFIDENCE) -> int | None:
    """About how many paired episodes in all would decide, were the next ones like these
    (the sample repeated in order, under the same range): a doubling, then a bisection,
    up to :data:`PROJECTION_CAP`. None: none would (E on the line)."""
    f, q = np.asarray(fp32, np.float64), np.asarray(quant, np.float64)
    n = len(f)
    low, high = n, max(2 * n, 8)
    while not _decision(np.resize(f, high), np.resize(q, high), bounds, tolerance, confidence):
        if high >= PROJECTION_CAP:
            return None
        low, high = high, min(2 * high, PROJECTION_CAP)
    while high - low > max(1, low // 50):  # to 2 %: an estimate, not a promise
        mid = (low + high) // 2
        if _decision(np.resize(f, mid), np.resize(q, mid), bounds, tolerance, confidence):
            high = mid
        else:
            low = mid
    return high


def decision(fp32: np.ndarray, quant: np.ndarray, tolerance: float = TOLERANCE, confidence: float = CONFIDENCE,
             games: np.ndarray | None = None, env_id: str | None = None,
             returns: tuple[float, float] | None = None, insure: float = DEFAULT_INSURE) -> Decision:
    """What :func:`judge` decides, without its interval and projection (two capital
    processes instead of about a hundred): what a deciding loop asks at every look."""
    if not math.isfinite(relative_error(float(np.mean(np.asarray(fp32, np.float64))),
                                        float(np.mean(np.asarray(quant, np.float64))))):
        return Decision.NA
    f, q = _paired(fp32, quant, games)
    decided = _decision(f, q, return_range(f, q, env_id, returns, insure), tolerance, confidence)
    return Decision.KEEPS if decided > 0 else Decision.LOSES if decided < 0 else Decision.UNDECIDED


def judge(fp32: np.ndarray, quant: np.ndarray, tolerance: float = TOLERANCE, confidence: float = CONFIDENCE,
          games: np.ndarray | None = None, env_id: str | None = None,
          returns: tuple[float, float] | None = None, insure: float = DEFAULT_INSURE) -> Verdict:
    """The verdict on paired per-episode returns in the order played (see the module
    docstring): ``fp32`` the reference's, ``quant`` the candidate's; ``games``: a game index
    per episode (:func:`games_of`), so replays count once; ``env_id``: the env, for its
    defined return range; ``returns``: a range given by the user (``--return-range``; a
    return outside it raises :class:`ReturnsOutsideRange`); ``insure``: mean returns an
    unseen failure may cost where the env defines no range (``--insure``)."""
    check_insure(insure)
    e, low, high, bounds = _interval(fp32, quant, confidence, games, env_id, returns, insure)
    n = len(fp32)
    k = None if games is None else len(np.unique(games))
    if not math.isfinite(e):
        return Verdict(e, low, high, n, Decision.NA, games=k, returns=bounds)
    f, q = _paired(fp32, quant, games)
    upper = e < tolerance  # the side a decision is nearest to
    bound = float(one_sided_bound(f[None], q[None], bounds.as_tuple(), 1 - confidence, upper)[0])
    decided = _decision(f, q, bounds, tolerance, confidence)
    if decided:
        outcome = Decision.KEEPS if decided > 0 else Decision.LOSES
        if (outcome == Decision.KEEPS) != upper:  # E's point sits on the other side: report the bound decided on
            upper = not upper
            bound = float(one_sided_bound(f[None], q[None], bounds.as_tuple(), 1 - confidence, upper)[0])
        loss = float(loss_bound(f[None], q[None], bounds.as_tuple(), 1 - confidence, upper)[0])
        return Verdict(e, low, high, n, outcome, games=k, returns=bounds, bound=bound, loss=loss)
    need = episodes_to_decide(f, q, bounds, tolerance, confidence)
    if need is not None and k is not None and k < n:
        need = int(math.ceil(need * n / k))  # new episodes bring new games at the rate seen so far
    loss = float(loss_bound(f[None], q[None], bounds.as_tuple(), 1 - confidence, upper)[0])
    return Verdict(e, low, high, n, Decision.UNDECIDED, need, games=k, returns=bounds, bound=bound, loss=loss)


@dataclass(frozen=True)
class Sequential:
    """The outcome of a sequential test (:func:`sequential_keeps`, :func:`sequential_at_least`)."""

    kept: bool
    verdict: Verdict
    episodes: int
    """Paired episodes played by each policy."""
    estimate: bool = False
    """``kept`` rests on the point estimate, not on a decided verdict (the cap came first)."""

    def label(self) -> str:
        """``keeps`` / ``loses`` where the verdict decided; ``estimate: E 1.2 % <= 5 %
        (undecided ...)`` where the point estimate chose: never ``keeps`` without a verdict."""
        if not self.estimate:
            return self.verdict.label()
        if not self.verdict.relative:  # no E to quote: fp32's mean cannot be told from 0
            return (f"estimate: mean return {'kept' if self.kept else 'lost'}, E n/a (fp32 mean ~ 0) "
                    f"({self.verdict.label()})")
        side = "<=" if self.kept else ">"
        return f"estimate: E {self.verdict.e:.1f} % {side} {TOLERANCE:g} % ({self.verdict.label()})"


def _sequence(play_a: Callable[[int], np.ndarray], play_b: Callable[[int], np.ndarray], first: int, cap: int,
              tolerance: float, env_id: str | None, judging: Judging) -> tuple[Verdict, int]:
    """Looks after ``first`` episodes, then after every ``first`` more (the confidence
    sequence may be looked at as often as wished), up to ``cap``."""
    n = min(first, cap)
    while True:
        a, b = play_a(n), play_b(n)
        if decision(a, b, tolerance, env_id=env_id, returns=judging.return_range,
                    insure=judging.insure) != Decision.UNDECIDED or n >= cap:
            break
        n = min(n + first, cap)
    # the whole verdict (interval, bound, projection) once, where the looks stopped
    return judge(a, b, tolerance, env_id=env_id, returns=judging.return_range, insure=judging.insure), n


def sequential_keeps(play_fp32: Callable[[int], np.ndarray], play_quant: Callable[[int], np.ndarray],
                     first: int = 4, cap: int = 16, tolerance: float = TOLERANCE, env_id: str | None = None,
                     strict: bool = False, judging: Judging = Judging()) -> Sequential:
    """A paired sequential test: ``play_X(n)`` returns the first ``n`` per-episode returns
    of a policy on calibration seeds (the same seeds for both). Plays ``first`` episodes,
    then ``first`` more at a time while the verdict is undecided, up to ``cap``; the
    confidence sequence stays valid over the looks. A keep or a loss stops at once. Still
    undecided at the cap: ``strict`` says not kept; otherwise the point estimate decides
    (``E <= tolerance``), a choice between candidates rather than a claim, and the outcome
    says so (:attr:`Sequential.estimate`, its label ``estimate: ...``, never ``keeps``)."""
    verdict, n = _sequence(play_fp32, play_quant, first, cap, tolerance, env_id, judging)
    if verdict.verdict == Decision.NA:  # fp32 averages 0: compare absolute returns instead
        return Sequential(float(np.mean(play_quant(n))) >= float(np.mean(play_fp32(n))), verdict, n, estimate=True)
    if verdict.verdict == Decision.UNDECIDED and not strict:
        return Sequential(verdict.e <= tolerance, verdict, n, estimate=True)
    return Sequential(verdict.verdict == Decision.KEEPS, verdict, n)


def sequential_at_least(play_incumbent: Callable[[int], np.ndarray], play_challenger: Callable[[int], np.ndarray],
                        first: int = 8, cap: int = 64, env_id: str | None = None,
                        judging: Judging = Judging()) -> Sequential:
    """Does the challenger play at least as well as the incumbent? A paired sequential test
    of the challenger's E against the incumbent at tolerance 0: ``kept`` only where the
    confidence sequence says the challenger scores more (E below 0, one-sided), or where both
    play the same return on every episode (nothing to choose). Anything short of that keeps
    the incumbent: a repair never ships what it could not show is no worse."""
    verdict, n = _sequence(play_incumbent, play_challenger, first, cap, 0.0, env_id, judging)
    tied = bool(np.array_equal(play_incumbent(n), play_challenger(n)))
    return Sequential(verdict.verdict == Decision.KEEPS or tied, verdict, n)
