"""The split of ``quarl.measure`` (issue 32): the record schema imports nothing heavy, one
rule decides calibration, one function gives what both cell keys say about a config, and
records stay typed until written, in the files every earlier quarl wrote."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from quarl.core.records import ResultsLog
from quarl.envs import EnvSpec
from quarl.evaluation.calibration import (
    CALIBRATION_SEED_OFFSET,
    calibrate_if_needed,
    calibration_inputs,
    calibration_returns,
)
from quarl.evaluation.cells import Cell, EvalSettings, cell_key, config_identity, evaluate_cells
from quarl.evaluation.record import CellRecord, EvalRecord, json_fields, sql_columns
from quarl.policies.base import Policy
from quarl.ptq.run import run_ptq
from quarl.quantization.config import QuantConfig

CARTPOLE = EnvSpec("CartPole-v1")
HEAVY = ("torch", "gymnasium", "onnxruntime", "numpy")


def _policy() -> Policy:
    """A CartPole MLP whose weights are a fixed function (no RNG): the same policy on every machine."""
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.from_numpy(3.0 * np.sin(np.arange(p.numel()) * 1.3 + i).reshape(p.shape).astype(np.float32)))
    return Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax")


def test_the_study_store_and_the_record_schema_load_no_evaluator() -> None:
    """``import quarl.study.store`` used to load torch, gymnasium and ONNX Runtime (1.3 s)."""
    code = ("import json, sys; import quarl.study.store, quarl.evaluation.record; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_store_columns_are_those_every_store_was_written_with() -> None:
    assert sql_columns() == {
        "env_id": "TEXT NOT NULL", "mean": "REAL NOT NULL", "std": "REAL NOT NULL", "returns": "TEXT NOT NULL",
        "lengths": "TEXT NOT NULL", "quant": "TEXT", "steps_per_s": "REAL", "latency_us": "REAL",
        "model_bytes": "INTEGER", "build_s": "REAL", "endings": "TEXT", "acting": "TEXT", "sticky_actions": "REAL"}
    assert json_fields() == ("returns", "lengths", "quant", "endings")


# results.jsonl and ptq.json of this run as quarl wrote them before the split (the int8
# cell's values depend on the CPU's fastest mode: its keys are compared, not its numbers)
KEY_FIELDS = ["precision", "episodes", "seed", "max_steps", "policy_sha256", "config", "env", "format"]
RECORD_FIELDS = ["algo", "checkpoint", "env_id", "mean", "std", "returns", "lengths", "quant", "steps_per_s",
                 "latency_us", "model_bytes", "build_s", "endings", "acting", "sticky_actions", "provenance"]
BEFORE = {
    "fp32": {"returns": [28.0, 32.0, 25.0], "mean": 28.333333333333332, "std": 2.8674417556808756, "model_bytes": 232,
             "endings": ["3a66e0541477aecf", "3e2e86286c6ab0e3", "2af20d395ec55a2d"]},
    "fp16": {"returns": [28.0, 32.0, 25.0], "mean": 28.333333333333332, "std": 2.8674417556808756, "model_bytes": 116,
             "endings": ["3a66e0541477aecf", "3e2e86286c6ab0e3", "2af20d395ec55a2d"]},
    "sim3": {"returns": [26.0, 32.0, 23.0], "mean": 27.0, "std": 3.7416573867739413, "model_bytes": 665,
             "endings": ["b7b54cff85bf3334", "10e5e0916cc03f6d", "0b0100037279e53c"]},
}
ROWS_BEFORE = [
    {"precision": "fp32", "mean": 28.33, "std": 2.87, "E%": 0.0, "E lo": None, "E hi": None, "verdict": None},
    # the verdict columns as the confidence sequence gives them (2026-11): three episodes decide nothing, and
    # an interval end beyond +-1000 % is infinite (null in JSON); CartPole's own range 0:500 bounds E by 100 %
    # (2026-11-28: a return cannot fall below 0)
    {"precision": "fp16", "mean": 28.33, "std": 2.87, "E%": 0.0, "E lo": None, "E hi": 100.0,
     "verdict": "undecided (~1117 more episodes)"},
    {"precision": "sim3", "mean": 27.0, "std": 3.74, "E%": 4.71, "E lo": None, "E hi": 100.0,
     "verdict": "undecided after 3 episodes (E near 5 %)"},
]
ROW_FIELDS = ["precision", "mean", "std", "E%", "E lo", "E hi", "verdict", "range", "episodes", "steps_per_s", "mode",
              "fp32_layers", "agree%", "algo", "env_id", "checkpoint", "policy_sha256"]


def test_a_ptq_run_writes_what_it_wrote_before_the_split_and_reuses_it_as_typed_records(tmp_path: Path) -> None:
    settings = EvalSettings(episodes=3, seed=5, n_envs=3, max_steps=200)
    run_ptq(_policy(), CARTPOLE, ["fp16", "sim3", "int8"], settings, tmp_path, source="agent.zip")
    text = (tmp_path / "results.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [list(line) for line in lines] == ([KEY_FIELDS + RECORD_FIELDS] * 3
                                              + [KEY_FIELDS + ["runtime"] + RECORD_FIELDS])
    for line in lines[:3]:
        want = BEFORE[line["precision"]]
        assert {k: line[k] for k in want} == want and line["lengths"] == [int(r) for r in want["returns"]]
        assert (line["seed"], line["episodes"], line["max_steps"], line["format"]) == (5, 3, 200, 14)
        assert (line["algo"], line["checkpoint"], line["acting"], line["sticky_actions"]) == \
            ("unknown", "agent.zip", "greedy", None)
        assert line["policy_sha256"] == "dff17a15b9825a68936be7840e81c6c5bf909c158fd1264be3b24c65e3e019a7"
    assert lines[3]["quant"]["mode"].startswith("int8")
    rows = json.loads((tmp_path / "ptq.json").read_text())
    assert [list(r) for r in rows] == [ROW_FIELDS] * 4
    assert [{k: r[k] for k in ROWS_BEFORE[0]} for r in rows[:3]] == ROWS_BEFORE

    # the same cells again: every one read back as the typed record it was written from, nothing appended
    cells = [Cell(label, QuantConfig.parse(label)) for label in ("fp32", "fp16", "sim3", "int8")]
    again = evaluate_cells(_policy(), CARTPOLE, cells, settings, ResultsLog(tmp_path / "results.jsonl"), None,
                           "moved.zip")
    assert all(isinstance(r, CellRecord) and r.reused for r in again)
    assert [r.precision for r in again] == ["fp32", "fp16", "sim3", "int8"]
    assert (tmp_path / "results.jsonl").read_text() == text
    for record, line in zip(again, lines, strict=True):
        assert record.checkpoint == "moved.zip"  # this run's identity, the stored measurements
        assert json.loads(json.dumps(record.to_dict())) == {**line, "checkpoint": "moved.zip"}
        assert record.result == EvalRecord.from_dict(line)


def test_one_rule_decides_calibration_and_what_it_is_computed_from() -> None:
    policy = _policy()
    for label in ("fp32", "fp16", "sim3"):  # weights alone: nothing to calibrate
        assert calibrate_if_needed(policy, CARTPOLE, QuantConfig.parse(label)).inputs is None
    states = calibration_inputs(policy, CARTPOLE)
    assert states.shape[1:] == (4,) and 0 < len(states) <= 256
    activations = QuantConfig(precision="nbit", bits=3, activations=True)
    for config in (QuantConfig.parse("int8"), QuantConfig.parse("int4"), activations):
        calibrated = calibrate_if_needed(policy, CARTPOLE, config)
        assert calibrated.inputs is not None and np.array_equal(calibrated.inputs, states)
        assert calibrated.returns.first == CALIBRATION_SEED_OFFSET + 100
    # a run's earlier calibration is reused as it is, never recomputed
    given, returns = np.zeros((3, 4), np.float32), calibration_returns(CARTPOLE, 50)
    reused = calibrate_if_needed(policy, CARTPOLE, QuantConfig.parse("int8"), 50, given, returns)
    assert reused.inputs is given and reused.returns is returns
    assert calibrate_if_needed(policy, CARTPOLE, QuantConfig.parse("fp16"), 50).returns.max_steps == 50


def _study_hash(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def test_ptq_and_study_keys_say_the_same_of_a_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both keys take the config as run, the format and (real int only) the runtime from
    :func:`config_identity`: another CPU's int8 result matches neither, fp16's both."""
    from quarl.quant import modes
    from quarl.study.grid import config_key

    settings, fingerprint = EvalSettings(episodes=2), "f" * 64
    int8, fp16 = QuantConfig.parse("int8"), QuantConfig.parse("fp16")
    here = modes.runtime_key()
    for config, runtime in ((int8, here), (fp16, None)):
        identity = config_identity(config)
        assert identity.runtime == runtime and identity.format == 14
        assert identity.config == dataclasses.asdict(config.resolved())
        key = cell_key(CARTPOLE, Cell(config.label, config), settings, fingerprint)
        assert key.get("runtime") == runtime and key["config"] == identity.config
        assert config_key(config) == _study_hash([14, identity.config, runtime or {}])  # as older stores hold it
    before = {c.label: (cell_key(CARTPOLE, Cell(c.label, c), settings, fingerprint), config_key(c))
              for c in (int8, fp16)}
    other = {"onnxruntime": "0.0", "cpu": "other", "vnni": "False"}
    monkeypatch.setattr(modes, "runtime_key", lambda: other)
    ptq_int8, study_int8 = cell_key(CARTPOLE, Cell("int8", int8), settings, fingerprint), config_key(int8)
    assert ptq_int8["runtime"] == other and ptq_int8 != before["int8"][0] and study_int8 != before["int8"][1]
    assert (cell_key(CARTPOLE, Cell("fp16", fp16), settings, fingerprint), config_key(fp16)) == before["fp16"]


def test_a_study_record_reads_back_from_the_store_as_it_was_written(tmp_path: Path) -> None:
    from quarl.study.store import StudyRecord, StudyStore

    result = EvalRecord("CartPole-v1", 9.5, 0.5, [9.0, 10.0], [9, 10], {"mode": "int8-dyn", "fp32_layers": [0]},
                        1234.5, 7.25, 456, 0.125, ["aa", "bb"], "greedy", None)
    record = StudyRecord("/agents/ppo", "ab" * 32, "int8", "0123456789abcdef", 2, 2, 0, "ppo CartPole-v1", "ppo",
                         result, 3.5, "node", {"cores": 2}, "2026-01-01T00:00:00+00:00")
    store = StudyStore(tmp_path / "study.sqlite")
    try:
        store.insert(record)
        assert store.records() == [record] and store.done() == {record.key()}
        stored = store.db.execute("SELECT returns, quant, provenance, max_steps FROM cells_v2").fetchone()
        assert stored == ("[9.0, 10.0]", '{"mode": "int8-dyn", "fp32_layers": [0]}', '{"cores": 2}', 0)
    finally:
        store.close()
