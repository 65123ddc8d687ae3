"""Files an earlier quarl wrote (``tests/data/recovery_v1``: a recovered folder and the
state of its run) are read by this one: the folder loads with its manifest and hashes
checked, its ``recovery.json`` reads back as written, and the state resumes the run that
wrote it."""

from __future__ import annotations

import dataclasses
import json
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

import quarl
from quarl.core.errors import QuarlError
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.modes import int8_compute
from quarl.quant.student import KernelSpec
from quarl.recovery import RecoverConfig, distill, load_recovered, pick_spec, read_recovery_record, read_state
from quarl.recovery.report import RoundJson, RoundStats

DATA = Path(__file__).parent / "data" / "recovery_v1"
CONFIG = RecoverConfig(precision="int4-block", rounds=2, max_rounds=2, episodes_per_round=2, updates_per_round=20,
                       finetune_steps=0, closed_loop=False)
"""The options ``make.py`` recovered with."""


def _folder(tmp_path: Path) -> Path:
    out = tmp_path / "rec"
    shutil.copytree(DATA / "folder", out)
    return out


def test_a_recovered_folder_written_before_loads(tmp_path: Path) -> None:
    out = _folder(tmp_path)
    path = out / "CartPole-v1" / "recovery.json"
    record = read_recovery_record(path)
    assert record == json.loads(path.read_text())  # as written
    assert (record["precision"], record["kernel"]["mode"], record["shipped"]) == ("int4", "int4-block", "ptq")
    assert [r["round"] for r in record["rounds"]] == [0, 1] and record["budget"]["rounds_played"] == 2
    assert KernelSpec.from_dict(record["kernel"]).to_dict() == record["kernel"]
    recovered = load_recovered(out)
    assert recovered is not None and recovered.precision == "int4" and recovered.record == record
    states = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    assert recovered.kernel.act_rows(states).shape == recovered.original.act_rows(states).shape == (8,)


def test_a_finished_recovery_written_before_is_reused_not_run_again(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from quarl.recovery import run_recover, workflow

    out = _folder(tmp_path)
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    monkeypatch.setattr(workflow, "recover_stages", _never)
    checkpoint = tmp_path / "agent.zip"  # the original policy, as recover was given it
    shutil.copy(out / "CartPole-v1" / "original.zip", checkpoint)
    agent = quarl.load(checkpoint, env="CartPole-v1")
    assert agent.env_spec is not None
    record, records = run_recover(checkpoint, agent.env_spec, agent.policy, CONFIG, out)
    assert record == json.loads((out / "CartPole-v1" / "recovery.json").read_text()) and records == []
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file() and path.name != ".lock"} == before


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("recovered again")


def _picks_the_writers_kernel() -> bool:
    """Whether this CPU, as ``QUARL_CPU_KIND`` has it answer, picks the kernel the state was
    written for: ``int4-block`` itself (MatMulNBits computing in int8, not the mode's
    fallback) with ``auto`` int8 weights resolved to symmetric (VNNI)."""
    return ortb.has_vnni() and int8_compute(4) == "int8"


def test_a_state_written_before_resumes_its_run_where_the_cpu_picks_its_kernel(tmp_path: Path) -> None:
    """The state resumes where the CPU picks the kernel it was written for (the machine that
    wrote it, any with VNNI and MatMulNBits' int8 compute) and is refused in one line that
    names what differs elsewhere (its student was trained for that kernel's grid)."""
    if _picks_the_writers_kernel():
        _resumes(tmp_path)
    else:
        _is_refused(tmp_path)


def test_a_state_written_before_is_refused_where_the_cpu_picks_another_kernel(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARL_CPU_KIND", "avx2")  # no VNNI, no exact int8 MatMulNBits: int4-weight-only, asymmetric
    _is_refused(tmp_path)


def _is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state.pt"
    shutil.copy(DATA / "state.pt", state)
    before = state.read_bytes()
    agent = quarl.load(DATA / "folder" / "CartPole-v1" / "original.zip", env="CartPole-v1")
    assert agent.env_spec is not None
    spec, _ = pick_spec(agent.policy, agent.env_spec, CONFIG)
    assert spec.mode == ("int4-weight-only" if int8_compute(4) == "inexact" else "int4-block")
    with pytest.raises(QuarlError) as refused:
        distill(agent.policy, agent.env_spec, CONFIG, spec, state_path=state)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{state} was written for another kernel than this run picks (")
    if not ortb.has_vnni():
        assert "int8_weights symmetric -> asymmetric" in message
    if int8_compute(4) == "inexact":
        assert "mode int4-block -> int4-weight-only" in message and "compute_int8 True -> False" in message
    assert state.read_bytes() == before  # left as it was: it resumes where it was written


def _resumes(tmp_path: Path) -> None:
    state = tmp_path / "state.pt"
    shutil.copy(DATA / "state.pt", state)
    saved = read_state(state)
    agent = quarl.load(DATA / "folder" / "CartPole-v1" / "original.zip", env="CartPole-v1")
    assert agent.env_spec is not None and saved["teacher"] == agent.policy.fingerprint()
    spec, _ = pick_spec(agent.policy, agent.env_spec, CONFIG)
    played: list[int] = []
    result = distill(agent.policy, agent.env_spec, CONFIG, spec, state_path=state,
                     progress=lambda stats: played.append(stats.round))
    assert played == []  # both rounds were played before: nothing is played again
    rounds = json.loads((DATA / "folder" / "CartPole-v1" / "recovery.json").read_text())["rounds"]
    assert [h.to_dict() for h in result.history] == saved["history"] == rounds
    assert result.updates == saved["updates"] == 2 * CONFIG.updates_per_round
    assert torch.equal(torch.from_numpy(result.heldout if result.heldout is not None else np.zeros(0)),
                       saved["heldout"])


def test_a_round_in_memory_has_the_fields_of_a_round_in_a_file() -> None:
    """RoundStats mirrors RoundJson (the definition pydantic checks): the same names in the
    same order, the same types with the same checks, a default exactly where the file may
    lack the field."""
    in_file = typing.get_type_hints(RoundJson, include_extras=True)
    in_memory = typing.get_type_hints(RoundStats, include_extras=True)
    assert list(in_memory) == list(in_file)
    optional = {name for name, hint in in_file.items() if typing.get_origin(hint) is typing.NotRequired}
    assert {name: in_file[name] for name in in_file if name not in optional} == \
        {name: in_memory[name] for name in in_file if name not in optional}
    assert {name: typing.get_args(in_file[name])[0] for name in optional} == {name: in_memory[name] for name in optional}
    assert {f.name for f in dataclasses.fields(RoundStats) if f.default is not dataclasses.MISSING} == optional
