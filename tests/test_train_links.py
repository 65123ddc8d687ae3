"""``quarl train --out OUT`` never writes through a symbolic link it finds inside OUT."""

from __future__ import annotations

from pathlib import Path

import pytest

from quarl.core.errors import QuarlError
from quarl.training.sb3_train import TrainConfig, train


def test_a_linked_algo_folder_is_refused_before_training(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "runs"
    out.mkdir()
    (out / "dqn").symlink_to(elsewhere)
    with pytest.raises(QuarlError, match=r"runs/dqn is a symbolic link \(to .*elsewhere\)"):
        train(TrainConfig("dqn", "CartPole-v1", timesteps=100, out=out, eval_freq=0, tensorboard=False))
    assert list(elsewhere.iterdir()) == []  # nothing written there


def test_a_linked_env_config_folder_is_refused(tmp_path: Path) -> None:
    """A run folder whose ENV sub-folder is a link (planted before the run ends) is refused
    when the run's files are written, and nothing lands through it."""
    out = tmp_path / "runs"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = out / "dqn" / "CartPole-v1_1"
    run.mkdir(parents=True)
    (run / "CartPole-v1").symlink_to(elsewhere)
    with pytest.raises(QuarlError, match=r"CartPole-v1 is a symbolic link"):
        train(TrainConfig("dqn", "CartPole-v1", timesteps=64, out=out, eval_freq=0, tensorboard=False,
                          hyperparams={"learning_starts": 0}, run_dir=run))
    assert list(elsewhere.iterdir()) == []
