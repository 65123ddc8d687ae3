"""PyBullet, the paper's third env family: its ids make quietly through the registry, and an
RL Zoo PyBullet folder (gSDE, VecNormalize pickled with the old ``gym`` space classes) loads
safely and acts as Stable-Baselines3 acts."""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from quarl.checkpoints import load_checkpoint
from quarl.envs import EnvSpec, env_family, make_env

ENV = "HopperBulletEnv-v0"


def test_pybullet_ids_are_a_family_and_print_nothing(capfd: pytest.CaptureFixture) -> None:
    capfd.readouterr()
    env = make_env(EnvSpec("HalfCheetahBulletEnv-v0"))
    obs, _ = env.reset(seed=0)
    obs2, *_ = env.step(env.action_space.sample())
    assert env_family("HalfCheetahBulletEnv-v0").name == "pybullet"
    assert obs.shape == (26,) and np.isfinite(obs2).all()
    out, err = capfd.readouterr()
    assert out == "" and "pybullet build time" not in err  # pybullet's C banner and argv[0]= stay out of tables


@pytest.fixture(scope="module")
def bullet_run(tmp_path_factory: pytest.TempPathFactory):
    """PPO on HopperBulletEnv-v0 with the RL Zoo's hyperparameters (gSDE, VecNormalize),
    2 rollouts; its vecnormalize.pkl then rewritten as the Zoo's published folders hold it:
    pickled with the old ``gym`` package's space classes, which is not installed."""
    from quarl.training.sb3_train import TrainConfig, train

    out = tmp_path_factory.mktemp("bullet")
    result = train(TrainConfig("ppo", ENV, timesteps=1024, out=out, eval_freq=0, tensorboard=False,
                               hyperparams={"n_envs": 2}))
    stats = result.run_dir / ENV / "vecnormalize.pkl"
    vecnorm = result.model.get_vec_normalize_env()
    old = {name: types.ModuleType(name) for name in ("gym", "gym.spaces", "gym.spaces.box")}

    class Box:  # what gym 0.21's Box pickles as: gym.spaces.box.Box with its state
        def __init__(self, space) -> None:
            self.__dict__.update({"low": space.low, "high": space.high, "_shape": space.shape,
                                  "dtype": space.dtype})

    Box.__module__, Box.__qualname__ = "gym.spaces.box", "Box"
    old["gym.spaces.box"].Box = Box
    sys.modules.update(old)
    spaces = vecnorm.observation_space, vecnorm.action_space
    try:
        vecnorm.observation_space, vecnorm.action_space = Box(spaces[0]), Box(spaces[1])
        stats.write_bytes(pickle.dumps(vecnorm))
    finally:
        vecnorm.observation_space, vecnorm.action_space = spaces
        for name in old:
            sys.modules.pop(name)
    assert b"gym.spaces.box" in stats.read_bytes()
    with pytest.raises(ModuleNotFoundError):  # what rl_zoo3.enjoy meets in the Zoo's folders
        pickle.loads(stats.read_bytes())
    return result


def test_a_zoo_pybullet_folder_with_an_old_gym_pickle_acts_as_sb3(bullet_run) -> None:
    from stable_baselines3.common.vec_env import VecNormalize

    agent = load_checkpoint(bullet_run.run_dir)  # the safe reader: old gym classes as inert records
    policy = agent.policy
    assert agent.env_spec.env_id == ENV and policy.obs_normalizer is not None
    model = bullet_run.model
    vecnorm = model.get_vec_normalize_env()
    assert isinstance(vecnorm, VecNormalize)
    env = make_env(agent.env_spec)
    obs, _ = env.reset(seed=3)
    states = []
    for _ in range(200):
        states.append(obs)
        action, _ = model.predict(vecnorm.normalize_obs(obs[None]), deterministic=True)
        obs, _, term, trunc, _ = env.step(action[0])
        if term or trunc:
            obs, _ = env.reset()
    raw = np.stack(states)
    want = np.concatenate([model.predict(vecnorm.normalize_obs(o[None]), deterministic=True)[0] for o in raw])
    got = np.concatenate([policy.act(o[None]) for o in raw])  # gSDE acts by its mean, as SB3 does deterministically
    assert np.array_equal(got, want), np.abs(got - want).max()


def test_a_pybullet_agent_runs_real_int8(bullet_run, tmp_path: Path) -> None:
    from tests.conftest import run_cli
    from tests.test_cli import read_csv

    r = run_cli("ptq", str(bullet_run.run_dir), "--precisions", "int8", "--episodes", "3", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = {row["precision"]: row for row in read_csv(tmp_path / "ptq.csv")}
    assert rows["int8"]["mode"].startswith("int8-") and float(rows["fp32"]["mean"]) != 0.0
