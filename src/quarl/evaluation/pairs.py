"""The verdict for any two policies: paired returns from any source (a pruned, distilled or
retrained policy, or a run of another tool), judged as ``ptq``, ``study`` and ``recover``
judge theirs (:func:`quarl.verdict.judge`).

```python
import quarl

v = quarl.judge([500, 500, 480], [500, 490, 500], env_id="CartPole-v1")
print(v.label(), v.e, v.low, v.high, v.returns.label())
```

``quarl judge RETURNS.csv`` reads the pairs from a CSV file whose header is
``seed,reference,candidate``, one row per paired episode in the order played.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quarl.core.errors import QuarlError
from quarl.core.limits import read_capped
from quarl.verdict import DEFAULT_INSURE, TOLERANCE, Decision, Verdict
from quarl.verdict import judge as _judge
from quarl.verdict.bounds import ReturnsOutsideRange, check_insure

HEADER = ("seed", "reference", "candidate")
MAX_CSV_BYTES = 64 << 20
"""A returns file larger than this is refused before it is read (10^6 rows fit in 40 MB)."""
MAX_PAIRS = 1_000_000


def judge(reference: Sequence[float] | np.ndarray, candidate: Sequence[float] | np.ndarray,
          env_id: str | None = None, insure: float = DEFAULT_INSURE,
          return_range: tuple[float, float] | None = None) -> Verdict:
    """Does ``candidate`` keep ``reference``'s return? Paired per-episode returns (index i:
    the same seed, in the order played). ``env_id``: the env, for its defined range of
    returns; ``insure``: mean returns an unseen failure may cost where it defines none;
    ``return_range``: every return lies in ``(lo, hi)``. Bad input raises
    :class:`quarl.core.errors.QuarlError` in one line."""
    ref = _returns(reference, "reference")
    cand = _returns(candidate, "candidate")
    if len(ref) != len(cand):
        raise QuarlError(f"reference and candidate returns must pair one to one: got {len(ref)} and {len(cand)}")
    try:
        check_insure(insure)
    except ValueError as exc:
        raise QuarlError(str(exc)) from None
    if return_range is not None:
        lo, hi = (float(v) for v in return_range)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise QuarlError(f"return_range {return_range!r}: allowed (lo, hi), two finite numbers with lo < hi")
        return_range = (lo, hi)
    try:
        return _judge(ref, cand, env_id=env_id, returns=return_range, insure=insure)
    except ReturnsOutsideRange as exc:
        raise QuarlError(str(exc)) from None


def _returns(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    try:
        array = np.asarray(values, np.float64)
    except (TypeError, ValueError):
        raise QuarlError(f"{name} returns: allowed a list of numbers") from None
    if array.ndim != 1 or not 0 < len(array) <= MAX_PAIRS:
        raise QuarlError(f"{name} returns: allowed 1 to {MAX_PAIRS:,} numbers in one list (got shape {array.shape})")
    if not np.isfinite(array).all():
        raise QuarlError(f"{name} returns: {array[~np.isfinite(array)][0]} is not a finite number")
    return array


@dataclass(frozen=True)
class Pairs:
    """Paired returns read from a CSV file."""

    seeds: np.ndarray
    reference: np.ndarray
    candidate: np.ndarray


def read_pairs(path: Path) -> Pairs:
    """``seed,reference,candidate`` rows of ``path``; one line naming the first bad row
    otherwise (header, a number that is not one, a repeated seed, an empty or huge file)."""
    raw = read_capped(path, MAX_CSV_BYTES, "a CSV of paired returns (header seed,reference,candidate)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise QuarlError(f"{path}: not a text file: give a CSV of paired returns (header seed,reference,candidate)") \
            from None
    rows = csv.reader(io.StringIO(text))
    header = tuple(h.strip() for h in next(rows, []))
    if header != HEADER:
        raise QuarlError(f"{path}: header {','.join(header) or '(empty)'!r}: allowed {','.join(HEADER)}")
    seeds: list[int] = []
    ref: list[float] = []
    cand: list[float] = []
    for line, row in enumerate(rows, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 3:
            raise QuarlError(f"{path} line {line}: {len(row)} fields, allowed 3 (seed,reference,candidate)")
        seed, r, c = (x.strip() for x in row)
        try:
            seeds.append(int(seed))
            ref.append(float(r))
            cand.append(float(c))
        except ValueError:
            raise QuarlError(f"{path} line {line}: {','.join(row)!r}: allowed an integer seed and two numbers") \
                from None
        if not (math.isfinite(ref[-1]) and math.isfinite(cand[-1])):
            raise QuarlError(f"{path} line {line}: returns must be finite numbers (got {r}, {c})")
        if len(seeds) > MAX_PAIRS:
            raise QuarlError(f"{path}: over {MAX_PAIRS:,} rows")
    if not seeds:
        raise QuarlError(f"{path}: no rows after the header: one row per paired episode")
    if len(set(seeds)) != len(seeds):
        repeated = next(s for s in seeds if seeds.count(s) > 1)
        raise QuarlError(f"{path}: seed {repeated} appears twice: one row per paired episode (seed)")
    return Pairs(np.array(seeds, np.int64), np.array(ref), np.array(cand))


def describe(verdict: Verdict, reference: np.ndarray, candidate: np.ndarray) -> list[str]:
    """The verdict in a few lines, as ``quarl judge`` prints it."""
    n = verdict.episodes
    ref_mean = float(np.mean(reference))
    lines = [f"reference {ref_mean:.2f}, candidate {float(np.mean(candidate)):.2f}: mean return over "
             f"{n} paired episodes"]
    if verdict.relative or verdict.verdict == Decision.NA:
        lines.append(f"E {verdict.e:.2f} % of the reference's return lost, 95 % interval [{verdict.low:.2f}, "
                     f"{verdict.high:.2f}]")
    else:  # a ratio to a mean that cannot be told from 0: any value, so none is printed
        lines.append("E n/a: the reference's mean return cannot be told from 0 here (E's 95 % interval is "
                     "unbounded), so a relative error means nothing")
    if verdict.decided and not verdict.relative:
        side = "<" if verdict.verdict == Decision.KEEPS else ">"
        lines.append(f"verdict: {verdict.verdict} (mean loss {side} {verdict.loss:.2f} returns with 95 % confidence, "
                     f"one-sided; tolerance {TOLERANCE:g} % of |{ref_mean:.2f}| = "
                     f"{TOLERANCE / 100 * abs(ref_mean):.2f} returns)")
    elif verdict.verdict == Decision.KEEPS:
        lines.append(f"verdict: keeps (E < {verdict.bound:.2f} % with 95 % confidence, one-sided; tolerance "
                     f"{TOLERANCE:g} %)")
    elif verdict.verdict == Decision.LOSES:
        lines.append(f"verdict: loses (E > {verdict.bound:.2f} % with 95 % confidence, one-sided; tolerance "
                     f"{TOLERANCE:g} %)")
    elif verdict.verdict == Decision.NA:
        lines.append("verdict: n/a (the reference's mean return is 0: no relative error)")
    else:
        need = verdict.episodes_to_decide
        more = (f"about {max(need - n, 1)} more paired episodes like these would decide" if need is not None
                else "no number of episodes like these decides (E sits on the tolerance)")
        lines.append(f"verdict: undecided: {more}")
    if verdict.returns is not None:
        lines.append(f"range: {verdict.returns.label()}, insured against {verdict.returns.insures()}")
    return lines
