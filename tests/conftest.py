"""Shared fixtures: the RL Zoo agents in ../shared (skipped when absent) and a tiny PPO
CartPole policy trained once per session."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ["QUARL_CACHE"] = "off"  # every test chooses int modes afresh (tests of the cache turn it on)
os.environ["QUARL_DECIDE_EPISODES"] = "0"  # verdicts on the episodes asked for; tests of deciding ask for it
os.environ["QUARL_WORKERS"] = "1"  # evaluation in the test process (monkeypatches apply); tests of workers ask for them
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
ZOO = Path(os.environ.get("QUARL_ZOO", ROOT.parent / "shared" / "zoo"))


def skip_where_the_cpu_cannot_run(label: str) -> None:
    """Skip a test of the int mode ``label`` (any other precision: nothing) where the mode's
    own ``cpu_unsupported`` says this CPU, as ``QUARL_CPU_KIND`` has quarl answer, cannot run
    it exactly: quarl runs its fallback there (or refuses it), never the mode itself."""
    from quarl.quant.modes import MODES

    mode = MODES.get(label)
    reason = mode.cpu_unsupported() if mode is not None else None
    if reason is not None:
        pytest.skip(reason)


def zoo_run(algo: str, env: str) -> Path:
    path = ZOO / algo / f"{env}_1"
    if not path.exists():
        pytest.skip(f"RL Zoo agent {algo}/{env}_1 not found under {ZOO} (../shared is absent)")
    return path


@pytest.fixture(autouse=True)
def _fresh_caches(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test starts with no cache another test (or another run) filled: the int-mode
    choice cache off (a test of the cache points ``QUARL_CACHE`` at a folder of its own) and
    a Hub cache of its own, whatever an earlier test left in ``os.environ``. A choice stored
    by an earlier test once made a test's first ptq call calibrate differently from its
    later ones (``[(10000, 8), (10100, 4)] == [(10000, 8)]``)."""
    monkeypatch.setenv("QUARL_CACHE", "off")
    monkeypatch.setenv("QUARL_HUB_CACHE", str(tmp_path_factory.mktemp("hub-cache")))


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


def actorq_summary(**fields: object) -> dict:
    """A complete ActorQ summary.json (neutral values) with ``fields`` set, for tests of
    what reads stored runs (compare, the scaling model)."""
    base: dict = {
        "config": {}, "machine": {"cores": 2}, "target_reward": None, "reached": False, "time_to_reward_s": None,
        "elapsed_s": 1.0, "final_running_mean": None, "evals": [], "env_steps": 0, "learner_steps": 0,
        "env_steps_per_s": 0.0, "learner_steps_per_s": 0.0, "actor_env_steps_per_s": {}, "actor_ms_per_step": {},
        "actor_time_share": {}, "actor_busy_ms_per_step": 0.0, "actor_wall_ms_per_step": 0.0,
        "evaluator_busy_s": 0.0, "coordinator_ms_per_step": 0.0, "learner_ms_per_step": 0.0,
        "env_steps_at_target": None, "learner_time_share": {}, "learner_busy_s": 0.0, "weight_versions": 0,
        "pulls": 0, "loads": 0, "restarts": 0, "actor_nodes": {}, "episodes": 0, "broadcast": {},
        "energy": {"available": False},
    }
    return {**base, **fields}
