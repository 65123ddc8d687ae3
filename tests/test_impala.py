"""IMPALA in ActorQ: V-trace against a direct reference, the learner's mismatch measures,
int4 actors, and a local run that learns CartPole with quantized actors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from quarl.actorq.config import ActorQConfig
from quarl.actorq.run_loader import load_actorq_run
from quarl.actorq.system import run_actorq
from quarl.actorq.vtrace import vtrace
from quarl.core.errors import QuarlError
from tests.conftest import run_cli


def reference_vtrace(log_rho, rewards, discounts, continues, values, next_values, rho_bar, c_bar):
    """V-trace written from its definition, one unroll (1-D arrays), float64:
    v_s = V(x_s) + sum_t (prod_{s <= i < t} d_i k_i c_i) delta_t, the sum ending where the
    episode or the unroll does."""
    rho = np.exp(log_rho)
    T = len(rewards)
    delta = np.minimum(rho_bar, rho) * (rewards + discounts * next_values - values)
    c = np.minimum(c_bar, rho)
    vs = np.zeros(T)
    for s in range(T):
        total, weight = 0.0, 1.0
        for t in range(s, T):
            total += weight * delta[t]
            weight *= discounts[t] * continues[t] * c[t]
            if weight == 0.0:
                break
        vs[s] = values[s] + total
    adv = np.zeros(T)
    for s in range(T):
        following = vs[s + 1] if s + 1 < T and continues[s] else next_values[s]
        adv[s] = min(rho_bar, rho[s]) * (rewards[s] + discounts[s] * following - values[s])
    return vs, adv


def _unroll(rng: np.random.Generator, T: int, gamma: float = 0.9):
    terminal = rng.random(T) < 0.1
    truncated = ~terminal & (rng.random(T) < 0.1)
    return dict(log_rho=rng.normal(0, 0.5, T), rewards=rng.normal(size=T),
                discounts=np.where(terminal, 0.0, gamma), continues=np.where(terminal | truncated, 0.0, 1.0),
                values=rng.normal(size=T), next_values=rng.normal(size=T))


@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 0.5), (1e9, 1e9)])
def test_vtrace_matches_its_definition_on_hand_made_unrolls(rho_bar: float, c_bar: float) -> None:
    rng = np.random.default_rng(0)
    unrolls = [_unroll(rng, 12) for _ in range(7)]
    batch = {k: torch.tensor(np.stack([u[k] for u in unrolls], axis=1)) for k in unrolls[0]}  # [T, B]
    out = vtrace(batch["log_rho"], batch["rewards"], batch["discounts"], batch["continues"], batch["values"],
                 batch["next_values"], rho_bar, c_bar)
    for b, u in enumerate(unrolls):
        vs, adv = reference_vtrace(**u, rho_bar=rho_bar, c_bar=c_bar)
        np.testing.assert_allclose(out.vs[:, b].numpy(), vs, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out.advantages[:, b].numpy(), adv, rtol=1e-10, atol=1e-12)


def test_vtrace_with_rho_and_c_one_is_the_n_step_return() -> None:
    """pi = mu: v_s is the discounted sum of rewards to the unroll's (or episode's) end,
    bootstrapped from the last next state's value; a terminal cuts it with no bootstrap."""
    T, gamma = 5, 0.9
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
    values = torch.tensor([[0.5], [0.1], [0.2], [0.3], [0.4]])
    next_values = torch.tensor([[0.1], [0.2], [0.3], [0.4], [10.0]])
    ones = torch.ones(T, 1)
    out = vtrace(torch.zeros(T, 1), rewards, gamma * ones, ones, values, next_values)
    expected = [sum(gamma ** (k - s) * rewards[k, 0].item() for k in range(s, T)) + gamma ** (T - s) * 10.0
                for s in range(T)]
    np.testing.assert_allclose(out.vs[:, 0].numpy(), expected, rtol=1e-6)
    # a terminal at step 2: steps 0..2 sum to it with no bootstrap, 3..4 start anew
    discounts = torch.tensor([[gamma], [gamma], [0.0], [gamma], [gamma]])
    continues = torch.tensor([[1.0], [1.0], [0.0], [1.0], [1.0]])
    out = vtrace(torch.zeros(T, 1), rewards, discounts, continues, values, next_values)
    expected = [1 + gamma * 2 + gamma ** 2 * 3, 2 + gamma * 3, 3.0, 4 + gamma * 5 + gamma ** 2 * 10, 5 + gamma * 10]
    np.testing.assert_allclose(out.vs[:, 0].numpy(), expected, rtol=1e-6)


def _config(tmp_path: Path, env_id: str = "CartPole-v1", **kw) -> ActorQConfig:
    base = dict(algo="impala", actors=2, policy_layers=(64, 64), critic_layers=(64, 64), learning_rate=1e-3,
                batch_size=320, update_period=100, push_period=1, eval_every_steps=5000, eval_episodes=5,
                target_reward=195.0, max_env_steps=200_000, max_minutes=30.0, local=True, out=tmp_path / "run")
    return ActorQConfig.flat(env_id, **{**base, **kw})


def test_the_learner_measures_no_mismatch_against_itself(tmp_path: Path) -> None:
    """Unrolls whose behaviour outputs are the learner's own: ratios 1, KL 0, nothing clipped."""
    from quarl.actorq.learners import IMPALALearner
    from quarl.actorq.replay import Unroll

    config = _config(tmp_path)
    learner = IMPALALearner(config, 4, 2)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 20, 4)).astype(np.float32)
    with torch.no_grad():
        behaviour = learner.policy(torch.from_numpy(obs)).numpy()
    unroll = Unroll(obs, rng.integers(0, 2, (3, 20)), rng.normal(size=(3, 20)).astype(np.float32),
                    np.full((3, 20), 0.99, np.float32), np.ones((3, 20), np.float32), obs, behaviour,
                    np.zeros(3, np.int64))
    metrics = learner.step(unroll)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7) and metrics["rho_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["rho_clipped"] == 0.0 and all(math.isfinite(v) for v in metrics.values())


def test_int4_actors_get_a_smaller_model_that_acts_like_fp32(tmp_path: Path) -> None:
    from quarl.actorq.acting import ActorPolicy, Broadcaster, env_info, make_network

    sizes = {}
    for precision in ("int8", "int4"):
        config = _config(tmp_path, actor_precision=precision, policy_layers=(256, 256))
        info = env_info(config)
        torch.manual_seed(0)  # the same weights whatever ran before (int4 at 0.987 after one order, 0.99 needed)
        net = make_network(config, info)
        weights = {k: v.detach().numpy() for k, v in net.state_dict().items()}
        broadcaster = Broadcaster(config, info)
        sizes[precision] = broadcaster.publish(1, weights)["bytes"]
        actor = ActorPolicy(config, info)
        actor.load(broadcaster.pull(-1))
        obs = np.random.default_rng(1).normal(size=(200, 4)).astype(np.float32)
        with torch.no_grad():
            ref = net(torch.from_numpy(obs)).numpy()
        out = np.concatenate([actor(o[None]) for o in obs])
        assert np.corrcoef(out.ravel(), ref.ravel())[0, 1] > 0.99, precision
    assert sizes["int4"] < 0.7 * sizes["int8"]


@pytest.mark.parametrize("edit,message", [
    ({"unroll_length": 30}, "--unroll-length 30 must divide the actors' chunk of 100 steps"),
    ({"c_bar": 2.0}, "must satisfy 0 < c-bar <= rho-bar"),
    ({"replay": "prioritized"}, r"--replay is not an option of --algo impala \(its own: --baseline-cost, "),
    ({"entropy_cost": -0.1}, "--entropy-cost -0.1 must be >= 0"),
])
def test_bad_impala_settings_are_one_line(tmp_path: Path, edit: dict, message: str) -> None:
    with pytest.raises(QuarlError, match=message):
        _config(tmp_path).with_values(**edit)


def test_a_local_impala_run_with_int8_actors_learns_cartpole_and_reports_the_mismatch(tmp_path: Path) -> None:
    """On steps, not seconds: the target is reached within the env-step budget; the summary,
    TensorBoard and the compare table carry finite mismatch measures."""
    r = run_cli("actorq", "run", "CartPole-v1", "--algo", "impala", "--local", "--actors", "2",
                "--actor-precision", "int8", "--policy-layers", "64,64", "--lr", "1e-3", "--batch-size", "320",
                "--update-period", "100", "--push-period", "1", "--eval-freq", "5000", "--eval-episodes", "5",
                "--target-reward", "195", "--max-env-steps", "200000", "--max-minutes", "30",
                "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reached"], summary["final_running_mean"]
    mismatch = summary["mismatch"]
    assert set(mismatch) == {"kl", "rho_mean", "rho_std", "rho_clipped", "policy_lag"}
    assert all(math.isfinite(v) for v in mismatch.values())
    assert 0 < mismatch["kl"] < 0.1 and 0.5 < mismatch["rho_mean"] < 2 and mismatch["policy_lag"] >= 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    assert "mismatch/kl" in events.Tags()["scalars"]
    from quarl.actorq.compare import compare_rows
    from quarl.actorq.summary import ActorQSummary

    row = compare_rows({"int8": [ActorQSummary.read(tmp_path / "run" / "summary.json")]})[0]
    assert row["kl"] == pytest.approx(mismatch["kl"], rel=1e-3) and "rho_clipped" in row
    # the scaling model reads an impala run: each env step is learned from once
    from quarl.actorq.model import costs_from_summaries

    costs = costs_from_summaries("int8", [ActorQSummary.read(tmp_path / "run" / "summary.json")])
    assert costs.env_steps_per_learner_step == 320
    from quarl.actorq.model import Cluster, scaling_rows

    rows = scaling_rows({"int8": costs}, [1, 8], Cluster(actors=1, nodes=1, cores_per_node=16), baseline="int8")
    assert [r["actors"] for r in rows] == [1, 8] and rows[1]["env_steps_per_s"] > rows[0]["env_steps_per_s"]


def test_impala_with_gaussian_actions_on_mujoco_runs_with_int4_actors(tmp_path: Path) -> None:
    """Continuous actions: a Gaussian around the network's mean (fixed sigma); int4 actors;
    a short run on steps whose mismatch is finite and small."""
    from quarl.actorq.system import run_actorq

    config = _config(tmp_path, env_id="InvertedPendulum-v4", actor_precision="int4", max_env_steps=4_000,
                     eval_every_steps=2_000, eval_episodes=2, target_reward=1e9)
    summary = run_actorq(config)
    assert summary.env_steps >= 4_000 and summary.learner_steps > 0
    assert all(math.isfinite(v) for v in summary.mismatch.values()) and summary.mismatch["kl"] < 0.1
    assert summary.actor_quant["mode"] in ("int4-block", "int4-weight-only")


def test_gae_matches_a_direct_sum_and_stops_at_episode_ends() -> None:
    """GAE(lambda) = sum_k (gamma lambda)^k delta_{t+k} within an episode; a terminal step
    bootstraps nothing and the next episode starts its own sum."""
    from quarl.actorq.ppo_learner import gae

    gamma, lam, T = 0.9, 0.8, 5
    rng = np.random.default_rng(0)
    rewards, values, next_values = (torch.tensor(rng.normal(size=(T, 1))) for _ in range(3))
    discounts = torch.tensor([[gamma], [gamma], [0.0], [gamma], [gamma]])
    continues = torch.tensor([[1.0], [1.0], [0.0], [1.0], [1.0]])
    out = gae(rewards, discounts, continues, values, next_values, lam)
    delta = (rewards + discounts * next_values - values)[:, 0].numpy()
    expected = [sum((gamma * lam) ** (k - t) * delta[k] for k in range(t, 3)) if t < 3 else
                sum((gamma * lam) ** (k - t) * delta[k] for k in range(t, T)) for t in range(T)]
    np.testing.assert_allclose(out[:, 0].numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_local_ppo_run_with_quantized_actors_learns_cartpole(precision: str, tmp_path: Path) -> None:
    """PPO, registered in its own module, learns CartPole from int8 / int4 actors' unrolls
    (the clipped ratio against their quantized policy) within the env-step budget."""
    config = _config(tmp_path, algo="ppo", actor_precision=precision, max_env_steps=100_000)
    summary = run_actorq(config)
    assert summary.reached, (summary.final_running_mean, summary.env_steps)
    assert summary.config["algo"] == "ppo" and summary.mismatch is not None and summary.mismatch["kl"] >= 0
    policy, _, algo = load_actorq_run(config.out)
    assert algo == "ppo" and policy.head == "argmax"
