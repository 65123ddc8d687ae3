"""Each axis is one registry, and each of CONTRIBUTING's recipes is followed here end to end:
a made-up precision, policy layout, env family, real int mode and ActorQ learner are added
with one registration each (no other quarl file changes), run through ptq or ActorQ, then
removed."""

from __future__ import annotations

import copy
import dataclasses
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import quarl
from quarl.actorq.options import DQNOptions
from quarl.core.errors import QuarlError
from quarl.envs import families as envs
from quarl.evaluation.cells import EvalSettings
from quarl.policies import sb3
from quarl.ptq.run import run_ptq
from quarl.quant import modes
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.layers import linear_layers
from quarl.quantization import precisions
from quarl.quantization.config import QuantConfig

if TYPE_CHECKING:
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.replay import Batch

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
        envs.ENV_FAMILIES.remove("toy")
        sb3.LAYOUTS.remove("brain")
        precisions.PRECISIONS.remove("fp8")


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


class PlainDQNLearner:
    """A made-up ActorQ learner written from the ``Learner`` protocol alone (``steps``,
    ``step``, ``weights``, ``policy_network``, ``state_dict``, ``load_state_dict``): plain DQN,
    the target network both picks and rates the next action. Its policy network is
    :func:`quarl.actorq.learners.policy_network`, the one actors and the loader rebuild."""

    def __init__(self, config: ActorQConfig, obs_dim: int, n_actions: int) -> None:
        from quarl.actorq.learners import policy_network

        torch.manual_seed(config.seed)
        self.config = config
        self.q = policy_network(config, obs_dim, n_actions)
        self.target = copy.deepcopy(self.q)
        self.opt = torch.optim.Adam(self.q.parameters(), lr=config.learning_rate)
        self.steps = 0

    def step(self, batch: Batch) -> dict[str, Any]:
        obs, next_obs = torch.as_tensor(batch.obs), torch.as_tensor(batch.next_obs)
        q = self.q(obs).gather(1, torch.as_tensor(batch.action).long().view(-1, 1)).squeeze(1)
        with torch.no_grad():
            target = (torch.as_tensor(batch.reward)
                      + torch.as_tensor(batch.discount) * self.target(next_obs).max(1).values)
        loss = nn.functional.smooth_l1_loss(q, target)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.steps += 1
        if self.steps % DQNOptions.of(self.config).target_update_period == 0:
            self.target.load_state_dict(self.q.state_dict())
        return {"loss": loss.item()}

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in self.q.state_dict().items()}

    def policy_network(self) -> nn.Module:
        return self.q

    def state_dict(self) -> dict[str, Any]:
        parts: dict[str, Any] = {"online": self.q, "target": self.target, "optimizer": self.opt}
        return {"steps": self.steps, **{name: part.state_dict() for name, part in parts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in (("online", self.q), ("target", self.target), ("optimizer", self.opt)):
            part.load_state_dict(state[name])
        self.steps = int(state["steps"])


def test_an_actorq_learner_is_one_class_and_one_registration(tmp_path: Path) -> None:
    """CONTRIBUTING's ActorQ recipe: a learner class and one ``register_algorithm(Algorithm(...))``
    (its action spaces, replay and rate limiter: here uniform replay, as dqn's entry builds it);
    the coordinator, the actors, the help and the run folder's loader take it without another
    edit, and refuse it on the wrong actions and once it is gone."""
    from quarl.actorq import algorithms
    from quarl.actorq.acting import env_info
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.run_loader import load_actorq_run
    from quarl.actorq.system import run_actorq

    made: list[PlainDQNLearner] = []

    def make_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool) -> PlainDQNLearner:
        made.append(PlainDQNLearner(config, obs_dim, act_dim))
        return made[-1]

    dqn = algorithms.get_algorithm("dqn")
    algorithms.register_algorithm(algorithms.Algorithm(
        "plain-dqn", "plain DQN, a made-up learner", "discrete", make_learner, dqn.make_replay, dqn.make_limiter,
        DQNOptions, other="d4pg"))
    try:
        assert "plain-dqn" in algorithms.algorithm_names() and "plain-dqn: plain DQN" in algorithms.algorithms_help()
        config = ActorQConfig.flat("CartPole-v1", algo="plain-dqn", actors=1, local=True, policy_layers=(32, 32),
                                   batch_size=32, min_replay=100, eval_episodes=2, max_env_steps=600,
                                   out=tmp_path / "run", max_minutes=3.0)
        summary = run_actorq(config)
        assert len(made) == 1 and made[0].steps == summary.learner_steps > 0
        assert summary.env_steps >= 600 and summary.config["algo"] == "plain-dqn"
        policy, _, algo = load_actorq_run(tmp_path / "run")
        assert algo == "plain-dqn" and policy.head == "argmax"
        for (name, learned), loaded in zip(made[0].weights().items(), policy.network.state_dict().values(),
                                           strict=True):
            np.testing.assert_array_equal(loaded.numpy(), learned, err_msg=name)  # the learner's own network
        with pytest.raises(QuarlError, match="plain-dqn needs discrete actions but Pendulum-v1 .*: use --algo d4pg"):
            env_info(ActorQConfig("Pendulum-v1", algo="plain-dqn"))
    finally:
        algorithms.ALGORITHMS.remove("plain-dqn")
    with pytest.raises(QuarlError, match="unknown --algo 'plain-dqn': allowed dqn, d4pg, impala, ppo"):
        ActorQConfig("CartPole-v1", algo="plain-dqn")


def _weight_only_b64() -> modes.IntMode:
    """A made-up int mode: 8-bit MatMulNBits weights in blocks of 64 inputs whatever block size
    is asked for, fp32 activations; its reference rounds the same blocks in PyTorch, and
    recover's student the same grid. It runs on every CPU (no fallback) and ActorQ's actors
    cannot refill 8-bit MatMulNBits weights (not an actor kernel)."""
    from quarl.quant.backends import onnxruntime as ortb
    from quarl.quant.backends.reference import simulate_nbits

    return modes.IntMode("weight-only-b64", 8, "MatMulNBits, 8-bit weights in blocks of 64, fp32 activations",
                         lambda r: ortb.quantize_nbits(r.model, 8, 64, False, r.excluded_nodes()),
                         lambda r, _: simulate_nbits(r.network, 8, 64, False, r.keep),
                         student=modes.StudentGrid("block", "fp32", block_size=64), fallback=None, actor=False)


def test_a_made_up_int_mode_is_one_registration(registered: None, tmp_path: Path) -> None:
    """CONTRIBUTING's mode recipe: one ``register_mode(IntMode(...))``; the label parses, ptq
    runs it end to end, it computes what its reference computes (10x closer to it than to
    fp32), and the automatic int8 choice tries it; recover's student of it rounds on the grid
    it declares (blocks of 64 where 32 are asked for) and the model built from the student's
    integers computes what the student computes; ActorQ keeps its int8 actor kernel (the
    mode does not declare one); once removed, its label is refused."""
    from quarl.actorq.actor_precisions import onnx_mode
    from quarl.policies.base import Policy
    from quarl.quant.backends import onnxruntime as ortb
    from quarl.quant.student import make_student, real_model
    from quarl.quantization.api import quantize
    from quarl.recovery import RecoverConfig
    from quarl.recovery.dagger import pick_spec

    label = "int8-weight-only-b64"
    modes.register_mode(_weight_only_b64())
    try:
        assert QuantConfig.parse(label).mode == "weight-only-b64"
        agent = quarl.load(_brain_checkpoint(tmp_path), env=ENV_ID)
        records = run_ptq(agent.policy, agent.env_spec, [label], EvalSettings(episodes=4), tmp_path / "ptq")
        assert {r["precision"]: r["mean"] for r in records} == {"fp32": STEPS, label: STEPS}  # +-1 weights: exact

        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 128), nn.Tanh(), nn.Linear(128, 3)).eval()
        policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), gym.spaces.Discrete(3), "argmax")
        states = np.random.default_rng(1).normal(size=(256, 6)).astype(np.float32)
        mode = modes.get_mode(label)
        request = modes.BuildRequest(net, ortb.export_onnx(net, (6,)), None)
        real = ortb.OrtEngine(mode.build(request))(states)
        with torch.inference_mode():
            reference = mode.reference(request, b"")(torch.from_numpy(states)).numpy()
            fp32 = net(torch.from_numpy(states)).numpy()
        to_fp32 = np.abs(real - fp32).max()
        assert to_fp32 > 1e-5 and np.abs(real - reference).max() <= 0.1 * to_fp32

        tried = quantize(policy, QuantConfig("int8"), states).meta["quant"]["tried"]
        assert label in {t["mode"] for t in tried}

        spec, _ = pick_spec(agent.policy, agent.env_spec, RecoverConfig(precision=label, block_size=32))
        assert spec.mode == label and spec.blocks == 64
        spec = dataclasses.replace(spec, keep=frozenset())
        student = make_student(net, spec)
        with torch.no_grad():
            for p in student.parameters():  # a trained student: off the teacher's weights
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
            want = student.eval()(torch.from_numpy(states)).numpy()
        deployed = ortb.OrtEngine(real_model(student, spec, (6,)))(states)
        assert np.abs(deployed - want).max() <= 1e-4 * np.abs(want).max()
        assert onnx_mode("int8") == "int8-dyn-tensor" and label not in {m.label for m in modes.actor_modes().values()}
    finally:
        modes.MODES.remove(label)
    with pytest.raises(QuarlError, match=f"unknown precision '{label}'"):
        QuantConfig.parse(label)


def test_a_trainer_is_one_registration(tmp_path: Path) -> None:
    """CONTRIBUTING's training recipe: a trainer registered at run time is trained by
    ``quarl train`` (SB3 defaults where the RL Zoo has no entry for it), its action spaces
    are checked, and without the registration the name is refused in one line."""
    from quarl.checkpoints import load_checkpoint
    from quarl.core.errors import QuarlError
    from quarl.training.hyperparams import TRAINERS, Trainer, register_trainer
    from quarl.training.sb3_train import TrainConfig, check_algo_env, train

    register_trainer(Trainer("myac", "stable_baselines3", "A2C", "discrete"))
    try:
        with pytest.raises(QuarlError, match="registered already"):
            register_trainer(Trainer("myac", "stable_baselines3", "A2C"))
        with pytest.raises(QuarlError, match="myac needs discrete actions but Pendulum-v1 has Box"):
            check_algo_env("myac", "Pendulum-v1")
        run = train(TrainConfig("myac", "CartPole-v1", timesteps=200, out=tmp_path, eval_freq=0,
                                tensorboard=False)).run_dir
        assert run.parent.name == "myac" and (run / "CartPole-v1.zip").exists()
        assert load_checkpoint(run).policy.head == "argmax"
    finally:
        TRAINERS.remove("myac")
    with pytest.raises(QuarlError, match="unknown algorithm 'myac'"):
        check_algo_env("myac", "CartPole-v1")
