"""docs/api.md's example, run as a reader would: an SB3 model loaded from its zip without an
env (SB3 keeps no env id there), then ``quarl.load`` / ``quantize`` / ``evaluate`` on it.
Issue 49: the page called ``quarl.load(model)`` on such a model, which raised, while its
comment said the env id comes with the model."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from conftest import ROOT, zoo_run

PAGE = ROOT / "docs" / "api.md"
MARKER = "<!-- made-by: tests/test_api_docs.py::test_the_api_page_example_runs_as_shown -->"


def _zoo_cartpole_as_sb3_zip(path: Path) -> None:
    """The RL Zoo's PPO CartPole agent saved as today's SB3 writes a model (its weights in a
    fresh ``PPO``: the zoo's zip pickles classes of the old ``gym``), so SB3 loads it as a
    user's ``ppo-CartPole-v1.zip``."""
    import gymnasium as gym
    import stable_baselines3 as sb3

    from quarl.core.limits import load_torch, open_zip, torch_file_cap

    run = zoo_run("ppo", "CartPole-v1")
    with open_zip(run / "CartPole-v1.zip", "an SB3 checkpoint") as archive:
        weights = load_torch(archive.read("policy.pth"), torch_file_cap(), "a policy")
    model = sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), device="cpu", seed=0)
    model.policy.load_state_dict(weights)
    model.save(path)


def _blocks() -> tuple[str, str]:
    """The page's python block and the output block after its marker."""
    text = PAGE.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    shown = re.search(re.escape(MARKER) + r"\s*```\n(.*?)```", text, re.S)
    assert code and shown, "docs/api.md lost its example or its output block"
    return code.group(1), shown.group(1)


def test_the_api_page_example_runs_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block runs in a folder holding ppo-CartPole-v1.zip and prints what the page shows
    (the zoo agent returns 500 on every seed, at int8 too)."""
    _zoo_cartpole_as_sb3_zip(tmp_path / "ppo-CartPole-v1.zip")
    code, shown = _blocks()
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__doc__"})
    assert printed.getvalue() == shown


def test_what_the_page_says_of_a_model_with_and_without_its_env(tmp_path: Path) -> None:
    """A model loaded without its env is refused in one line naming its spaces and ``env=``; one
    that holds its env gives quarl.load its env id; an EnvSpec names the env of one without."""
    import gymnasium as gym
    import stable_baselines3 as sb3

    import quarl
    from quarl.core.errors import QuarlError
    from quarl.envs import EnvSpec

    _zoo_cartpole_as_sb3_zip(tmp_path / "ppo-CartPole-v1.zip")
    bare = sb3.PPO.load(tmp_path / "ppo-CartPole-v1.zip", device="cpu")
    with pytest.raises(QuarlError) as refused:
        quarl.load(bare)
    assert str(refused.value) == (
        "this PPO model holds no env (SB3 keeps none in its zip; it knows only its spaces, observations Box(4,), "
        "actions Discrete(2)): name its env, a gymnasium id (quarl.load(model, env=\"ENV_ID\"), quarl.evaluate(model, "
        "\"ENV_ID\")), or load the model with its env (PPO.load(path, env=...))")
    held = sb3.PPO.load(tmp_path / "ppo-CartPole-v1.zip", env=gym.make("CartPole-v1"), device="cpu")
    assert quarl.load(held).env_spec.env_id == "CartPole-v1"
    assert quarl.evaluate(bare, EnvSpec("CartPole-v1"), episodes=3).returns.tolist() == [500.0] * 3
