"""The loader rebuilds each algorithm's acting network from the zip alone and acts exactly
as Stable-Baselines3's own ``predict(deterministic=True)``."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import sb3_contrib
import stable_baselines3 as sb3
import torch
from torch import nn

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.core.literals import parse_literal
from quarl.policies.safe_load import load_vecnormalize, load_zoo_yaml


class ImageEnv(gym.Env):
    """Atari-shaped observations (84, 84, 4) uint8 with 4 actions; no emulator needed."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


ALGOS = {
    "a2c": sb3.A2C,
    "ppo": sb3.PPO,
    "dqn": sb3.DQN,
    "sac": sb3.SAC,
    "td3": sb3.TD3,
    "ddpg": sb3.DDPG,
    "qrdqn": sb3_contrib.QRDQN,
    "tqc": sb3_contrib.TQC,
    "trpo": sb3_contrib.TRPO,
    "ars": sb3_contrib.ARS,
    "crossq": sb3_contrib.CrossQ,
    "ppo_mask": sb3_contrib.MaskablePPO,
}
OFF_POLICY = ("dqn", "qrdqn", "sac", "td3", "ddpg", "tqc", "crossq")
CASES = [
    ("a2c", "CartPole-v1", "MlpPolicy", {}),
    ("ppo", "CartPole-v1", "MlpPolicy", {"policy_kwargs": {"net_arch": [32, 48], "activation_fn": nn.ReLU}}),
    ("ppo", "Pendulum-v1", "MlpPolicy", {}),
    ("a2c", "Pendulum-v1", "MlpPolicy", {"use_sde": True}),
    ("ppo", "Pendulum-v1", "MlpPolicy", {"use_sde": True, "policy_kwargs": {"squash_output": True}}),
    ("trpo", "Pendulum-v1", "MlpPolicy", {"n_steps": 256, "batch_size": 64}),
    ("trpo", "CartPole-v1", "MlpPolicy", {"n_steps": 256, "batch_size": 64}),
    ("ppo_mask", "CartPole-v1", "MlpPolicy", {}),
    ("ars", "Pendulum-v1", "LinearPolicy", {"n_delta": 2}),
    ("ars", "Pendulum-v1", "LinearPolicy", {"n_delta": 2, "policy_kwargs": {"with_bias": True}}),
    ("ars", "Pendulum-v1", "MlpPolicy", {"n_delta": 2}),
    ("ars", "CartPole-v1", "LinearPolicy", {"n_delta": 2}),
    ("ars", "CartPole-v1", "MlpPolicy", {"n_delta": 2, "policy_kwargs": {"net_arch": [16]}}),
    ("dqn", "CartPole-v1", "MlpPolicy", {"policy_kwargs": {"net_arch": [64, 64, 64]}}),
    ("qrdqn", "CartPole-v1", "MlpPolicy", {}),
    ("sac", "Pendulum-v1", "MlpPolicy", {}),
    ("sac", "Pendulum-v1", "MlpPolicy", {"use_sde": True}),
    ("tqc", "Pendulum-v1", "MlpPolicy", {}),
    ("crossq", "Pendulum-v1", "MlpPolicy", {"policy_kwargs": {"net_arch": [32, 32]}}),
    ("td3", "Pendulum-v1", "MlpPolicy", {"policy_kwargs": {"net_arch": [32, 32]}}),
    ("ddpg", "Pendulum-v1", "MlpPolicy", {}),
    ("ppo", "image", "CnnPolicy", {}),
    ("dqn", "image", "CnnPolicy", {"buffer_size": 100}),
]


def _make(algo: str, env_id: str, policy: str, kwargs: dict, seed: int = 3):
    env = ImageEnv() if env_id == "image" else gym.make(env_id)
    extra = {"buffer_size": 1000} if algo in OFF_POLICY else {}
    if algo in OFF_POLICY:
        extra["learning_starts"] = 100
    if algo in ("ppo", "a2c", "ppo_mask") and env_id != "image":
        extra["n_steps"] = 128
    return ALGOS[algo](policy, env, seed=seed, device="cpu", **{**extra, **kwargs})


def _rollout_states(model, env_id: str, steps: int = 300) -> np.ndarray:
    """Observations met by SB3's own deterministic policy (real states, not noise)."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=7)
    states = []
    for _ in range(steps):
        states.append(obs)
        action, _ = model.predict(obs, deterministic=True)
        obs, _, term, trunc, _ = env.step(action)
        if term or trunc:
            obs, _ = env.reset()
    return np.stack(states)


@pytest.mark.parametrize("algo,env_id,policy,kwargs", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_actions_match_sb3_predict(tmp_path: Path, algo: str, env_id: str, policy: str, kwargs: dict) -> None:
    """A tiny agent of each kind, trained a few hundred steps (off-policy: 100 updates after
    its 100 random steps, enough to move every weight off its initialization): quarl's policy
    and its fp32 engine act as ``predict(deterministic=True)`` on every state of a rollout."""
    from quarl.quantization.api import quantize
    from quarl.quantization.config import QuantConfig

    model = _make(algo, env_id, policy, kwargs)
    if env_id != "image":
        steps = 800 if algo == "ars" else 200 if algo in OFF_POLICY else 400  # SAC, TQC: 300 updates took 4-6 s
        model.learn(steps, **({"use_masking": False} if algo == "ppo_mask" else {}))
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = load_checkpoint(path).policy
    assert loaded.algo == ("ppo" if algo == "ppo_mask" else algo)
    space = model.observation_space
    if env_id == "image":
        obs = np.random.default_rng(0).integers(0, 256, (16, *space.shape), dtype=np.uint8)
    else:
        obs = _rollout_states(model, env_id)
    want = np.stack([model.predict(o, deterministic=True)[0] for o in obs])  # batch 1, as deployed
    for acting in (loaded, quantize(loaded, QuantConfig("fp32"))):
        got = np.concatenate([acting.act(o[None]) for o in obs])
        if isinstance(model.action_space, gym.spaces.Discrete):
            assert np.array_equal(got, want)
        else:
            assert np.array_equal(got, want), np.abs(got - want).max()


def test_recurrent_ppo_is_refused_in_one_line(tmp_path: Path) -> None:
    model = sb3_contrib.RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=32, seed=0, device="cpu")
    model.save(tmp_path / "lstm.zip")
    with pytest.raises(QuarlError, match="recurrent policies .* not supported"):
        load_checkpoint(tmp_path / "lstm.zip")


def test_normalization_matches_vecnormalize_exactly() -> None:
    """Observations normalized as VecNormalize does (float64 statistics, then float32)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from quarl.policies.base import ObsNormalizer

    venv = VecNormalize(make_vec_env("HalfCheetah-v5", n_envs=1, seed=0), clip_obs=5.0)
    venv.reset()
    raw = []
    for _ in range(100):
        venv.step(np.array([venv.action_space.sample()]))
        raw.append(venv.get_original_obs()[0])
    norm = ObsNormalizer(venv.obs_rms.mean, venv.obs_rms.var, 5.0, venv.epsilon)
    policy_input = np.stack(raw)
    from quarl.policies.base import Policy

    want = venv.normalize_obs(policy_input)
    got = Policy(nn.Sequential(nn.Identity()), venv.observation_space, venv.action_space, "clip",
                 obs_normalizer=norm).preprocess(policy_input)
    assert got.dtype == np.float32 and np.array_equal(got, want.astype(np.float32))


def test_zip_is_read_without_unpickling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _make("ppo", "CartPole-v1", "MlpPolicy", {})
    model.save(tmp_path / "m.zip")

    def refuse(*_a, **_k):
        raise AssertionError("pickle.loads called")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    assert load_checkpoint(tmp_path / "m.zip").policy.head == "argmax"


def test_vecnormalize_read_with_allow_list_matches_sb3(tmp_path: Path) -> None:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), clip_obs=7.0)
    venv.reset()
    for _ in range(50):
        venv.step(np.array([venv.action_space.sample() for _ in range(2)]))
    venv.save(tmp_path / "vecnormalize.pkl")
    stats = load_vecnormalize(tmp_path / "vecnormalize.pkl")
    assert np.allclose(stats.mean, venv.obs_rms.mean) and np.allclose(stats.var, venv.obs_rms.var)
    assert stats.clip_obs == 7.0


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_vecnormalize_with_foreign_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(pickle.dumps({"obs_rms": _Evil()}))
    with pytest.raises(QuarlError, match=r"refused; pass --trust-pickle.*") as info:
        load_vecnormalize(path)
    assert "builtins.print" in str(info.value)


def test_policy_pth_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    model = _make("ppo", "CartPole-v1", "MlpPolicy", {})
    model.save(tmp_path / "m.zip")
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(tmp_path / "m.zip") as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "policy.pth":
                import io

                buf = io.BytesIO()
                torch.save({"w": _Evil()}, buf)
                data = buf.getvalue()
            dst.writestr(name, data)
    with pytest.raises(QuarlError, match="cannot be read as plain tensors"):
        load_checkpoint(bad)


@pytest.mark.parametrize(
    "content,message",
    [(b"not a zip", "not a zip file"), (None, "does not exist")],
)
def test_bad_checkpoint_files(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "model.zip"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(QuarlError, match=message):
        load_checkpoint(path)


def test_zoo_yaml_and_literals(tmp_path: Path) -> None:
    from tests.conftest import zoo_run

    config = load_zoo_yaml(zoo_run("ppo", "HalfCheetah-v3") / "HalfCheetah-v3" / "config.yml")
    assert config["normalize"] is True and config["n_envs"] == 1
    kwargs = parse_literal(config["policy_kwargs"])
    assert kwargs["activation_fn"] == "nn.ReLU"
    assert kwargs["net_arch"] == [{"pi": [256, 256], "vf": [256, 256]}]
    assert parse_literal("<class 'torch.nn.modules.activation.Tanh'>") == "torch.nn.modules.activation.Tanh"


def test_predict_has_sb3s_signature_and_numbers(tiny_run: Path) -> None:
    """Code written for an SB3 model runs a quarl policy: one observation or a batch, the
    same actions as SB3's own predict, and ``(actions, None)``."""
    import stable_baselines3 as sb3

    from quarl.api import quantize
    from quarl.checkpoints import load_checkpoint

    agent = load_checkpoint(tiny_run)
    model = sb3.PPO.load(tiny_run / "CartPole-v1.zip", device="cpu")
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    actions, state = agent.policy.predict(obs, deterministic=True)
    assert state is None and actions.shape == (32,)
    assert np.array_equal(actions, model.predict(obs, deterministic=True)[0])
    one, _ = agent.policy.predict(obs[0])
    assert np.ndim(one) == 0 and one == actions[0]
    int8 = quantize(agent.policy, "int8", agent.env_spec)
    assert (int8.predict(obs)[0] == actions).mean() >= 0.9
    # deterministic=False samples, as SB3's does: over many draws, each state's action frequencies agree
    draws = np.stack([agent.policy.predict(obs[:4], deterministic=False)[0] for _ in range(400)])
    theirs = np.stack([model.predict(obs[:4], deterministic=False)[0] for _ in range(400)])
    assert np.abs(draws.mean(axis=0) - theirs.mean(axis=0)).max() < 0.15


def test_a_zip_inside_a_run_folder_finds_the_statistics_it_was_trained_with(tmp_path: Path) -> None:
    """best_model.zip / rl_model_N_steps.zip in an RL Zoo run folder: its ENV/ holds the
    VecNormalize statistics, as rl_zoo3 finds them (without them the zoo's HalfCheetah scored
    -1043 instead of 5891)."""
    import shutil

    from tests.conftest import zoo_run

    run = tmp_path / "HalfCheetah-v3_1"
    shutil.copytree(zoo_run("ppo", "HalfCheetah-v3"), run)
    for name in ("best_model.zip", "rl_model_1000_steps.zip"):
        shutil.copy(run / "HalfCheetah-v3.zip", run / name)
        agent = load_checkpoint(run / name)
        assert agent.policy.obs_normalizer is not None and agent.env_spec.env_id == "HalfCheetah-v4"
    (run / "Other-v0").mkdir()
    (run / "Other-v0" / "config.yml").write_text("{}\n")
    with pytest.raises(QuarlError, match="beside 2 RL Zoo config folders"):
        load_checkpoint(run / "best_model.zip")


def test_the_api_takes_an_env_id_and_the_zoos_schedule_syntax_is_text(tiny_run: Path) -> None:
    import quarl
    from quarl.core.literals import parse_literal

    agent = quarl.load(tiny_run)
    by_id = quarl.evaluate(agent.policy, "CartPole-v1", episodes=3)
    by_spec = quarl.evaluate(agent.policy, agent.env_spec, episodes=3)
    assert np.array_equal(by_id.returns, by_spec.returns)
    assert quarl.quantize(agent.policy, "int8", "CartPole-v1").meta["quant"]["mode"].startswith("int8-")
    with pytest.raises(QuarlError, match="neither an EnvSpec nor a gymnasium env id"):
        quarl.evaluate(agent.policy, 42, episodes=1)
    assert parse_literal("lin_3e-4") == "lin_3e-4" and parse_literal("1e-3") == 1e-3  # --hp learning_rate=lin_3e-4


def test_a_run_folder_is_one_policy_and_the_zoo_options_pick_its_zips(tiny_run: Path, tmp_path: Path) -> None:
    """rl_zoo3.enjoy's rules: the final model by default, --load-checkpoint N,
    --load-last-checkpoint, --load-best; a second final model is refused with both names."""
    import shutil

    from quarl.checkpoints import load_checkpoint
    from quarl.core.errors import QuarlError
    from quarl.policies.zoo_folder import pick_zip
    from tests.conftest import run_cli

    run = tmp_path / "ppo" / "CartPole-v1_1"
    shutil.copytree(tiny_run, run)
    steps = sorted(int(p.name.split("_")[2]) for p in run.glob("rl_model_*_steps.zip"))
    assert steps, "the tiny run keeps checkpoints"
    assert pick_zip(run) == run / "CartPole-v1.zip"
    assert pick_zip(run, load_last_checkpoint=True) == run / f"rl_model_{steps[-1]}_steps.zip"
    assert pick_zip(run, load_checkpoint=steps[0]) == run / f"rl_model_{steps[0]}_steps.zip"
    with pytest.raises(QuarlError, match=r"--load-checkpoint 7: .* no rl_model_7_steps.zip \(checkpoints: "):
        pick_zip(run, load_checkpoint=7)
    with pytest.raises(QuarlError, match="no best_model.zip"):
        pick_zip(run, load_best=True)
    first = run_cli("play", str(run), "--load-checkpoint", str(steps[0]), "--episodes", "2")
    want = load_checkpoint(run / f"rl_model_{steps[0]}_steps.zip")
    assert first.returncode == 0 and want.policy.fingerprint() != load_checkpoint(run).policy.fingerprint()
    from quarl.evaluation.episodes import evaluate

    mean = evaluate(want.policy, want.env_spec, episodes=2, n_envs=1).returns.mean()
    assert f"mean return {mean:.2f} over 2 episodes" in first.stdout
    shutil.copyfile(run / "CartPole-v1.zip", run / "other.zip")
    refused = run_cli("ptq", str(run), "--episodes", "1")
    assert refused.returncode == 2 and "holds 2 policies (CartPole-v1.zip, other.zip)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_the_api_takes_the_sb3_model_a_user_holds() -> None:
    """quarl.load / quantize / evaluate take an SB3 model object with its VecNormalize: the
    env id and the observation statistics come with it, and quarl acts as model.predict."""
    import numpy as np
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import quarl

    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0), norm_reward=False)
    model = sb3.PPO("MlpPolicy", venv, n_steps=64, batch_size=64, seed=0, device="cpu")
    model.learn(256)
    agent = quarl.load(model)
    assert agent.env_spec.env_id == "CartPole-v1" and agent.policy.obs_normalizer is not None
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    want, _ = model.predict(venv.normalize_obs(obs), deterministic=True)
    assert np.array_equal(agent.policy.act(obs), want)
    result = quarl.evaluate(model, episodes=4, n_envs=2)
    assert np.array_equal(result.returns, quarl.evaluate(agent.policy, "CartPole-v1", episodes=4, n_envs=2).returns)
    int8 = quarl.quantize(model, "int8")
    assert int8.meta["quant"]["mode"].startswith("int8") and int8.obs_normalizer is not None
    with pytest.raises(QuarlError, match="not a dict"):
        quarl.quantize({}, "int8")


NEVER = " (allowed: finite numbers, or Infinity..-Infinity for a layer never observed)"


@pytest.mark.parametrize("edit,message", [
    (None, None),
    ({"out_min": float("nan")}, "out_min..out_max = nan..2.0 is not a finite range" + NEVER),
    ({"out_min": 1.0, "out_max": 1.0}, "out_min..out_max = 1.0..1.0 has width 0.0: a range must be wider than zero"),
    ({"w_max": float("inf")}, "w_min..w_max = -0.5..inf is not a finite range" + NEVER),
])
def test_a_qat_runs_state_is_checked_when_its_policy_is_loaded(tiny_run: Path, tmp_path: Path, edit: dict | None,
                                                               message: str | None) -> None:
    """qat.json beside config.yml is read as the QATState a resume reads: NaN, inf or
    zero-width ranges are refused at load time too (they used to load: a NaN range was
    skipped, a zero-width one divided by zero), in one line naming the file and the layer."""
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    names = [getattr(m, "sb3_name") for m in load_checkpoint(run).policy.network.modules() if isinstance(m, nn.Linear)]
    layers = {name: {"quantize": True, "out_min": -1.0, "out_max": 2.0, "w_min": -0.5, "w_max": 0.5} for name in names}
    if edit is not None:
        layers[names[1]].update(edit)
    qat = next(run.rglob("config.yml")).parent / "qat.json"
    qat.write_text(json.dumps({"config": {"bits": 4, "quant_delay": 0, "scheme": "quarl", "granularity": "auto",
                                          "critic": False}, "enabled": True, "layers": layers}))
    if message is None:
        policy = load_checkpoint(run).policy
        x = np.zeros((1, 4), np.float32)
        assert policy.act(x).shape == (1,) and len(names) == 3  # fake-quantized as trained
        return
    with pytest.raises(QuarlError) as caught:
        load_checkpoint(run)
    assert str(caught.value) == f"{qat}: field layers.{names[1]}: {message}"
