"""Seeded evaluation: deterministic, independent of batching, and the zoo's rewards."""

from __future__ import annotations

import os

import numpy as np
import pytest

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, check_env_id, current_env_id, make_env
from quarl.evaluation import parallel
from quarl.evaluation.calibration import calibration_inputs
from quarl.evaluation.episodes import evaluate
from quarl.quant.modes import MODES
from quarl.quantization.api import quantize
from quarl.quantization.config import QuantConfig
from tests.conftest import zoo_run


def test_same_numbers_twice_and_for_any_batch_size() -> None:
    ckpt = load_checkpoint(zoo_run("ppo", "LunarLander-v2"))
    a = evaluate(ckpt.policy, ckpt.env_spec, episodes=6, seed=5, n_envs=3)
    b = evaluate(ckpt.policy, ckpt.env_spec, episodes=6, seed=5, n_envs=3)
    c = evaluate(ckpt.policy, ckpt.env_spec, episodes=6, seed=5, n_envs=1)
    assert np.array_equal(a.returns, b.returns) and np.array_equal(a.lengths, b.lengths)
    assert np.allclose(a.returns, c.returns)  # episode i always gets seed + i
    d = evaluate(ckpt.policy, ckpt.env_spec, episodes=6, seed=6, n_envs=3)
    assert np.allclose(a.returns[1:], d.returns[:-1])  # shifted seeds, shifted episodes


def test_int8_evaluation_is_deterministic() -> None:
    ckpt = load_checkpoint(zoo_run("sac", "Pendulum-v1"))
    calibration = calibration_inputs(ckpt.policy, ckpt.env_spec)
    policy = quantize(ckpt.policy, QuantConfig("int8"), calibration)
    a = evaluate(policy, ckpt.env_spec, episodes=4, seed=0, n_envs=4)
    b = evaluate(policy, ckpt.env_spec, episodes=4, seed=0, n_envs=2)
    assert np.array_equal(a.returns, b.returns)


def test_max_steps_truncates() -> None:
    ckpt = load_checkpoint(zoo_run("ppo", "CartPole-v1"))
    r = evaluate(ckpt.policy, ckpt.env_spec, episodes=3, max_steps=37)
    assert r.lengths.tolist() == [37, 37, 37]


def test_env_that_does_not_fit_the_policy() -> None:
    ckpt = load_checkpoint(zoo_run("ppo", "CartPole-v1"))
    with pytest.raises(QuarlError, match=r"observations of shape \(3,\) but the policy expects \(4,\)"):
        evaluate(ckpt.policy, EnvSpec("Pendulum-v1"), episodes=1)
    continuous = load_checkpoint(zoo_run("ppo", "MountainCarContinuous-v0")).policy
    with pytest.raises(QuarlError, match=r"env 'MountainCar-v0' has action space Discrete\(3\)"):
        evaluate(continuous, EnvSpec("MountainCar-v0"), episodes=1)


def test_env_ids() -> None:
    assert current_env_id("HalfCheetah-v3") == "HalfCheetah-v4"
    assert current_env_id("LunarLander-v2") == "LunarLander-v3"
    assert current_env_id("CartPole-v1") == "CartPole-v1"
    with pytest.raises(QuarlError, match=r"unknown env id 'CartPol-v1'.*did you mean CartPole-v1"):
        check_env_id("CartPol-v1")


def test_atari_env_gives_stacked_84x84_frames() -> None:
    env = make_env(EnvSpec("BreakoutNoFrameskip-v4", wrappers=("atari",), frame_stack=4))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert not obs[:3].any() and obs[3].any()  # zero padding before the first frame, as VecFrameStack
    env.close()


# Published RL Zoo results (benchmark.md): mean +/- std; the policy must land within them.
ZOO_RESULTS = [
    ("ppo", "HalfCheetah-v3", 5819.0, 663.0),
    ("ppo", "LunarLander-v2", 242.0, 32.0),
    ("ppo", "MountainCarContinuous-v0", 88.3, 2.6),
    ("sac", "Pendulum-v1", -157.0, 91.0),
]


@pytest.mark.parametrize("algo,env,mean,std", ZOO_RESULTS)
def test_zoo_policies_reach_published_reward(algo: str, env: str, mean: float, std: float) -> None:
    ckpt = load_checkpoint(zoo_run(algo, env))
    result = evaluate(ckpt.policy, ckpt.env_spec, episodes=20 if env != "HalfCheetah-v3" else 10, seed=0)
    assert result.mean >= mean - std, result.returns


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_cartpole_reaches_500_at_fp32_and_int8(algo: str) -> None:
    ckpt = load_checkpoint(zoo_run(algo, "CartPole-v1"))
    calibration = calibration_inputs(ckpt.policy, ckpt.env_spec)
    block = MODES["int8-block"].runnable(ckpt.policy.network)  # its fallback where this CPU cannot run it
    for config in (QuantConfig("fp32"), QuantConfig("int8"), QuantConfig.parse(block.label)):
        result = evaluate(quantize(ckpt.policy, config, calibration), ckpt.env_spec, episodes=10, seed=0)
        assert result.mean == 500.0, (config.label, result.returns)


@pytest.mark.parametrize("algo,env,zip_name", [("ppo", "HalfCheetah-v3", "HalfCheetah-v3.zip"),
                                               ("sac", "Pendulum-v1", "Pendulum-v1.zip")])
def test_fp32_returns_equal_sb3_predict_on_the_same_seeds(algo: str, env: str, zip_name: str) -> None:
    """Episode by episode, to the last bit, with 2 envs side by side (a chaotic MuJoCo
    episode turns a 1e-7 difference in one action into another return)."""
    import stable_baselines3 as sb3

    from quarl.envs import make_env

    run = zoo_run(algo, env)
    ckpt = load_checkpoint(run)
    policy = ckpt.policy
    model = getattr(sb3, algo.upper()).load(
        run / zip_name, device="cpu",
        custom_objects={"observation_space": policy.observation_space, "action_space": policy.action_space,
                        "learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0})
    norm = policy.obs_normalizer
    want = []
    for episode in range(2):
        env_ = make_env(ckpt.env_spec)
        obs, _ = env_.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            if norm is not None:  # as VecNormalize.normalize_obs
                obs = np.clip((obs - norm.mean) / np.sqrt(norm.var + norm.epsilon), -norm.clip, norm.clip)
                obs = obs.astype(np.float32)
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, term, trunc, _ = env_.step(action)
            total += float(reward)
            done = term or trunc
        want.append(total)
    got = evaluate(policy, ckpt.env_spec, episodes=2, seed=0, n_envs=2)
    assert got.returns.tolist() == want


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4-weight-only"])
def test_workers_give_every_episode_the_serial_runs_numbers(tiny_run, precision: str) -> None:
    """Episodes split over worker processes: the same return and length per episode as one
    process playing them all, whatever the split, and every episode reported once."""
    from quarl.api import quantize as quantize_label

    ckpt = load_checkpoint(tiny_run)
    policy = ckpt.policy if precision == "fp32" else quantize_label(ckpt.policy, precision, ckpt.env_spec)
    serial = evaluate(policy, ckpt.env_spec, episodes=13, seed=3)
    seen: list[tuple[int, float]] = []
    split = parallel.evaluate(policy, ckpt.env_spec, episodes=13, seed=3, workers=2,
                              on_episode=lambda ep, r: seen.append((ep, r)))
    assert np.array_equal(serial.returns, split.returns) and np.array_equal(serial.lengths, split.lengths)
    assert split.endings == serial.endings and len(set(serial.endings)) == 13  # CartPole's resets differ
    assert sorted(seen) == [(i, float(r)) for i, r in enumerate(serial.returns)]
    if precision == "fp32":  # another split: three workers, two envs each
        three = parallel.evaluate(policy, ckpt.env_spec, episodes=13, seed=3, workers=3, n_envs=2)
        assert np.array_equal(serial.returns, three.returns)


def test_a_worker_reports_each_episode_as_it_ends(tiny_run, tmp_path, monkeypatch) -> None:
    """The progress bar moves per episode while a chunk of 32 plays, not once per chunk:
    the worker's loop puts (evaluation, episode, return) on its queue at each episode's end."""
    import pickle

    ckpt = load_checkpoint(tiny_run)
    policy_file = tmp_path / "policy.pkl"
    policy_file.write_bytes(pickle.dumps(ckpt.policy))
    messages: list[tuple[int, int, float]] = []

    class Queue:
        def put(self, item: tuple[int, int, float]) -> None:
            messages.append(item)

    monkeypatch.setattr(parallel, "_finished", Queue())
    start, returns, _, _ = parallel._play_chunk(str(policy_file), "test", ckpt.env_spec, 3, 5, 4, 32, None, 7)
    assert start == 5 and sorted(messages) == [(7, 5 + i, float(r)) for i, r in enumerate(returns)]


def test_the_chunks_cover_every_episode_once() -> None:
    from quarl.evaluation.parallel import chunks

    for episodes in (1, 2, 7, 20, 101):
        for workers in (1, 2, 3, 16):
            for n_envs in (1, 8):
                pieces = chunks(episodes, workers, n_envs)
                covered = [s + i for s, n in pieces for i in range(n)]
                assert covered == list(range(episodes)) and max(n for _, n in pieces) - min(n for _, n in pieces) <= 1
                assert len(pieces) % workers == 0 or len(pieces) == episodes  # every worker gets as many pieces
    assert chunks(20, 2, 8) == [(0, 10), (10, 10)]  # 8 side by side, then 2: not 8 pieces of 2 or 3
    assert sorted({n for _, n in chunks(100, 2, 8)}) == [8, 9] and len(chunks(100, 2, 8)) == 12


def test_a_script_without_a_main_guard_runs_once_with_workers(tmp_path, tiny_run) -> None:
    """Workers start without importing the caller's __main__: a script with no
    `if __name__ == "__main__"` guard is not run again in each worker."""
    import os
    import subprocess
    import sys

    script = tmp_path / "evaluate_it.py"
    script.write_text("import quarl\n"
                      "from quarl.evaluation.parallel import evaluate\n"
                      f"agent = quarl.load({str(tiny_run)!r})\n"
                      "print('ran', evaluate(agent.policy, agent.env_spec, episodes=4, workers=2).returns.tolist())\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("ran") == 1


def test_workers_on_mujoco_keep_their_envs_and_every_episodes_numbers() -> None:
    """A worker reuses its envs from chunk to chunk (a MuJoCo env takes longer to make than
    a short episode to play): each episode still starts from its own seeded reset."""
    import quarl

    agent = quarl.load(zoo_run("ppo", "HalfCheetah-v3"))
    serial = evaluate(agent.policy, agent.env_spec, episodes=9, seed=0, max_steps=60)
    split = parallel.evaluate(agent.policy, agent.env_spec, episodes=9, seed=0, max_steps=60, workers=2, n_envs=3)
    assert np.array_equal(serial.returns, split.returns) and np.array_equal(serial.lengths, split.lengths)


def test_a_killed_worker_is_one_line_and_the_next_evaluation_starts_fresh(tiny_run) -> None:
    import os
    import signal

    from quarl.core.errors import QuarlError

    ckpt = load_checkpoint(tiny_run)
    parallel.evaluate(ckpt.policy, ckpt.env_spec, episodes=4, workers=2)  # workers up
    executor = parallel._executor(2)
    for pid in list(executor._processes):
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(QuarlError, match="an evaluation worker died"):
        parallel.evaluate(ckpt.policy, ckpt.env_spec, episodes=6, workers=2)
    again = parallel.evaluate(ckpt.policy, ckpt.env_spec, episodes=6, workers=2)
    assert np.array_equal(again.returns, evaluate(ckpt.policy, ckpt.env_spec, episodes=6).returns)


def test_importing_quarl_on_a_headless_machine_renders_mujoco_off_screen() -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    code = "import os, quarl; print(os.environ.get('MUJOCO_GL'))"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "egl"
    env["MUJOCO_GL"] = "osmesa"  # a user's own choice stays
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == \
        "osmesa"
