"""Outputs never overwrite inputs: an output folder that is, holds or is inside the
checkpoint or run folder a command reads is refused in one line before anything is
written (issue 38: ``recover DIR/ENV.zip --out DIR`` replaced the user's zip with the
student; ``--out`` equal to the zoo folder ended in a SameFileError traceback)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from quarl.core.errors import QuarlError
from tests.conftest import run_cli, zoo_run


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> SHA-256)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def user(tmp_path: Path) -> Path:
    """A copy of the zoo's DQN CartPole run folder and its zip alone beside it."""
    shutil.copytree(zoo_run("dqn", "CartPole-v1"), tmp_path / "CartPole-v1_1")
    shutil.copyfile(tmp_path / "CartPole-v1_1" / "CartPole-v1.zip", tmp_path / "CartPole-v1.zip")
    return tmp_path


def refused(user: Path, *args: str) -> str:
    before = snapshot(user)
    r = run_cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert snapshot(user) == before and not (user / "sub").exists()  # nothing written, nothing replaced
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_recover_into_the_folder_holding_its_zip_is_refused_and_the_zip_stays(user: Path) -> None:
    line = refused(user, "recover", str(user / "CartPole-v1.zip"), "--env", "CartPole-v1", "--out", str(user),
                   "--rounds", "1")
    assert line == (f"error: --out {user} holds the input {user / 'CartPole-v1.zip'}: an output folder may not be, "
                    "hold or be inside an input (it could overwrite it); give another folder")


@pytest.mark.parametrize("command", [["recover"], ["ptq"], ["export", "--precision", "int8"], ["sweep"], ["analyze"],
                                     ["bench"], ["study"]])
@pytest.mark.parametrize("where, relation", [("CartPole-v1_1", "is the input"),
                                             ("CartPole-v1_1/sub", "is inside the input"),
                                             (".", "holds the input")])
def test_every_command_refuses_an_output_folder_at_its_input(user: Path, command: list[str], where: str,
                                                             relation: str) -> None:
    out = user / where
    line = refused(user, command[0], str(user / "CartPole-v1_1"), *command[1:], "--out", str(out))
    assert line.startswith(f"error: --out {out} {relation} {user / 'CartPole-v1_1'}: "), line


def test_an_output_folder_beside_the_input_is_taken(user: Path) -> None:
    r = run_cli("ptq", str(user / "CartPole-v1_1"), "--precisions", "fp16", "--episodes", "2", "--out",
                str(user / "results"))
    assert r.returncode == 0 and (user / "results" / "results.jsonl").is_file(), r.stdout + r.stderr


def test_the_rule_sees_through_symbolic_links_and_spellings(tmp_path: Path) -> None:
    from quarl.outputs import apart_from_inputs

    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    with pytest.raises(QuarlError, match="is the input"):
        apart_from_inputs(tmp_path / "link", [tmp_path / "run"])
    with pytest.raises(QuarlError, match="is inside the input"):
        apart_from_inputs(tmp_path / "link" / ".." / "run" / "x", [tmp_path / "run"])
    with pytest.raises(QuarlError, match="holds the input"):
        apart_from_inputs(tmp_path, [tmp_path / "link" / "model.zip"])
    assert apart_from_inputs(tmp_path / "runs", [tmp_path / "run", None, "hf://org/repo"]) == tmp_path / "runs"
    assert apart_from_inputs(None, [tmp_path]) is None


def test_the_python_api_refuses_it_too(user: Path) -> None:
    import quarl

    before = snapshot(user)
    with pytest.raises(QuarlError, match="is the input"):
        quarl.recover(user / "CartPole-v1_1", user / "CartPole-v1_1", "int8", rounds=1)
    assert snapshot(user) == before
