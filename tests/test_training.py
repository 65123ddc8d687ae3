"""Training: zoo hyperparameters, QAT on every SB3 algorithm, mixed precision, resume."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import stable_baselines3 as sb3
import torch
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, make_env
from quarl.evaluation.episodes import evaluate
from quarl.quant.qat import QATLayer, plain_layers
from quarl.quantization.config import QATConfig
from quarl.training.hyperparams import TRAINERS
from quarl.training.mixed_precision import LossScale, enable_mixed_precision, fp32_outputs
from quarl.training.qat_sb3 import QATCallback, load_qat_state, qat_targets, read_qat_state, wrap_policy, wrapped_layers
from quarl.training.sb3_train import TrainConfig, train
from quarl.training.train_setup import prepare

# Small, fast settings per algorithm (the zoo's values otherwise).
TINY = {
    "a2c": ("CartPole-v1", {"n_envs": 2, "policy_kwargs": "dict(net_arch=[32, 32])"}),
    "ppo": ("CartPole-v1", {"n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2,
                            "policy_kwargs": "dict(net_arch=[32, 32])"}),
    "dqn": ("CartPole-v1", {"learning_starts": 100, "train_freq": 16, "gradient_steps": 4,
                            "policy_kwargs": "dict(net_arch=[32, 32])"}),
    "sac": ("Pendulum-v1", {"learning_starts": 100, "batch_size": 32, "policy_kwargs": "dict(net_arch=[32, 32])"}),
    "td3": ("Pendulum-v1", {"learning_starts": 100, "batch_size": 32, "policy_kwargs": "dict(net_arch=[32, 32])"}),
    "ddpg": ("Pendulum-v1", {"learning_starts": 100, "batch_size": 32, "policy_kwargs": "dict(net_arch=[32, 32])"}),
    # sb3-contrib, through the same trainer registry
    "qrdqn": ("CartPole-v1", {"learning_starts": 100, "train_freq": 16, "gradient_steps": 4,
                              "policy_kwargs": "dict(net_arch=[32, 32], n_quantiles=5)"}),
    "tqc": ("Pendulum-v1", {"learning_starts": 100, "batch_size": 32,
                            "policy_kwargs": "dict(net_arch=[32, 32], n_critics=2, n_quantiles=5)"}),
}
TRPO = ("CartPole-v1", {"n_envs": 2, "n_steps": 64, "batch_size": 64, "policy_kwargs": "dict(net_arch=[32, 32])"})


def _obs(env_id: str, n: int = 256) -> np.ndarray:
    env = make_env(EnvSpec(env_id))
    env.reset(seed=0)
    space = env.observation_space
    env.close()
    space.seed(0)
    return np.stack([space.sample() for _ in range(n)]).astype(np.float32) * 0.5


# ---------------------------------------------------------------------------- hyperparameters


def test_zoo_hyperparameters_become_sb3_kwargs() -> None:
    import gymnasium as gym

    ppo = prepare("ppo", "CartPole-v1", gym.spaces.Discrete(2))
    assert (ppo.n_envs, ppo.n_timesteps, ppo.policy) == (8, 100_000, "MlpPolicy")
    lr = ppo.model_kwargs["learning_rate"]
    assert lr(1.0) == pytest.approx(1e-3) and lr(0.5) == pytest.approx(5e-4)  # lin_0.001
    dqn = prepare("dqn", "CartPole-v1", gym.spaces.Discrete(2), {"batch_size": 32})
    assert dqn.model_kwargs["policy_kwargs"] == {"net_arch": [256, 256]}
    assert dqn.model_kwargs["batch_size"] == 32
    box = gym.spaces.Box(-2, 2, (1,))
    td3 = prepare("td3", "Pendulum-v1", box)
    assert td3.model_kwargs["action_noise"]._sigma == pytest.approx([0.1])
    cheetah = prepare("ppo", "HalfCheetah-v4", gym.spaces.Box(-1, 1, (6,)))
    assert cheetah.normalize is not None and cheetah.normalize["gamma"] == cheetah.raw["gamma"]
    atari = prepare("dqn", "PongNoFrameskip-v4", gym.spaces.Discrete(6))
    assert atari.env_spec.wrappers == ("atari",) and atari.env_spec.frame_stack == 4 and atari.policy == "CnnPolicy"
    relu = prepare("ppo", "CartPole-v1", gym.spaces.Discrete(2), {"policy_kwargs": "dict(activation_fn=nn.ReLU)"})
    assert relu.model_kwargs["policy_kwargs"]["activation_fn"] is nn.ReLU
    with pytest.raises(QuarlError, match="nn.Foo"):
        prepare("ppo", "CartPole-v1", gym.spaces.Discrete(2), {"policy_kwargs": "dict(activation_fn=nn.Foo)"})
    with pytest.raises(QuarlError, match="lin_x"):
        prepare("ppo", "CartPole-v1", gym.spaces.Discrete(2), {"learning_rate": "lin_x"})


# ---------------------------------------------------------------------------- QAT on SB3


# TQC acts with SAC's actor and trains through the same QAT wrappers, and SB3's DDPG is its TD3
# (a subclass with TD3's policy, actor and targets): run with -m slow (13 s and 2 s), to keep the
# default suite under five minutes on two cores
@pytest.mark.parametrize("algo", [pytest.param(a, marks=pytest.mark.slow) if a in ("tqc", "ddpg") else a
                                  for a in TINY])
def test_qat_training_delay_and_convert(algo: str, tmp_path: Path) -> None:
    """Nothing is quantized before the delay, every acting layer after it, critics and
    targets never; the saved run loads as a policy that acts exactly like the
    fake-quantized network."""
    env_id, hp = TINY[algo]
    qat = QATConfig(bits=4, quant_delay=300)
    setup = prepare(algo, env_id, make_env(EnvSpec(env_id)).action_space, hp)
    sb3_model = TRAINERS[algo].algo_class()("MlpPolicy", env_id, seed=0, device="cpu", **setup.model_kwargs)
    callback = QATCallback(qat)
    sb3_model.learn(200, callback=callback)
    assert wrapped_layers(sb3_model.policy)
    assert not any(m.quantize for m in wrapped_layers(sb3_model.policy).values())  # monitoring only
    sb3_model.learn(200, callback=callback, reset_num_timesteps=False)
    assert all(m.quantize for m in wrapped_layers(sb3_model.policy).values())

    # 400 steps: 100 quantized after the delay, as the callback's run above (every check here holds
    # from the first quantized step; 200 more SAC updates took a quarter of the test)
    result = train(TrainConfig(algo, env_id, timesteps=400, qat=qat, hyperparams=hp, out=tmp_path,
                               eval_freq=0, tensorboard=False))
    model = result.model
    layers = wrapped_layers(model.policy)
    assert all(m.quantize for m in layers.values())
    acting = {id(m) for t in qat_targets(model.policy).values() for m in t.modules() if isinstance(m, QATLayer)}
    acting |= {id(t) for t in qat_targets(model.policy).values() if isinstance(t, QATLayer)}
    assert {id(m) for m in layers.values()} == acting
    for name in ("critic", "critic_target", "actor_target", "q_net_target", "value_net"):
        if hasattr(model.policy, name):
            assert not any(isinstance(m, QATLayer) for m in getattr(model.policy, name).modules()), name
    # every wrapped layer recorded an output range
    assert all(float(m.output_observer.min_val) <= float(m.output_observer.max_val) for m in layers.values())

    policy = load_checkpoint(result.run_dir).policy
    assert policy.precision == "qat4"
    model.policy.set_training_mode(False)
    obs = _obs(env_id)
    sb3_actions, _ = model.predict(obs, deterministic=True)
    ours = policy.act(obs)
    if algo in ("dqn", "ppo", "a2c", "qrdqn"):
        assert (ours == sb3_actions).mean() == 1.0
    else:
        np.testing.assert_allclose(ours, sb3_actions, atol=1e-5)


def test_qat_state_restores_into_a_fresh_model(tmp_path: Path) -> None:
    env_id, hp = TINY["dqn"]
    result = train(TrainConfig("dqn", env_id, timesteps=600, qat=QATConfig(3, 200), hyperparams=hp, out=tmp_path,
                               eval_freq=0, tensorboard=False))
    state = read_qat_state(result.run_dir / "CartPole-v1" / "qat.json")
    fresh = sb3.DQN.load(result.run_dir / "CartPole-v1.zip", device="cpu")
    wrap_policy(fresh.policy, QATConfig(3, 200))
    load_qat_state(fresh.policy, state)
    obs = torch.as_tensor(_obs(env_id))
    result.model.policy.set_training_mode(False)
    fresh.policy.set_training_mode(False)
    with torch.no_grad():
        torch.testing.assert_close(fresh.policy.q_net(obs), result.model.policy.q_net(obs), rtol=0, atol=0)
    # plain_layers gives back SB3's own names (what model.save writes)
    with plain_layers(fresh.policy):
        assert not any(".layer." in k for k in fresh.policy.state_dict())
    assert any(".layer." in k for k in fresh.policy.state_dict())


def test_ppo_cartpole_4bit_qat_learns_in_10k_steps(tmp_path: Path) -> None:
    """The fast twin of the acceptance run below: 10k steps, quantization from 5k; seeds 0
    and 1 scored 216 and 165 (a random policy ~22), so >= 100 is learning under 4 bits."""
    result = train(TrainConfig("ppo", "CartPole-v1", timesteps=10_000, seed=0, qat=QATConfig(4, 5_000),
                               out=tmp_path, eval_freq=0, tensorboard=False))
    ckpt = load_checkpoint(result.run_dir)
    assert ckpt.policy.precision == "qat4"
    assert len(torch.unique(ckpt.policy.network[0].weight)) <= 2**4 + 1
    assert evaluate(ckpt.policy, ckpt.env_spec, episodes=10, seed=0, n_envs=5).mean >= 100


@pytest.mark.slow
def test_ppo_cartpole_4bit_qat_reaches_475(tmp_path: Path) -> None:
    """The acceptance run: RL Zoo PPO hyperparameters, 40k steps, seed 0, quantization
    from step 20k; the 4-bit policy (weights and activations) is evaluated over 10 episodes."""
    result = train(TrainConfig("ppo", "CartPole-v1", timesteps=40_000, seed=0, qat=QATConfig(4, 20_000),
                               out=tmp_path, eval_freq=0, tensorboard=False))
    ckpt = load_checkpoint(result.run_dir)
    assert ckpt.policy.precision == "qat4"
    weights = ckpt.policy.network[0].weight
    assert len(torch.unique(weights)) <= 2**4 + 1  # on the 4-bit grid (quarl scheme: 2^n + 1 levels)
    res = evaluate(ckpt.policy, ckpt.env_spec, episodes=10, seed=0, n_envs=5)
    assert res.mean >= 475, res.returns


# ---------------------------------------------------------------------------- mixed precision


def _dqn_batches(model: sb3.DQN) -> list:
    """Record the batches ``model.train`` samples (to replay them through a reference)."""
    seen: list = []
    sample = model.replay_buffer.sample

    def recording(*args, **kwargs):
        seen.append(sample(*args, **kwargs))
        return seen[-1]

    model.replay_buffer.sample = recording
    return seen


@pytest.mark.parametrize(("init_scale", "fused"), [(2.0**24, False), (2.0**40, False), (2.0**40, True)])
def test_fp16_updates_are_gradscaler_updates(init_scale: float, fused: bool) -> None:
    """SB3's DQN update at fp16 with quarl's loss scale, against torch.amp.GradScaler driving an
    identical copy of the network and optimizer on the same batches: the same scale after
    every step (halved on overflow, doubled after 3 clean steps), the same skipped steps, the
    same weights bit for bit. With a fused Adam both skip an overflowed step inside the
    optimizer's kernel (GradScaler's path for optimizers that declare amp support)."""
    model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=10**6, seed=0, device="cpu", max_grad_norm=1.0,
                    learning_rate=1e-3,
                    policy_kwargs={"net_arch": [64, 64], "optimizer_kwargs": {"fused": True} if fused else {}})
    assert getattr(model.policy.optimizer, "_step_supports_amp_scaling", False) == fused
    model.learn(400)  # fills the buffer, no update yet
    import copy

    ref = copy.deepcopy(model.policy)  # its optimizer comes along, on the copied parameters
    scale = enable_mixed_precision(model, "fp16", loss_scale=LossScale("cpu", init_scale=init_scale, growth_interval=3))
    assert scale is not None
    batches = _dqn_batches(model)
    scales = []
    for _ in range(24):
        model.train(gradient_steps=1, batch_size=32)
        scales.append(scale.scale)

    fp32_outputs(ref, "cpu")
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=3)
    ref_scales, skipped = [], 0
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            with torch.no_grad():
                next_q = ref.q_net_target(batch.next_observations).max(dim=1)[0].reshape(-1, 1)
                target = batch.rewards + (1 - batch.dones) * model.gamma * next_q
            current = torch.gather(ref.q_net(batch.observations), dim=1, index=batch.actions.long())
            loss = torch.nn.functional.smooth_l1_loss(current, target)
        ref.optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(ref.optimizer)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        before = scaler.get_scale()
        scaler.step(ref.optimizer)
        scaler.update()
        skipped += scaler.get_scale() < before
        ref_scales.append(scaler.get_scale())

    assert scales == ref_scales
    assert scale.skipped == skipped and scale.steps == 24
    assert skipped >= 1  # overflows happened: the first steps at these scales overflow fp16
    # and the scale grew after 3 clean steps (consecutive pairs: one fewer)
    assert any(b == 2 * a for a, b in zip(scales, scales[1:], strict=False))
    for mine, theirs in zip(model.policy.state_dict().values(), ref.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.Tensor.backward.__name__ == "backward" and torch.nn.utils.clip_grad_norm_.__name__ == "clip_grad_norm_"


def test_loss_scale_syncs_once_per_update() -> None:
    """One host read of the overflow flag per optimizer step, none per parameter."""
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scale = LossScale("cpu", init_scale=4.0)
    reads = []
    item = torch.Tensor.item

    def counting(self):
        reads.append(self.shape)
        return item(self)

    torch.Tensor.item = counting
    try:
        for _ in range(3):
            opt.zero_grad()
            scale.scale_loss(net(torch.ones(2, 4)).sum()).backward()
            scale.step(opt, opt.step)
    finally:
        torch.Tensor.item = item
    assert len(reads) == 3 and scale.skipped == 0


def test_loss_scale_with_a_fused_optimizer_never_syncs() -> None:
    """A fused Adam is handed the overflow flag and skips on the device: no host read at all;
    overflowed steps leave the weights and Adam's step count as they were, a clean one moves them."""
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(net.parameters(), lr=0.1, fused=True)
    scale = LossScale("cpu", init_scale=2.0**127)  # 2^127 x a loss of 1e6 is inf in fp32, until halved 20 times
    reads = []
    item = torch.Tensor.item

    def counting(self):
        reads.append(self.shape)
        return item(self)

    def update(loss_scale: float) -> None:
        opt.zero_grad()
        scale.scale_loss(net(torch.ones(2, 4)).sum() * loss_scale).backward()
        scale.step(opt, opt.step)

    before = [p.detach().clone() for p in net.parameters()]
    torch.Tensor.item = counting
    try:
        for _ in range(3):
            update(1e6)
    finally:
        torch.Tensor.item = item
    assert reads == [] and scale.steps == 3 and scale.skipped == 3 and scale.scale == 2.0**124
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert {float(opt.state[p]["step"]) for p in net.parameters()} == {0.0}  # skipped steps are not counted
    scale._scale.fill_(1.0)  # a scale that does not overflow: the next step is taken
    update(1.0)
    assert scale.skipped == 3 and not all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert {float(opt.state[p]["step"]) for p in net.parameters()} == {1.0}


class BrightSide(gym.Env):
    """A small image env: an 8x8 frame of grey noise with one bright pixel in its left or
    right half; reward 1 for naming the side (0 left, 1 right), 20 frames an episode. Random
    play scores 10, a policy that finds the pixel 20."""

    observation_space = gym.spaces.Box(0, 255, (1, 8, 8), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def _frame(self) -> np.ndarray:
        self.side = int(self.np_random.integers(2))
        frame = self.np_random.integers(0, 160, (1, 8, 8), dtype=np.uint8)
        frame[0, self.np_random.integers(8), self.np_random.integers(4) + 4 * self.side] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        self.t += 1
        return self._frame(), reward, False, self.t >= 20, {}


class SmallCNN(BaseFeaturesExtractor):
    def __init__(self, observation_space: gym.spaces.Box) -> None:
        super().__init__(observation_space, 32)
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(16 * 4 * 4, 32), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize("precision", [pytest.param("fp32", marks=pytest.mark.slow), "bf16",
                                       pytest.param("fp16", marks=pytest.mark.slow)])  # fp16: no fp16 units on a CPU
def test_a_low_precision_dqn_learns_an_image_env(precision: str) -> None:
    """A CNN DQN at bf16 / fp16 (autocast, channels_last, fp16 loss scaling) learns BrightSide
    as fp32 does, in 1,500 steps (seed 0: fp32, bf16 and fp16 all scored 19.3 of 20; untrained 9.7,
    fp32 after 500 steps 14.0)."""
    model = sb3.DQN("CnnPolicy", BrightSide(), learning_starts=200, train_freq=1, batch_size=32, gamma=0.0,
                    learning_rate=1e-3, exploration_fraction=0.3, target_update_interval=200, seed=0, device="cpu",
                    policy_kwargs={"features_extractor_class": SmallCNN, "net_arch": []})
    scale = enable_mixed_precision(model, precision)
    if precision != "fp32":
        assert model.policy.q_net.features_extractor.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    model.learn(1500)
    env = BrightSide()
    scores = []
    for episode in range(10):
        obs, _ = env.reset(seed=100 + episode)
        done, score = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(model.predict(obs, deterministic=True)[0])
            score, done = score + r, term or trunc
        scores.append(score)
    assert np.mean(scores) >= 17, scores
    if scale is not None:
        assert scale.steps == 1300 and scale.skipped < 20  # the first steps at 2**16 may overflow, then few


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_autocasts_the_updates(precision: str, dtype: torch.dtype) -> None:
    model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=50, train_freq=8, gradient_steps=2, seed=0,
                    device="cpu", policy_kwargs={"net_arch": [32]})
    seen: list[torch.dtype] = []
    heads: list[torch.dtype] = []
    model.policy.q_net.q_net[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    model.policy.q_net.q_net[-1].register_forward_hook(lambda _m, _i, out: heads.append(out.dtype))
    before = [p.detach().clone() for p in model.policy.q_net.parameters()]
    scaler = enable_mixed_precision(model, precision)
    model.learn(300)
    assert dtype in seen  # the gradient updates ran in low precision ...
    assert torch.float32 in seen  # ... while acting stayed fp32
    assert set(heads) == {torch.float32}  # Q-values (what the loss sees) always fp32
    assert all(p.dtype == torch.float32 for p in model.policy.parameters())  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.q_net.parameters(), strict=True))
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())
    assert (scaler is not None) == (precision == "fp16")
    assert torch.Tensor.backward.__name__ == "backward"  # the fp16 patch is gone after train()


def test_bf16_ppo_learns_in_10k_steps(tmp_path: Path) -> None:
    """Fast twin of the 30k run below. After 10k bf16 steps seeds 0, 1, 2 scored 79-100, 387, 99
    with the backward pass outside autocast (as now) and 476, 72, 104 with it inside (as
    before): 10k steps is early in PPO's learning and a seed's score spreads widely either
    way; a random policy scores ~22."""
    result = train(TrainConfig("ppo", "CartPole-v1", timesteps=10_000, precision="bf16", out=tmp_path, eval_freq=0,
                               tensorboard=False))
    ckpt = load_checkpoint(result.run_dir)
    assert evaluate(ckpt.policy, ckpt.env_spec, episodes=10, seed=0, n_envs=5).mean >= 60


@pytest.mark.slow
def test_bf16_ppo_still_learns(tmp_path: Path) -> None:
    result = train(TrainConfig("ppo", "CartPole-v1", timesteps=30_000, precision="bf16", out=tmp_path, eval_freq=0,
                               tensorboard=False))
    ckpt = load_checkpoint(result.run_dir)
    # a random policy scores ~22; one 30k-step seed scored 120 on an AVX512-BF16 CPU (native bf16
    # kernels) and >= 195 on an AVX2 one (emulated bf16): the threshold is learning, not a CPU
    assert evaluate(ckpt.policy, ckpt.env_spec, episodes=10, seed=0, n_envs=5).mean >= 100


# ---------------------------------------------------------------------------- runs


def test_run_folder_logs_and_checkpoints(tmp_path: Path) -> None:
    env_id, hp = TINY["ppo"]
    result = train(TrainConfig("ppo", env_id, timesteps=1000, hyperparams=hp, out=tmp_path, eval_freq=300,
                               eval_episodes=2, checkpoint_freq=200))
    run = result.run_dir
    assert run == tmp_path / "ppo" / "CartPole-v1_1"
    # the last two checkpoints kept, named as the RL Zoo names them; the best evaluation as best_model.zip
    assert sorted(p.name for p in run.glob("rl_model_*.zip")) == ["rl_model_1000_steps.zip", "rl_model_800_steps.zip"]
    assert (run / "best_model.zip").exists()
    assert list((run / "tb").rglob("events.out.tfevents.*"))
    assert np.load(run / "evaluations.npz")["results"].shape[1] == 2
    again = train(TrainConfig("ppo", env_id, timesteps=1000, hyperparams=hp, out=tmp_path, eval_freq=0))
    assert again.run_dir.name == "CartPole-v1_2"  # a new run never overwrites an old one
    with pytest.raises(QuarlError, match="already finished"):
        train(TrainConfig("ppo", env_id, timesteps=1000, hyperparams=hp, out=tmp_path), resume=True)


class _Payload:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED",))


def test_resume_reads_checkpoints_without_unpickling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--resume restores weights, optimizer, replay and normalization from tensors and
    arrays; a replay pickle (an older quarl's, or a planted one) is refused in one line and
    its payload does not run; a failed start's empty folder is skipped."""
    import pickle

    monkeypatch.chdir(tmp_path)
    env_id, hp = TINY["dqn"]
    config = TrainConfig("dqn", env_id, timesteps=600, hyperparams=hp, out=tmp_path, eval_freq=0, checkpoint_freq=300,
                         tensorboard=False)
    first = train(config)
    run = first.run_dir
    (run / "CartPole-v1.zip").unlink()  # as if killed after the 600-step checkpoint
    (tmp_path / "dqn" / "CartPole-v1_2").mkdir()  # a start that failed before any checkpoint
    saved = np.load(run / "rl_model_600_steps.replay.npz", allow_pickle=False)
    resumed = train(replace(config, timesteps=900), resume=True)
    assert resumed.run_dir == run and resumed.resumed_from == 600 and resumed.timesteps >= 900
    buffer = resumed.model.replay_buffer
    pos = int(saved["pos"])
    assert pos > 500 and np.array_equal(buffer.observations[:pos], saved["observations"][:pos])  # the replay went on

    (run / "CartPole-v1.zip").unlink()
    for old in run.glob("*.replay.npz"):
        old.unlink()
    latest = max(run.glob("rl_model_*_steps.zip"), key=lambda p: int(p.stem.split("_")[2]))
    (run / latest.name.replace(".zip", ".replay.pkl")).write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(QuarlError, match=r"replay.pkl \(an older quarl's checkpoint\) needs unpickling: refused"):
        train(replace(config, timesteps=1200), resume=True)
    assert not (tmp_path / "PWNED").exists()


def test_trpo_trains_and_loads_but_refuses_qat_in_one_line(tmp_path: Path) -> None:
    """sb3-contrib's TRPO through the trainer registry: the run loads as SB3 acts; QAT is
    refused (its line search needs second derivatives, which the straight-through estimator lacks)."""
    env_id, hp = TRPO
    result = train(TrainConfig("trpo", env_id, timesteps=256, hyperparams=hp, out=tmp_path, eval_freq=0,
                               tensorboard=False))
    ckpt = load_checkpoint(result.run_dir)
    assert ckpt.algo == "trpo"
    obs = _obs(env_id)
    assert (ckpt.policy.act(obs) == result.model.predict(obs, deterministic=True)[0]).all()
    with pytest.raises(QuarlError, match="trpo's natural-gradient step needs second derivatives"):
        train(TrainConfig("trpo", env_id, timesteps=256, hyperparams=hp, qat=QATConfig(4, 100), out=tmp_path))


def test_the_rl_zoo_player_loads_the_best_model_and_a_checkpoint(tmp_path: Path, capsys, monkeypatch) -> None:
    """rl_zoo3.enjoy --load-best and --load-checkpoint N find what quarl train wrote."""
    import sys

    from rl_zoo3.enjoy import enjoy

    env_id, hp = TINY["ppo"]
    train(TrainConfig("ppo", env_id, timesteps=1000, hyperparams=hp, out=tmp_path, eval_freq=300, eval_episodes=2,
                      checkpoint_freq=500, tensorboard=False))
    for flag in (["--load-best"], ["--load-checkpoint", "1000"]):
        monkeypatch.setattr(sys, "argv", ["enjoy", "--algo", "ppo", "--env", env_id, "-f", str(tmp_path),
                                          "--exp-id", "1", "-n", "300", "--no-render", *flag])
        capsys.readouterr()
        enjoy()
        out = capsys.readouterr().out
        assert "Loading" in out and ("best_model" in out or "rl_model_1000_steps" in out), out[-1000:]


def test_a_run_checkpointed_by_an_older_quarl_still_resumes(tmp_path: Path) -> None:
    """Runs written before checkpoints took the RL Zoo's names (checkpoints/step_N.zip)."""
    env_id, hp = TINY["ppo"]
    config = TrainConfig("ppo", env_id, timesteps=400, hyperparams=hp, out=tmp_path, eval_freq=0, checkpoint_freq=200,
                         tensorboard=False)
    run = train(config).run_dir
    (run / "CartPole-v1.zip").unlink()
    (run / "checkpoints").mkdir()
    for p in run.glob("rl_model_*_steps.*"):
        step = int(p.name.split("_")[2])
        p.rename(run / "checkpoints" / p.name.replace(f"rl_model_{step}_steps", f"step_{step}"))
    resumed = train(replace(config, timesteps=600), resume=True)
    assert resumed.resumed_from == 400 and resumed.timesteps >= 600


def test_training_says_its_rolling_return_as_it_learns(tmp_path: Path) -> None:
    """A line per tenth of the budget with the mean return of the last training episodes
    (SB3's ep_info_buffer): steps rise, the returns are CartPole's (at least 8 per episode)."""
    import re

    from quarl.training.sb3_train import TrainConfig, train

    lines: list[str] = []
    train(TrainConfig("ppo", "CartPole-v1", timesteps=2048, out=tmp_path, eval_freq=0, tensorboard=False,
                      on_progress=lines.append))
    parsed = [re.fullmatch(r"step ([\d,]+): mean training return ([\d.]+) over the last (\d+) episodes", x)
              for x in lines]
    assert 8 <= len(parsed) <= 10 and all(parsed), lines
    steps = [int(m.group(1).replace(",", "")) for m in parsed]
    assert steps == sorted(steps) and steps[-1] > 0.9 * 2048
    assert all(8.0 <= float(m.group(2)) <= 500.0 and 1 <= int(m.group(3)) <= 100 for m in parsed)


def test_resume_refuses_a_checkpoint_that_lies_about_its_step_or_its_replay(tmp_path: Path) -> None:
    """A copy named rl_model_99999999999_steps.zip made the run end "finished" without
    training, and a replay position of -5 hid every stored transition: one line each."""
    import shutil

    env_id, hp = TINY["dqn"]
    config = TrainConfig("dqn", env_id, timesteps=600, hyperparams=hp, out=tmp_path, eval_freq=0, checkpoint_freq=300,
                         tensorboard=False)
    run = train(config).run_dir
    (run / "CartPole-v1.zip").unlink()  # as if killed after the 600-step checkpoint
    shutil.copy(run / "rl_model_600_steps.zip", run / "rl_model_99999999999_steps.zip")
    with pytest.raises(QuarlError, match=r"says step 99,999,999,999 but its model was saved at step 600"):
        train(replace(config, timesteps=900), resume=True)
    (run / "rl_model_99999999999_steps.zip").unlink()
    with pytest.raises(QuarlError, match=r"rl_model_600_steps.zip is at step 600, past this run's 500 steps"):
        train(replace(config, timesteps=500), resume=True)
    replay = run / "rl_model_600_steps.replay.npz"
    arrays = dict(np.load(replay, allow_pickle=False))
    arrays["pos"] = np.array(-5)
    np.savez(replay.with_suffix(""), **arrays)  # np.savez adds .npz
    with pytest.raises(QuarlError, match=r"replay buffer's position -5 \(full False\) is not one in a buffer"):
        train(replace(config, timesteps=900), resume=True)


# ---------------------------------------------------------------------------- values that mean something


def test_a_checkpoint_of_another_algorithm_is_refused_naming_both(tmp_path: Path) -> None:
    """An A2C checkpoint resumed as PPO loaded RMSprop's state into Adam and died mid-run
    (KeyError 'betas'); fine-tuned as PPO it trained on silently. One line naming both."""
    import shutil

    from quarl.quant.student import KernelSpec
    from quarl.training.finetune import finetune

    env_id, a2c_hp = TINY["a2c"]
    a2c = train(TrainConfig("a2c", env_id, timesteps=200, hyperparams=a2c_hp, out=tmp_path, eval_freq=0,
                            checkpoint_freq=100, tensorboard=False)).run_dir
    ppo_config = TrainConfig("ppo", env_id, timesteps=400, hyperparams=TINY["ppo"][1], out=tmp_path, eval_freq=0,
                             tensorboard=False)
    ppo_run = tmp_path / "ppo" / "CartPole-v1_1"
    ppo_run.mkdir(parents=True)
    shutil.copy(a2c / "rl_model_200_steps.zip", ppo_run / "rl_model_200_steps.zip")
    with pytest.raises(QuarlError, match=r"rl_model_200_steps.zip was saved by a2c, not ppo: resume it as a2c"):
        train(ppo_config, resume=True)
    # the same zip in a folder that calls it ppo, fine-tuned with PPO's updates
    shutil.copytree(a2c, tmp_path / "zoo" / "ppo" / "CartPole-v1_1")
    ckpt = load_checkpoint(tmp_path / "zoo" / "ppo" / "CartPole-v1_1")
    assert ckpt.algo == "ppo"
    with pytest.raises(QuarlError, match=r"CartPole-v1.zip was saved by a2c, not ppo: fine-tune it as a2c"):
        finetune(tmp_path / "zoo" / "ppo" / "CartPole-v1_1" / "CartPole-v1.zip", ckpt.policy, ckpt.env_spec,
                 KernelSpec("int8", frozenset()), None, 100)
    # its own algorithm resumes it
    shutil.rmtree(tmp_path / "a2c" / "CartPole-v1_1" / "CartPole-v1")
    (a2c / "CartPole-v1.zip").unlink()
    assert train(TrainConfig("a2c", env_id, timesteps=300, hyperparams=a2c_hp, out=tmp_path, eval_freq=0,
                             tensorboard=False), resume=True).resumed_from == 200


_LAYER = {"quantize": True, "out_min": -1.0, "out_max": 2.0, "w_min": -0.5, "w_max": 0.5}
_STATE = {"config": {"bits": 3, "quant_delay": 200, "scheme": "quarl", "granularity": "auto", "critic": False},
          "enabled": True, "layers": {"q_net.q_net.0": _LAYER}}


@pytest.mark.parametrize("edit,message", [
    (lambda s: s["layers"]["q_net.q_net.0"].update(out_max=float("nan")), r"field layers.q_net.q_net.0.out_max: "
     r"Input should be a finite number|out_min..out_max = -1.0..nan is not a finite range"),
    (lambda s: s["layers"]["q_net.q_net.0"].update(out_max=float("inf")),
     r"out_min..out_max = -1.0..inf is not a finite"),
    (lambda s: s["layers"]["q_net.q_net.0"].update(w_min=0.5), r"w_min..w_max = 0.5..0.5 has width 0.0: a range must "
     r"be wider than zero"),
    (lambda s: s["layers"]["q_net.q_net.0"].update(out_min=3.0), r"out_min..out_max = 3.0..2.0 has width -1.0"),
    (lambda s: s.update(layers=[1, 2]), r"field layers: Input should be a valid dictionary \(got \[1, 2\]\)"),
    (lambda s: s["layers"]["q_net.q_net.0"].pop("w_min"), r"field layers.q_net.q_net.0.w_min: Field required$"),
    (lambda s: s["layers"]["q_net.q_net.0"].update(out_min="-1"), r"field layers.q_net.q_net.0.out_min: Input should "
     r"be a valid number \(got '-1'\)"),
    (lambda s: s["config"].update(bits=99), r"field config: .*99"),
    (lambda s: s["config"].update(bits=4), r"field config.bits: the run was trained with bits=4, this one asks 3"),
    (lambda s: s.update(enabled="yes"), r"field enabled: Input should be a valid boolean \(got 'yes'\)"),
])
def test_a_qat_state_that_means_nothing_is_refused_naming_file_and_field(tmp_path: Path, edit, message: str) -> None:
    from quarl.training.qat_sb3 import read_qat_state

    state = json.loads(json.dumps(_STATE))
    path = tmp_path / "rl_model_600_steps.qat.json"
    path.write_text(json.dumps(state))
    # as written, it loads
    assert read_qat_state(path, QATConfig(3, 200)).layers["q_net.q_net.0"].model_dump() == _LAYER
    edit(state)
    path.write_text(json.dumps(state))
    with pytest.raises(QuarlError, match=message) as caught:
        read_qat_state(path, QATConfig(3, 200))
    assert str(caught.value).startswith(f"{path}: field ") and "\n" not in str(caught.value)


def test_a_layer_never_observed_keeps_its_sentinel_range(tmp_path: Path) -> None:
    """An observer that saw nothing yet holds (+inf, -inf), which json writes as Infinity,
    -Infinity: a checkpoint taken before the first update must still resume."""
    from quarl.training.qat_sb3 import read_qat_state

    state = json.loads(json.dumps(_STATE))
    state["layers"]["q_net.q_net.0"].update(out_min=float("inf"), out_max=float("-inf"))
    path = tmp_path / "qat.json"
    path.write_text(json.dumps(state))
    assert read_qat_state(path).layers["q_net.q_net.0"].out_max == float("-inf")
    state["layers"]["q_net.q_net.0"].update(out_min=float("-inf"), out_max=float("inf"))  # not the sentinel
    path.write_text(json.dumps(state))
    with pytest.raises(QuarlError, match=r"out_min..out_max = -inf..inf is not a finite range"):
        read_qat_state(path)


def test_resume_refuses_a_nan_range_in_the_checkpoint_qat_state(tmp_path: Path) -> None:
    env_id, hp = TINY["dqn"]
    config = TrainConfig("dqn", env_id, timesteps=600, qat=QATConfig(3, 200), hyperparams=hp, out=tmp_path,
                         eval_freq=0, checkpoint_freq=300, tensorboard=False)
    run = train(config).run_dir
    (run / "CartPole-v1.zip").unlink()
    qat_file = run / "rl_model_600_steps.qat.json"
    state = json.loads(qat_file.read_text())
    name = sorted(state["layers"])[0]
    state["layers"][name]["out_max"] = float("nan")
    qat_file.write_text(json.dumps(state))
    with pytest.raises(QuarlError, match=rf"rl_model_600_steps.qat.json: field layers.{re.escape(name)}"):
        train(replace(config, timesteps=900), resume=True)


def test_resume_refuses_normalization_statistics_that_mean_nothing(tmp_path: Path) -> None:
    from quarl.training.checkpoint_arrays import load_vecnormalize_arrays, vecnormalize_arrays

    class Rms:
        def __init__(self, shape: tuple[int, ...]) -> None:
            self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 4.0

    class Venv:
        obs_rms, ret_rms = Rms((3,)), Rms(())

    good = vecnormalize_arrays(Venv())
    load_vecnormalize_arrays(Venv(), good, "f.npz")
    for key, value, message in [
        ("obs_rms.var", np.array([1.0, -1.0, 1.0]), r"field obs_rms.var: \[1.0, -1.0, 1.0\] is "
         r"not a finite variance >= 0"),
        ("obs_rms.mean", np.zeros(4), r"field obs_rms.mean: float64 \(4,\), this run's statistics "
         r"are numbers of shape \(3,\)"),
        ("ret_rms.count", np.array(0.0), r"field ret_rms.count: \[0.0\] is not a finite value > 0"),
        ("obs_rms.mean", np.array([np.nan, 0, 0]), r"field obs_rms.mean: \[nan, 0.0, 0.0\] is not a "
         r"finite mean"),
    ]:
        with pytest.raises(QuarlError, match=rf"^f.npz: {message}"):
            load_vecnormalize_arrays(Venv(), {**good, key: value}, "f.npz")
    with pytest.raises(QuarlError, match=r"field ret_rms.var: missing"):
        load_vecnormalize_arrays(Venv(), {k: v for k, v in good.items() if k != "ret_rms.var"}, "f.npz")
