"""The study store on a real full filesystem (a 1 MB tmpfs, which only root can mount; the
tests skip, saying why, where it cannot be made): running out of space while opening the
store or storing a cell is one line naming the store, the cells stored before are intact,
and a rerun with space again continues from them."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quarl.core.errors import QuarlError
from quarl.study.store import StudyStore
from tests.conftest import ZOO
from tests.test_fuzz_records import _store_record


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip(f"a full filesystem needs a small tmpfs, which only root can mount (running as uid {os.geteuid()})")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): no full filesystem to test on")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _leave_free(disk: Path, free: int) -> Path:
    """Fill ``disk`` until about ``free`` bytes are left; the filler, to remove for space again."""
    filler = disk / "filler"
    size = max(0, shutil.disk_usage(disk).free - free)
    with filler.open("wb") as fh:
        fh.write(b"\0" * size)
    return filler


def _rows(path: Path) -> list[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return db.execute("SELECT * FROM cells_v2 ORDER BY rowid").fetchall()
    finally:
        db.close()


def test_a_store_that_fills_the_disk_keeps_the_cells_stored_before(small_disk: Path) -> None:
    filler = _leave_free(small_disk, 200 << 10)
    path = small_disk / "out" / "study.sqlite"
    store = StudyStore(path)
    stored = []
    with pytest.raises(QuarlError) as caught:
        for seed in range(10_000):
            record = dataclasses.replace(_store_record(), seed=seed)
            store.insert(record)
            stored.append(record)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "the disk is full" in message, message
    assert "cells stored before it are kept" in message
    store.close()
    assert 1 <= len(stored) < 10_000 and len(_rows(path)) == len(stored)
    filler.unlink()  # space again: the store opens, holds every cell stored before, and takes more
    store = StudyStore(path)
    assert [r.to_dict() for r in store.records()] == [r.to_dict() for r in stored]
    assert store.done() == {r.key() for r in stored}
    store.insert(dataclasses.replace(_store_record(), seed=len(stored)))
    assert len(store.records()) == len(stored) + 1
    store.close()


@pytest.mark.parametrize("free", [0, 8 << 10])
def test_a_store_opened_on_a_full_disk_is_one_line_and_leaves_nothing(small_disk: Path, free: int) -> None:
    _leave_free(small_disk, free)
    path = small_disk / "out" / "study.sqlite"
    with pytest.raises(QuarlError) as caught:
        StudyStore(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "the disk is full" in message, message
    assert "refused before computing anything" in message
    assert sorted(p.name for p in path.parent.iterdir()) == []  # no empty store, WAL or shared memory left


@pytest.mark.slow
def test_quarl_study_on_a_full_disk_ends_in_one_line_and_a_rerun_continues(small_disk: Path,
                                                                          request: pytest.FixtureRequest) -> None:
    zoo = ZOO / "ppo" / "CartPole-v1_1"
    agent = zoo if zoo.exists() else request.getfixturevalue("tiny_run")
    filler = _leave_free(small_disk, 200 << 10)
    out = small_disk / "study"
    seeds = ",".join(str(s) for s in range(60))
    command = [sys.executable, "-m", "quarl.cli", "study", str(agent), "--precisions", "fp32", "--seeds", seeds,
               "--episodes", "2", "--decide-episodes", "0", "--out", str(out)]
    full = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "300"})
    output = full.stdout + full.stderr
    assert full.returncode == 2 and "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "study.sqlite cannot store the cell: the disk is full" in errors[0], output[-3000:]
    before = _rows(out / "study.sqlite")
    assert 1 <= len(before) < 60
    filler.unlink()
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    after = _rows(out / "study.sqlite")
    assert len(after) == 60 and after[: len(before)] == before  # the cells stored before: reused, unchanged
