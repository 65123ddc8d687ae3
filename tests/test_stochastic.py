"""Stochastic evaluation as the RL Zoo plays (``predict(deterministic=False)``), with common
random numbers between precisions."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec
from quarl.evaluation.episodes import acting, evaluate
from quarl.quant.modes import MODES
from quarl.quantization.api import quantize
from quarl.quantization.config import QuantConfig

CARTPOLE = EnvSpec("CartPole-v1")


def test_sampled_returns_match_sb3s_stochastic_predict_in_distribution(tiny_run: Path) -> None:
    """A weak PPO CartPole (its sampled and greedy play differ): quarl's sampled returns and
    SB3's evaluate_policy(deterministic=False) over 60 episodes each agree in mean within 4
    standard errors, while greedy play scores otherwise."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.utils import set_random_seed

    policy = load_checkpoint(tiny_run).policy
    ours = evaluate(acting(policy, CARTPOLE, True), CARTPOLE, episodes=60, n_envs=16).returns
    model = PPO.load(next(tiny_run.glob("*.zip")), device="cpu")
    set_random_seed(0)
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(gym.make("CartPole-v1"))
    env.reset(seed=1000)
    theirs, _ = evaluate_policy(model, env, n_eval_episodes=60, deterministic=False, return_episode_rewards=True)
    theirs = np.asarray(theirs, float)
    se = np.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se, (ours.mean(), theirs.mean(), se)
    greedy = evaluate(policy, CARTPOLE, episodes=60, n_envs=16).returns
    assert not np.array_equal(greedy, ours)  # it really samples


def test_fp32_and_a_quantized_copy_share_their_noise_per_seed_and_step(tiny_run: Path) -> None:
    policy = acting(load_checkpoint(tiny_run).policy, CARTPOLE, True)
    fp32 = evaluate(policy, CARTPOLE, episodes=40, n_envs=8)
    half = evaluate(quantize(policy, QuantConfig("fp16")), CARTPOLE, episodes=40, n_envs=8)
    again = evaluate(policy, CARTPOLE, episodes=40, n_envs=3)  # the noise is the seed's and step's, not the env's
    assert np.array_equal(fp32.returns, again.returns)
    assert np.mean(fp32.returns == half.returns) >= 0.9  # they part only where the distributions differ


def test_the_zoo_default_and_heads_that_cannot_sample() -> None:
    import torch
    from torch import nn

    from quarl.policies.base import Policy

    net = nn.Sequential(nn.Linear(4, 2))
    box = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    logits = Policy(net, box, gym.spaces.Discrete(2), "argmax", algo="ppo")
    assert not acting(logits, CARTPOLE).stochastic  # the RL Zoo plays CartPole greedily
    assert acting(logits, EnvSpec("MinAtar/Breakout-v1")).stochastic  # and Atari / MinAtar stochastically
    gaussian = Policy(nn.Sequential(nn.Linear(3, 1), nn.Tanh()), gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                      gym.spaces.Box(-2, 2, (1,), np.float32), "unscale", algo="sac")
    assert not acting(gaussian, EnvSpec("Pendulum-v1")).stochastic
    with pytest.raises(QuarlError, match="noise layers were not found"):
        acting(gaussian, EnvSpec("Pendulum-v1"), True)
    assert logits.fingerprint() != acting(logits, CARTPOLE, True).fingerprint()  # stored apart
    assert torch.equal(net[0].weight, acting(logits, CARTPOLE, True).network[0].weight)


def test_a_dqn_explores_with_its_saved_rate() -> None:
    from tests.conftest import zoo_run

    policy = load_checkpoint(zoo_run("dqn", "CartPole-v1")).policy
    rate = policy.meta["exploration_rate"]
    assert 0 < rate < 0.2
    sampled = acting(policy, CARTPOLE, True)
    x = np.zeros((2000, 4), np.float32)
    greedy = policy.act_rows(x)
    explored = sampled.sample_rows(x, [(0, t) for t in range(2000)])
    changed = np.mean(explored != greedy)
    assert 0.25 * rate < changed < rate  # a random action is the greedy one half the time (2 actions)


def test_a_categorical_heads_distance_to_fp32_is_reported_beside_agreement(tiny_run: Path) -> None:
    """KL(fp32 || int mode) per calibration state: near 0 at int8, larger at int4, and in
    the table's KL column; Q-heads and Gaussians have none."""
    from quarl.evaluation.calibration import calibration_inputs
    from quarl.evaluation.reports import quant_columns

    agent = load_checkpoint(tiny_run)
    states = calibration_inputs(agent.policy, agent.env_spec)
    int8 = MODES["int8-block"].runnable(agent.policy.network).label  # its fallback where this CPU cannot run it
    kl = {p: quantize(agent.policy, QuantConfig.parse(p), states).meta["quant"]["kl"] for p in (int8,
                                                                                                "int4-weight-only")}
    assert 0 <= kl[int8] < kl["int4-weight-only"] < 0.5, kl
    assert float(quant_columns({"quant": {"mode": int8, "agreement": 1.0, "kl": kl[int8]}})["KL"]) \
        == pytest.approx(kl[int8], rel=0.05)
    assert "KL" not in quant_columns({"quant": {"mode": "int8-block", "agreement": 1.0, "kl": None}})


def test_a_gaussian_ppo_samples_as_sb3s_does(tmp_path: Path) -> None:
    """A PPO Pendulum (diagonal Gaussian, state-independent log std): sampled returns match
    SB3's evaluate_policy(deterministic=False) in mean within 4 standard errors; fp32 and
    fp16 share their noise."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.utils import set_random_seed

    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=256, seed=0, device="cpu")
    model.learn(512)
    model.save(tmp_path / "ppo.zip")
    policy = load_checkpoint(tmp_path / "ppo.zip").policy
    assert len(policy.meta["log_std"]) == 1
    spec = EnvSpec("Pendulum-v1")
    sampled = acting(policy, spec, True)
    ours = evaluate(sampled, spec, episodes=40, n_envs=8).returns
    set_random_seed(0)
    env = Monitor(gym.make("Pendulum-v1"))
    env.reset(seed=1000)
    theirs = np.asarray(evaluate_policy(model, env, n_eval_episodes=40, deterministic=False,
                                        return_episode_rewards=True)[0], float)
    se = np.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se, (ours.mean(), theirs.mean(), se)
    assert not np.array_equal(ours, evaluate(policy, spec, episodes=40, n_envs=8).returns)
    half = evaluate(quantize(sampled, QuantConfig("fp16")), spec, episodes=40, n_envs=8).returns
    assert np.abs(half - ours).max() < 0.05 * np.abs(ours).mean()  # the same noise: nearly the same episodes


def test_an_absurd_log_std_is_refused_in_one_line(tmp_path: Path) -> None:
    """A crafted zip whose Gaussian log std is 1000 (std overflows to inf) would sample inf /
    NaN actions: refused on load (a NaN one already is, as every non-finite tensor)."""
    import io
    import zipfile

    import torch
    from stable_baselines3 import PPO

    PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, seed=0, device="cpu").save(tmp_path / "ok.zip")
    with zipfile.ZipFile(tmp_path / "ok.zip") as src, zipfile.ZipFile(tmp_path / "nan.zip", "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "policy.pth":
                sd = torch.load(io.BytesIO(data), weights_only=True)
                sd["log_std"] = torch.full_like(sd["log_std"], 1000.0)
                buffer = io.BytesIO()
                torch.save(sd, buffer)
                data = buffer.getvalue()
            dst.writestr(info, data)
    assert "log_std" in load_checkpoint(tmp_path / "ok.zip").policy.meta
    with pytest.raises(QuarlError, match=r"log_std \[1000.0\] is not finite within \+-20"):
        load_checkpoint(tmp_path / "nan.zip")


def test_a_study_samples_and_sets_sticky_actions_where_an_env_has_them(tiny_run: Path, tmp_path: Path) -> None:
    """One store, two protocols: a sampled study of a CartPole and a MinAtar agent keys its
    cells apart from the greedy one (the fp32 returns differ), records how each played, and
    sets sticky actions on the MinAtar env alone; its fp32 cell is what ``evaluate`` gives
    the sampled policy on those seeds."""
    from quarl.envs import with_sticky_actions
    from quarl.study.grid import SEED_STRIDE, StudyConfig, run_study
    from quarl.training.sb3_train import TrainConfig, train

    minatar = train(TrainConfig("a2c", "MinAtar/Breakout-v1", timesteps=256, out=tmp_path / "agents", eval_freq=0,
                                tensorboard=False)).run_dir
    agents = (tiny_run, minatar)
    greedy = run_study(StudyConfig(agents, ("fp32",), (1,), episodes=6, n_envs=3, out=tmp_path, stochastic=False))
    sampled = run_study(StudyConfig(agents, ("fp32",), (1,), episodes=6, n_envs=3, out=tmp_path, stochastic=True,
                                    sticky_actions=0.25))
    assert len(greedy) == len(sampled) == 2
    assert {r["policy_sha256"] for r in greedy}.isdisjoint({r["policy_sha256"] for r in sampled})
    by_env = {r["env_id"]: r for r in sampled}
    assert {r["acting"] for r in greedy} == {"greedy"} and {r["acting"] for r in sampled} == {"sampled"}
    assert by_env["MinAtar/Breakout-v1"]["sticky_actions"] == 0.25 and by_env["CartPole-v1"]["sticky_actions"] is None
    want = evaluate(acting(load_checkpoint(tiny_run).policy, CARTPOLE, True), CARTPOLE, episodes=6,
                    seed=SEED_STRIDE, n_envs=2).returns
    np.testing.assert_allclose(by_env["CartPole-v1"]["returns"], want, atol=1e-3)
    spec = with_sticky_actions(EnvSpec("MinAtar/Breakout-v1"), 0.25)
    want = evaluate(acting(load_checkpoint(minatar).policy, spec, True), spec, episodes=6, seed=SEED_STRIDE,
                    n_envs=2).returns
    np.testing.assert_allclose(by_env["MinAtar/Breakout-v1"]["returns"], want, atol=1e-3)
    greedy_cartpole = next(r for r in greedy if r["env_id"] == "CartPole-v1")
    assert greedy_cartpole["returns"] != by_env["CartPole-v1"]["returns"]


def test_play_samples_as_ptq_does(tiny_run: Path) -> None:
    from tests.conftest import run_cli

    result = run_cli("play", str(tiny_run), "--episodes", "3", "--seed", "7", "--stochastic")
    assert result.returncode == 0, result.stdout + result.stderr
    want = evaluate(acting(load_checkpoint(tiny_run).policy, CARTPOLE, True), CARTPOLE, episodes=3, seed=7,
                    n_envs=1).returns
    assert f"mean return {want.mean():.2f} over 3 episodes, sampled actions" in result.stdout
    refused = run_cli("play", str(tiny_run), "--episodes", "1", "--sticky-actions", "0.25")
    assert refused.returncode == 2 and "--sticky-actions is for Atari and MinAtar" in refused.stderr


def test_demo_samples_when_asked(tiny_run: Path, tmp_path: Path) -> None:
    from quarl.demo.run import run_demo
    from quarl.evaluation.cells import EvalSettings

    rows = run_demo([tiny_run], ["fp16"], EvalSettings(episodes=5, n_envs=5), tmp_path, stochastic=True,
                    sticky_actions=0.25)  # CartPole has no sticky actions: it plays as it is
    want = evaluate(acting(load_checkpoint(tiny_run).policy, CARTPOLE, True), CARTPOLE, episodes=5).returns
    assert rows[0]["fp32"] == pytest.approx(want.mean(), abs=0.01)


def test_sampled_agreement_is_one_minus_total_variation_for_two_actions(tiny_run: Path) -> None:
    """Under shared Gumbel noise two categorical policies over 2 actions sample the same
    action with probability 1 - TV: the estimate over 2,000 states is within 0.01 of it."""
    import torch

    from quarl.quantization.candidates import sampled_agreement

    policy = load_checkpoint(tiny_run).policy
    states = np.random.default_rng(3).normal(size=(2000, 4)).astype(np.float32)
    with torch.no_grad():
        logits = policy.network(torch.from_numpy(states)).double().numpy()
    moved = logits + np.random.default_rng(4).normal(scale=1.0, size=logits.shape)
    p, q = (np.exp(x - x.max(1, keepdims=True)) for x in (logits, moved))
    tv = 0.5 * np.abs(p / p.sum(1, keepdims=True) - q / q.sum(1, keepdims=True)).sum(1).mean()
    assert sampled_agreement(policy, states, logits) == 1.0
    assert abs(sampled_agreement(policy, states, moved) - (1 - tv)) < 0.01


def test_a_sampling_policys_int_mode_is_chosen_on_its_sampled_agreement(tiny_run: Path) -> None:
    """The automatic choice of a sampling categorical policy records the sampled agreement
    it was judged by (a choice stored apart from the greedy one) and the table shows it."""
    from quarl.evaluation.calibration import calibration_inputs
    from quarl.evaluation.reports import quant_columns

    policy = load_checkpoint(tiny_run).policy
    calibration = calibration_inputs(policy, CARTPOLE)
    sampled = quantize(acting(policy, CARTPOLE, True), QuantConfig.parse("int4"), calibration=calibration)
    greedy = quantize(policy, QuantConfig.parse("int4"), calibration=calibration)
    quant = sampled.meta["quant"]
    assert sampled.stochastic and not greedy.stochastic
    assert 0.9 <= quant["sampled_agreement"] <= 1.0
    assert "sampled agree%" in quant_columns({"quant": quant})
    from quarl.quantization.choice import choose

    states = calibration[:400]
    for bar in (0.95, 0.9999):  # a bar the sampled agreement meets, and one it may not
        chosen, tried = choose(policy, 4, states, "auto", 32, bar, 0.02, sampled=True)
        passing = [c for c in tried if c.sampled_agreement >= bar]
        if passing:
            assert chosen.sampled_agreement >= bar
        else:
            assert chosen.sampled_agreement == max(c.sampled_agreement for c in tried)


# ---------------------------------------------------------------------------- state-dependent noise


_TRAINED: dict[tuple[str, str, int], tuple[type, Path]] = {}
"""The models :func:`_sb3_model` trained in this test process, by kind, env and steps."""


def _sb3_model(kind: str, tmp_path: Path, env_id: str = "Pendulum-v1", steps: int = 300):
    """A briefly trained SB3 model with a state-dependent noise head, saved and reloaded (trained
    once per test process and kind, then copied to the test's folder: an SAC's 250 updates took
    3 s, and three tests read one)."""
    import shutil

    from stable_baselines3 import PPO, SAC

    path = tmp_path / f"{kind}.zip"
    if (kind, env_id, steps) not in _TRAINED:
        make = {"sac": lambda: SAC("MlpPolicy", env_id, seed=0, device="cpu", learning_starts=50),
                "sac_gsde": lambda: SAC("MlpPolicy", env_id, seed=0, device="cpu", learning_starts=50, use_sde=True),
                "ppo_gsde": lambda: PPO("MlpPolicy", env_id, seed=0, device="cpu", n_steps=128, batch_size=64,
                                        use_sde=True, policy_kwargs={"log_std_init": -1.0, "full_std": False}),
                "ppo_gsde_squash": lambda: PPO("MlpPolicy", env_id, seed=0, device="cpu", n_steps=128, batch_size=64,
                                               use_sde=True, policy_kwargs={"squash_output": True, "use_expln": True})}
        model = make[kind]()
        model.learn(steps)
        model.save(path)
        _TRAINED[(kind, env_id, steps)] = (type(model), path)
    algorithm, trained = _TRAINED[(kind, env_id, steps)]
    if trained != path:
        shutil.copy(trained, path)
    return algorithm.load(path, device="cpu"), path


@pytest.mark.parametrize("kind", ["sac", "sac_gsde", "ppo_gsde", "ppo_gsde_squash"])
def test_state_dependent_noise_samples_exactly_as_sb3_with_the_same_draws(kind: str, tmp_path: Path) -> None:
    """SAC's squashed Gaussian and gSDE (SAC, PPO; squashed or clipped, full or one-column
    std, exp or expln): quarl's sampled action for (seed, step) equals what SB3's policy
    samples given the same standard normal draws, to 1e-5 of the action range."""
    import torch

    from quarl.policies.base import GSDE_STREAM

    model, path = _sb3_model(kind, tmp_path)
    policy = acting(load_checkpoint(path).policy, EnvSpec("Pendulum-v1"), True)
    assert policy.noise is not None and policy.noise.kind == ("squashed_gaussian" if kind == "sac" else "gsde")
    obs = np.random.default_rng(3).uniform(-1, 1, (6, 3)).astype(np.float32)
    keys = [(100 + i, 7 * i) for i in range(len(obs))]
    ours = policy.sample_rows(policy.preprocess(obs), keys)
    sb3 = model.policy
    theirs = []
    for row, key in zip(obs, keys, strict=True):
        x = torch.as_tensor(row[None])
        with torch.no_grad():
            if kind == "sac":
                mean, log_std, _ = sb3.actor.get_action_dist_params(x)
                eps = torch.as_tensor(np.random.default_rng(list(key)).standard_normal(1))
                action = torch.tanh(mean.double() + torch.exp(log_std.double()) * eps).numpy()
            else:
                dist = sb3.actor.action_dist if kind == "sac_gsde" else sb3.action_dist
                std = dist.get_std(sb3.actor.log_std if kind == "sac_gsde" else sb3.log_std).double().numpy()
                mat = np.random.default_rng([key[0], GSDE_STREAM]).standard_normal(std.shape) * std
                dist.exploration_mat = torch.as_tensor(mat, dtype=torch.float32)
                action = (sb3.actor(x, deterministic=False) if kind == "sac_gsde"
                          else sb3._predict(x, deterministic=False))
                action = action.double().numpy()
        theirs.append(np.clip(sb3.unscale_action(action) if sb3.squash_output else action, -2, 2)[0])
    np.testing.assert_allclose(ours, np.asarray(theirs), atol=4e-5)
    assert np.abs(ours - policy.act(obs)).max() > 1e-3  # it really samples


def test_a_gsde_matrix_is_drawn_per_episode_and_shared_by_precisions(tmp_path: Path) -> None:
    """Within an episode a gSDE policy's noise is latent @ one matrix (SB3 keeps it until
    reset_noise); another episode seed draws another; fp16 samples with fp32's draws."""
    _, path = _sb3_model("sac_gsde", tmp_path)
    policy = acting(load_checkpoint(path).policy, EnvSpec("Pendulum-v1"), True)
    x = policy.preprocess(np.random.default_rng(0).uniform(-1, 1, (1, 3)).astype(np.float32))
    same_episode = [policy.sample_rows(x, [(5, step)])[0, 0] for step in range(3)]
    assert same_episode[0] == same_episode[1] == same_episode[2]  # one state, one matrix: one action
    other = policy.sample_rows(x, [(6, 0)])[0, 0]
    assert other != same_episode[0]
    half = quantize(policy, QuantConfig("fp16"))
    assert half.noise is policy.noise
    assert abs(half.sample_rows(x, [(5, 0)])[0, 0] - same_episode[0]) < 0.02


# 5-13 s: SAC's sampling is held to SB3's draw by draw above, sampled play end to end by the PPO tests
@pytest.mark.slow
def test_sac_sampled_returns_match_sb3s_on_mujoco(tmp_path: Path) -> None:
    """An SAC on MuJoCo's InvertedPendulum (a few hundred steps: its episodes vary): quarl's
    sampled episode lengths and SB3's evaluate_policy(deterministic=False) agree in mean
    within 4 standard errors, and differ from greedy play."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.utils import set_random_seed

    model, path = _sb3_model("sac", tmp_path, "InvertedPendulum-v4", steps=400)
    spec = EnvSpec("InvertedPendulum-v4")
    policy = load_checkpoint(path).policy
    ours = evaluate(acting(policy, spec, True), spec, episodes=60, n_envs=8).returns
    set_random_seed(0)
    env = Monitor(gym.make("InvertedPendulum-v4"))
    env.reset(seed=1000)
    theirs = np.asarray(evaluate_policy(model, env, n_eval_episodes=60, deterministic=False,
                                        return_episode_rewards=True)[0], float)
    se = np.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se + 1e-9, (ours.mean(), theirs.mean(), se)
    assert not np.array_equal(ours, evaluate(policy, spec, episodes=60, n_envs=8).returns)


def test_td3_samples_greedily_as_sb3s_predict_does(tmp_path: Path) -> None:
    """TD3 / DDPG's predict ignores ``deterministic`` (their noise is for training): asked to
    sample, they play greedily and say so (records read ``greedy``), not a refusal."""
    from stable_baselines3 import TD3

    TD3("MlpPolicy", "Pendulum-v1", seed=0, device="cpu").save(tmp_path / "td3.zip")
    policy = load_checkpoint(tmp_path / "td3.zip").policy
    spec = EnvSpec("Pendulum-v1")
    sampled = acting(policy, spec, True)
    assert not sampled.stochastic
    assert np.array_equal(evaluate(sampled, spec, episodes=4).returns, evaluate(policy, spec, episodes=4).returns)
    from quarl.policies.base import sample_actions

    out = policy.forward(policy.preprocess(np.zeros((3, 3), np.float32)))
    assert np.array_equal(sample_actions(policy, out, [(0, 0), (1, 0), (2, 5)]), policy.postprocess(out))


def test_an_export_of_a_sampling_continuous_policy_is_refused_and_an_export_cannot_sample(tmp_path: Path) -> None:
    """The ONNX model holds a Gaussian's mean alone: exporting a sampling SAC is refused
    (its sidecar would say "sampled"), and sampling from an export says what to do."""
    from quarl.export.artifact import export_policy
    from quarl.policies.onnx_artifact import load_artifact

    _, path = _sb3_model("sac", tmp_path)
    spec = EnvSpec("Pendulum-v1")
    policy = load_checkpoint(path).policy
    with pytest.raises(QuarlError, match="an export holds sac's mean action alone, not its noise: export with "
                                         "--deterministic"):
        export_policy(acting(policy, spec, True), "fp32", tmp_path / "out" / "policy", env_spec=spec)
    export_policy(policy, "fp32", tmp_path / "out" / "policy", env_spec=spec)
    exported, _ = load_artifact(tmp_path / "out" / "policy.onnx")
    with pytest.raises(QuarlError, match="cannot be sampled from an exported model .*evaluate the checkpoint it came "
                                         "from with --stochastic, or drop --stochastic"):
        acting(exported, spec, True)
