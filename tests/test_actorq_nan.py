"""Nothing non-finite saved as success in ActorQ (issue 38): a checkpoint whose replay holds
NaN rewards, whose learner holds a NaN tensor or tensors of other shapes is refused on
--resume in one line, the checkpoint and policy.pt untouched; a NaN met mid-run stops the run
with the last good checkpoint kept (as ``quarl train``'s guard does); an ActorQ run folder
whose policy.pt is NaN or of shapes that do not chain is one line, not a traceback."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from quarl.core.errors import QuarlError, StoppedRun
from tests.conftest import run_cli

RUN = ["actorq", "run", "CartPole-v1", "--local", "--actors", "1", "--policy-layers", "32,32", "--batch-size", "32",
       "--min-replay", "100", "--eval-episodes", "2", "--checkpoint-replay"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("actorq") / "run"
    r = run_cli(*RUN, "--max-env-steps", "400", "--out", str(out))
    assert r.returncode == 0 and (out / "checkpoint.pt").is_file(), r.stdout + r.stderr
    return out


def crafted(first_run: Path, tmp_path: Path, edit) -> Path:  # noqa: ANN001 - a function of the blob
    out = tmp_path / "run"
    shutil.copytree(first_run, out)
    blob = torch.load(out / "checkpoint.pt", weights_only=True)
    edit(blob)
    torch.save(blob, out / "checkpoint.pt")
    return out


def _nan_rewards(blob: dict) -> None:
    blob["replay"]["data"]["reward"][5 : blob["replay"]["size"]] = float("nan")


def _nan_weight(blob: dict) -> None:
    blob["learner"]["q"]["0.weight"][0, 0] = float("nan")


def _nan_adam(blob: dict) -> None:
    blob["learner"]["opt"]["state"][0]["exp_avg"][0] = float("inf")


def _wrong_shape(blob: dict) -> None:
    blob["learner"]["q"]["2.weight"] = torch.zeros(7, 5)


@pytest.mark.parametrize("edit, says", [
    (_nan_rewards, "checkpoint.pt: replay: reward holds NaN or inf (row 5): refused, nothing learnt from it"),
    (_nan_weight, "checkpoint.pt: learner.q.0.weight holds NaN or inf: refused"),
    (_nan_adam, "checkpoint.pt: learner.opt.state.0.exp_avg holds NaN or inf: refused"),
    (_wrong_shape, "does not fit this run's learner (other --algo or --policy-layers?): size mismatch for 2.weight"),
])
def test_resume_refuses_a_checkpoint_with_nan_or_other_shapes_and_keeps_it(first_run: Path, tmp_path: Path, edit,  # noqa: ANN001
                                                                          says: str) -> None:
    out = crafted(first_run, tmp_path, edit)
    before = {name: digest(out / name) for name in ("checkpoint.pt", "policy.pt", "summary.json")}
    r = run_cli(*RUN, "--max-env-steps", "800", "--out", str(out), "--resume")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()  # the "starting ... actors" notice, then the one error line
    assert [line for line in lines if line.startswith("error:")] == lines[-1:] and says in lines[-1], r.stderr
    assert "Traceback" not in r.stderr and len(lines) <= 2
    assert {name: digest(out / name) for name in before} == before  # nothing overwritten


class NaNAfterSwitch(gym.Wrapper):
    """CartPole whose rewards turn NaN once ``BROKEN`` is set (a broken env mid-run)."""

    BROKEN = False

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action):  # noqa: ANN001, ANN201
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float("nan") if NaNAfterSwitch.BROKEN else reward, terminated, truncated, info


def test_a_nan_met_mid_run_stops_it_with_the_last_good_checkpoint(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.system import run_actorq

    if "QuarlNaNAfterSwitch-v0" not in gym.registry:
        gym.register("QuarlNaNAfterSwitch-v0", entry_point=NaNAfterSwitch, max_episode_steps=500)
    config = ActorQConfig.flat("QuarlNaNAfterSwitch-v0", local=True, max_minutes=3.0, out=tmp_path / "run", actors=1,
                               policy_layers=(32, 32), batch_size=32, min_replay=100, eval_episodes=2,
                               max_env_steps=400, checkpoint_replay=True, target_reward=1e9)
    run_actorq(config)
    out = tmp_path / "run"
    before = {name: digest(out / name) for name in ("checkpoint.pt", "policy.pt")}
    monkeypatch.setattr(NaNAfterSwitch, "BROKEN", True)
    with pytest.raises(StoppedRun) as info:
        run_actorq(replace(config, max_env_steps=4000), resume=True)
    text = str(info.value)
    assert "ActorQ training stopped at env step" in text and "the learner's loss (nan)" in text, text
    assert f"the last good checkpoint {out / 'checkpoint.pt'} is kept" in text and "\n" not in text
    assert {name: digest(out / name) for name in before} == before  # the NaN learner was saved nowhere
    sd = torch.load(out / "policy.pt", weights_only=True)
    assert all(bool(torch.isfinite(v).all()) for v in sd.values())


def test_a_nan_met_before_any_checkpoint_is_one_line_and_saves_nothing(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.system import run_actorq

    if "QuarlNaNAfterSwitch-v0" not in gym.registry:
        gym.register("QuarlNaNAfterSwitch-v0", entry_point=NaNAfterSwitch, max_episode_steps=500)
    monkeypatch.setattr(NaNAfterSwitch, "BROKEN", True)
    config = ActorQConfig.flat("QuarlNaNAfterSwitch-v0", local=True, max_minutes=3.0, out=tmp_path / "run", actors=1,
                               policy_layers=(32, 32), batch_size=32, min_replay=100, eval_episodes=2,
                               max_env_steps=2000, target_reward=1e9)
    with pytest.raises(QuarlError, match="no checkpoint was written before it") as info:
        run_actorq(config)
    assert not isinstance(info.value, StoppedRun)
    assert not (tmp_path / "run" / "policy.pt").exists() and not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda sd: sd["0.weight"].__setitem__((0, 0), float("nan")), "tensor '0.weight' holds 1 non-finite values"),
    (lambda sd: sd.update({"2.weight": torch.zeros(7, 5)}), "does not hold the layers of a policy"),
    (lambda sd: sd.update({"2.weight": torch.zeros(7, 5), "2.bias": torch.zeros(7)}),
     "does not run on an observation of shape (4,)"),
])
def test_a_run_folder_with_a_nan_or_misshapen_policy_is_one_line(first_run: Path, tmp_path: Path, edit,  # noqa: ANN001
                                                                 says: str) -> None:
    out = tmp_path / "run"
    shutil.copytree(first_run, out)
    sd = torch.load(out / "policy.pt", weights_only=True)
    edit(sd)
    torch.save(sd, out / "policy.pt")
    r = run_cli("ptq", str(out), "--precisions", "fp16", "--episodes", "2", "--out", str(tmp_path / "ptq"))
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
