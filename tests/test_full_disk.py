"""A full disk (issue 38): every writer goes through quarl.core.atomic (a temporary in the same
folder, fsync, rename, the temporary removed on failure), so ENOSPC during ptq, train or
export ends in one line naming the file, leaves no ``.tmp`` and keeps what was finished
before. ENOSPC is simulated by making the write itself fail part-way (no disk is filled)."""

from __future__ import annotations

import errno
import json
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import stable_baselines3 as sb3

from quarl.core import atomic
from quarl.core.errors import QuarlError
from tests.conftest import run_cli


def _one_line(err: str) -> str:
    """The error line: one, the last (progress bars and training's progress lines before it)."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err[-2000:]
    return errors[0]


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name]


class FullDisk:
    """Writes to a file whose name ``matches`` fail with ENOSPC after half their bytes
    (a callable writer after it wrote its whole temporary); ``after`` such writes succeed first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.matches: Callable[[str], bool] = lambda name: False
        self.after = 0
        self.failed: list[str] = []
        real_bytes, real_writer = atomic._write_bytes, atomic._call_writer

        def target(path: Path) -> bool:
            name = re.sub(r"^\.(.*)\.\d+\.\d+\.tmp(.*)$", r"\1\2", Path(path).name)  # a temporary's file
            if not self.matches(name):
                return False
            if self.after > 0:
                self.after -= 1
                return False
            self.failed.append(name)
            return True

        def write_bytes(fd: int, data: bytes, path: Path) -> None:
            if target(path):
                os.write(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_bytes(fd, data, path)

        def call_writer(write: Callable[[Path], Any], tmp: Path) -> None:
            real_writer(write, tmp)
            if target(tmp):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(atomic, "_write_bytes", write_bytes)
        monkeypatch.setattr(atomic, "_call_writer", call_writer)

    def on(self, fragment: str, after: int = 0) -> FullDisk:
        self.matches = lambda name: fragment in name
        self.after = after
        return self


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    return FullDisk(monkeypatch)


# ---------------------------------------------------------------------------- the helper


@pytest.mark.parametrize("content", ["new text", b"new bytes", lambda tmp: tmp.write_bytes(b"written by a writer")])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path, full_disk: FullDisk,
                                                                    content: Any) -> None:
    path = tmp_path / "table.csv"
    path.write_text("old")
    full_disk.on("table")
    with pytest.raises(QuarlError) as caught:
        atomic.write_atomic(path, content)
    assert str(caught.value) == (f"{path} could not be written (No space left on device): nothing was written to it; "
                                 "what finished before is kept")
    assert path.read_text() == "old" and _temporaries(tmp_path) == []
    full_disk.on("nothing")
    atomic.write_atomic(path, content)
    assert path.read_text() != "old" and _temporaries(tmp_path) == []


def test_a_line_that_does_not_fit_is_cut_back(tmp_path: Path, full_disk: FullDisk) -> None:
    log = tmp_path / "results.jsonl"
    atomic.append_line(log, '{"cell": 1}')
    full_disk.on("results")
    with pytest.raises(QuarlError, match="results.jsonl could not be written"):
        atomic.append_line(log, '{"cell": 2, "returns": [1, 2, 3]}')
    assert log.read_text() == '{"cell": 1}\n'


def test_torch_s_own_write_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    with pytest.raises(QuarlError, match=r"policy.pt could not be written \(.*file write failed\)"):
        atomic.write_atomic(tmp_path / "policy.pt", fails)
    assert list(tmp_path.iterdir()) == []


def test_a_stray_enospc_is_still_one_line_from_the_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A writer not yet through quarl.core.atomic (recovery's): the CLI names the file."""
    from quarl.cli.settings import Evaluation

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x.pt"))

    monkeypatch.setattr(Evaluation, "settings", disk_full)
    r = run_cli("ptq", str(_agent(tmp_path)), "--env", "CartPole-v1", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "x.pt could not be written (No space left on device)" in _one_line(r.stderr)


# ---------------------------------------------------------------------------- the commands


def _agent(tmp_path: Path) -> Path:
    path = tmp_path / "agent" / "ppo.zip"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu", n_steps=64,
                policy_kwargs={"net_arch": [16]}).save(path)
    return path


PTQ = ["--env", "CartPole-v1", "--episodes", "2", "--decide-episodes", "0", "--max-steps", "50"]


@pytest.mark.parametrize("target", ["results.jsonl", "ptq.csv", "ptq.json"])
def test_ptq_on_a_full_disk_is_one_line_and_keeps_the_finished_cells(tmp_path: Path, full_disk: FullDisk,
                                                                      target: str) -> None:
    agent, out = _agent(tmp_path), tmp_path / "out"
    r = run_cli("ptq", str(agent), *PTQ, "--precisions", "fp32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    full_disk.on(target)
    r = run_cli("ptq", str(agent), *PTQ, "--precisions", "fp32,fp16", "--out", str(out))
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"{out / target} could not be written (No space left on device)" in line, line
    assert full_disk.failed and _temporaries(tmp_path) == []
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after[target] == before[target]  # the old table, or the log without half a line
    lines = after["results.jsonl"].decode().splitlines()
    assert all(json.loads(line) for line in lines) and len(lines) >= len(before["results.jsonl"].decode().splitlines())
    full_disk.on("nothing")  # space again: the finished fp32 cell is reused, fp16 evaluated
    r = run_cli("ptq", str(agent), *PTQ, "--precisions", "fp32,fp16", "--out", str(out))
    assert r.returncode == 0 and "reused" in r.stdout, r.stderr


def test_export_on_a_full_disk_keeps_the_old_export(tmp_path: Path, full_disk: FullDisk) -> None:
    agent, out = _agent(tmp_path), tmp_path / "export"
    r = run_cli("export", str(agent), "--env", "CartPole-v1", "--precision", "fp32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for target in ("policy.onnx", "policy.json"):
        full_disk.on(target)
        r = run_cli("export", str(agent), "--env", "CartPole-v1", "--precision", "fp16", "--out", str(out))
        assert r.returncode == 2 and f"{out / target} could not be written" in _one_line(r.stderr)
        assert _temporaries(tmp_path) == []
        assert (out / "policy.json").read_bytes() == before["policy.json"]  # the sidecar still describes the model
    r = run_cli("ptq", str(out), "--episodes", "1", "--decide-episodes", "0", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr  # the old export is whole: its hash still matches


@pytest.mark.parametrize("target,after", [("steps.zip", 1), ("CartPole-v1.zip", 0), ("config.yml", 0)])
def test_train_on_a_full_disk_keeps_its_checkpoints_and_resumes(tmp_path: Path, full_disk: FullDisk, target: str,
                                                                after: int) -> None:
    args = ["train", "dqn", "CartPole-v1", "--timesteps", "300", "--eval-freq", "0", "--checkpoint-freq", "100",
            "--hp", "learning_starts=50", "--hp", "buffer_size=1000", "--hp", "train_freq=10",
            "--hp", "policy_kwargs=dict(net_arch=[16])",
            # one update per train_freq, not the zoo's 128 (3,200 updates were half the test; the writes are its point)
            "--hp", "gradient_steps=1", "--out", str(tmp_path / "runs")]
    full_disk.on(target, after)
    r = run_cli(*args)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and "could not be written (No space left on device)" in line and target in line, line
    assert _temporaries(tmp_path) == []
    run = next((tmp_path / "runs").rglob("quarl-train.json")).parent
    assert not (run / "CartPole-v1.zip").exists()  # never a final zip the run did not finish
    checkpoints = sorted(run.rglob("rl_model_*_steps.zip"))
    assert checkpoints
    for ckpt in checkpoints:
        with zipfile.ZipFile(ckpt) as z:
            assert z.testzip() is None
    full_disk.on("nothing")
    r = run_cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert (run / "CartPole-v1.zip").is_file() and (run / "CartPole-v1" / "config.yml").is_file()
