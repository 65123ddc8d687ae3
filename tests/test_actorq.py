"""ActorQ: each piece in-process, then whole runs (in-process and on a local Ray)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from quarl.actorq import wire
from quarl.actorq.acting import Actor, ActorPolicy, Broadcaster, env_info, make_network
from quarl.actorq.algorithms import make_learner
from quarl.actorq.config import ActorQConfig
from quarl.actorq.learners import D4PGLearner, DQNLearner
from quarl.actorq.options import DQNOptions
from quarl.actorq.replay import Batch, NStep, PrioritizedReplay, RateLimiter, Replay, SumTree, stack
from quarl.actorq.system import run_actorq
from quarl.core.errors import QuarlError
from tests.conftest import actorq_summary

SMALL = dict(policy_layers=(64, 64), batch_size=32, min_replay=100, eval_episodes=2)
D4PG_SMALL = dict(SMALL, critic_layers=(64, 64))

# A configuration that learns CartPole in well under a minute on 2 cores.
CARTPOLE = dict(algo="dqn", actors=2, actor_precision="int8", policy_layers=(256, 256), learning_rate=1e-3,
                batch_size=64, min_replay=500, samples_per_insert=8.0, update_period=100, push_period=50,
                target_reward=195.0, eval_every_s=2.0, eval_episodes=3, replay_size=50_000)


def _batch(rng: np.random.Generator, n: int, obs_dim: int, action: np.ndarray) -> Batch:
    return Batch(obs=rng.normal(size=(n, obs_dim)).astype(np.float32), action=action,
                 reward=rng.normal(size=n).astype(np.float32), discount=np.full(n, 0.99, np.float32),
                 next_obs=rng.normal(size=(n, obs_dim)).astype(np.float32))


# ---------------------------------------------------------------------------- learners


@pytest.mark.parametrize("algo", ["dqn", "d4pg"])
def test_learner_loss_decreases_on_a_fixed_batch(algo: str) -> None:
    rng = np.random.default_rng(0)
    small = SMALL if algo == "dqn" else D4PG_SMALL
    config = ActorQConfig.flat("CartPole-v1" if algo == "dqn" else "Pendulum-v1", algo=algo, learning_rate=1e-3,
                               target_update_period=10_000, **{k: v for k, v in small.items() if k != "batch_size"})
    if algo == "dqn":
        learner = DQNLearner(config, 4, 2)
        batch = _batch(rng, 64, 4, rng.integers(0, 2, 64))
        key = "loss"
    else:
        learner = D4PGLearner(config, 3, 1)
        batch = _batch(rng, 64, 3, rng.uniform(-1, 1, (64, 1)).astype(np.float32))
        key = "critic_kl"
    first = learner.step(batch)[key]
    for _ in range(200):
        last = learner.step(batch)[key]
    assert last < 0.5 * first
    state = learner.state_dict()
    fresh = DQNLearner(config, 4, 2) if algo == "dqn" else D4PGLearner(config, 3, 1)
    fresh.load_state_dict(state)
    for k, v in learner.weights().items():
        np.testing.assert_array_equal(fresh.weights()[k], v)


def test_d4pg_projection_keeps_mass_and_moves_atoms() -> None:
    config = ActorQConfig.flat("Pendulum-v1", algo="d4pg", v_min=-10, v_max=10, n_atoms=21, **D4PG_SMALL)
    learner = D4PGLearner(config, 3, 1)
    probs = torch.softmax(torch.randn(5, 21), 1)
    same = learner.project(torch.zeros(5), torch.ones(5), probs)
    torch.testing.assert_close(same, probs)  # r = 0, discount 1: unchanged
    shifted = learner.project(torch.ones(5), torch.ones(5), probs)  # +1 = exactly one atom up
    torch.testing.assert_close(shifted[:, 1:-1], probs[:, :-2])
    torch.testing.assert_close(shifted.sum(1), torch.ones(5))
    half = learner.project(torch.full((5,), 0.5), torch.zeros(5), probs)  # all mass at 0.5: split 50/50
    torch.testing.assert_close(half[:, 10], torch.full((5,), 0.5))
    torch.testing.assert_close(half[:, 11], torch.full((5,), 0.5))


# ---------------------------------------------------------------------------- wire, broadcaster, actors


@pytest.mark.parametrize("bits", [32, 16, 8, 7, 6, 5, 4, 3, 2])
def test_wire_round_trip_within_bound(bits: int) -> None:
    rng = np.random.default_rng(bits)
    weights = {"0.weight": rng.normal(size=(64, 5)).astype(np.float32),
               "0.bias": rng.normal(size=64).astype(np.float32),
               "2.weight": rng.uniform(0.1, 2.0, size=(3, 64)).astype(np.float32)}
    payload = wire.encode(weights, version=7, bits=bits)
    version, back = wire.decode(payload)
    assert version == 7 == wire.version_of(payload)
    raw = sum(w.nbytes for w in weights.values())
    for name, w in weights.items():
        assert back[name].shape == w.shape and back[name].dtype == np.float32
        if bits == 32:
            np.testing.assert_array_equal(back[name], w)
        elif bits == 16:
            np.testing.assert_allclose(back[name], w, rtol=1e-3)
        else:
            lo, hi = min(w.min(), 0.0), max(w.max(), 0.0)  # the affine range always holds 0
            scale = (hi - lo) / (2**bits - 1)
            assert np.abs(back[name] - w).max() <= scale / 2 * (1 + 1e-5)
    body = len(payload) - 4 - int.from_bytes(payload[:4], "little")
    assert body == sum(bits * -(-w.size // 8) for w in weights.values()) or bits >= 16
    assert body <= raw * bits / 32 + 3 * bits


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1001])
def test_wire_packing_matches_a_word_by_word_reference(bits: int, n: int) -> None:
    """The vectorized packer against the layout written out one word at a time: word i =
    sum over j of code[j*m + i] << (bits*j), its bytes stored row by row."""
    codes = np.random.default_rng(n * bits).integers(0, 2**bits, size=n).astype(np.uint8)
    m = -(-n // 8)
    padded = np.zeros(8 * m, dtype=np.int64)
    padded[:n] = codes
    expected = bytearray(bits * m)
    for i in range(m):
        word = sum(int(padded[j * m + i]) << (bits * j) for j in range(8))
        for b in range(bits):
            expected[b * m + i] = (word >> (8 * b)) & 0xFF
    packed = wire._pack(codes, bits)
    assert packed == bytes(expected)
    np.testing.assert_array_equal(wire._unpack(packed, bits, n), codes)


def test_int8_actor_policy_acts_like_fp32() -> None:
    config = ActorQConfig.flat("CartPole-v1", actor_precision="int8", **SMALL)
    info = env_info(config)
    learner = DQNLearner(config, info.obs_dim, info.act_dim)
    weights = learner.weights()
    policies = {}
    for precision in ("fp32", "int8"):
        c = replace(config, actor_precision=precision)
        b = Broadcaster(c, info)
        stats = b.publish(3, weights)
        assert stats["bytes"] > 0 and stats["version"] == 3
        p = ActorPolicy(c, info)
        p.load(b.pull(-1))
        assert p.version == 3
        policies[precision] = p
    obs = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32)
    q32, q8 = policies["fp32"](obs), policies["int8"](obs)
    assert (q32.argmax(1) == q8.argmax(1)).mean() >= 0.95
    assert np.abs(q32 - q8).max() <= 0.05 * np.abs(q32).max()


def test_actor_loads_only_when_the_version_moves() -> None:
    config = ActorQConfig.flat("CartPole-v1", actor_precision="fp32", update_period=10, **SMALL)
    info = env_info(config)
    learner = DQNLearner(config, info.obs_dim, info.act_dim)
    b = Broadcaster(config, info)
    actor = Actor(config, info, 0, b.pull)
    assert actor.run(5).steps == 0  # nothing published yet: the actor waits
    b.publish(1, learner.weights())
    r = actor.run(50)
    assert (r.steps, r.pulls, r.loads, r.version) == (50, 5, 1, 1)  # 5 pulls, one load
    b.publish(2, learner.weights())
    r = actor.run(30)
    assert (r.pulls, r.loads, r.version) == (3, 1, 2)
    assert set(r.times) == {"inference", "env", "pull", "deserialize", "load"} and r.times["inference"] > 0
    batch = r.batch
    assert batch is not None and batch.obs.shape[1] == 4
    allowed = np.array([0.0, 0.99**3], np.float32)  # CartPole only terminates: no partial bootstraps
    assert np.isclose(batch.discount[:, None], allowed[None]).any(1).all()


def test_exploration_is_spread_over_actors() -> None:
    options = DQNOptions(max_exploration=0.2)
    assert [round(options.exploration(i, 4), 3) for i in range(4)] == [0.05, 0.1, 0.15, 0.2]


# ---------------------------------------------------------------------------- replay


def test_nstep_returns_terminals_and_truncation() -> None:
    ns = NStep(3, 0.5)
    o = [np.full(2, i, np.float32) for i in range(10)]
    assert ns.add(o[0], 0, 1.0, o[1], False, False) == []
    assert ns.add(o[1], 1, 2.0, o[2], False, False) == []
    (t,) = ns.add(o[2], 0, 4.0, o[3], False, False)
    assert t[2] == pytest.approx(1 + 0.5 * 2 + 0.25 * 4) and t[3] == pytest.approx(0.125) and t[4] is o[3]
    out = ns.add(o[3], 1, 8.0, o[4], True, False)  # terminal: flush, no bootstrap
    assert [x[3] for x in out] == [0.0, 0.0, 0.0]
    assert out[0][2] == pytest.approx(2 + 0.5 * 4 + 0.25 * 8)
    ns.add(o[5], 0, 1.0, o[6], False, False)
    out = ns.add(o[6], 0, 1.0, o[7], False, True)  # time limit: bootstrap from the last state
    assert [x[3] for x in out] == [0.25, 0.5] and all(x[4] is o[7] for x in out)
    batch = stack(out)
    assert batch.obs.dtype == np.float32 and batch.reward.tolist() == [1.5, 1.0]


def test_replay_ring_and_uniform_sampling() -> None:
    replay = Replay(capacity=10, seed=0)
    for start in (0, 6):
        n = 6
        replay.insert(_items(start, n))
    assert replay.size == 10 and replay.cursor == 2
    assert sorted(replay.data["obs"][:, 0].tolist()) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # 0, 1 overwritten
    sample = replay.sample(5000).obs[:, 0]
    counts = np.bincount(sample.astype(int))[2:]
    assert counts.min() > 400  # uniform over the ten stored items


def _items(start: int, n: int) -> Batch:
    return Batch(obs=np.arange(start, start + n, dtype=np.float32)[:, None], action=np.zeros(n),
                 reward=np.zeros(n, np.float32), discount=np.ones(n, np.float32), next_obs=np.zeros((n, 1), np.float32))


def test_sum_tree_sums_and_finds_prefix_intervals() -> None:
    tree = SumTree(5)  # 8 leaves
    tree.set(np.arange(5), np.array([1.0, 0.0, 2.0, 3.0, 4.0]))
    assert tree.total == 10.0
    # prefix sums 0 | 1 | 1 | 3 | 6 | 10: each target falls in its leaf's interval; empty leaves never
    found = tree.find(np.array([0.0, 0.99, 1.0, 2.99, 3.0, 5.99, 6.0, 9.99]))
    assert found.tolist() == [0, 0, 2, 2, 3, 3, 4, 4]
    tree.set(np.array([4, 0]), np.array([0.5, 0.0]))
    assert tree.total == 5.5 and tree.find(np.array([0.0]))[0] == 2


def test_prioritized_replay_samples_by_priority_with_importance_weights() -> None:
    replay = PrioritizedReplay(capacity=4, seed=0, priority_exponent=1.0, importance_exponent=0.5)
    replay.insert(_items(0, 4))
    sample = replay.sample(8)
    assert np.allclose(sample.weight, 1.0)  # new items all get the same (largest) priority
    replay.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    draws = np.concatenate([replay.sample(100).index for _ in range(400)])
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.01)
    batch = replay.sample(64)
    expected = (4 * (batch.index + 1) / 10.0) ** -0.5  # (N P(i))^-beta, normalized by the largest
    np.testing.assert_allclose(batch.weight, expected / expected.max(), rtol=1e-5)
    assert np.array_equal(batch.obs[:, 0], batch.index.astype(np.float32))  # rows match their index
    replay.insert(_items(4, 1))  # overwrites item 0 with the largest priority seen (4)
    assert replay.tree.get(np.array([0]))[0] == pytest.approx(4.0)
    # alpha = 0 is uniform whatever the priorities
    flat = PrioritizedReplay(capacity=4, seed=0, priority_exponent=0.0)
    flat.insert(_items(0, 4))
    flat.update_priorities(np.arange(4), np.array([1.0, 10.0, 100.0, 1000.0]))
    freq = np.bincount(np.concatenate([flat.sample(100).index for _ in range(200)]), minlength=4) / 20_000
    np.testing.assert_allclose(freq, 0.25, atol=0.01)
    copy = PrioritizedReplay(capacity=4, seed=0, priority_exponent=1.0)
    copy.load_state(replay.state())
    assert copy.tree.total == replay.tree.total and copy.max_priority == replay.max_priority


@pytest.mark.parametrize("algo", ["dqn", "d4pg"])
def test_learners_weight_losses_and_report_priorities(algo: str) -> None:
    rng = np.random.default_rng(1)
    config = ActorQConfig.flat("CartPole-v1" if algo == "dqn" else "Pendulum-v1", algo=algo,
                               **(SMALL if algo == "dqn" else D4PG_SMALL))
    action = rng.integers(0, 2, 32) if algo == "dqn" else rng.uniform(-1, 1, (32, 1)).astype(np.float32)
    batch = _batch(rng, 32, 4 if algo == "dqn" else 3, action)
    make = (lambda: DQNLearner(config, 4, 2)) if algo == "dqn" else (lambda: D4PGLearner(config, 3, 1))
    plain, weighted = make(), make()
    key = "loss" if algo == "dqn" else "critic_loss"
    ones = plain.step(batch)
    assert "priority" not in ones  # uniform replay: nothing to send back
    out = weighted.step(replace(batch, weight=np.ones(32, np.float32), index=np.arange(32)))
    assert out[key] == pytest.approx(ones[key], rel=1e-6)  # unit weights: the plain loss
    assert out["priority"].shape == (32,) and (out["priority"] >= 0).all() and out["priority"].max() > 0
    # weight 0 on half the batch: the loss is the weighted mean of the per-sample losses
    half = make()
    w = np.r_[np.ones(16), np.zeros(16)].astype(np.float32)
    got = half.step(replace(batch, weight=w, index=np.arange(32)))[key]
    first = batch.rows(slice(0, 16))
    assert got == pytest.approx(0.5 * make().step(first)[key], rel=1e-5)


def test_rate_limiter_blocks_and_releases() -> None:
    lim = RateLimiter(samples_per_insert=4.0, min_size=10, error_buffer=8.0)
    assert not lim.can_sample(1)  # below min_size
    for _ in range(10):
        assert lim.can_insert(1)
        lim.inserted(1)
    # diff = 40 - 0; min_diff = 32: up to 8 samples now
    assert lim.can_sample(8) and not lim.can_sample(9)
    assert lim.can_insert(2) and not lim.can_insert(3)  # max_diff = 48
    lim.sampled(8)
    assert not lim.can_sample(1)  # learner must wait for inserts ...
    lim.inserted(1)  # ... one insert allows samples_per_insert more samples
    assert lim.can_sample(4) and not lim.can_sample(5)
    lim.inserted(5)  # diff = 16 * 4 - 8 = 56 > max_diff
    assert not lim.can_insert(1)  # actors too far ahead: blocked ...
    assert lim.can_sample(12)
    lim.sampled(12)  # diff = 44
    assert lim.can_insert(1) and not lim.can_insert(2)  # ... until the learner has sampled enough


# ---------------------------------------------------------------------------- whole runs


@pytest.mark.slow
def test_local_run_learns_checkpoints_and_resumes(tmp_path: Path) -> None:
    """In one process, with prioritized replay checkpointed along with the learner (the
    Ray run below uses uniform replay)."""
    config = ActorQConfig.flat("CartPole-v1", local=True, max_minutes=4.0, out=tmp_path / "run", replay="prioritized",
                          checkpoint_replay=True, **CARTPOLE)
    summary = run_actorq(config)
    assert summary.reached, summary.evals[-5:]
    assert summary.final_running_mean >= 195
    assert summary.time_to_reward_s <= summary.elapsed_s
    assert summary.loads < summary.pulls  # versioned pulls skip unchanged weights
    assert set(summary.actor_ms_per_step) == {"inference", "env", "pull", "deserialize", "load"}
    assert summary.broadcast["bytes"] > 0 and summary.energy["available"]
    # the steady rate leaves start-up out: it counts fewer steps over less time than the whole-run rate
    assert summary.steady_env_steps_per_s is not None and summary.steady_env_steps_per_s > 0
    assert summary.steady_env_steps_per_s * summary.elapsed_s > 0.5 * summary.env_steps
    assert (tmp_path / "run" / "evals.csv").read_text().startswith("t_s,version,return,running_mean,env_steps")
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["learner_steps"] == summary.learner_steps

    blob = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)  # plain tensors and numbers
    # pending n-step windows: fewer
    assert DQNOptions.of(config).min_replay < blob["replay"]["size"] <= summary.env_steps
    assert blob["replay"]["max_priority"] > 1.0  # learner's TD errors went back into the tree

    resumed = run_actorq(replace(config, max_minutes=summary.elapsed_s / 60 + 0.1, target_reward=1e9), resume=True)
    assert resumed.learner_steps > summary.learner_steps
    assert resumed.elapsed_s >= summary.elapsed_s + 5


class _Payload:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED",))


def test_evaluations_every_n_env_steps(tmp_path: Path) -> None:
    """--eval-freq: each evaluation snapshots the learner once N more env steps
    have been inserted (give or take the chunks that arrive in one coordinator pass)."""
    every = 600  # with chunks of 50 steps: a pass may add 200 beyond it (was 1,500 and 100 over 6,500 steps: 9 s)
    config = ActorQConfig.flat("CartPole-v1", local=True, actors=2, target_reward=1e9, max_minutes=10,
                               max_env_steps=2800, out=tmp_path / "run", eval_every_steps=every, eval_every_s=1e6,
                               chunk_steps=50, **SMALL)
    summary = run_actorq(config)  # ends on steps, whatever this machine's speed
    steps = [e[3] for e in summary.evals]
    assert 2800 <= summary.env_steps < 2800 + 4 * config.actors * config.chunk_steps
    assert steps[0] == 0 and len(steps) >= 4, steps
    gaps = np.diff(steps)
    slack = 2 * config.actors * config.chunk_steps  # QUEUE_DEPTH chunks per actor in one pass
    assert (gaps >= every).all() and (gaps <= every + slack).all(), gaps
    assert len(steps) >= summary.env_steps // (every + slack)
    rows = (tmp_path / "run" / "evals.csv").read_text().splitlines()
    assert [int(r.split(",")[-1]) for r in rows[1:]] == steps
    with pytest.raises(QuarlError, match="--eval-freq 0 must be at least 1"):
        replace(config, eval_every_steps=0)


def test_a_busy_evaluator_delays_step_spaced_evaluations_without_copying_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluator busy on every other pass (as a Ray one is while it plays): an evaluation
    due by env steps waits for it, and the learner's weights are copied only for an
    evaluation that starts."""
    import quarl.actorq.system as system
    from quarl.actorq.local_fleet import LocalFleet

    class BusyEveryOtherPass(LocalFleet):
        passes = starts = refused = 0

        def evaluator_idle(self) -> bool:
            BusyEveryOtherPass.passes += 1
            return BusyEveryOtherPass.passes % 2 == 0

        def evaluate(self, version, weights, at_s) -> None:
            BusyEveryOtherPass.starts += 1
            super().evaluate(version, weights, at_s)

    monkeypatch.setattr(system, "make_fleet", lambda config, info: BusyEveryOtherPass(config, info))
    every = 600
    config = ActorQConfig.flat("CartPole-v1", local=True, actors=2, target_reward=1e9, max_minutes=10,
                               max_env_steps=2000, out=tmp_path / "run", eval_every_steps=every, chunk_steps=50,
                               **SMALL)
    summary = run_actorq(config)  # ends on steps: a loaded machine made the 12 s budget hold only two evaluations
    steps = [e[3] for e in summary.evals]
    assert len(steps) >= 3 and (np.diff(steps) >= every).all(), steps
    assert BusyEveryOtherPass.starts == len(steps)  # one start (and one weight copy) per evaluation
    assert BusyEveryOtherPass.passes >= 2 * len(steps) - 1  # it was asked, and refused, in between


def test_resume_never_unpickles_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crafted checkpoint.pt in the output folder is refused in one line; its payload
    does not run. A checkpoint of another network shape is refused in one line too."""

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"learner": _Payload()}, out / "checkpoint.pt")
    config = ActorQConfig.flat("CartPole-v1", local=True, max_minutes=0.2, out=out, **CARTPOLE)
    with pytest.raises(QuarlError, match="not an ActorQ checkpoint of plain tensors"):
        run_actorq(config, resume=True)
    assert not (tmp_path / "PWNED").exists()
    other = make_learner(replace(config, policy_layers=(32,)), 4, 2)
    torch.save({"learner": other.state_dict(), "state": {}, "limiter": (0, 0), "replay": None,
                "config": config.to_json()}, out / "checkpoint.pt")
    with pytest.raises(QuarlError, match="does not fit this run's learner"):
        run_actorq(config, resume=True)


@pytest.mark.slow  # over 10 s: run with -m slow
def test_ray_run_with_int8_actors_survives_a_killed_actor(tmp_path: Path) -> None:
    """Two int8 actors on a local Ray: one is killed mid-run and replaced; the run goes on
    until the replaced actor has stepped 1,000 more and 16,000 env steps are done (bounds in
    steps, not seconds: a slow replacement start on a busy machine only makes it longer), and
    the learner keeps learning (evaluations spaced in env steps)."""
    killed: list[int] = []
    steps_at_kill: list[int] = []

    def kill_once(state, fleet) -> bool:
        if not killed and state.learner_steps > 100:
            fleet.kill(0)
            killed.append(state.learner_steps)
            steps_at_kill.append(state.actor_steps.get(0, 0))
        return bool(killed) and state.env_steps >= 16_000 and state.actor_steps.get(0, 0) > steps_at_kill[0] + 1_000

    config = ActorQConfig.flat("CartPole-v1", max_minutes=30.0, out=tmp_path / "ray",
                          **{**CARTPOLE, "target_reward": 1e9, "eval_every_s": 1e6}, eval_every_steps=4_000,
                          max_env_steps=400_000)
    summary = run_actorq(config, on_tick=kill_once)
    assert killed and summary.restarts >= 1
    assert 16_000 <= summary.env_steps < 400_000  # ended by the rule above: the replacement acted
    first, last = summary.evals[0][2], max(e[2] for e in summary.evals[-3:])
    assert last > first + 30, summary.evals  # learning went on past the kill


def test_actor_precisions_come_from_the_precision_registry() -> None:
    """A registered precision an actor can run (a float one PyTorch casts to, or a real int
    one whose width has an actor kernel) is an --actor-precision without a second list;
    nbit (simulated) is not; once removed it is refused again."""
    from quarl.actorq.actor_precisions import actor_precisions, onnx_mode
    from quarl.quantization import precisions

    assert actor_precisions() == ("fp32", "fp16", "bf16", "int8", "int4")
    int8 = precisions.get("int8")
    precisions.register(precisions.Precision("int8-alt", "another int8", int8.build, bits=8, real_int=True))
    try:
        assert actor_precisions()[-1] == "int8-alt" and onnx_mode("int8-alt") == "int8-dyn-tensor"
        config = ActorQConfig("CartPole-v1", actor_precision="int8-alt", local=True)
        assert Broadcaster(config, env_info(config)).mode == "int8-dyn-tensor"
    finally:
        precisions.PRECISIONS.remove("int8-alt")
    with pytest.raises(QuarlError, match="unknown --actor-precision 'int8-alt': allowed fp32, fp16, bf16, int8, int4"):
        ActorQConfig("CartPole-v1", actor_precision="int8-alt", local=True)


def test_actor_kernels_are_the_int_modes_that_declare_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """An int precision's actors run the first registered mode of its width that declares
    ``actor``; a width whose modes declare none has no int actors."""
    from quarl.actorq.actor_precisions import actor_precisions, onnx_mode
    from quarl.quant import modes

    assert (onnx_mode("int8"), onnx_mode("int4")) == ("int8-dyn-tensor", "int4-block")
    with modes.MODES.replaced("int4-block", replace(modes.MODES["int4-block"], actor=False)):
        assert onnx_mode("int4") == "int4-weight-only"
        with modes.MODES.replaced("int8-dyn-tensor", replace(modes.MODES["int8-dyn-tensor"], actor=False)):
            assert onnx_mode("int8") is None and actor_precisions() == ("fp32", "fp16", "bf16", "int4")
    assert (onnx_mode("int8"), onnx_mode("int4")) == ("int8-dyn-tensor", "int4-block")  # put back as they were


def test_int_actors_run_the_declared_fallback_where_the_cpu_cannot_run_their_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this CPU's MatMulNBits int8 kernels are inexact, int4 actors run int4-block's
    declared fallback (weight-only: no int8 activations, ``accuracy_level`` 4 gone) and later
    versions refill that graph; elsewhere they run int4-block itself."""
    import onnx
    from onnx import helper

    from quarl.actorq.acting import payload_version
    from quarl.quant import modes

    def levels(payload: bytes | None) -> list[int]:
        assert payload is not None
        model = onnx.load_from_string(payload[12:])
        return [int(helper.get_attribute_value(a)) if a is not None else 0
                for node in model.graph.node if node.op_type == "MatMulNBits"
                for a in [next((a for a in node.attribute if a.name == "accuracy_level"), None)]]

    config = ActorQConfig("CartPole-v1", actor_precision="int4", policy_layers=(64, 64))
    info = env_info(config)
    weights = {k: v.detach().numpy() for k, v in make_network(config, info).state_dict().items()}
    monkeypatch.setattr(modes, "int8_compute", lambda bits: "int8")
    exact = Broadcaster(config, info)
    exact.publish(1, weights)
    assert levels(exact.payload) and set(levels(exact.payload)) == {4}
    monkeypatch.setattr(modes, "int8_compute", lambda bits: "inexact")
    fallback = Broadcaster(config, info)
    fallback.publish(1, weights)
    assert levels(fallback.payload) and 4 not in levels(fallback.payload)
    fallback.publish(2, weights)  # refilled: the fallback's graph again
    assert fallback.template is not None and payload_version(fallback.payload or b"") == 2
    assert levels(fallback.payload) and 4 not in levels(fallback.payload)


def test_bad_configs_fail_with_one_line() -> None:
    with pytest.raises(QuarlError, match=r"--actors 0 must be in 1..4096"):
        ActorQConfig("CartPole-v1", actors=0)
    with pytest.raises(QuarlError, match="--wire-bits 12 is not supported"):
        ActorQConfig("CartPole-v1", wire_bits=12)
    with pytest.raises(QuarlError, match="unknown --replay 'reverb'"):
        ActorQConfig.flat("CartPole-v1", replay="reverb")
    with pytest.raises(QuarlError, match=r"priority_exponent=1.5 must be in \[0, 1\]"):
        ActorQConfig.flat("CartPole-v1", replay="prioritized", priority_exponent=1.5)
    with pytest.raises(QuarlError, match="unknown --algo 'r2d2': allowed dqn, d4pg, impala, ppo"):
        ActorQConfig("CartPole-v1", algo="r2d2")
    with pytest.raises(QuarlError, match=r"--clip-range 1.5 must be in \(0, 1\)"):
        ActorQConfig.flat("CartPole-v1", algo="ppo", clip_range=1.5)
    with pytest.raises(QuarlError, match="d4pg needs continuous actions"):
        env_info(ActorQConfig("CartPole-v1", algo="d4pg"))
    with pytest.raises(QuarlError, match="dqn needs discrete actions"):
        env_info(ActorQConfig("Pendulum-v1", algo="dqn"))


def test_d4pg_actor_on_the_control_suite() -> None:
    """DeepMind Control Suite through gymnasium (shimmy): dict observations are flattened."""
    config = ActorQConfig.flat("dm_control/cartpole-balance-v0", algo="d4pg", actor_precision="int8", **D4PG_SMALL)
    info = env_info(config)
    assert (info.obs_dim, info.act_dim, info.discrete) == (5, 1, False)
    learner = D4PGLearner(config, info.obs_dim, info.act_dim)
    b = Broadcaster(config, info)
    b.publish(1, learner.weights())
    r = Actor(config, info, 1, b.pull).run(40)
    assert r.steps == 40 and r.batch is not None
    assert np.abs(r.batch.action).max() <= 1.0 and r.batch.obs.shape == (len(r.batch), 5)
    metrics = learner.step(r.batch.rows(np.arange(32) % len(r.batch)))
    assert np.isfinite(list(metrics.values())).all()


def _summary(ttr: float | None, learner_steps: int, inference_ms: float, energy_kwh: float) -> dict:
    evals = [[10.0 * i, i, 50.0 * i] for i in range(1, 6)]
    return actorq_summary(
        target_reward=195.0, reached=ttr is not None, time_to_reward_s=ttr, final_running_mean=200.0,
        elapsed_s=ttr or 600.0, env_steps_at_target=None if ttr is None else int(100 * ttr),
        evals=evals, learner_steps=learner_steps, learner_steps_per_s=learner_steps / 100.0,
        actor_env_steps_per_s={"0": 40.0, "1": 60.0},
        actor_ms_per_step={"inference": inference_ms, "env": 0.1, "pull": 0.2, "deserialize": 0.0, "load": 0.0},
        actor_time_share={"inference": inference_ms / 4, "env": 0.2, "pull": 0.05, "deserialize": 0.0, "load": 0.0,
                          "other": 0.05, "rate_limit": 0.1, "dispatch": 0.1},
        learner_time_share={"learning": 0.5, "waiting": 0.5},
        broadcast={"bytes": 1000}, energy={"available": True, "energy_kwh": energy_kwh, "co2_kg": 0.001,
                                           "method": "estimated"})


def test_compare_table_from_stored_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """compare reuses finished runs (nothing trains here) and tabulates them: mean and
    spread over repeats, speedup against the first precision, learner steps."""
    from quarl.actorq.compare import run_compare

    runs = {("fp32", 0): _summary(100.0, 1000, 2.0, 0.002), ("fp32", 1): _summary(300.0, 3000, 2.0, 0.004),
            ("fp32", 2): _summary(200.0, 2000, 2.0, 0.003),
            ("int8", 0): _summary(100.0, 1000, 0.5, 0.001), ("int8", 1): _summary(None, 5000, 0.5, 0.003),
            ("int8", 2): _summary(50.0, 1000, 0.5, 0.002)}
    for (precision, rep), summary in runs.items():
        folder = tmp_path / precision / f"rep{rep}"
        folder.mkdir(parents=True)
        summary["config"] = replace(ActorQConfig("CartPole-v1"), actor_precision=precision, seed=rep).to_json()
        (folder / "summary.json").write_text(json.dumps(summary))
    with caplog.at_level("WARNING", logger="quarl.actorq.compare"):
        result = run_compare(ActorQConfig("CartPole-v1"), ["fp32", "int8"], 3, tmp_path)
    assert "--eval-freq N compares the fleets at the same learning progress" in caplog.text
    rows = {r["actor_precision"]: r for r in result.table}
    assert rows["fp32"]["time_to_reward_s"] == 200.0 and rows["fp32"]["time_std_s"] == round(np.std([100, 300, 200]), 1)
    assert rows["fp32"]["reached"] == "3/3" and rows["int8"]["reached"] == "2/3"
    assert rows["int8"]["time_to_reward_s"] == 75.0 and rows["int8"]["speedup"] == round(200 / 75, 2)  # reached runs
    # over all runs, the one that did not reach counts at its whole budget (600 s)
    assert rows["int8"]["time_all_runs_s"] == 250.0 and rows["int8"]["speedup_all_runs"] == round(200 / 250, 2)
    # paired by seed over the repeats both reached: 100/100 and 200/50
    assert rows["int8"]["speedup_min"] == 1.0 and rows["int8"]["speedup_max"] == 4.0
    assert rows["fp32"]["speedup_min"] == rows["fp32"]["speedup_max"] == 1.0
    assert rows["fp32"]["env_steps_to_target"] == 20000 and rows["int8"]["env_steps_to_target"] == 7500
    assert rows["fp32"]["learner_steps"] == 2000 and rows["int8"]["learner_steps"] == 2333
    assert rows["fp32"]["actor_steps_per_s"] == 50.0 and rows["int8"]["inference_ms"] == 0.5
    assert rows["fp32"]["energy_wh"] == 3.0 and rows["int8"]["energy_wh"] == 2.0
    shares = {r["actor_precision"]: r for r in result.breakdown}
    assert shares["fp32"]["inference"] == 0.5 and shares["int8"]["inference"] == 0.125
    assert shares["int8"]["rate_limit"] == 0.1 and shares["int8"]["learner_busy"] == 0.5
    assert shares["int8"]["actor_steps_per_s"] == 50.0
    for name in ("compare.csv", "compare.md", "breakdown.csv", "breakdown.md", "convergence.png", "breakdown.png",
                 "energy.png"):
        assert (tmp_path / name).stat().st_size > 0
    # a stored run of another configuration is never taken for this one
    with pytest.raises(QuarlError, match="holds a run of another configuration \\(target_reward differ\\)"):
        run_compare(ActorQConfig("CartPole-v1", target_reward=150.0), ["fp32", "int8"], 3, tmp_path)


@pytest.mark.parametrize("algo,env_id", [("dqn", "CartPole-v1"), ("d4pg", "Pendulum-v1")])
def test_actorq_output_loads_as_a_policy(tmp_path: Path, algo: str, env_id: str) -> None:
    """OUT/policy.pt + summary.json of an ActorQ run act as the learner's network does,
    so ptq / export / bench take ActorQ's output."""
    import quarl
    from quarl.actorq.learners import policy_network

    config = ActorQConfig(env_id, algo=algo, policy_layers=(32, 16), out=tmp_path)
    info = env_info(config)
    net = policy_network(config, info.obs_dim, info.act_dim, continuous=not info.discrete)
    torch.save(net.state_dict(), tmp_path / "policy.pt")
    (tmp_path / "summary.json").write_text(json.dumps({"config": config.to_json()}))
    agent = quarl.load(tmp_path)
    obs = np.random.default_rng(0).normal(size=(64, info.obs_dim)).astype(np.float32)
    with torch.no_grad():
        out = net(torch.from_numpy(obs)).numpy()
    want = out.argmax(1) if algo == "dqn" else np.stack([info.to_env(a) for a in out])
    assert np.array_equal(agent.policy.act(obs), want)
    assert agent.algo == algo and agent.env_spec.env_id == env_id
    assert quarl.evaluate(quarl.quantize(agent.policy, "int8", agent.env_spec), agent.env_spec, episodes=2).steps > 0


def test_a_target_the_untrained_policy_meets_is_refused(tmp_path: Path) -> None:
    """CartPole's untrained policy scores ~9: a target of 5 would be 'reached' before any
    learning, so the run stops with one line instead of reporting a time to reward."""
    config = ActorQConfig.flat("CartPole-v1", local=True, actors=1, target_reward=5.0, max_minutes=1.0,
                          out=tmp_path / "run", eval_every_s=0.5, **SMALL)
    with pytest.raises(QuarlError, match=r"--target-reward 5 is met by the untrained policy \(its first evaluation"):
        run_actorq(config)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_actor_models_after_the_first_are_refilled_exactly_as_onnx_runtime_builds_them(precision: str) -> None:
    """Version 1 is built by ONNX Runtime's quantizer; later versions refill its graph. Each
    refilled model holds the very initializers a fresh build of those weights holds."""
    import onnx
    from onnx import numpy_helper

    def initializers(payload: bytes) -> dict[str, np.ndarray]:
        model = onnx.load_from_string(payload[12:])
        return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    config = ActorQConfig("CartPole-v1", actor_precision=precision, policy_layers=(128, 100))  # 100: a part block
    info = env_info(config)
    refilled = Broadcaster(config, info)
    for version, seed in enumerate((0, 1, 2), start=1):
        torch.manual_seed(seed)
        weights = {k: v.detach().numpy() for k, v in make_network(config, info).state_dict().items()}
        refilled.publish(version, weights)
        fresh = Broadcaster(config, info)
        fresh.publish(version, weights)
        got, want = initializers(refilled.payload), initializers(fresh.payload)
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), (version, name)
    assert refilled.template is not None


@pytest.mark.slow
def test_ctrl_c_in_the_first_second_leaves_a_run_that_resumes(tmp_path: Path) -> None:
    """A Ctrl-C long before the first periodic checkpoint (60 s): the interrupted run still
    writes one, and --resume continues from its learner steps."""
    ticks = []

    def interrupt(state, fleet) -> None:
        ticks.append(state.learner_steps)
        if state.learner_steps >= 5:
            raise KeyboardInterrupt

    config = ActorQConfig.flat("CartPole-v1", max_minutes=5.0, out=tmp_path / "run", **{
        **CARTPOLE, "target_reward": 1e9, "actors": 1, "min_replay": 100, "policy_layers": (64, 64)},
        max_env_steps=600)
    with pytest.raises(KeyboardInterrupt):
        run_actorq(config, on_tick=interrupt)
    assert (tmp_path / "run" / "checkpoint.pt").is_file()
    resumed = run_actorq(config, resume=True)
    assert resumed.learner_steps > ticks[-1] >= 5


def test_the_steady_rate_counts_from_when_every_actor_had_reported() -> None:
    from quarl.actorq.run_state import RunState
    from quarl.actorq.summarize import steady_rate as _steady_rate

    state = RunState(env_steps=10_000, elapsed_s=30.0, steady_from_s=10.0, env_steps_at_steady=2_000)
    assert _steady_rate(state) == 400.0  # 8,000 steps in 20 s; the whole run's 333 includes 10 s of start-up
    assert _steady_rate(RunState(env_steps=100, elapsed_s=5.0)) is None  # an actor never reported
    assert _steady_rate(RunState(env_steps=100, elapsed_s=5.0, steady_from_s=4.5)) is None  # too short to tell


def test_resume_refuses_another_config_and_a_crafted_state(tmp_path: Path) -> None:
    """--resume continues the run its checkpoint holds: other learning options are refused
    in one line naming the first one (a budget may change), and so are counters no run has."""
    import torch

    config = ActorQConfig.flat("CartPole-v1", local=True, max_minutes=3.0, out=tmp_path / "run", actors=1,
                               policy_layers=(32, 32), batch_size=32, min_replay=100, eval_episodes=2,
                               max_env_steps=400)
    first = run_actorq(config)
    with pytest.raises(QuarlError, match=r"learning_rate=0.0001, this one has 0.001: resume with the same options"):
        run_actorq(replace(config, learning_rate=1e-3), resume=True)
    more = run_actorq(replace(config, max_env_steps=800), resume=True)  # a longer budget is the same run
    assert more.env_steps >= 800 > first.env_steps
    path = tmp_path / "run" / "checkpoint.pt"
    blob = torch.load(path, weights_only=True)
    blob["state"]["env_steps"] = -10**18
    torch.save(blob, path)
    with pytest.raises(QuarlError, match=r"env_steps=-1000000000000000000 is not a count"):
        run_actorq(config, resume=True)
    torch.save({}, path)
    with pytest.raises(QuarlError, match="holds no run config"):
        run_actorq(config, resume=True)


def test_an_actor_that_always_dies_stops_the_run_after_a_capped_number_of_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in acting kills every chunk: the run restarts the actor up to its cap, then stops
    in one line with the last error, its checkpoint written, instead of looping until its
    time budget ends."""
    from quarl.actorq import acting
    from quarl.actorq.coordinator import max_restarts

    def broken(self, steps):
        raise RuntimeError("env exploded")

    monkeypatch.setattr(acting.Actor, "run", broken)
    config = ActorQConfig.flat("CartPole-v1", local=True, max_minutes=5.0, out=tmp_path / "run", actors=1,
                               policy_layers=(32, 32), batch_size=32, min_replay=100, eval_episodes=2)
    with pytest.raises(QuarlError, match=rf"actors died {max_restarts(config) + 1} times.*env exploded"):
        run_actorq(config)
    assert (tmp_path / "run" / "checkpoint.pt").is_file()


@pytest.mark.slow  # over 10 s: run with -m slow
def test_sigterm_to_a_ray_run_keeps_its_checkpoint_without_an_abort_dump(tmp_path: Path) -> None:
    """Ray's driver installs a SIGTERM handler that dumps a C++ stack and aborts: quarl puts
    its own back, so a SIGTERM writes the checkpoint, shuts Ray down, exits 143 and prints
    the command that resumes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "quarl.cli", "actorq", "run", "CartPole-v1", "--actors", "1",
                             "--policy-layers", "32,32", "--max-minutes", "3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "300"})
    deadline = time.time() + 180
    while time.time() < deadline and not (out / "tb").exists():  # Ray is up and the loop has started
        time.sleep(0.5)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert "SIGTERM received" not in output and "logging.cc" not in output
    assert (out / "checkpoint.pt").is_file() and "--resume" in output.splitlines()[-1]
