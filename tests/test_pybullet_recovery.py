"""The path a user takes for PyBullet after recovery: ``quarl study`` over a folder of RL Zoo
PyBullet agents with a ``rec-int8`` column (issue 41, item 9)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.conftest import run_cli

ENV = "InvertedPendulumBulletEnv-v0"


@pytest.mark.slow  # training, a recovery and PyBullet episodes: about 15 s on two shared cores
def test_study_over_a_folder_of_pybullet_agents_adds_a_recovered_column(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    r = run_cli("train", "ppo", ENV, "-n", "256", "--hp", "n_steps=128", "--eval-freq", "0", "-f", str(agents))
    assert r.returncode == 0, r.stderr
    assert (agents / "ppo" / f"{ENV}_1" / f"{ENV}.zip").exists()  # the RL Zoo layout the study walks

    out = tmp_path / "study"
    r = run_cli("study", str(agents), "--precisions", "fp32,rec-int8", "--seeds", "0", "--episodes", "3",
                "--n-envs", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr
    with (out / "table.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1 and ENV in rows[0]["policy"]
    row = rows[0]
    assert row["rec-int8"] not in ("", None) and row["rec-int8 verdict"]  # a recovered column with its verdict
    assert float(row["fp32"]) > 0
    assert len(list((out / "recovered").iterdir())) == 1  # recovered once, under OUT/recovered
    # a rerun evaluates nothing new and recovers nothing again
    again = run_cli("study", str(agents), "--precisions", "fp32,rec-int8", "--seeds", "0", "--episodes", "3",
                    "--n-envs", "3", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert len(list((out / "recovered").iterdir())) == 1
