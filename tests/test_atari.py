"""Atari evaluation scores whole games as the RL Zoo's player does (FIRE at each new life,
the game's raw score from inside the wrappers), on a real ALE env and a trained agent."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from quarl.checkpoints import load_checkpoint
from quarl.envs import game_score, make_env
from quarl.evaluation.episodes import evaluate

ENV = "BreakoutNoFrameskip-v4"


@pytest.fixture(scope="module")
def breakout_run(tmp_path_factory) -> Path:
    """An A2C Breakout agent trained briefly with the RL Zoo's Atari hyperparameters, as a zoo folder."""
    from quarl.training.sb3_train import TrainConfig, train

    out = tmp_path_factory.mktemp("atari")
    return train(TrainConfig("a2c", ENV, timesteps=320, out=out, eval_freq=0, tensorboard=False)).run_dir


def _zoo_player(run: Path, seed: int, capsys, monkeypatch) -> tuple[float, int]:
    """The first game's score and length (emulator frames) as ``rl_zoo3.enjoy --deterministic`` prints them."""
    from rl_zoo3.enjoy import enjoy

    monkeypatch.setattr(sys, "argv", ["enjoy", "--algo", "a2c", "--env", ENV, "-f", str(run.parent.parent),
                                      "--exp-id", "1", "-n", "400", "--no-render", "--deterministic",
                                      "--seed", str(seed)])
    capsys.readouterr()
    enjoy()
    out = capsys.readouterr().out
    scores = re.findall(r"Atari Episode Score: (\S+)", out)
    lengths = re.findall(r"Atari Episode Length (\d+)", out)
    assert scores, out[-2000:]
    return float(scores[0]), int(lengths[0])


def _game(policy, spec, seed: int) -> tuple[float, int, int]:
    """(score, emulator frames, lives played) of one game, reset between lives as the zoo's player does."""
    env = make_env(spec)
    game = game_score(env)
    obs, _ = env.reset(seed=seed)
    lives = 1
    while True:
        obs, _, terminated, truncated, _ = env.step(policy.postprocess(policy.forward(policy.preprocess(obs[None])))[0])
        if terminated or truncated:
            if game.over:
                return game.score, game.length, lives
            obs, _ = env.reset()
            lives += 1


def test_fp32_scores_equal_the_rl_zoo_player_on_the_same_seeds(breakout_run: Path, capsys, monkeypatch) -> None:
    agent = load_checkpoint(breakout_run)
    result = evaluate(agent.policy, agent.env_spec, episodes=2, seed=0)
    for seed in (0, 1):
        zoo_score, zoo_frames = _zoo_player(breakout_run, seed, capsys, monkeypatch)
        score, frames, lives = _game(agent.policy, agent.env_spec, seed)
        assert lives == 5  # every life played: FIRE started each one
        assert (score, frames) == (zoo_score, zoo_frames)  # the same game, frame for frame
        assert result.returns[seed] == zoo_score
    # an agent episode is a game of 5 lives, not a wait for the step cap
    assert np.all(result.lengths < 1000)


def test_a_game_cut_short_still_starts_the_next_episode_on_its_own_seed(breakout_run: Path) -> None:
    """SB3's EpisodicLifeEnv continues an unfinished game on reset (ignoring the seed); a
    game cut by ``max_steps`` must not leak into the next episode."""
    agent = load_checkpoint(breakout_run)
    whole = evaluate(agent.policy, agent.env_spec, episodes=1, seed=1, n_envs=1)
    cut = int(whole.lengths[0]) - 5  # every episode is cut a few steps before its last life ends
    assert list(evaluate(agent.policy, agent.env_spec, episodes=3, seed=0, n_envs=1,
                         max_steps=cut).lengths) == [cut] * 3
    env = make_env(agent.env_spec)  # envs handed in (ActorQ's evaluator) after a cut game
    evaluate(agent.policy, agent.env_spec, episodes=1, seed=0, max_steps=cut, envs=[env])
    again = evaluate(agent.policy, agent.env_spec, episodes=1, seed=1, envs=[env])
    assert list(again.lengths) == list(whole.lengths) and list(again.returns) == list(whole.returns)


def test_clipped_rewards_and_lost_lives_stay_inside_the_game_score() -> None:
    """Raw Breakout rewards (1, 4, 7 per brick) reach the score; the agent sees them clipped."""
    from quarl.envs import EnvSpec

    env = make_env(EnvSpec(ENV, wrappers=("atari",), frame_stack=4))
    game = game_score(env)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    seen, lives_ended = 0.0, 0
    while not game.over:
        _, r, terminated, truncated, _ = env.step(int(rng.integers(4)))
        assert r in (0.0, 1.0)
        seen += r
        if (terminated or truncated) and not game.over:
            lives_ended += 1
            env.reset()
    assert lives_ended == 4 and game.score >= seen


@pytest.mark.slow  # over 10 s: run with -m slow
def test_sampled_scores_match_rl_zoo_enjoy_stochastic_in_distribution(breakout_run: Path, capsys,
                                                                       monkeypatch) -> None:
    """Sampling parity on Atari: the game scores of ``rl_zoo3.enjoy --stochastic`` (its one
    env, games one after another) and quarl's sampled evaluation (a seed per game, common
    random numbers) agree in mean within 4 standard errors; sampled games are distinct."""
    from rl_zoo3.enjoy import enjoy

    from quarl.evaluation.episodes import acting

    monkeypatch.setattr(sys, "argv", ["enjoy", "--algo", "a2c", "--env", ENV, "-f", str(breakout_run.parent.parent),
                                      "--exp-id", "1", "-n", "3000", "--no-render", "--stochastic", "--seed", "7"])
    capsys.readouterr()
    enjoy()
    theirs = np.array([float(s) for s in re.findall(r"Atari Episode Score: (\S+)", capsys.readouterr().out)])
    assert len(theirs) >= 6, theirs
    agent = load_checkpoint(breakout_run)
    sampled = acting(agent.policy, agent.env_spec)  # the RL Zoo's default for Atari: sampling
    assert sampled.stochastic
    result = evaluate(sampled, agent.env_spec, episodes=30, seed=0, n_envs=8)
    ours = result.returns
    se = np.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se + 0.5, (ours, theirs)
    # distinct games, not replays of a few
    assert len({(r, n) for r, n in zip(ours, result.lengths, strict=True)}) >= 15
