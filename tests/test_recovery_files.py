"""Files an earlier quarl wrote (``tests/data/recovery_v1``: a recovered folder and the
state of its run) are read by this one: the folder loads with its manifest and hashes
checked, its ``recovery.json`` reads back as written, and the state resumes the run that
wrote it."""

from __future__ import annotations

import dataclasses
import json
import shutil
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
from quarl.recovery.report import RoundStats

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
    # the fixture's rounds predate calibration_kept: read back as not recorded (None)
    assert [h.to_dict() for h in result.history] == [h.to_dict() for h in saved["history"]] == [
        {**r, "calibration_kept": None} for r in rounds]
    assert result.updates == saved["updates"] == 2 * CONFIG.updates_per_round
    assert torch.equal(torch.from_numpy(result.heldout if result.heldout is not None else np.zeros(0)),
                       saved["heldout"])


def test_a_round_is_defined_once_and_both_files_hold_its_dict(tmp_path: Path) -> None:
    """RoundStats is the one definition of a round: both files hold its dict (its fields in
    order), a state's rounds read back as RoundStats, and a round read from either file is
    checked by RoundStats' own annotations (one line naming the field); a round an older
    quarl wrote without its calibration verdict reads back with none."""
    names = [f.name for f in dataclasses.fields(RoundStats)]
    rounds = json.loads((DATA / "folder" / "CartPole-v1" / "recovery.json").read_text())["rounds"]
    assert names[-1] == "calibration_kept"  # newer than the fixture's files: absent there, None read back
    assert len(rounds) == 2 and all(list(r) == names[:-1] for r in rounds)
    saved = read_state(DATA / "state.pt")
    assert all(type(h) is RoundStats and h.calibration_kept is None for h in saved["history"])
    assert [h.to_dict() for h in saved["history"]] == [{**r, "calibration_kept": None} for r in rounds]
    assert [h.kept for h in saved["history"]] == [r["calibration_verdict"] == "keeps" for r in rounds]
    out = _folder(tmp_path)
    path = out / "CartPole-v1" / "recovery.json"
    record = json.loads(path.read_text())
    for change, field in [({"agreement": 1.5}, "agreement"), ({"loss": "0.5"}, "loss"), ({"round": True}, "round"),
                          ({"states": 1.0}, "states"), ({"extra": 1}, "extra")]:
        path.write_text(json.dumps({**record, "rounds": [{**rounds[0], **change}, rounds[1]]}))
        with pytest.raises(QuarlError, match=rf"^{path}: field rounds\.0\.{field}: "):
            read_recovery_record(path)
        state = tmp_path / "state.pt"
        torch.save({**torch.load(DATA / "state.pt", weights_only=True),
                    "history": [{**rounds[0], **change}, rounds[1]]}, state)
        with pytest.raises(QuarlError, match=rf"^{state}: field history\.0\.{field}: .*start afresh$"):
            read_state(state)
    older = {key: value for key, value in rounds[0].items() if key != "calibration_verdict"}
    path.write_text(json.dumps({**record, "rounds": [older, rounds[1]]}))
    assert read_recovery_record(path)["rounds"][0] == older  # read back as written
    torch.save({**torch.load(DATA / "state.pt", weights_only=True), "history": [older, rounds[1]]}, state)
    assert read_state(state)["history"][0] == RoundStats(**{**older, "calibration_verdict": ""})
