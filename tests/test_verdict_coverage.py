"""The coverage harness on real return pools (tests/data/return_pools, made by
benchmarks/make_return_pools.py) and on synthetic pools with rare large failures: quarl's
verdict holds its stated error rates (coverage >= 95 %, wrong <= 5 %, within Monte Carlo
error) at every episode count and under the deciding schedule on every pool its insurance
covers; the bootstrap it replaced does not; the pools it does not cover can fool it, as the
docs say."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from quarl.verdict.coverage import SIZES, Pool, fixed_n, load_pools, schedule, sequential, synthetic_pools, table

POOLS = load_pools(Path(__file__).parent / "data" / "return_pools")
SYNTHETIC = synthetic_pools(real=POOLS)
COVERED = [p for p in POOLS + SYNTHETIC if p.covered()]
DRAWS = 100
MC = 2 * math.sqrt(0.05 * 0.95 / DRAWS)  # two Monte Carlo standard errors at the 5 % line
STREAMS = 200
MC_SEQ = 2 * math.sqrt(0.05 * 0.95 / STREAMS)


def _id(pool: Pool) -> str:
    return f"{pool.name}-{pool.precision}"


def test_the_pools_are_real_and_span_the_cases() -> None:
    """At least 6 agents, 500+ paired episodes each; E below, near and above 5 %; a pool
    with rare failures and one where the quantized policy plays identically."""
    assert len({p.name for p in POOLS}) >= 6
    assert all(len(p.fp32) >= 500 for p in POOLS)
    es = [p.e for p in POOLS]
    assert min(es) < 1 and max(es) > 10 and any(2 <= e <= 8 for e in es)
    heavy = [p for p in POOLS if 0.005 < _failures(p) < 0.1 and p.e < 5]
    assert heavy, "a pool with rare failures"
    assert any(np.array_equal(p.fp32, p.quant) for p in POOLS), "a tied pool"


@pytest.mark.parametrize("pool", COVERED, ids=_id)
def test_the_confidence_sequence_holds_its_error_rates_at_every_n_and_under_deciding(pool: Pool) -> None:
    """Every covered pool, real or synthetic: coverage >= 95 % and wrong <= 5 % within two
    Monte Carlo standard errors, at fixed sizes and under the deciding schedule (a look every
    10 episodes, 20 to 640)."""
    for n in SIZES:
        r = fixed_n(pool, "cs", n, DRAWS, seed=n)
        assert r.coverage >= 0.95 - MC and r.wrong <= 0.05 + MC, (n, r)
    r = sequential(pool, "cs", 20, 640, STREAMS, seed=1)  # the benchmark runs 1,000
    assert r.coverage >= 0.95 - MC_SEQ and r.wrong <= 0.05 + MC_SEQ, r


def test_the_synthetic_pools_span_rare_large_failures_and_the_uncovered_ones_can_fool_it() -> None:
    """The issue's harness: failures 1 in 30 / 100 / 300 costing 1, 3, 6 and 20 mean returns,
    Acrobot time-outs and Pendulum failed swing-ups (covered: the envs' own ranges), identical
    play and small noise. A failure costing 6 mean returns once in 100 episodes (E 6 %) is
    beyond the default insurance and is called *keeps* far more than 5 % of the time; insured
    against it (--insure 7), it is not."""
    names = {p.name for p in SYNTHETIC}
    assert {f"1 in {k} costs {c:g}" for k in (30, 100, 300) for c in (1, 3, 6, 20)} <= names
    assert {"identical", "Acrobot-v1 times out 1 in 100", "Pendulum-v1 never swings up 1 in 100"} <= names
    rare = next(p for p in SYNTHETIC if p.name == "1 in 100 costs 6")
    assert 5 < rare.e < 7 and not rare.covered() and rare.covered(insure=7.0)
    fooled = sequential(rare, "cs", 20, 640, STREAMS, seed=3)
    assert fooled.wrong > 0.2, fooled
    insured = sequential(rare, "cs", 20, 640, STREAMS, seed=3, insure=7.0)
    assert insured.wrong <= 0.05 + MC_SEQ and insured.coverage >= 0.95 - MC_SEQ, insured
    for name in ("Acrobot-v1 times out 1 in 100", "Pendulum-v1 never swings up 1 in 100"):
        pool = next(p for p in SYNTHETIC if p.name == name)
        assert pool.e > 5 and pool.covered()  # a loss (near the line): rarely called keeps
        assert sequential(pool, "cs", 20, 640, STREAMS, seed=4).wrong <= 0.05 + MC_SEQ


def test_median_episodes_to_decide_on_the_issues_pairs() -> None:
    """The issue's targets, one-sided tests looked at every 10 episodes: identical play keeps
    in at most 100 episodes (median), E = 2.5 % with a difference sd of 2 % in at most 200."""
    by = {p.name: p for p in SYNTHETIC}
    assert sequential(by["identical"], "cs", 20, 640, STREAMS, seed=5).median_to_decide <= 100
    assert sequential(by["noise E 1 sd 2"], "cs", 20, 640, STREAMS, seed=5).median_to_decide <= 120
    assert sequential(by["noise E 2.5 sd 2"], "cs", 20, 640, STREAMS, seed=5).median_to_decide <= 200


def _failures(pool: Pool) -> float:
    """How often the quantized policy falls: an episode that loses more than half of fp32's
    median return, against that median (sign-aware: Pendulum's and Acrobot's are negative)."""
    median = float(np.median(pool.fp32))
    return float(np.mean(pool.quant < median - 0.5 * abs(median)))


def _heavy() -> Pool:
    """The issue's pool: the zoo's PPO HalfCheetah at sim4 falls in about 1 episode of 45
    (0..2,000 instead of ~5,800) while keeping E under the line."""
    pool = next(p for p in POOLS if (p.name, p.precision) == ("ppo-HalfCheetah-v4", "sim4"))
    assert 0.005 < _failures(pool) < 0.1 and pool.e < 5
    return pool


def test_the_bootstrap_it_replaced_fails_on_rare_failures_at_five_episodes() -> None:
    """The issue's case: five episodes rarely hold a failure, so BCa's "95 %" interval
    misses the pool's E far more than 5 % of the time, where the sequence does not."""
    pool = _heavy()
    bca = fixed_n(pool, "bca", 5, 100, seed=5)
    assert bca.coverage < 0.8, bca
    assert fixed_n(pool, "cs", 5, 100, seed=5).coverage >= 0.95
    t = fixed_n(pool, "t", 5, DRAWS, seed=5)
    assert t.coverage < 0.8, t


def test_one_episode_decides_nothing_on_any_pool() -> None:
    for pool in POOLS:
        assert fixed_n(pool, "cs", 1, 100, seed=0).decided == 0.0, _id(pool)


def test_deciding_decides_most_clear_cases_within_the_default_budget() -> None:
    """Power, not only validity: pools far from the line decide under the default schedule,
    most of them nearly always (the noisiest, Acrobot's int8 at E = -0.2 %, in about 2 of 3).
    Pendulum's own range (-3,254.7..0, twenty mean returns) is the exception: keeping needs
    about 1,300 clean episodes, beyond 640, and it decides within 2,000."""
    clear = [p for p in POOLS if (p.e < 1 or p.e > 15) and not (p.env_id == "Pendulum-v1" and p.e < 15)]
    assert clear
    decided = {_id(pool): sequential(pool, "cs", 20, 640, 50, seed=2).decided for pool in clear}
    assert min(decided.values()) >= 0.5, decided
    assert np.mean(list(decided.values())) >= 0.9, decided
    pendulum = next(p for p in POOLS if p.env_id == "Pendulum-v1" and p.precision == "int8")
    assert sequential(pendulum, "cs", 20, 640, 20, seed=2).decided == 0.0
    assert sequential(pendulum, "cs", 20, 2000, 20, seed=2, chunk=100).decided >= 0.9


def test_the_table_has_a_cell_per_size_and_the_schedule() -> None:
    rows = table(POOLS[:1], methods=("cs",), sizes=(1, 5), draws=20, cap=40)
    assert list(rows[0]) == ["pool", "E%", "covered", "method", "cov@1", "wrong@1", "cov@5", "wrong@5", "cov@seq",
                             "wrong@seq", "decided@seq", "episodes@seq", "median@seq"]
    assert schedule(20, 640)[:3] == [20, 30, 40] and schedule(20, 640)[-1] == 640 and schedule(5, 12) == [5, 12]
