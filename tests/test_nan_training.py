"""Runtime NaN / inf in training stops the run at the env step where it appeared, keeps the
last good checkpoint on disk (finite, loadable) and ends in one line naming both."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from quarl.core.errors import QuarlError
from quarl.training.guard import NonFiniteTraining, non_finite_loss, non_finite_transition
from quarl.training.periodic_saves import latest_checkpoint
from quarl.training.sb3_train import TrainConfig, train

EPISODE = 20


class BadRewardEnv(gym.Env):
    """Two actions, a 2-d observation, episodes of 20 steps; from its ``bad_at``-th step
    (counted over its whole life, 1-based) it returns ``bad_reward`` at every step."""

    def __init__(self, bad_at: int = 10**9, bad_reward: float = float("nan")) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.bad_at, self.bad_reward = bad_at, bad_reward
        self.steps = 0
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        self.t += 1
        reward = self.bad_reward if self.steps >= self.bad_at else float(action)
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return obs, reward, False, self.t >= EPISODE, {}


NAN_AT = 137
gym.register("QuarlTest/NaNRewardAt137-v0", entry_point=BadRewardEnv, kwargs={"bad_at": NAN_AT})
# a finite reward whose square overflows float32: the value loss turns inf, the weights NaN
gym.register("QuarlTest/Fine-v0", entry_point=BadRewardEnv)
gym.register("QuarlTest/HugeReward-v0", entry_point=BadRewardEnv, kwargs={"bad_at": 1, "bad_reward": 3e38})

PPO_HP = {"n_envs": 1, "n_steps": 32, "batch_size": 32, "n_epochs": 1, "policy_kwargs": "dict(net_arch=[16])"}
DQN_HP = {"learning_starts": 16, "train_freq": 4, "gradient_steps": 1, "batch_size": 16, "buffer_size": 1000,
          "policy_kwargs": "dict(net_arch=[16])"}


def _finite_zip(path: Path, algo: str) -> None:
    """The zip loads with SB3 and every tensor it holds is finite."""
    import stable_baselines3 as sb3

    model = getattr(sb3, algo.upper()).load(path, device="cpu")
    for name, tensor in model.policy.state_dict().items():
        assert torch.isfinite(tensor).all(), name


@pytest.mark.parametrize("algo,hp", [("ppo", PPO_HP), ("dqn", DQN_HP)])
def test_a_nan_reward_stops_training_at_its_step_and_keeps_the_last_good_checkpoint(
        algo: str, hp: dict, tmp_path: Path) -> None:
    config = TrainConfig(algo, "QuarlTest/NaNRewardAt137-v0", timesteps=400, hyperparams=hp, out=tmp_path,
                         eval_freq=0, checkpoint_freq=50, tensorboard=False)
    with pytest.raises(QuarlError) as caught:
        train(config)
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(rf"stopped at env step {NAN_AT}: the reward of env 0 \(nan\) is not finite", message), message
    run = tmp_path / algo / "QuarlTest_NaNRewardAt137-v0_1"
    assert "the last good checkpoint is rl_model_100_steps.zip (step 100)" in message, message
    assert latest_checkpoint(run) == (100, run / "rl_model_100_steps.zip")  # none at 150: it stopped at 137
    assert not (run / "QuarlTest_NaNRewardAt137-v0.zip").exists()  # no final model
    _finite_zip(run / "rl_model_100_steps.zip", algo)
    if algo == "dqn":  # the replay saved beside it: the 99 transitions stored before step 100's callback
        replay = np.load(run / "rl_model_100_steps.replay.npz")
        assert int(replay["pos"]) == 99 and np.isfinite(replay["rewards"]).all()


def test_a_ppo_update_that_goes_nan_stops_training_before_the_next_step(tmp_path: Path) -> None:
    """Rewards of 3e38 are finite, but the advantages they make overflow: the update after
    the first rollout (32 steps) logs a NaN loss and leaves NaN weights; no step is taken
    with them and the checkpoint written before the update is the last one."""
    config = TrainConfig("ppo", "QuarlTest/HugeReward-v0", timesteps=256, hyperparams=PPO_HP, out=tmp_path,
                         eval_freq=0, checkpoint_freq=16, tensorboard=False)
    with pytest.raises(QuarlError) as caught:
        train(config)
    message = str(caught.value)
    assert re.search(r"stopped at env step 32: (the loss train/\w*loss \((inf|nan)\)|weight [\w.]+) is not finite",
                     message), message
    run = tmp_path / "ppo" / "QuarlTest_HugeReward-v0_1"
    assert latest_checkpoint(run) == (32, run / "rl_model_32_steps.zip")
    _finite_zip(run / "rl_model_32_steps.zip", "ppo")


def test_an_infinite_dqn_loss_stops_training_where_it_appeared(tmp_path: Path) -> None:
    """A learning rate of 1e30: the first update (step 20: learning starts after 16, one
    update every 4 steps) scales the weights to ~1e30, so the second one's Q-values and loss
    overflow to inf at step 24. DQN acts by argmax and would train on silently (it did: 200
    steps, exit 0); the run stops at 24 and keeps the checkpoint of step 20."""
    config = TrainConfig("dqn", "QuarlTest/Fine-v0", timesteps=200, hyperparams={**DQN_HP, "learning_rate": 1e30},
                         out=tmp_path, eval_freq=0, checkpoint_freq=10, tensorboard=False)
    with pytest.raises(QuarlError, match=r"^training stopped at env step 24: the loss train/loss \(inf\) is not finite "
                       r"\(NaN or inf\); the last good checkpoint is rl_model_20_steps.zip \(step 20\)"):
        train(config)
    run = tmp_path / "dqn" / "QuarlTest_Fine-v0_1"
    assert latest_checkpoint(run) == (20, run / "rl_model_20_steps.zip")
    _finite_zip(run / "rl_model_20_steps.zip", "dqn")


def test_the_guard_names_what_is_not_finite() -> None:
    assert non_finite_transition(np.array([1.0, 2.0]), np.zeros((2, 3), np.float32)) is None
    assert non_finite_transition(np.array([1.0, np.inf]), None) == "the reward of env 1 (inf)"
    assert non_finite_transition(np.array([0.0]), {"pos": np.array([[np.nan]]), "img": np.zeros(3, np.uint8)}) \
        == "an observation (pos)"
    assert non_finite_transition(np.array([0.0]), np.full((1, 4), 255, np.uint8)) is None
    assert non_finite_loss({"train/value_loss": 1.5, "train/explained_variance": float("nan")}) is None
    assert non_finite_loss({"train/value_loss": float("inf")}) == "the loss train/value_loss (inf)"
    assert str(NonFiniteTraining(1234, "weight x")) \
        == "training stopped at env step 1,234: weight x is not finite (NaN or inf)"


gym.register("QuarlTest/NaNRewardAt100-v0", entry_point=BadRewardEnv, kwargs={"bad_at": 100})


def test_fine_tuning_stops_at_a_nan_reward_and_keeps_nothing_of_it(tmp_path: Path) -> None:
    """quarl recover's fine-tuning with the agent's own algorithm: the agent trained 64 clean
    steps; in fine-tuning, its fresh env's 100th step returns NaN: one line naming step 100."""
    from quarl.checkpoints import load_checkpoint
    from quarl.quant.student import KernelSpec
    from quarl.training.finetune import finetune

    run = train(TrainConfig("ppo", "QuarlTest/NaNRewardAt100-v0", timesteps=64, hyperparams=PPO_HP, out=tmp_path,
                            eval_freq=0, tensorboard=False)).run_dir
    ckpt = load_checkpoint(run)
    zip_path = run / "QuarlTest_NaNRewardAt100-v0.zip"
    with pytest.raises(QuarlError, match=rf"^fine-tuning {re.escape(str(zip_path))}: training stopped at env step 100: "
                       r"the reward of env 0 \(nan\) is not finite \(NaN or inf\); nothing of it is kept$"):
        finetune(zip_path, ckpt.policy, ckpt.env_spec, KernelSpec("int8-dyn-tensor", frozenset()), None, 300)


def test_quarl_train_prints_the_whole_command_that_continues_a_stopped_run(tmp_path: Path) -> None:
    """As typed: ``quarl train`` stopped by a NaN reward exits 2 with one line that ends in
    the command continuing it (the same one with ``--resume``)."""
    import sys

    from typer.testing import CliRunner

    from quarl.cli import app

    args = ["train", "ppo", "QuarlTest/NaNRewardAt137-v0", "-n", "400", "--eval-freq", "0", "--checkpoint-freq", "50",
            "--out", str(tmp_path), *[a for k, v in PPO_HP.items() for a in ("--hp", f"{k}={v}")]]
    old_argv = sys.argv
    sys.argv = ["quarl", *args]  # what resume_command reads, as in a real run
    try:
        r = CliRunner().invoke(app, args)
    finally:
        sys.argv = old_argv
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "stopped at env step 137" in lines[0], r.output
    assert lines[0].rstrip().endswith("--resume)") and "(to continue: quarl train ppo QuarlTest/NaNRewardAt137-v0" \
        in lines[0], lines[0]


def test_resume_continues_with_the_hyperparameters_the_run_started_with(tmp_path: Path) -> None:
    """A run stopped by a NaN has no args.yml yet: --resume without --hp takes the run's own
    (its rollouts stay 32 steps, not SB3's 2048), and other --hp are refused in one line."""
    import stable_baselines3 as sb3

    def config(hp: dict) -> TrainConfig:
        return TrainConfig("ppo", "QuarlTest/NaNRewardAt137-v0", timesteps=400, hyperparams=hp, out=tmp_path,
                           eval_freq=0, checkpoint_freq=50, tensorboard=False)

    with pytest.raises(QuarlError, match="stopped at env step 137"):
        train(config(PPO_HP))
    with pytest.raises(QuarlError,
                       match=r"started with --hp .*\"n_steps\": 32.* not .*\"n_steps\": 64.*resume without --hp"):
        train(config({**PPO_HP, "n_steps": 64}), resume=True)
    with pytest.raises(QuarlError, match="stopped at env step 237"):  # resumed at 100: the env's 137th step again
        train(config({}), resume=True)
    run = tmp_path / "ppo" / "QuarlTest_NaNRewardAt137-v0_1"
    assert latest_checkpoint(run)[0] == 200
    assert sb3.PPO.load(run / "rl_model_200_steps.zip", device="cpu").n_steps == 32
