"""MultiDiscrete and MultiBinary actions (A2C / PPO): loaded, played greedily and sampled
as SB3 does, quantized, exported and distilled."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.multi_target_envs  # noqa: F401  (registers MultiTarget-v0 and BinaryTarget-v0)
from quarl.checkpoints import load_checkpoint
from quarl.envs import EnvSpec
from quarl.evaluation.episodes import acting, evaluate
from quarl.quantization.api import quantize
from quarl.quantization.config import QuantConfig

ENVS = {"multi_argmax": "MultiTarget-v0", "bernoulli": "BinaryTarget-v0"}
BEST = {"multi_argmax": 40.0, "bernoulli": 60.0}  # 20 steps x sub-actions hit


@pytest.fixture(scope="module", params=sorted(ENVS))
def trained(request, tmp_path_factory) -> tuple[str, object, Path]:
    """(head, the SB3 model, its zip): a PPO trained 4,000 steps on its multi-target env."""
    from stable_baselines3 import PPO

    head = request.param
    model = PPO("MlpPolicy", ENVS[head], seed=0, device="cpu", n_steps=256, batch_size=64, learning_rate=3e-3)
    model.learn(4000)
    path = tmp_path_factory.mktemp(head) / "ppo.zip"
    model.save(path)
    return head, model, path


def test_greedy_actions_equal_sb3s_and_the_policy_has_learned(trained) -> None:
    head, model, path = trained
    policy = load_checkpoint(path).policy
    assert policy.head == head
    env = gym.make(ENVS[head])
    obs = np.stack([env.observation_space.sample() for _ in range(300)])
    assert np.array_equal(policy.act(obs), model.predict(obs, deterministic=True)[0])
    returns = evaluate(policy, EnvSpec(ENVS[head]), episodes=10).returns
    assert returns.mean() >= 0.8 * BEST[head], returns  # it learned: a random policy scores about half of this


def test_sampled_sub_actions_follow_sb3s_distribution(trained) -> None:
    """Sampled actions on one state over 4,000 draws: each sub-action's (or bit's)
    frequencies match the probabilities SB3's distribution gives, within 0.03."""
    head, model, path = trained
    policy = acting(load_checkpoint(path).policy, EnvSpec(ENVS[head]), True)
    obs = gym.make(ENVS[head]).reset(seed=3)[0][None]
    draws = policy.sample_rows(policy.preprocess(np.repeat(obs, 4000, 0)), [(9, s) for s in range(4000)])
    with torch.no_grad():
        dist = model.policy.get_distribution(torch.as_tensor(obs)).distribution
    if head == "bernoulli":
        np.testing.assert_allclose(draws.mean(0), dist.probs[0].numpy(), atol=0.03)
    else:
        for i, categorical in enumerate(dist):
            freq = np.bincount(draws[:, i], minlength=categorical.probs.shape[1]) / len(draws)
            np.testing.assert_allclose(freq, categorical.probs[0].numpy(), atol=0.03)
    assert len({tuple(np.atleast_1d(a)) for a in draws}) > 1  # it really samples


def test_sampled_returns_match_sb3s_evaluate_policy(trained) -> None:
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    head, model, path = trained
    spec = EnvSpec(ENVS[head])
    ours = evaluate(acting(load_checkpoint(path).policy, spec, True), spec, episodes=40, n_envs=8).returns
    env = Monitor(gym.make(ENVS[head]))
    env.reset(seed=1000)
    torch.manual_seed(0)
    theirs = np.asarray(evaluate_policy(model, env, n_eval_episodes=40, deterministic=False,
                                        return_episode_rewards=True)[0], float)
    se = np.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se + 0.5, (ours.mean(), theirs.mean(), se)


def test_int8_keeps_the_greedy_actions_and_an_export_acts_as_its_source(trained, tmp_path: Path) -> None:
    from quarl.export.artifact import _space
    from quarl.policies.onnx_artifact import _space as read_space

    head, _, path = trained
    policy = load_checkpoint(path).policy
    spec = EnvSpec(ENVS[head])
    from quarl.evaluation.calibration import calibration_inputs

    fp32 = evaluate(policy, spec, episodes=10).returns
    quantized = quantize(policy, QuantConfig("int8"), calibration_inputs(policy, spec))
    assert quantized.meta["quant"]["agreement"] >= 0.95
    int8 = evaluate(quantized, spec, episodes=10).returns
    assert abs(int8.mean() - fp32.mean()) <= 0.05 * BEST[head]
    assert read_space(_space(policy.action_space), "action space") == policy.action_space


def test_distillation_losses_of_multi_heads_vanish_at_the_teacher_and_train_toward_it(trained) -> None:
    from quarl.recovery import distill_loss

    head, _, path = trained
    policy = load_checkpoint(path).policy
    x = torch.as_tensor(policy.preprocess(np.stack([gym.make(ENVS[head]).observation_space.sample()
                                                    for _ in range(64)])))
    teacher = policy.network(x)
    assert float(distill_loss(policy, teacher, teacher, 1.0)) == pytest.approx(0.0, abs=1e-6)
    student = (teacher + torch.randn_like(teacher)).requires_grad_(True)
    before = float(distill_loss(policy, student, teacher, 1.0).detach())
    optimizer = torch.optim.Adam([student], lr=0.1)
    for _ in range(100):
        optimizer.zero_grad()
        distill_loss(policy, student, teacher, 1.0).backward()
        optimizer.step()
    assert before > 0.05 and float(distill_loss(policy, student, teacher, 1.0).detach()) < 0.2 * before


def test_a_multi_discrete_space_of_absurd_size_is_refused_in_one_line() -> None:
    from quarl.core.errors import QuarlError
    from quarl.policies.sb3_spaces import space_from_json

    entry = {":type:": "<class 'gymnasium.spaces.multi_discrete.MultiDiscrete'>", "nvec": "[  3  10 200]",
             "start": "[0 0 0]"}  # numpy pads its text to the widest number
    assert space_from_json(entry, "action space") == gym.spaces.MultiDiscrete([3, 10, 200])
    entry["start"] = "[0 1 0]"
    with pytest.raises(QuarlError, match=r"start '\[0 1 0\]': only 0"):
        space_from_json(entry, "action space")
    entry = {":type:": "<class 'gymnasium.spaces.multi_discrete.MultiDiscrete'>", "nvec": "[3 0]"}
    with pytest.raises(QuarlError, match=r"nvec .*expected 1 to 1024 whole sizes"):
        space_from_json(entry, "action space")
    entry["nvec"] = "[" + " ".join(["2"] * 5000) + "]"
    with pytest.raises(QuarlError, match="expected 1 to 1024"):
        space_from_json(entry, "action space")
    binary = {":type:": "<class 'gymnasium.spaces.multi_binary.MultiBinary'>", "n": 10**9}
    with pytest.raises(QuarlError, match="allowed 1..1024 bits"):
        space_from_json(binary, "action space")


def test_an_export_plays_as_it_was_judged_by_default(trained, tmp_path: Path) -> None:
    """The sidecar's ``acting`` is the default of ptq / play on the export: a sampled export
    samples unless told otherwise, a greedy one plays greedily."""
    from quarl.export.artifact import export_policy
    from quarl.policies.onnx_artifact import load_artifact

    head, _, path = trained
    spec = EnvSpec(ENVS[head])
    policy = load_checkpoint(path).policy
    export_policy(acting(policy, spec, True), "fp32", tmp_path / "sampled" / "policy", env_spec=spec)
    export_policy(acting(policy, spec, False), "fp32", tmp_path / "greedy" / "policy", env_spec=spec)
    sampled, _ = load_artifact(tmp_path / "sampled" / "policy.onnx")
    greedy, _ = load_artifact(tmp_path / "greedy" / "policy.onnx")
    assert acting(sampled, spec).stochastic and not acting(greedy, spec).stochastic
    assert not acting(sampled, spec, False).stochastic  # --deterministic still wins
    ours = evaluate(acting(sampled, spec), spec, episodes=8).returns
    assert np.array_equal(ours, evaluate(acting(policy, spec, True), spec, episodes=8).returns)  # the same draws


def test_a_dqn_export_keeps_its_exploration_rate() -> None:
    import tempfile

    from quarl.export.artifact import export_policy
    from quarl.policies.onnx_artifact import load_artifact
    from tests.conftest import zoo_run

    policy = load_checkpoint(zoo_run("dqn", "CartPole-v1")).policy
    with tempfile.TemporaryDirectory() as folder:
        export_policy(policy, "fp32", Path(folder) / "policy", env_spec=EnvSpec("CartPole-v1"))
        exported, _ = load_artifact(Path(folder) / "policy.onnx")
    assert exported.meta["exploration_rate"] == policy.meta["exploration_rate"] > 0


def test_quarl_trains_multi_action_envs_with_ppo_and_refuses_dqn(tmp_path: Path) -> None:
    from quarl.core.errors import QuarlError
    from quarl.training.sb3_train import TrainConfig, check_algo_env, train

    with pytest.raises(QuarlError, match=r"dqn does not take MultiDiscrete actions \(MultiTarget-v0\): use ppo, a2c "
                                         "or trpo"):
        check_algo_env("dqn", "MultiTarget-v0")
    run = train(TrainConfig("ppo", "BinaryTarget-v0", timesteps=512, hyperparams={"n_steps": 256}, out=tmp_path,
                            eval_freq=0, tensorboard=False)).run_dir
    policy = load_checkpoint(run).policy
    assert policy.head == "bernoulli" and policy.action_space == gym.spaces.MultiBinary(3)
