"""Shared fixtures: the RL Zoo agents in ../shared (skipped when absent) and a tiny PPO
CartPole policy trained once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
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


_BUILT: dict[str, object] = {}
"""The click command typer made of quarl's app for the test (and phase) now running."""


@contextmanager
def one_command_per_test() -> Iterator[None]:
    """Within it, typer's CliRunner runs the click command it made of quarl's app earlier in
    the same test instead of making it again (typer makes it on every ``invoke``: 0.1 s a
    call, most of a refused command's time). Each test gets its own, made afresh, as the
    console script makes one per process: a registry another test filled never reaches
    it, and one that showed a help (which fills the registries' lists into the command's
    options) is dropped."""
    import typer.main
    import typer.testing

    from quarl.cli import app

    test = os.environ.get("PYTEST_CURRENT_TEST", "")  # node id and phase: a fixture's set-up makes its own

    def built(typer_app: typer.Typer) -> object:
        if typer_app is not app:
            return typer.main.get_command(typer_app)
        if _BUILT.get("test") != test or "command" not in _BUILT:
            _BUILT.clear()
            _BUILT.update(test=test, command=typer.main.get_command(app))
        return _BUILT["command"]

    real = typer.testing._get_command
    typer.testing._get_command = built
    try:
        yield
    finally:
        typer.testing._get_command = real


def forget_a_command_that_showed_help(result: object) -> None:
    """A help shown fills the registries' lists into the command's options: the next
    invocation gets a command made afresh (:func:`one_command_per_test`)."""
    if "Usage:" in str(getattr(result, "output", "")):
        _BUILT.pop("command", None)


def run_cli(*args: str) -> CliResult:
    """``quarl ARGS`` in this process (typer's CliRunner): the same app, exit code and
    stdout / stderr as the console script, without a new interpreter importing torch.
    Tests of the console script itself (signals, kills, entry point) use a subprocess.
    The click command is made once per test (:func:`one_command_per_test`)."""
    from typer.testing import CliRunner

    from quarl.cli import app

    with one_command_per_test():
        result = CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))
    forget_a_command_that_showed_help(result)
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
