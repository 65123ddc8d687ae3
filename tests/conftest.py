"""Shared fixtures: the RL Zoo agents in ../shared (skipped when absent) and a tiny PPO
CartPole policy trained once per session."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
ZOO = Path(os.environ.get("QUARL_ZOO", ROOT.parent / "shared" / "zoo"))


def zoo_run(algo: str, env: str) -> Path:
    path = ZOO / algo / f"{env}_1"
    if not path.exists():
        pytest.skip(f"RL Zoo agent {algo}/{env}_1 not found under {ZOO} (../shared is absent)")
    return path


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A PPO CartPole policy trained for a few seconds, saved as a zoo run folder."""
    from quarl.training.sb3_train import TrainConfig, train

    out = tmp_path_factory.mktemp("trained")
    config = TrainConfig("ppo", "CartPole-v1", timesteps=4096, out=out, eval_freq=0, tensorboard=False)
    return train(config).run_dir


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """``quarl ARGS`` in this process (typer's CliRunner): the same app, exit code and
    stdout / stderr as the console script, without a new interpreter importing torch.
    Tests of the console script itself (signals, kills, entry point) use a subprocess."""
    from typer.testing import CliRunner

    from quarl.cli import app

    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)
