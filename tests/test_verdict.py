"""The verdict on E: a paired bootstrap interval that covers a known loss at about its
stated rate, and a sequential test that stops as soon as the answer is clear."""

from __future__ import annotations

import numpy as np
import pytest

from quarl.verdict import games_of, interval, judge, sequential_keeps


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
    assert first.verdict == "undecided" and first.label() in (f"undecided (~{first.episodes_to_decide - 20} more "
                                                              "episodes)", "undecided after 20 episodes (E near 5 %)")
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


def test_episodes_that_replay_one_game_are_one_game() -> None:
    """Copies on either side join (transitively); distinct endings stay apart."""
    fp32 = ["a", "b", "a", "c", "d", "e"]
    quant = ["x", "y", "z", "y", "w", "w"]  # 1 and 3 replay one int8 game, 4 and 5 another
    assert games_of(fp32, quant).tolist() == [0, 1, 0, 1, 2, 2]
    assert games_of(list("abc"), list("xyz")).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="two equal lists"):
        games_of(["a"], [])


def test_replayed_games_add_no_confidence() -> None:
    """Four games, each replayed by ten seeds (a deterministic Atari policy on v4): counted as
    40 episodes the interval is narrow; as four games it is exactly the interval of the four
    games played once (E is a ratio of sums), and a verdict that needs the copies fails."""
    fp32_games = np.array([23.0, 12.0, 14.0, 17.0])
    quant_games = np.array([27.0, 12.0, 16.0, 17.0])
    fp32, quant = np.repeat(fp32_games, 10), np.repeat(quant_games, 10)
    games = games_of([str(r) for r in fp32], [str(r) for r in quant])
    assert games.max() == 3
    naive = interval(fp32, quant)
    honest = interval(fp32, quant, games=games)
    assert np.allclose(honest, interval(fp32_games, quant_games))
    assert np.allclose(honest, interval(fp32, quant, games=10 * games + 7))  # any labels, none empty
    assert honest[2] - honest[1] > 2 * (naive[2] - naive[1])
    # a loss of 3 % with a point of noise per game: "keeps" from 40 copies, not from 4 games
    lose = np.repeat(fp32_games * 0.97 + np.array([1.0, -1.0, 0.5, -0.5]), 10)
    lose_games = games_of([str(r) for r in fp32], [str(r) for r in lose])
    assert judge(fp32, lose).verdict == "keeps"
    honest_verdict = judge(fp32, lose, games=lose_games)
    assert honest_verdict.verdict == "undecided" and honest_verdict.games == 4
    assert honest_verdict.label().endswith("(4 distinct games of 40)")
    one = games_of(["g"] * 5, ["h"] * 5)  # every episode one game: nothing to generalize from
    assert judge(np.full(5, 10.0), np.full(5, 9.0), games=one).verdict == "undecided"


def test_the_table_judges_games_where_the_records_say_how_episodes_ended() -> None:
    from quarl.reports import verdict_columns

    fp32 = [23.0, 12.0, 14.0, 17.0] * 10
    quant = [r * 0.97 + n for r, n in zip(fp32, [1.0, -1.0, 0.5, -0.5] * 10)]
    base = {"mean": float(np.mean(fp32)), "returns": fp32, "endings": [f"f{r}" for r in fp32]}
    record = {"mean": float(np.mean(quant)), "returns": quant, "endings": [f"q{r}" for r in quant]}
    assert verdict_columns(base, record)["verdict"] == "undecided (~228 more episodes) (4 distinct games of 40)"

    older = {k: v for k, v in record.items() if k != "endings"}  # a record from before endings: episodes as before
    assert verdict_columns(base, older)["verdict"] == "keeps"
    crafted = {**record, "endings": [[1]] * 40}  # not digests: ignored, not a crash
    assert verdict_columns(base, crafted)["verdict"] == "keeps"

def test_an_estimate_far_beyond_the_episodes_played_is_not_printed_as_a_plan() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(100, 30, 20)
    near = judge(fp32, fp32 * 0.948 + rng.normal(0, 3, 20))  # E 5.0 %: an estimate of millions of episodes
    assert near.verdict == "undecided" and near.episodes_to_decide > 10 * 20
    assert near.label() == "undecided after 20 episodes (E near 5 %)"


def test_ptq_plays_more_episodes_until_the_verdict_decides_and_a_rerun_reuses_them(tmp_path) -> None:
    """A random Pendulum policy at sim4: undecided over 4 episodes; --decide-episodes plays
    4, 8 more (fp32 too, on the next seeds) until it keeps; a rerun plays nothing again."""
    import gymnasium as gym
    import torch
    from torch import nn

    from quarl.envs import EnvSpec
    from quarl.measure import EvalSettings
    from quarl.policies.base import Policy
    from quarl.ptq import run_ptq
    from quarl.reports import ptq_rows

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 1), nn.Tanh())
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32),
                    "unscale")
    settings = EvalSettings(episodes=4, n_envs=4)
    spec = EnvSpec("Pendulum-v1")
    plain = {r["precision"]: r for r in ptq_rows(run_ptq(policy, spec, ["sim4"], settings, tmp_path / "plain"))}
    assert plain["sim4"]["verdict"].startswith("undecided")
    records = run_ptq(policy, spec, ["sim4"], settings, tmp_path / "decide", decide_episodes=64)
    rows = {r["precision"]: r for r in ptq_rows(records)}
    assert rows["sim4"]["verdict"] == "keeps"
    by = {r["precision"]: r for r in records}
    assert len(by["sim4"]["returns"]) == len(by["fp32"]["returns"]) == 16  # 4, then 4 and 8 more
    assert np.mean(by["fp32"]["returns"][:4]) == pytest.approx(plain["fp32"]["mean"], abs=0.01)  # seeds 0..3 first
    log = (tmp_path / "decide" / "results.jsonl").read_text().splitlines()
    again = run_ptq(policy, spec, ["sim4"], settings, tmp_path / "decide", decide_episodes=64)
    assert (tmp_path / "decide" / "results.jsonl").read_text().splitlines() == log  # every chunk reused
    assert [r["returns"] for r in again] == [r["returns"] for r in records]
