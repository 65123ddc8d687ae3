"""``--gym-packages`` as rl_zoo3 has it (modules found in the current folder, imported in every
evaluation worker), and the stricter rule for modules a file names: a run folder's
``args.yml`` gym_packages are imported only when the user names them or passes
``--trust-gym-packages``; a ``__main__`` module or a name that is not a dotted identifier
never. Each case runs the console command as a user types it, from the folder that holds
the package, as a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import forked_cli

PACKAGE = '''
from pathlib import Path

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

Path("imported.txt").write_text("mygym was imported")  # the test sees whether the module ran
gym.register("QuarlShortCartPole-v0", entry_point=CartPoleEnv, max_episode_steps=5)
'''
"""A package that registers CartPole cut at 5 steps (CartPole cannot fall in 5 steps, so
every episode there returns exactly 5) and leaves a mark in the folder it runs in."""


def quarl(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m quarl.cli ARGS`` in ``cwd`` as a process of its own (forked from a server that
    imported quarl's dependencies once, :mod:`tests.forked_cli`: mygym is imported afresh)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the current folder can supply mygym
    env.update(COLUMNS="200", OMP_NUM_THREADS="1")
    return forked_cli.run(cwd, *args, env=env)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: the package ``mygym/``, a policy for its env, and an RL Zoo run folder
    whose args.yml names the package (as ``rl_zoo3.train --gym-packages mygym`` writes it)."""
    import gymnasium as gym
    import stable_baselines3 as sb3

    path = tmp_path_factory.mktemp("user")
    (path / "mygym").mkdir()
    (path / "mygym" / "__init__.py").write_text(PACKAGE)
    model = sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=32, batch_size=32, seed=0, device="cpu")
    model.save(path / "short.zip")  # the same spaces as the package's env
    config = path / "logs" / "ppo" / "QuarlShortCartPole-v0_1" / "QuarlShortCartPole-v0"
    config.mkdir(parents=True)
    (config.parent / "QuarlShortCartPole-v0.zip").hardlink_to(path / "short.zip")
    (config / "config.yml").write_text(yaml.safe_dump({"policy": "MlpPolicy"}))
    (config / "args.yml").write_text(yaml.safe_dump({"env": "QuarlShortCartPole-v0", "gym_packages": ["mygym"]}))
    return path


def returns(out: Path) -> dict[str, list[float]]:
    return {rec["precision"]: rec["returns"]
            for rec in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_gym_packages_imports_from_the_current_folder_and_in_every_worker(folder: Path) -> None:
    """Issue 41: ``--gym-packages mygym`` from the folder holding mygym/ (no PYTHONPATH), with
    two evaluation workers that must know the env the package registers."""
    r = quarl(folder, "ptq", "short.zip", "--env", "QuarlShortCartPole-v0", "--gym-packages", "mygym",
              "--precisions", "fp16", "--episodes", "4", "--workers", "2", "--out", "out-workers")
    assert r.returncode == 0, r.stdout + r.stderr
    played = returns(folder / "out-workers")
    assert sorted(played) == ["fp16", "fp32"] and all(len(r) >= 4 and set(r) == {5.0} for r in played.values())
    r = quarl(folder, "ptq", "short.zip", "--env", "QuarlShortCartPole-v0", "--precisions", "fp16", "--episodes", "2")
    assert r.returncode == 2 and "unknown env id 'QuarlShortCartPole-v0'" in r.stderr, r.stderr


def test_a_run_folder_names_modules_that_are_imported_only_when_the_user_allows_it(folder: Path) -> None:
    (folder / "imported.txt").unlink(missing_ok=True)
    run = "logs/ppo/QuarlShortCartPole-v0_1"
    r = quarl(folder, "play", run, "--episodes", "2")
    assert r.returncode == 2 and not (folder / "imported.txt").exists()  # nothing the file names ran
    assert r.stderr.strip().splitlines() == [
        "error: logs/ppo/QuarlShortCartPole-v0_1/QuarlShortCartPole-v0/args.yml gym_packages asks to import mygym "
        "(code, not imported unasked): pass --gym-packages mygym, which this run was trained with, or "
        "--trust-gym-packages if you trust it"], r.stderr
    for allow in (["--gym-packages", "mygym"], ["--trust-gym-packages"]):
        r = quarl(folder, "play", run, "--episodes", "2", *allow)
        assert r.returncode == 0 and "mean return 5.00 over 2 episodes" in r.stdout, r.stdout + r.stderr
        assert (folder / "imported.txt").exists()


@pytest.mark.parametrize("name, says", [
    ("venv.__main__", "'venv.__main__' is a program's __main__ module, never imported"),
    ("__main__", "'__main__' is a program's __main__ module, never imported"),
    ("../mygym", "'../mygym' is not a module name: allowed a dotted identifier"),
    ("mygym/__init__.py", "'mygym/__init__.py' is not a module name: allowed a dotted identifier"),
])
def test_a_main_module_or_a_path_is_never_imported_even_when_trusted(folder: Path, tmp_path: Path, name: str,
                                                                     says: str) -> None:
    """Issue 38: ``gym_packages: [venv.__main__]`` ran Python's venv tool (it wrote bin/, lib/
    and pyvenv.cfg into the folder); named by a file or by the user, it is refused."""
    run = tmp_path / "ppo" / "QuarlShortCartPole-v0_1"
    (run / "QuarlShortCartPole-v0").mkdir(parents=True)
    (run / "QuarlShortCartPole-v0.zip").hardlink_to(folder / "short.zip")
    (run / "QuarlShortCartPole-v0" / "config.yml").write_text(yaml.safe_dump({"policy": "MlpPolicy"}))
    (run / "QuarlShortCartPole-v0" / "args.yml").write_text(yaml.safe_dump({"env": "QuarlShortCartPole-v0",
                                                                            "gym_packages": [name]}))
    for args in (["play", str(run), "--episodes", "1", "--trust-gym-packages"],
                 ["play", "short.zip", "--env", "CartPole-v1", "--episodes", "1", "--gym-packages", name]):
        r = quarl(tmp_path if args[1] == str(run) else folder, *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ppo"]  # no bin/, lib/ or pyvenv.cfg


def test_a_module_the_file_names_that_is_not_installed_says_so_with_trust(folder: Path, tmp_path: Path) -> None:
    """``this`` printed the Zen of Python when a file named it; unasked it is refused, and a
    trusted name that does not exist is one line naming where modules are looked for."""
    run = tmp_path / "ppo" / "QuarlShortCartPole-v0_1"
    (run / "QuarlShortCartPole-v0").mkdir(parents=True)
    (run / "QuarlShortCartPole-v0.zip").hardlink_to(folder / "short.zip")
    (run / "QuarlShortCartPole-v0" / "config.yml").write_text(yaml.safe_dump({"policy": "MlpPolicy"}))
    args_file = run / "QuarlShortCartPole-v0" / "args.yml"
    args_file.write_text(yaml.safe_dump({"env": "QuarlShortCartPole-v0", "gym_packages": ["this"]}))
    r = quarl(tmp_path, "play", str(run), "--episodes", "1")
    assert r.returncode == 2 and "asks to import this" in r.stderr and "Zen of Python" not in r.stdout + r.stderr
    args_file.write_text(yaml.safe_dump({"env": "QuarlShortCartPole-v0", "gym_packages": ["no_such_envs"]}))
    r = quarl(tmp_path, "play", str(run), "--episodes", "1", "--trust-gym-packages")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "gym_packages 'no_such_envs' cannot be imported: ModuleNotFoundError" in r.stderr
    assert f"in the current folder, {tmp_path}" in r.stderr


CORRIDOR = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Five steps down a corridor, one reward each: every episode returns exactly 5."""

    observation_space = gym.spaces.Box(0.0, 5.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, self.t >= 5, False, {}


gym.register("Corridor-v0", entry_point=Corridor)
'''
"""A user's own env, in a module of the folder they work in (not installed)."""


def test_a_custom_env_trained_by_quarl_is_evaluated_again_with_the_option_its_run_names(tmp_path: Path) -> None:
    """Issue 49: ``quarl train ppo Corridor-v0 --gym-packages mygym`` wrote no gym_packages into
    args.yml, so ``quarl ptq`` of the run answered 'unknown env id' and never named the option.
    Now args.yml names the module as rl_zoo3 writes it, ptq without the option says which option
    to pass in one line (importing nothing), and with it the run folder is evaluated, workers too."""
    (tmp_path / "mygym").mkdir()
    (tmp_path / "mygym" / "__init__.py").write_text(CORRIDOR)
    r = quarl(tmp_path, "train", "ppo", "Corridor-v0", "--gym-packages", "mygym", "--timesteps", "128", "--hp",
              "n_steps=64", "--hp", "batch_size=32", "--eval-freq", "0", "--eval-episodes", "2")
    assert r.returncode == 0 and "mean return 5.00 +/- 0.00 over 2 episodes" in r.stdout, r.stdout + r.stderr
    run = tmp_path / "runs" / "ppo" / "Corridor-v0_1"
    args = yaml.safe_load((run / "Corridor-v0" / "args.yml").read_text())
    assert args["gym_packages"] == ["mygym"] and args["env"] == "Corridor-v0"

    r = quarl(tmp_path, "ptq", "runs/ppo/Corridor-v0_1", "--precisions", "fp16", "--episodes", "4")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: runs/ppo/Corridor-v0_1/Corridor-v0/args.yml gym_packages asks to import mygym (code, not imported "
        "unasked): pass --gym-packages mygym, which this run was trained with, or --trust-gym-packages if you trust "
        "it"], r.stderr
    assert not (tmp_path / "results").exists()

    r = quarl(tmp_path, "ptq", "runs/ppo/Corridor-v0_1", "--gym-packages", "mygym", "--precisions", "fp16",
              "--episodes", "4", "--workers", "2", "--decide-episodes", "0", "--out", "out")
    assert r.returncode == 0, r.stdout + r.stderr
    played = returns(tmp_path / "out")
    assert sorted(played) == ["fp16", "fp32"] and all(r == [5.0] * 4 for r in played.values()), played
