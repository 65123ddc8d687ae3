"""Each axis is one registry: a made-up precision, policy layout and env family are added
here with one registration each (no other quarl file changes) and run through ptq end
to end, then removed."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import quarl
from quarl import envs
from quarl.errors import QuarlError
from quarl.policies import sb3
from quarl.policies.base import linear_layers
from quarl.measure import EvalSettings
from quarl.ptq import run_ptq
from quarl.quant import precisions
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.config import QuantConfig

ENV_ID = "toy/Corridor-v0"
STEPS = 20


class Corridor(gym.Env):
    """Reward 1 for each step whose action is 1 exactly when the observation's first entry
    is positive; 20 steps. A policy that reads the sign scores 20, a constant one about 10."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.obs, {}

    def step(self, action):
        reward = float(int(action) == int(self.obs[0] > 0))
        self.t += 1
        self.obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.obs, reward, False, self.t >= STEPS, {}


def _register_toy() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=Corridor)


def _brain(x: sb3.LayoutInput) -> sb3.Acting:
    """A made-up library that stores its policy as ``brain.{0,2}`` (Linear, ReLU, Linear)."""
    layers: list[nn.Module] = []
    for i in (0, 2):
        w, b = x.sd[f"brain.{i}.weight"], x.sd[f"brain.{i}.bias"]
        layer = nn.Linear(w.shape[1], w.shape[0])
        layer.load_state_dict({"weight": w, "bias": b})
        layers += [layer, x.activation()] if i == 0 else [layer]
    return sb3.Acting(layers, "argmax")


def _fp8(policy, config, calibration, returns):
    """fp8 (e4m3) weights, fp32 arithmetic: a made-up precision."""
    network = policy.clone_network().float()
    with torch.no_grad():
        for _, layer in linear_layers(network):
            layer.weight.copy_(layer.weight.to(torch.float8_e4m3fn).float())
    return policy.with_network(network, config.label, TorchEngine(network))


@pytest.fixture
def registered() -> Iterator[None]:
    envs.register_env_family(envs.EnvFamily("toy", lambda env_id: env_id.startswith("toy/"), _register_toy))
    sb3.register_layout(sb3.Layout("brain", lambda sd: "brain.0.weight" in sd, _brain))
    precisions.register(precisions.Precision("fp8", "fp8 e4m3 weights, fp32 arithmetic", _fp8))
    try:
        yield
    finally:
        envs.ENV_FAMILIES.pop("toy")
        sb3.LAYOUTS.pop("brain")
        precisions.PRECISIONS.pop("fp8")


def _brain_checkpoint(path: Path) -> Path:
    """An SB3 zip (a real PPO save for its spaces) whose policy.pth holds the made-up
    layout: weights that pick action 1 exactly when the first observation is positive."""
    from stable_baselines3 import PPO

    _register_toy()
    PPO("MlpPolicy", gym.make(ENV_ID), n_steps=32, batch_size=32).save(path / "brain.zip")
    w1 = torch.zeros(4, 2)
    w1[0, 0], w1[1, 0] = 1.0, -1.0
    w2 = torch.zeros(2, 4)
    w2[0, 1], w2[1, 0] = 1.0, 1.0
    sd = {"brain.0.weight": w1, "brain.0.bias": torch.zeros(4), "brain.2.weight": w2, "brain.2.bias": torch.zeros(2)}
    with zipfile.ZipFile(path / "brain.zip") as src:
        entries = {n: src.read(n) for n in src.namelist()}
    buf = io.BytesIO()
    torch.save(sd, buf)
    entries["policy.pth"] = buf.getvalue()
    with zipfile.ZipFile(path / "brain.zip", "w") as dst:
        for name, blob in entries.items():
            dst.writestr(name, blob)
    return path / "brain.zip"


def test_a_made_up_precision_layout_and_env_family_run_ptq_end_to_end(registered: None, tmp_path: Path) -> None:
    agent = quarl.load(_brain_checkpoint(tmp_path), env=ENV_ID)
    assert agent.policy.algo == "brain" and envs.env_family(ENV_ID).name == "toy"
    records = run_ptq(agent.policy, agent.env_spec, ["fp8", "sim2"], EvalSettings(episodes=6), tmp_path / "ptq")
    means = {r["precision"]: r["mean"] for r in records}
    assert means == {"fp32": STEPS, "fp8": STEPS, "sim2": STEPS}  # +-1 weights survive fp8 and 2 bits exactly
    assert "| fp8 " in (tmp_path / "ptq" / "ptq.md").read_text()
    assert QuantConfig.parse("fp8").label == "fp8"


def test_without_the_registrations_each_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(QuarlError, match="unknown precision 'fp8'"):
        QuantConfig.parse("fp8")
    with pytest.raises(QuarlError, match="unsupported policy layout: the state dict matches none of dqn"):
        quarl.load(_brain_checkpoint(tmp_path), env=ENV_ID)
    assert envs.env_family(ENV_ID).name == "gymnasium"


def test_families_claim_their_ids() -> None:
    assert envs.env_family("ALE/Pong-v5").name == "atari"
    assert envs.env_family("PongNoFrameskip-v4").name == "atari"
    assert envs.env_family("dm_control/cartpole-balance-v0").name == "dm_control"
    assert envs.env_family("CartPole-v1").name == "gymnasium"
    assert list(envs.ENV_FAMILIES)[-1] == "gymnasium"


def test_an_actorq_algorithm_is_one_registration(tmp_path: Path) -> None:
    """A new --algo is one registry entry: its learner (here a plain DQN whose target net is
    the online one, wrapped to count its steps), replay and limiter; the coordinator, the
    actors, the help and the run folder's loader take it without another edit."""
    import dataclasses

    from quarl.actorq import algorithms
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.system import run_actorq
    from quarl.policies.actorq_run import load_actorq_run

    dqn = algorithms.get_algorithm("dqn")
    made: list[object] = []

    def learner(config, obs_dim, act_dim, discrete):
        made.append(dqn.make_learner(config, obs_dim, act_dim, discrete))
        return made[-1]

    entry = dataclasses.replace(dqn, name="counting-dqn", summary="test entry", make_learner=learner)
    algorithms.register_algorithm(entry)
    try:
        assert "counting-dqn" in algorithms.algorithm_names()
        config = ActorQConfig("CartPole-v1", algo="counting-dqn", actors=1, local=True, policy_layers=(32, 32),
                              batch_size=32, min_replay=100, eval_episodes=2, max_env_steps=600,
                              out=tmp_path / "run", max_minutes=3.0)
        summary = run_actorq(config)
        assert len(made) == 1 and made[0].steps == summary.learner_steps > 0
        assert summary.env_steps >= 600 and summary.config["algo"] == "counting-dqn"
        policy, _, algo = load_actorq_run(tmp_path / "run")
        assert algo == "counting-dqn" and policy.head == "argmax"
        with pytest.raises(QuarlError, match="counting-dqn needs discrete actions but Pendulum-v1"):
            from quarl.actorq.acting import env_info

            env_info(ActorQConfig("Pendulum-v1", algo="counting-dqn"))
    finally:
        del algorithms.ALGORITHMS["counting-dqn"]
    with pytest.raises(QuarlError, match="unknown --algo 'counting-dqn': allowed dqn, d4pg, impala, ppo"):
        ActorQConfig("CartPole-v1", algo="counting-dqn")
