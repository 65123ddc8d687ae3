"""The verdict on E: a confidence sequence that covers a known loss at its stated rate at
every episode count and under repeated looks, sees failures it has not met, and a
sequential test that stops as soon as the answer is clear."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from quarl.verdict import episodes_to_decide, games_of, interval, judge, sequential_at_least, sequential_keeps
from quarl.verdict.betting import TRUNCATION, max_log_capital, predmix_bets
from quarl.verdict.bounds import ENV_RETURN_BOUNDS, parse_range, return_range


def _reference_log_capital(x: list[float], m: float, alpha: float, upward: bool) -> float:
    """Waudby-Smith & Ramdas's hedged capital written as a plain loop (eq. 26 bets)."""
    total, peak, s, sq = 0.0, 0.0, 0.0, 0.0
    mus: list[float] = []
    for t, value in enumerate(x, start=1):
        sigma2_prev = (0.25 + sq) / t  # t - 1 observations and one fake
        bet = math.sqrt(2 * math.log(1 / alpha) / (t * math.log(1 + t) * sigma2_prev))
        bet = min(bet, TRUNCATION / m) if upward else min(bet, TRUNCATION / (1 - m))
        total += math.log(1 + bet * (value - m)) if upward else math.log(1 - bet * (value - m))
        peak = max(peak, total)
        s += value
        mu = min((0.5 + s) / (t + 1), 1.0)
        mus.append(mu)
        sq += (value - mu) ** 2
    return peak


@pytest.mark.parametrize("upward", [True, False])
def test_the_capital_process_equals_a_plain_loop_of_the_papers_formula(upward: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (3, 40)) ** 2
    m = np.array([0.2, 0.33, 0.6])
    got = max_log_capital(x, m, 0.025, upward)
    want = [_reference_log_capital(list(row), float(mi), 0.025, upward) for row, mi in zip(x, m, strict=True)]
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert predmix_bets(np.full((1, 3), 0.5), 0.05)[0, 0] == pytest.approx(
        math.sqrt(2 * math.log(20) / (math.log(2) * 0.25)))


def test_the_interval_covers_a_known_loss_at_every_episode_count() -> None:
    """Returns spread 30 % from seed to seed; the quantized policy loses a true 3 % plus
    its own noise on the same seeds: the interval holds 3 % in at least 95 % of samples at
    each N (it is conservative), and is never zero-wide."""
    rng = np.random.default_rng(7)
    for n in (1, 5, 20, 100):
        hits, widths = 0, []
        for _ in range(200):
            fp32 = rng.normal(100, 30, n)
            quant = fp32 - 3 + rng.normal(0, 5, n)
            e, low, high = interval(fp32, quant)
            hits += low <= 3.0 <= high
            widths.append(high - low)
        assert hits / 200 >= 0.95, (n, hits)
        assert min(widths) > 0
    assert np.median(widths) < 12  # at 100 episodes: narrow enough to decide a 3 % loss soon


def test_pairing_by_seed_is_what_narrows_the_interval() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(100, 30, 200)
    quant = fp32 - 1 + rng.normal(0, 1, 200)
    paired = interval(fp32, quant)
    shuffled = interval(fp32, rng.permutation(quant))
    assert paired[2] - paired[1] < (shuffled[2] - shuffled[1]) / 3


def test_one_episode_never_decides_and_says_how_many_would() -> None:
    """The issue's case: one episode said *keeps* with the zero-width [1.17, 1.17] %."""
    v = judge(np.array([5830.0]), np.array([5762.0]))
    assert v.verdict == "undecided" and v.high - v.low > 50
    for f, q in ((250.0, -50.0), (250.0, 900.0), (-80.0, -500.0)):  # one episode, however lopsided, decides nothing
        assert judge(np.array([f]), np.array([q])).verdict == "undecided", (f, q)
    assert v.episodes_to_decide is not None and v.episodes_to_decide > 20
    assert v.label().startswith("undecided (~")


def test_clean_episodes_must_be_many_enough_to_exclude_an_unseen_failure() -> None:
    """CartPole played identically at its cap: no failure seen, but one could cost the whole
    500. Keeping within 5 % needs enough clean episodes to rule out a failure rate of 5 %
    (log(20) / 0.05 = 60 at the least, one-sided); it then keeps, and says when before.
    The issue's acceptance: 100 identical CartPole episodes at 500 keep."""
    first = judge(np.full(5, 500.0), np.full(5, 500.0), env_id="CartPole-v1")
    assert first.verdict == "undecided"
    assert 60 <= first.episodes_to_decide <= 100
    assert judge(np.full(first.episodes_to_decide, 500.0), np.full(first.episodes_to_decide, 500.0),
                 env_id="CartPole-v1").verdict == "keeps"
    assert judge(np.full(200, 500.0), np.full(200, 500.0), env_id="CartPole-v1").verdict == "keeps"
    hundred = judge(np.full(100, 500.0), np.full(100, 500.0), env_id="CartPole-v1")
    assert hundred.verdict == "keeps" and hundred.bound < 5 and hundred.returns.source == "env"


def test_the_envs_own_range_insures_against_a_failure_not_yet_seen() -> None:
    """The issue's acceptance: 160 identical clean Acrobot and Pendulum episodes are not
    *keeps* (a time-out at -500, a failed swing-up at -1,300 are within their ranges, and
    160 clean episodes cannot rule out a rate of them that costs 5 %), where the rule that
    widens what was seen by one mean return said *keeps*."""
    rng = np.random.default_rng(3)
    acrobot = np.clip(rng.normal(-80, 12, 160), -500, -60)
    pendulum = np.clip(rng.normal(-160, 60, 160), -400, -1)
    for env_id, returns in (("Acrobot-v1", acrobot), ("Pendulum-v1", pendulum)):
        v = judge(returns, returns.copy(), env_id=env_id)
        assert v.verdict == "undecided" and v.returns.source == "env", (env_id, v)
        assert v.episodes_to_decide is not None and v.episodes_to_decide > 300
        insured = judge(returns, returns.copy())  # no env named: insured against one mean return only
        assert insured.verdict == "keeps" and insured.returns.source == "insured"

def test_verdicts() -> None:
    rng = np.random.default_rng(1)
    fp32 = rng.normal(200, 20, 300)
    assert judge(fp32, fp32 + rng.normal(0, 1, 300)).verdict == "keeps"
    assert judge(fp32[:40], 0.6 * fp32[:40]).verdict == "loses"
    noisy = judge(fp32, fp32 * 0.95 + rng.normal(0, 40, 300))
    assert noisy.verdict == "undecided" and noisy.low < 5 < noisy.high
    assert judge(np.zeros(5), np.ones(5)).verdict == "n/a"  # fp32 averages 0: no relative error
    with pytest.raises(ValueError, match="equal"):
        judge(np.ones(3), np.ones(4))


def test_the_return_range_is_the_envs_where_it_is_defined_and_a_user_range_wins() -> None:
    env = return_range(np.full(4, 500.0), np.full(4, 500.0), "CartPole-v1")
    # exactly the env's range: fp32 and quantized in 0..500, a pair may part by the whole 500 either way
    assert env.as_tuple() == (0.0, 500.0, -500.0, 500.0, 0.0, 500.0) and env.source == "env"
    assert env.label() == "env 0:500" and "env allows" in env.insures()
    free = return_range(np.array([100.0, 120.0]), np.array([90.0, 130.0]), "HalfCheetah-v4")
    # both returns share 90..130 widened by one mean return (110 at the second episode; 100 at the first)
    assert free.as_tuple() == (90.0 - 110, 130.0 + 110, -10.0 - 110, 10.0 + 110, 90.0 - 110, 130.0 + 110)
    assert free.source == "insured" and free.insure == 1.0 and free.label() == "insure 1: -20:240"
    twice = return_range(np.array([100.0, 120.0]), np.array([90.0, 130.0]), "HalfCheetah-v4", insure=2.0)
    assert twice.d_hi == 10.0 + 220 and "2 mean returns" in twice.insures()
    fp32_failed = return_range(np.array([1000.0]), np.array([5800.0]))  # one episode in which fp32 fell
    assert fp32_failed.d_hi == 0.0 + 5800  # a tie stays possible, and a loss of one (quantized) mean return beyond it
    user = return_range(np.ones(2), np.ones(2), "CartPole-v1", given=(-1.0, 2.0))
    assert user.as_tuple() == (-1.0, 2.0, -3.0, 3.0, -1.0, 2.0) and user.source == "given"
    rescaled = return_range(np.full(3, 900.0), np.full(3, 900.0), "CartPole-v1")  # a wrapper's rewards: insured
    assert rescaled.f_hi > 900 and rescaled.source == "insured"
    assert ENV_RETURN_BOUNDS["Pendulum-v1"][0] == pytest.approx(-3254.7, abs=0.1)
    assert parse_range("-200:0") == (-200.0, 0.0)
    with pytest.raises(ValueError, match="LO:HI"):
        parse_range("5:1")


def test_a_given_range_the_returns_break_refuses_the_verdict_and_ranges_only_widen() -> None:
    from quarl.core.errors import QuarlError
    from quarl.evaluation.reports import paired_verdict
    from quarl.verdict import Judging, ReturnsOutsideRange, check_insure

    with pytest.raises(ReturnsOutsideRange, match="a return of 600 lies outside --return-range 0:500"):
        judge(np.full(5, 500.0), np.array([500.0, 500.0, 600.0, 500.0, 500.0]), returns=(0.0, 500.0))
    with pytest.raises(QuarlError, match="int8: a return of 600 lies outside"):  # what the commands print in one line
        paired_verdict({"returns": [500.0] * 3, "precision": "fp32"}, {"returns": [500.0, 600.0, 500.0],
                       "precision": "int8"}, Judging(return_range=(0.0, 500.0)))
    for bad in (-1.0, math.nan, math.inf, 1e9):
        with pytest.raises(ValueError, match="--insure"):
            check_insure(bad)
    rng = np.random.default_rng(0)
    fp32 = rng.normal(100, 10, 200)
    quant = fp32 + rng.normal(0, 5, 200)
    quant[150] = -400.0  # a failure costing 5 mean returns, late
    earlier = None
    for n in range(1, 201, 7):  # the range implied at each look holds the one before it
        now = return_range(fp32[:n], quant[:n])
        if earlier is not None:
            assert now.f_lo <= earlier.f_lo and now.f_hi >= earlier.f_hi
            assert now.d_lo <= earlier.d_lo and now.d_hi >= earlier.d_hi
        earlier = now
    # once the failure is seen, the range reaches it: every look is re-judged under it
    assert return_range(fp32, quant).d_hi >= fp32[150] + 400


def test_deciding_by_repeated_looks_keeps_the_error_rate() -> None:
    """A true E of exactly 5 % (on the line): any decided verdict is wrong. Looked at every
    10 episodes up to 640, each side one-sided at 5 %, stopping at the first decision, at
    most 5 % of streams decide."""
    from quarl.verdict.betting import decisions
    from quarl.verdict.bounds import ranges

    rng = np.random.default_rng(11)
    streams, cap = 300, 640
    fp32 = rng.normal(100, 20, (streams, cap))
    quant = 0.95 * fp32 + rng.normal(0, 10, (streams, cap))  # E's truth: 5 % (means 100 and 95)
    decided = np.zeros(streams, bool)
    for look in range(10, cap + 1, 10):
        open_ = np.flatnonzero(~decided)
        f, q = fp32[open_, :look], quant[open_, :look]
        decided[open_] = decisions(f, q, 5.0, ranges(f, q)) != 0
    assert decided.mean() <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / streams)


def _player(returns: np.ndarray, played: list[int]):
    def play(n: int) -> np.ndarray:
        played.append(n)
        return returns[:n]
    return play


def test_the_sequential_test_stops_early_on_an_obvious_loss_and_plays_on_for_a_keep() -> None:
    rng = np.random.default_rng(2)
    fp32 = rng.normal(100, 10, 512)
    played: list[int] = []
    lost = sequential_keeps(_player(fp32, []), _player(fp32 * 0.3, played), first=8, cap=512)
    assert not lost.kept and lost.verdict.verdict == "loses" and played == [8]
    played = []
    kept = sequential_keeps(_player(fp32, []), _player(fp32 + rng.normal(0, 0.1, 512), played), first=8, cap=512)
    assert kept.kept and kept.verdict.verdict == "keeps" and 8 < kept.episodes <= 512 and not kept.estimate
    assert played == [8 * (k + 1) for k in range(len(played))]  # a look every 8 episodes
    assert kept.label() == "keeps"


def test_the_sequential_test_stops_at_the_cap_and_strict_says_not_kept() -> None:
    rng = np.random.default_rng(3)
    fp32 = rng.normal(100, 30, 64)
    quant = fp32 * 0.97 + rng.normal(0, 25, 64)
    played: list[int] = []
    outcome = sequential_keeps(_player(fp32, []), _player(quant, played), first=4, cap=24)
    assert played == [4, 8, 12, 16, 20, 24] and outcome.episodes == 24
    assert outcome.verdict.verdict == "undecided" and outcome.kept is (outcome.verdict.e <= 5)
    # a choice by the point estimate says so: never "keeps" without a decided verdict
    assert outcome.estimate and outcome.label().startswith("estimate: E ") and "undecided" in outcome.label()
    strict = sequential_keeps(_player(fp32, []), _player(quant, []), first=4, cap=24, strict=True)
    assert not strict.kept and not strict.estimate


def test_a_challenger_is_chosen_only_where_it_is_shown_no_worse() -> None:
    """The repair's rule: the distilled student replaces PTQ's model only where the paired
    test says it scores more, or both play alike."""
    rng = np.random.default_rng(5)
    ptq = rng.normal(100, 10, 256)
    assert sequential_at_least(_player(ptq, []), _player(ptq + 40, []), cap=256).kept
    assert not sequential_at_least(_player(ptq, []), _player(ptq - 30, []), cap=256).kept
    assert not sequential_at_least(_player(ptq, []), _player(ptq + rng.normal(0, 5, 256), []), cap=256).kept
    assert sequential_at_least(_player(ptq, []), _player(ptq.copy(), []), cap=256).kept  # the same play


def test_the_episodes_an_undecided_verdict_asks_for_do_decide_it() -> None:
    rng = np.random.default_rng(4)
    fp32 = rng.normal(100, 20, 6000)
    quant = fp32 - 2 + rng.normal(0, 15, 6000)  # a true 2 % loss: keeps, given enough episodes
    first = judge(fp32[:100], quant[:100])
    assert (first.verdict == "undecided"
            and first.label() == f"undecided (~{first.episodes_to_decide - 100} more episodes)")
    enough = first.episodes_to_decide
    assert 100 < enough < 3000
    assert judge(fp32[:2 * enough], quant[:2 * enough]).verdict == "keeps"  # an estimate from 20 episodes: within 2x
    assert episodes_to_decide(np.full(3, 100.0), np.full(3, 95.0), return_range(np.full(3, 100.0), np.full(3, 95.0))) \
        is None  # E exactly on the line: nothing decides


def test_returns_that_are_mostly_zero_give_an_interval_not_a_crash() -> None:
    """MinAtar Asterix: most episodes score 0."""
    fp32 = np.array([0.0, 0.0, 3.0, 0.0])
    quant = np.array([0.0, 0.0, 1.0, 0.0])
    v = judge(fp32, quant)
    assert v.verdict == "undecided" and v.e == pytest.approx(200 / 3)
    assert judge(np.array([0.0, 0.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0, 0.0])).verdict == "undecided"
    outcome = sequential_keeps(lambda n: np.zeros(n), lambda n: np.ones(n), cap=8)
    assert outcome.kept and outcome.verdict.verdict == "n/a"  # fp32 scores 0 everywhere: compared as returns


def test_episodes_that_replay_one_game_are_one_game() -> None:
    """Copies on either side join (transitively); distinct endings stay apart."""
    fp32 = ["a", "b", "a", "c", "d", "e"]
    quant = ["x", "y", "z", "y", "w", "w"]  # 1 and 3 replay one int8 game, 4 and 5 another
    assert games_of(fp32, quant).tolist() == [0, 1, 0, 1, 2, 2]
    assert games_of(list("abc"), list("xyz")).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="two equal lists"):
        games_of(["a"], [])


def test_replayed_games_add_no_confidence() -> None:
    """Eight games, each replayed by twenty seeds (a deterministic Atari policy on v4):
    counted as 160 episodes the interval is narrow; as eight games it is exactly the
    interval of the eight games played once, and a verdict that needs the copies fails."""
    fp32_games = np.array([23.0, 12.0, 14.0, 17.0, 19.0, 21.0, 15.0, 18.0])
    quant_games = fp32_games.copy()
    fp32, quant = np.tile(fp32_games, 20), np.tile(quant_games, 20)
    games = games_of([str(r) for r in fp32], [str(r) for r in quant])
    assert games.max() == 7
    naive = interval(fp32, quant)
    honest = interval(fp32, quant, games=games)
    assert np.allclose(honest, interval(fp32_games, quant_games))
    assert np.allclose(honest, interval(fp32, quant, games=10 * games + 7))  # any labels, none empty
    assert honest[2] - honest[1] > 2 * (naive[2] - naive[1])
    assert judge(fp32, quant).verdict == "keeps"
    honest_verdict = judge(fp32, quant, games=games)
    assert honest_verdict.verdict == "undecided" and honest_verdict.games == 8
    assert honest_verdict.label().endswith("(8 distinct games of 160)")


def test_the_table_judges_games_where_the_records_say_how_episodes_ended() -> None:
    from quarl.evaluation.reports import verdict_columns

    fp32 = [23.0, 12.0, 14.0, 17.0, 19.0, 21.0, 15.0, 18.0] * 20
    base = {"mean": float(np.mean(fp32)), "returns": fp32, "endings": [f"f{r}" for r in fp32]}
    record = {"mean": float(np.mean(fp32)), "returns": list(fp32), "endings": [f"q{r}" for r in fp32]}
    assert verdict_columns(base, record)["verdict"].startswith("undecided (~")
    assert verdict_columns(base, record)["verdict"].endswith("(8 distinct games of 160)")
    older = {k: v for k, v in record.items() if k != "endings"}  # a record from before endings: episodes as before
    assert verdict_columns(base, older)["verdict"] == "keeps"
    crafted = {**record, "endings": [[1]] * 160}  # not digests: ignored, not a crash
    assert verdict_columns(base, crafted)["verdict"] == "keeps"


def test_an_estimate_far_beyond_the_episodes_played_is_not_printed_as_a_plan() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(100, 30, 400)
    near = judge(fp32, fp32 * 0.949 + rng.normal(0, 3, 400))  # E 5.1 %: an estimate of many thousands of episodes
    assert near.verdict == "undecided"
    assert near.episodes_to_decide is None or near.episodes_to_decide > 10 * 400
    assert near.label() == "undecided after 400 episodes (E near 5 %)"


def test_ptq_plays_more_episodes_until_the_verdict_decides_and_a_rerun_reuses_them(tmp_path) -> None:
    """A DQN-like CartPole policy that stays up at fp32 and fp16 alike: undecided over 8
    episodes; deciding plays 10 more at a time (fp32 too, on the next seeds) until it
    keeps; a rerun plays nothing again."""
    import gymnasium as gym
    import torch
    from torch import nn

    from quarl.envs import EnvSpec
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.reports import ptq_rows
    from quarl.policies.base import Policy
    from quarl.ptq.run import run_ptq

    net = nn.Linear(4, 2)
    with torch.no_grad():  # push right when the pole leans right, on angle and angular velocity
        net.weight.copy_(torch.tensor([[-0.1, -0.5, -1.0, -1.0], [0.1, 0.5, 1.0, 1.0]]))
        net.bias.zero_()
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax")
    settings = EvalSettings(episodes=8, n_envs=8)
    spec = EnvSpec("CartPole-v1")
    plain = {r["precision"]: r for r in ptq_rows(run_ptq(policy, spec, ["fp16"], settings, tmp_path / "plain"))}
    assert plain["fp32"]["mean"] == 500 and plain["fp16"]["verdict"].startswith("undecided")
    records = run_ptq(policy, spec, ["fp16"], settings, tmp_path / "decide", decide_episodes=256)
    rows = {r["precision"]: r for r in ptq_rows(records)}
    assert rows["fp16"]["verdict"] == "keeps"
    by = {r["precision"]: r for r in records}
    # 8, 18, 28, ...: 500 on every episode keeps from about 65 (one-sided, the env's range 0:500)
    assert len(by["fp16"]["returns"]) == len(by["fp32"]["returns"]) == 68
    assert all(r["verdict"] == "keeps" or r["precision"] == "fp32" for r in rows.values())
    assert rows["fp16"]["range"] == "env 0:500"
    log = (tmp_path / "decide" / "results.jsonl").read_text().splitlines()
    again = run_ptq(policy, spec, ["fp16"], settings, tmp_path / "decide", decide_episodes=256)
    assert (tmp_path / "decide" / "results.jsonl").read_text().splitlines() == log  # every chunk reused
    assert [r["returns"] for r in again] == [r["returns"] for r in records]


def test_quarl_judge_on_a_hand_written_csv_gives_ptqs_verdict(tmp_path) -> None:
    """The issue's acceptance: ``quarl judge`` on a CSV of the returns ptq played gives the
    same E, interval, verdict and range as ptq's table; the API function is the same."""
    import gymnasium as gym
    import torch
    from conftest import run_cli
    from torch import nn

    import quarl
    from quarl.envs import EnvSpec
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.reports import ptq_rows
    from quarl.policies.base import Policy
    from quarl.ptq.run import run_ptq

    net = nn.Linear(4, 2)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[-0.1, -0.5, -1.0, -1.0], [0.1, 0.5, 1.0, 1.0]]))
        net.bias.zero_()
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax")
    records = run_ptq(policy, EnvSpec("CartPole-v1"), ["sim3"], EvalSettings(episodes=30, n_envs=8), tmp_path / "ptq")
    row = next(r for r in ptq_rows(records) if r["precision"] == "sim3")
    by = {r.precision: r for r in records}
    csv_path = tmp_path / "returns.csv"
    csv_path.write_text("seed,reference,candidate\n" + "".join(
        f"{i},{f},{q}\n" for i, (f, q) in enumerate(zip(by["fp32"]["returns"], by["sim3"]["returns"], strict=True))))
    result = run_cli("judge", str(csv_path), "--env", "CartPole-v1")
    assert result.returncode == 0, result.stderr
    assert f"E {row['E%']:.2f} % of the reference's return lost, 95 % interval [{row['E lo']:.2f}, {row['E hi']:.2f}]" \
        in result.stdout
    assert f"verdict: {str(row['verdict']).split(' ')[0]}" in result.stdout
    assert f"range: {row['range']}, insured against" in result.stdout
    api = quarl.judge(by["fp32"]["returns"], by["sim3"]["returns"], env_id="CartPole-v1")
    assert round(api.e, 2) == row["E%"] and api.label() == row["verdict"]


@pytest.mark.parametrize("text, says", [
    ("seed,fp32,int8\n0,1,1\n", "header 'seed,fp32,int8': allowed seed,reference,candidate"),
    ("seed,reference,candidate\n", "no rows after the header"),
    ("seed,reference,candidate\n0,1,1\n0,2,2\n", "seed 0 appears twice"),
    ("seed,reference,candidate\n0,abc,1\n", "line 2: '0,abc,1': allowed an integer seed and two numbers"),
    ("seed,reference,candidate\n0,nan,1\n", "line 2: returns must be finite numbers"),
    ("seed,reference,candidate\n0,1\n", "line 2: 2 fields, allowed 3"),
    ("\xff\xfe\x00", "not a text file"),
])
def test_quarl_judge_refuses_a_bad_returns_file_in_one_line(tmp_path, text: str, says: str) -> None:
    from conftest import run_cli

    path = tmp_path / "bad.csv"
    path.write_bytes(text.encode("latin-1"))
    result = run_cli("judge", str(path))
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
        result.stderr
    assert run_cli("judge", str(tmp_path)).returncode == 2  # a folder
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    assert "is a named pipe, not a regular file" in run_cli("judge", str(fifo)).stderr  # refused, never read: no hang
    big = tmp_path / "big.csv"
    with big.open("wb") as fh:  # a sparse file past the cap: refused by its size, never read
        fh.truncate((64 << 20) + 1)
    assert "has 67108865 bytes, more than the 67108864 allowed" in run_cli("judge", str(big)).stderr


def test_the_judge_api_checks_its_input() -> None:
    import quarl
    from quarl.core.errors import QuarlError

    with pytest.raises(QuarlError, match="pair one to one: got 2 and 3"):
        quarl.judge([1, 2], [1, 2, 3])
    with pytest.raises(QuarlError, match="not a finite number"):
        quarl.judge([1, float("nan")], [1, 2])
    with pytest.raises(QuarlError, match="return_range"):
        quarl.judge([1, 2], [1, 2], return_range=(3, 1))
    assert quarl.judge([500.0] * 100, [500.0] * 100, env_id="CartPole-v1").verdict == "keeps"


def test_ptq_says_what_its_verdicts_insure_and_refuses_a_range_its_returns_break(tiny_run, tmp_path) -> None:
    """The range column and the line under the table; ``--return-range`` the returns break:
    one line, exit 2, the finished cells kept (a rerun with a right range reuses them)."""
    from conftest import run_cli

    out = tmp_path / "out"
    args = ("ptq", str(tiny_run), "--precisions", "fp32,fp16", "--episodes", "3", "--out", str(out))
    broken = run_cli(*args, "--return-range", "0:5")
    assert broken.returncode == 2 and "lies outside --return-range 0:5" in broken.stderr
    (line,) = [line for line in broken.stderr.splitlines() if "━" not in line]  # the progress bars, then one line
    assert re.fullmatch(r"error: fp16: a return of [\d.]+ lies outside --return-range 0:5: the verdict needs a range "
                        r"every return lies in \(widen it, or leave it out\)", line), line
    kept = len((out / "results.jsonl").read_text().splitlines())
    assert kept == 2  # both cells finished and stored before the verdict was refused
    fine = run_cli(*args, "--insure", "2")
    assert fine.returncode == 0, fine.stderr
    assert "insured against every return the env allows (its defined range)" in fine.stdout  # CartPole: its own
    assert "env 0:500" in fine.stdout and "reused 2 finished cells" in fine.stdout
    assert run_cli(*args, "--insure", "-3").returncode == 2
    assert "--return-range 'a:b' must be LO:HI" in run_cli(*args, "--return-range", "a:b").stderr


def test_the_docs_judge_example(tmp_path) -> None:
    """docs/ptq.md's `quarl judge` example: its CSV, run as the doc shows, prints the doc's block."""
    from conftest import ROOT, run_cli

    page = (ROOT / "docs" / "ptq.md").read_text()
    section = page[page.index("### `quarl judge`"):page.index("### What a verdict is worth")]
    csv_text = section.split("```csv\n", 1)[1].split("```", 1)[0]
    shown = section.split("<!-- made-by: tests/test_verdict.py::test_the_docs_judge_example -->\n\n```\n", 1)[1]
    shown = shown.split("```", 1)[0]
    (tmp_path / "returns.csv").write_text(csv_text)
    result = run_cli("judge", str(tmp_path / "returns.csv"), "--env", "LunarLander-v3")
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


def test_the_deciding_looks_decide_as_the_whole_verdict_does() -> None:
    """decision() (two capital processes, what ptq's, study's and the sequential tests' looks
    ask) says what judge() says, on samples that keep, lose, straddle, replay games and average 0."""
    from quarl.verdict import decision

    rng = np.random.default_rng(9)
    for trial in range(60):
        n = int(rng.integers(1, 200))
        fp32 = rng.normal(100, 30, n)
        quant = fp32 * (1 - rng.uniform(-0.1, 0.3)) + rng.normal(0, rng.uniform(0, 20), n)
        games = rng.integers(0, max(1, n // 2), n) if trial % 3 == 0 else None
        env = "CartPole-v1" if trial % 4 == 0 else None
        if env:
            fp32, quant = np.clip(fp32, 0, 500), np.clip(quant, 0, 500)
        assert decision(fp32, quant, games=games, env_id=env) == judge(fp32, quant, games=games, env_id=env).verdict
    assert decision(np.zeros(4), np.ones(4)) == "n/a"
