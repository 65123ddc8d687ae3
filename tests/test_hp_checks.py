"""``--hp`` values typed and priced before Stable-Baselines3 sees them (issue 38):
``n_steps=1e10`` asked for a 1.16 TiB rollout buffer, ``buffer_size=1e10`` for a 149 GiB
replay, ``policy=os.system`` reached SB3's policy lookup. Each is one line, exit 2, within
bounded memory, before a run folder exists."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from quarl.core.errors import QuarlError
from quarl.training.buffer_memory import buffer_memory, check_buffer_memory
from quarl.training.hp_checks import check_overrides
from quarl.training.train_setup import prepare
from tests.conftest import run_cli
from tests.test_crafted_files import PEAK_LIMIT_MB, _one_line, _popen_peak


@pytest.mark.parametrize("algo,hp,message", [
    ("ppo", ["n_steps=1e10"], "--hp n_steps=10,000,000,000: the rollout buffer (1 env) would take 447.0 GiB "
                              "(48 bytes a step), more than this machine's"),
    ("dqn", ["buffer_size=1e10"], "--hp buffer_size=10,000,000,000: the replay buffer would take 484.3 GiB "
                                  "(52 bytes a transition), more than this machine's"),
    ("ppo", ["policy=os.system"], "--hp policy='os.system': not a ppo policy; allowed: MlpPolicy, CnnPolicy, "
                                  "MultiInputPolicy"),
])
def test_hp_values_that_passed_quarl_and_crashed_sb3_are_one_line(tmp_path: Path, algo: str, hp: list[str],
                                                                   message: str) -> None:
    args = ["train", algo, "CartPole-v1", "--timesteps", "64", "--hp", "n_envs=1", "--out", str(tmp_path / "runs")]
    for item in hp:
        args += ["--hp", item]
    code, err, peak = _popen_peak(*args)
    line = _one_line(err)
    assert code == 2 and message in line, err[-1500:]
    assert peak < PEAK_LIMIT_MB, peak
    if "buffer" in message:
        assert "GiB of memory: refused (at most " in line
    assert not list((tmp_path / "runs").rglob("*"))  # refused before the run folder exists


@pytest.mark.parametrize("algo,hp,message", [
    ("ppo", {"n_steps": 2.5}, "--hp n_steps=2.5: ppo takes a whole number for n_steps (default 2048)"),
    ("ppo", {"n_steps": "banana"}, "--hp n_steps='banana': n_steps is a number (default 2048)"),
    ("ppo", {"use_sde": 1}, "--hp use_sde=1: ppo takes true or false for use_sde (default False)"),
    ("ppo", {"target_kl": "a"}, "--hp target_kl='a': ppo takes a number or null for target_kl (default None)"),
    ("ppo", {"policy_kwargs": [1]}, "--hp policy_kwargs=[1]: ppo takes a dict or null for policy_kwargs"),
    ("ppo", {"policy": 3}, "--hp policy=3: not a ppo policy; allowed: MlpPolicy"),
    ("ppo", {"normalize": 3}, "--hp normalize=3: ppo takes true or false or a string or a dict for normalize"),
    ("ppo", {"seed": 3}, "--hp seed: not settable (use --seed); allowed: "),
    ("ppo", {"device": "cuda"}, "--hp device: not settable (quarl trains on the CPU)"),
    ("dqn", {"train_freq": [4, 5]}, "--hp train_freq=[4, 5]: dqn takes a whole number or a list [int, str] for "
                                    "train_freq (default 4)"),
    ("dqn", {"replay_buffer_class": "os.system"}, "--hp replay_buffer_class: not settable"),
    ("sac", {"action_noise": "x"}, "--hp action_noise: not settable (use noise_type and noise_std)"),
])
def test_hp_values_are_of_the_type_sb3_declares(algo: str, hp: dict, message: str) -> None:
    with pytest.raises(QuarlError) as caught:
        check_overrides(algo, hp)
    assert message in str(caught.value)


def test_well_typed_hp_values_pass_and_whole_floats_become_ints() -> None:
    check_overrides("dqn", {"train_freq": [4, "step"], "buffer_size": 1e6, "exploration_fraction": 0.1})
    check_overrides("sac", {"ent_coef": "auto_0.1", "learning_rate": "lin_1e-3", "policy": "MlpPolicy"})
    check_overrides("ppo", {"clip_range_vf": None, "n_steps": 128, "normalize": "dict(norm_reward=False)"})
    setup = prepare("dqn", "CartPole-v1", gym.spaces.Discrete(2), {"buffer_size": 1e4, "batch_size": 32.0})
    assert type(setup.model_kwargs["buffer_size"]) is int and setup.model_kwargs["buffer_size"] == 10_000
    assert type(setup.model_kwargs["batch_size"]) is int


def test_buffers_are_priced_as_sb3_allocates_them() -> None:
    """The replay buffer holds observation and next observation in the space's dtype
    (one of them with optimize_memory_usage), the action and three float32 scalars; the
    rollout buffer n_steps x n_envs rows of observation, action and six float32 scalars."""
    import numpy as np
    from stable_baselines3 import DQN, PPO

    cartpole = gym.make("CartPole-v1")
    dqn = prepare("dqn", "CartPole-v1", cartpole.action_space, {"buffer_size": 1000})
    key, value, unit, total = buffer_memory("dqn", dqn, cartpole.observation_space, cartpole.action_space)
    model = DQN("MlpPolicy", cartpole, buffer_size=1000, device="cpu")
    rb = model.replay_buffer
    held = sum(getattr(rb, n).nbytes for n in ("observations", "next_observations", "actions", "rewards", "dones",
                                               "timeouts"))
    assert (key, value, total) == ("buffer_size", 1000, held)
    frames = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    optimized = prepare("dqn", "CartPole-v1", cartpole.action_space, {"buffer_size": 1000,
                                                                       "optimize_memory_usage": True})
    assert buffer_memory("dqn", optimized, frames, cartpole.action_space)[2] == 84 * 84 * 4 + 8 + 12
    ppo = prepare("ppo", "CartPole-v1", cartpole.action_space, {"n_steps": 64, "n_envs": 2})
    key, value, unit, total = buffer_memory("ppo", ppo, cartpole.observation_space, cartpole.action_space)
    buffer = PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, device="cpu").rollout_buffer
    arrays = ("observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages")
    assert (key, value) == ("n_steps", 64) and total == 2 * sum(getattr(buffer, n).nbytes for n in arrays)
    check_buffer_memory("ppo", ppo, cartpole.observation_space, cartpole.action_space)  # fits: no error


def test_a_zoo_entry_past_the_machine_is_named_as_the_zoo_s(monkeypatch: pytest.MonkeyPatch) -> None:
    import quarl.core.limits

    monkeypatch.setattr(quarl.core.limits, "machine_memory", lambda: 2**20)
    cartpole = gym.make("CartPole-v1")
    setup = prepare("dqn", "CartPole-v1", cartpole.action_space)
    with pytest.raises(QuarlError, match=r"the dqn hyperparameters' buffer_size=100,000: the replay buffer would take "
                                         r"0\.0 GiB \(52 bytes a transition\), more than this machine's 0\.0 GiB of "
                                         r"memory: refused \(at most buffer_size=20,164\)"):
        check_buffer_memory("dqn", setup, cartpole.observation_space, cartpole.action_space)


def test_a_healthy_run_with_hp_floats_trains(tmp_path: Path) -> None:
    r = run_cli("train", "dqn", "CartPole-v1", "--timesteps", "200", "--hp", "buffer_size=1e3", "--hp",
                "learning_starts=1e2", "--hp", "policy_kwargs=dict(net_arch=[16])", "--eval-freq", "0",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "runs").rglob("CartPole-v1.zip"))
