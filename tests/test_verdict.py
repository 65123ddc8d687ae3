"""The verdict on E: a paired bootstrap interval that covers a known loss at about its
stated rate, and a sequential test that stops as soon as the answer is clear."""

from __future__ import annotations

import numpy as np
import pytest

from quarl.verdict import interval, judge, sequential_keeps


def test_the_interval_covers_a_known_loss_at_about_95_percent() -> None:
    """Returns spread 30 % from seed to seed (chaotic envs); the quantized policy loses a
    true 3 % plus its own noise on the same seeds."""
    rng = np.random.default_rng(7)
    trials, hits, widths = 200, 0, []
    for t in range(trials):
        fp32 = rng.normal(100, 30, 20)
        quant = fp32 - 3 + rng.normal(0, 5, 20)
        e, low, high = interval(fp32, quant, resamples=1999, seed=t)
        assert low <= e <= high
        hits += low <= 3.0 <= high
        widths.append(high - low)
    assert 0.89 <= hits / trials <= 0.99, hits / trials
    # pairing: the interval is set by the 5 % noise of the differences, not the 30 % spread
    assert np.median(widths) < 8


def test_pairing_by_seed_is_what_narrows_the_interval() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(100, 30, 20)
    paired = interval(fp32, fp32 - 1 + rng.normal(0, 1, 20))
    shuffled = interval(fp32, rng.permutation(fp32 - 1 + rng.normal(0, 1, 20)))
    assert paired[2] - paired[1] < (shuffled[2] - shuffled[1]) / 5


def test_verdicts() -> None:
    rng = np.random.default_rng(1)
    fp32 = rng.normal(200, 20, 20)
    assert judge(fp32, fp32 + rng.normal(0, 1, 20)).verdict == "keeps"
    assert judge(fp32, 0.8 * fp32).verdict == "loses"
    noisy = judge(fp32, fp32 * 0.95 + rng.normal(0, 40, 20))
    assert noisy.verdict == "undecided" and noisy.low < 5 < noisy.high
    assert noisy.episodes_to_decide is None or noisy.episodes_to_decide > 20
    assert judge(np.full(20, 500.0), np.full(20, 500.0)).verdict == "keeps"  # CartPole at its cap: exact
    assert judge(np.zeros(5), np.ones(5)).verdict == "n/a"  # fp32 averages 0: no relative error
    with pytest.raises(ValueError, match="equal"):
        judge(np.ones(3), np.ones(4))


def _player(returns: np.ndarray, played: list[int]):
    def play(n: int) -> np.ndarray:
        played.append(n)
        return returns[:n]
    return play


@pytest.mark.parametrize("shift,kept", [(0.0, True), (0.5, False)])
def test_the_sequential_test_stops_early_on_an_obvious_keep_and_an_obvious_loss(shift: float, kept: bool) -> None:
    rng = np.random.default_rng(2)
    fp32 = rng.normal(100, 10, 64)
    quant = fp32 * (1 - shift) + rng.normal(0, 0.1, 64)
    played: list[int] = []
    outcome = sequential_keeps(_player(fp32, []), _player(quant, played), cap=64)
    assert outcome.kept is kept and outcome.episodes == 4 and played == [4]


def test_the_sequential_test_plays_more_while_undecided_and_stops_at_the_cap() -> None:
    rng = np.random.default_rng(3)
    fp32 = rng.normal(100, 30, 64)
    quant = fp32 * 0.96 + rng.normal(0, 25, 64)  # a 4 % loss under heavy noise: undecided for long
    played: list[int] = []
    outcome = sequential_keeps(_player(fp32, []), _player(quant, played), first=4, cap=24)
    assert played == [4, 8, 16, 24] and outcome.episodes == 24  # doubling, then the cap
    assert outcome.verdict.verdict == "undecided" and outcome.kept is (outcome.verdict.e <= 5)


def test_the_episodes_an_undecided_verdict_asks_for_do_decide_it() -> None:
    rng = np.random.default_rng(4)
    fp32 = rng.normal(100, 20, 4000)
    quant = fp32 - 2 + rng.normal(0, 15, 4000)  # a true 2 % loss: keeps, given enough episodes
    first = judge(fp32[:20], quant[:20])
    assert first.verdict == "undecided" and "more episodes" in first.label()
    enough = first.episodes_to_decide
    assert 20 < enough < 4000
    assert judge(fp32[:enough], quant[:enough]).verdict == "keeps"


def test_returns_that_are_mostly_zero_give_an_interval_not_a_crash() -> None:
    """Resamples whose fp32 returns average 0 have no E (MinAtar Asterix: most episodes score 0)."""
    fp32 = np.array([0.0, 0.0, 3.0, 0.0])
    quant = np.array([0.0, 0.0, 1.0, 0.0])
    v = judge(fp32, quant)
    assert v.verdict in ("loses", "undecided") and v.e == pytest.approx(200 / 3)
    assert judge(np.array([0.0, 0.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0, 0.0])).verdict == "undecided"
    outcome = sequential_keeps(lambda n: np.zeros(n), lambda n: np.ones(n), cap=8)
    assert outcome.kept and outcome.verdict.verdict == "n/a"  # fp32 scores 0 everywhere: compared as returns
