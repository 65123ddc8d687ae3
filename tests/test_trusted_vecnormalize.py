"""A vecnormalize.pkl unpickled with --trust-pickle is still checked (issue 38): a pickle of
another class, or a VecNormalize whose fields are of other types, is one line naming the
file and the type found, never an OverflowError or ValueError traceback."""

from __future__ import annotations

import collections
import pickle
import types
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from quarl.core.errors import QuarlError
from quarl.policies.safe_load import load_vecnormalize
from tests.conftest import run_cli


def _venv(**fields: Any) -> VecNormalize:
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    for name, value in fields.items():
        setattr(venv, name, value)
    venv.venv = None  # what VecNormalize.save pickles (no env)
    return venv


@pytest.mark.parametrize("obj,message", [
    (np.zeros(4), "holds a numpy.ndarray, not a VecNormalize (stable_baselines3.common.vec_env.VecNormalize): refused"),
    (collections.OrderedDict(a=1), "holds a collections.OrderedDict, not a VecNormalize"),
    (types.SimpleNamespace(obs_rms=RunningMeanStd(shape=(4,)), clip_obs=10**400),
     "holds a types.SimpleNamespace, not a VecNormalize"),
    (RunningMeanStd(shape=(4,)),
     "holds a stable_baselines3.common.running_mean_std.RunningMeanStd, not a VecNormalize"),
    (gym.spaces.Box(0, 1, (4,)), "holds a gymnasium.spaces.box.Box, not a VecNormalize"),
    (lambda: _venv(obs_rms=np.zeros(4)), "its obs_rms is a numpy.ndarray, not a RunningMeanStd"),
    (lambda: _venv(norm_obs=np.zeros(3)), "norm_obs=array([0., 0., 0.]) is a ndarray, not true or false"),
    (lambda: _venv(clip_obs=10**400), "clip_obs=" + "1" + "0" * 56 + "... is not a number"),
])
def test_a_trusted_pickle_of_another_type_is_one_line(tmp_path: Path, obj: Any, message: str) -> None:
    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(pickle.dumps(obj() if callable(obj) else obj))
    with pytest.raises(QuarlError) as caught:
        load_vecnormalize(path, trust_pickle=True, obs_shape=(4,))
    text = str(caught.value)
    assert "\n" not in text and text.startswith(str(path)) and message in text, text


def test_a_trusted_real_vecnormalize_still_loads(tmp_path: Path) -> None:
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    venv.obs_rms.mean = np.array([0.5, -1.0, 0.1, 2.0])
    path = tmp_path / "vecnormalize.pkl"
    venv.save(str(path))
    stats = load_vecnormalize(path, trust_pickle=True, obs_shape=(4,))
    assert np.array_equal(stats.mean, venv.obs_rms.mean) and stats.norm_obs is True


def test_ptq_on_a_run_folder_with_a_trusted_foreign_pickle_is_one_line(tmp_path: Path) -> None:
    import stable_baselines3 as sb3

    run = tmp_path / "ppo" / "CartPole-v1_1"
    (run / "CartPole-v1").mkdir(parents=True)
    sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu", n_steps=64).save(run / "CartPole-v1.zip")
    (run / "CartPole-v1" / "config.yml").write_text("normalize: true\n")
    (run / "CartPole-v1" / "vecnormalize.pkl").write_bytes(pickle.dumps(types.SimpleNamespace(obs_rms=np.zeros(4))))
    r = run_cli("ptq", str(run), "--precisions", "fp32", "--episodes", "1", "--trust-pickle",
                "--out", str(tmp_path / "o"))
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "vecnormalize.pkl holds a types.SimpleNamespace, not a VecNormalize" in lines[0]
