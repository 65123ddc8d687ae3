"""Every ``env_wrapper`` kind the RL Zoo's hyperparameter files name is built through the
allow-list (or refused in one line with the reason), each checked on a real env for the
effect it is meant to have."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, make_env
from quarl.envs import wrappers as env_wrappers
from quarl.policies.safe_load import load_zoo_yaml


def _zoo_wrapper_entries() -> list[object]:
    import rl_zoo3

    entries = []
    for path in sorted((Path(rl_zoo3.__file__).parent / "hyperparams").glob("*.yml")):
        for config in (load_zoo_yaml(path) or {}).values():
            if isinstance(config, dict) and config.get("env_wrapper") is not None:
                entry = config["env_wrapper"]
                entries.extend(entry if isinstance(entry, list) else [entry])
    return entries


def test_every_wrapper_in_the_zoo_hyperparams_is_allowed_or_refused_with_its_reason() -> None:
    entries = _zoo_wrapper_entries()
    paths = {next(iter(e)) if isinstance(e, dict) else e for e in entries}
    assert len(paths) >= 8, paths  # the zoo's configs name this many kinds today
    built = set()
    for entry in entries:
        path = next(iter(entry)) if isinstance(entry, dict) else entry
        if path == "ae.wrapper.AutoencoderWrapper":
            with pytest.raises(QuarlError, match="needs a trained autoencoder"):
                env_wrappers.from_zoo([entry])
            continue
        (wrapper,) = env_wrappers.from_zoo([entry])
        built.add(env_wrappers.name_and_kwargs(wrapper)[0])
    assert {"atari", "time_feature", "frame_skip", "history", "history_obs_dict", "time_limit",
            "resize_observation", "grayscale", "minigrid_flat_obs"} <= built


def _rollout(env: gym.Env, steps: int, seed: int = 0) -> tuple[list, list[float], int]:
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    observations, rewards, length = [obs], [], 0
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        observations.append(obs)
        rewards.append(float(reward))
        length += 1
        if terminated or truncated:
            break
    return observations, rewards, length


def _zoo(path: str, **kwargs) -> EnvSpec:
    return env_wrappers.from_zoo([{path: kwargs} if kwargs else path])


def test_time_feature_adds_the_remaining_time() -> None:
    env = make_env(EnvSpec("Pendulum-v1", wrappers=_zoo("sb3_contrib.common.wrappers.TimeFeatureWrapper",
                                                        max_steps=200)))
    obs, _, _ = _rollout(env, 10)
    assert obs[0].shape == (4,) and obs[0][-1] == pytest.approx(1.0) and obs[10][-1] == pytest.approx(1 - 10 / 200)


def test_atari_arguments_reach_the_wrapper_and_evaluation_builds_it_as_training_did() -> None:
    wrappers = _zoo("stable_baselines3.common.atari_wrappers.AtariWrapper", screen_size=64, terminal_on_life_loss=True,
                    clip_reward=True)
    env = make_env(EnvSpec("BreakoutNoFrameskip-v4", wrappers=wrappers))
    assert env.observation_space.shape == (64, 64, 1)
    # evaluation: the zoo's settings (lives end the agent's episodes), whole games scored inside
    assert {"EpisodicLifeEnv", "ClipRewardEnv", "FireResetEnv", "GameScore"} <= _layers(env)
    trained = make_env(EnvSpec("BreakoutNoFrameskip-v4", wrappers=wrappers), training=True)
    assert {"EpisodicLifeEnv", "ClipRewardEnv"} <= _layers(trained) and "GameScore" not in _layers(trained)


def _layers(env: gym.Env) -> set[str]:
    names = set()
    while hasattr(env, "env"):
        names.add(type(env).__name__)
        env = env.env
    return names


def test_frame_skip_repeats_each_action() -> None:
    env = make_env(EnvSpec("CartPole-v1", wrappers=_zoo("rl_zoo3.wrappers.FrameSkip", skip=2)))
    _, rewards, _ = _rollout(env, 3)
    assert rewards[:3] == [2.0, 2.0, 2.0]  # two CartPole steps (reward 1 each) per call


def test_history_stacks_observations_and_actions() -> None:
    env = make_env(EnvSpec("Pendulum-v1", wrappers=_zoo("rl_zoo3.wrappers.HistoryWrapper", horizon=3)))
    obs, _, _ = _rollout(env, 2)
    assert obs[0].shape == (3 * 3 + 1 * 3,)


class _GoalEnv(gym.Env):
    """A tiny dict-observation env, as the robotics envs the zoo's HER configs use."""

    observation_space = gym.spaces.Dict({"observation": gym.spaces.Box(-1, 1, (2,), np.float32),
                                         "desired_goal": gym.spaces.Box(-1, 1, (2,), np.float32),
                                         "achieved_goal": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return {k: np.zeros(2, np.float32) for k in self.observation_space.spaces}, {}

    def step(self, action):
        return {k: np.ones(2, np.float32) for k in self.observation_space.spaces}, 0.0, False, False, {}


def test_history_obs_dict_stacks_the_observation_entry() -> None:
    (wrapper,) = _zoo("rl_zoo3.wrappers.HistoryWrapperObsDict", horizon=2)
    env = env_wrappers.apply(_GoalEnv(), (wrapper,))
    obs, _ = env.reset(seed=0)
    assert obs["observation"].shape == (2 * 2 + 1 * 2,)


def test_time_limit_ends_episodes() -> None:
    env = make_env(EnvSpec("Pendulum-v1", wrappers=_zoo("gymnasium.wrappers.time_limit.TimeLimit",
                                                        max_episode_steps=7)))
    assert _rollout(env, 50)[2] == 7


def test_resize_observation() -> None:
    env = make_env(EnvSpec("CarRacing-v3", wrappers=_zoo("rl_zoo3.wrappers.YAMLCompatResizeObservation",
                                                         shape=[48, 40])))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (48, 40, 3)


def test_resize_then_grayscale_as_the_zoo_car_racing_config() -> None:
    wrappers = _zoo("rl_zoo3.wrappers.YAMLCompatResizeObservation", shape=[64, 64]) + _zoo(
        "gymnasium.wrappers.transform_observation.GrayscaleObservation", keep_dim=True)
    obs, _ = make_env(EnvSpec("CarRacing-v3", wrappers=wrappers)).reset(seed=0)
    assert obs.shape == (64, 64, 1)


def test_delayed_reward_pays_every_delay_steps() -> None:
    plain = _rollout(make_env(EnvSpec("Pendulum-v1")), 10)[1]
    delayed = _rollout(make_env(EnvSpec("Pendulum-v1", wrappers=_zoo("rl_zoo3.wrappers.DelayedRewardWrapper",
                                                                     delay=5))), 10)[1]
    assert delayed[0] == 0.0 and delayed[4] == pytest.approx(sum(plain[:5]), rel=1e-6)


def test_mask_velocity_zeroes_velocities() -> None:
    obs, _, _ = _rollout(make_env(EnvSpec("CartPole-v1", wrappers=_zoo("rl_zoo3.wrappers.MaskVelocityWrapper"))), 5)
    assert all(o[1] == 0 and o[3] == 0 for o in obs) and any(o[0] != 0 for o in obs)


def test_truncated_on_success_adds_the_reward_offset() -> None:
    plain = _rollout(make_env(EnvSpec("Pendulum-v1")), 5)[1]
    offset = _rollout(make_env(EnvSpec("Pendulum-v1", wrappers=_zoo("rl_zoo3.wrappers.TruncatedOnSuccessWrapper",
                                                                    reward_offset=1.0))), 5)[1]
    np.testing.assert_allclose(offset, np.array(plain) + 1.0, rtol=1e-6)


@pytest.mark.parametrize("path,kwargs", [("rl_zoo3.wrappers.ActionNoiseWrapper", {"noise_std": 0.0}),
                                         ("rl_zoo3.wrappers.ActionSmoothingWrapper", {"smoothing_coef": 0.0})])
def test_action_wrappers_at_zero_strength_leave_the_env_alone(path: str, kwargs: dict) -> None:
    plain = _rollout(make_env(EnvSpec("Pendulum-v1")), 20)[1]
    wrapped = _rollout(make_env(EnvSpec("Pendulum-v1", wrappers=_zoo(path, **kwargs))), 20)[1]
    np.testing.assert_allclose(wrapped, plain, rtol=1e-6)


def test_minigrid_without_its_package_is_one_line() -> None:
    try:
        import minigrid  # noqa: F401
    except ImportError:
        with pytest.raises(QuarlError, match="needs the minigrid package"):
            env_wrappers.apply(gym.make("CartPole-v1"), _zoo("minigrid.wrappers.FlatObsWrapper"))
    else:
        pytest.skip("minigrid is installed here")


@pytest.mark.parametrize("entry,message", [
    ("os.system", "is not supported: allowed"),
    ({"rl_zoo3.wrappers.FrameSkip": {"skip": 2, "evil": 1}}, "does not take 'evil': allowed skip"),
    ({"rl_zoo3.wrappers.FrameSkip": 3}, "must be a mapping"),
    ("ae.wrapper.AutoencoderWrapper", "needs a trained autoencoder"),
])
def test_refused_entries_are_one_line(entry: object, message: str) -> None:
    with pytest.raises(QuarlError, match=message):
        env_wrappers.from_zoo([entry])


def test_spec_with_arguments_survives_json() -> None:
    spec = EnvSpec("Pendulum-v1", wrappers=_zoo("rl_zoo3.wrappers.HistoryWrapper", horizon=2) +
                   _zoo("sb3_contrib.common.wrappers.TimeFeatureWrapper"))
    back = EnvSpec(**json.loads(json.dumps(dataclasses.asdict(spec))))
    assert back == spec
    assert spec.wrappers == (("history", (("horizon", 2),)), "time_feature")


def test_sticky_actions_make_a_deterministic_agents_seeds_different_games() -> None:
    """MinAtar Breakout with an untrained deterministic CNN: without sticky actions its 16
    seeds replay 2 games; at p = 0.25 (Machado et al.) they are 5 distinct games. The
    probability is an env kwarg (so part of every result's key); envs without one refuse it."""
    import gymnasium as gym
    import numpy as np
    import pytest
    import torch
    from torch import nn

    from quarl.core.errors import QuarlError
    from quarl.envs import EnvSpec, with_sticky_actions
    from quarl.evaluation.episodes import evaluate
    from quarl.policies.base import Policy

    torch.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 3))
    with torch.no_grad():  # large weights: actions that change with the frames (sticky actions repeat a change)
        for p in net.parameters():
            p.mul_(20)
    policy = Policy(net, gym.spaces.Box(0.0, 1.0, (4, 10, 10), np.float32), gym.spaces.Discrete(3), "argmax")
    plain = with_sticky_actions(EnvSpec("MinAtar/Breakout-v1"), 0.0)
    sticky = with_sticky_actions(EnvSpec("MinAtar/Breakout-v1"), 0.25)
    assert sticky.env_kwargs == {"sticky_action_prob": 0.25}
    games = {p: len(set(evaluate(policy, spec, episodes=16, n_envs=8).endings)) for p, spec in ((0.0, plain),
                                                                                                 (0.25, sticky))}
    assert games[0.25] > games[0.0], games
    with pytest.raises(QuarlError, match="for Atari and MinAtar envs; CartPole-v1"):
        with_sticky_actions(EnvSpec("CartPole-v1"), 0.25)
    with pytest.raises(QuarlError, match=r"must be a probability in \[0, 1\)"):
        with_sticky_actions(EnvSpec("MinAtar/Breakout-v1"), 1.5)
