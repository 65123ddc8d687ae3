"""``hf://ORG/REPO`` agents, offline: a cache pre-filled in the Hub's own layout is
read by the same safe loader as a local zoo folder; an agent not in it fails in one line
naming the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import quarl
from quarl.cli import app
from quarl.core.errors import QuarlError


def _prefill(cache: Path, repo: str, run: Path) -> None:
    """What ``snapshot_download`` leaves after fetching an RL Zoo repository."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    env = next(run.glob("*.zip")).stem
    shutil.copy(next(run.glob("*.zip")), snapshot / f"ppo-{env}.zip")
    for name in ("config.yml", "args.yml", "env_kwargs.yml"):
        if (run / env / name).exists():
            shutil.copy(run / env / name, snapshot / name)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_run: Path) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("QUARL_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _prefill(cache, "someone/ppo-CartPole-v1", tiny_run)
    return cache


def test_hub_agent_loads_from_the_cache_offline_and_acts_as_the_local_one(offline_cache: Path, tiny_run: Path) -> None:
    hub = quarl.load("hf://someone/ppo-CartPole-v1")
    local = quarl.load(tiny_run)
    assert hub.algo == "ppo" and hub.env_spec == local.env_spec
    assert hub.policy.fingerprint() == local.policy.fingerprint()
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(hub.policy.act(obs), local.policy.act(obs))


def test_hub_agent_through_the_cli(offline_cache: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["ptq", "hf://someone/ppo-CartPole-v1", "--precisions", "fp32", "--episodes", "2",
                                 "--out", str(tmp_path / "out")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "results.jsonl").exists()


def test_study_takes_a_hub_agent_beside_a_local_one(offline_cache: Path, tiny_run: Path, tmp_path: Path) -> None:
    """The Hub agent is fetched into its run folder and studied as one; it holds the same
    weights as the local folder, so both rows score the same."""
    r = CliRunner().invoke(app, ["study", "hf://someone/ppo-CartPole-v1", str(tiny_run), "--precisions", "fp32",
                                 "--seeds", "0", "--episodes", "2", "--out", str(tmp_path / "study")],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    import sqlite3

    rows = sqlite3.connect(tmp_path / "study" / "study.sqlite").execute(
        "SELECT checkpoint, policy_sha256, mean FROM cells_v2").fetchall()
    assert len(rows) == 2 and any(str(offline_cache) in row[0] for row in rows)
    assert rows[0][1:] == rows[1][1:]  # same content hash, same return


@pytest.mark.parametrize("name,message", [
    ("hf://someone/not-there", "not in the cache"),
    ("hf://no-repo-part", "is not hf://ORG/REPO"),
    ("hf://../../etc/passwd", "is not hf://ORG/REPO"),
])
def test_hub_bad_names_are_one_line(offline_cache: Path, name: str, message: str) -> None:
    with pytest.raises(QuarlError, match=message) as info:
        quarl.load(name)
    assert "\n" not in str(info.value)
    if message == "not in the cache":
        assert str(offline_cache) in str(info.value)
