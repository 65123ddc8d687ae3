"""Stored results are checked against what they describe (issue 38): a ``results.jsonl``
line or a study store row whose mean or std is not that of its own returns, or whose
returns are not finite, is evaluated again, never reused as it is (a fabricated mean of
123.45 was shown as *keeps*); a corrupt, foreign or read-only study store is one line
naming the file."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from quarl.core.errors import QuarlError
from quarl.core.records import disagreement
from quarl.study.store import TABLE, StudyStore
from tests.conftest import run_cli


@pytest.mark.parametrize("fields, says", [
    ({"mean": 28.0, "std": math.sqrt(8 / 3), "returns": [26.0, 30.0, 28.0], "lengths": [1, 2, 3]}, None),
    ({"mean": 28.00004, "std": math.sqrt(8 / 3), "returns": [26.0, 30.0, 28.0]}, None),  # 4-digit rounding
    ({"mean": 123.45, "std": math.sqrt(8 / 3), "returns": [26.0, 30.0, 28.0]},
     "its mean 123.45 is not the mean of its 3 returns (28.0000)"),
    ({"mean": 28.0, "std": 0.0, "returns": [26.0, 30.0, 28.0]}, "its std 0.0 is not the std of its 3 returns (1.6330)"),
    ({"mean": float("nan"), "std": float("nan"), "returns": [float("nan")]}, "return 0 is nan, not a finite number"),
    ({"mean": float("inf"), "std": 0.0, "returns": [1.0, float("inf")]}, "return 1 is inf, not a finite number"),
    ({"mean": 0.0, "std": 0.0, "returns": []}, "it holds no returns"),
    ({"mean": 1.0, "std": 0.0, "returns": [1.0], "lengths": [1, 1]}, "it holds 2 episode lengths for 1 returns"),
])
def test_a_stored_result_agrees_with_its_own_returns(fields: dict, says: str | None) -> None:
    assert disagreement(fields) == says


def test_ptq_evaluates_again_a_results_line_whose_mean_is_not_its_returns(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "ptq"
    args = ("ptq", str(tiny_run), "--env", "CartPole-v1", "--precisions", "fp16", "--episodes", "3",
            "--decide-episodes", "0", "--out", str(out))
    assert run_cli(*args).returncode == 0
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    true_means = {rec["precision"]: rec["mean"] for rec in lines}
    forged = [{**rec, "mean": 123.45} if rec["precision"] == "fp16" else rec for rec in lines]
    (out / "results.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in forged))
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "123.45" not in r.stdout
    again = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(again) == len(forged) + 1 and again[-1]["precision"] == "fp16"  # evaluated anew, appended
    assert again[-1]["mean"] == pytest.approx(true_means["fp16"]) and again[-1]["mean"] == pytest.approx(
        sum(again[-1]["returns"]) / len(again[-1]["returns"]))
    assert run_cli(*args).stdout.count("123.45") == 0 and len(
        (out / "results.jsonl").read_text().splitlines()) == len(again)  # the good line is reused now


def test_study_evaluates_again_a_row_whose_mean_is_not_its_returns(tiny_run: Path, tmp_path: Path) -> None:
    from quarl.study.grid import StudyConfig, run_study

    config = StudyConfig((tiny_run,), ("fp32",), (0,), episodes=2, n_envs=1, out=tmp_path, decide_episodes=0)
    (first,) = run_study(config)
    with sqlite3.connect(tmp_path / "study.sqlite") as db:
        db.execute(f"UPDATE {TABLE} SET mean = 123.45")
    db.close()
    store = StudyStore(tmp_path / "study.sqlite")
    assert store.done() == set() and store.records() == []  # neither reused nor shown
    store.close()
    (again,) = run_study(config)
    assert again.result.mean == pytest.approx(first.result.mean) and again.result.mean != 123.45
    with sqlite3.connect(tmp_path / "study.sqlite") as db:
        assert db.execute(f"SELECT COUNT(*), MAX(mean) FROM {TABLE}").fetchone() == (1, again.result.mean)
    db.close()


def test_a_corrupt_or_foreign_study_store_is_one_line_naming_it(tiny_run: Path, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "study.sqlite").write_bytes(bytes(range(256)) * 16)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with sqlite3.connect(foreign / "study.sqlite") as db:
        db.execute(f"CREATE TABLE {TABLE} (a TEXT, b INTEGER)")
    db.close()
    for folder, says in ((corrupt, "is not a SQLite study store, or a corrupt one (file is not a database)"),
                         (foreign, f"holds a {TABLE} table of another schema (no column checkpoint): not a quarl "
                                   "study store")):
        r = run_cli("study", str(tiny_run), "--precisions", "fp16", "--seeds", "0", "--episodes", "2",
                    "--out", str(folder))
        lines = [line for line in r.stderr.strip().splitlines() if line.startswith("error:")]
        assert r.returncode == 2 and lines == [f"error: {folder / 'study.sqlite'} {lines[0].split(' ', 2)[2]}"], \
            r.stderr
        assert says in lines[0] and "Traceback" not in r.stderr


def test_a_read_only_store_is_one_line_even_for_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root writes a file of mode 0444, so the store is opened read-only as SQLite does for
    a user who may not write it."""
    StudyStore(tmp_path / "study.sqlite").close()
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda path, **kw: connect(f"file:{path}?mode=ro", uri=True, **kw))
    with pytest.raises(QuarlError, match=r"study.sqlite cannot be written as a study store \(attempt to write a "
                                         r"readonly database\): refused before computing anything") as info:
        StudyStore(tmp_path / "study.sqlite")
    assert "\n" not in str(info.value)
