"""Property tests over the record readers moved onto quarl.core.file_schema: the RL Zoo YAML files
of a run folder, the export sidecar, the ActorQ summary, the study store's rows, results.jsonl
and the recovery files. Generated hostile content (random JSON shapes, wrong types, NaN,
huge numbers, deep nesting, cut or bit-flipped text) ends either in the documented result or
in a QuarlError of one line naming the file."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from quarl.actorq.run_loader import read_run_config
from quarl.actorq.summary import ActorQSummary, ActorQSummaryRecord
from quarl.core.errors import QuarlError
from quarl.core.records import ResultsLog, disagreement
from quarl.evaluation.record import EvalRecord, StoredCell
from quarl.policies.onnx_artifact import SidecarRecord, read_sidecar
from quarl.policies.zoo_folder import EnvKwargs, ZooArgs, ZooConfig, zoo_env_spec
from quarl.recovery import RECOVERY_FORMAT, RoundStats, read_recovery_record, read_state
from quarl.study.store import StudyRecord, StudyStore
from tests.conftest import actorq_summary
from tests.test_fuzz_files import HOSTILE_SCALARS, JSONISH, _mutated, _one_line
from tests.test_recovery_claims import _good_record

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _deep(depth: int = 100_000) -> Any:
    deep: Any = 0
    for _ in range(depth):  # built without recursion; deeper than Python's stack
        deep = [deep]
    return deep


# ---------------------------------------------------------------------------- RL Zoo YAML files


@FUZZ
@given(record_type=st.sampled_from([ZooConfig, ZooArgs, EnvKwargs]),
       key=st.sampled_from(["policy_kwargs", "normalize", "env_wrapper", "frame_stack", "env", "env_kwargs",
                            "gym_packages", "max_episode_steps", "other"]), value=JSONISH)
def test_zoo_yaml_fields_are_typed_or_one_line(record_type: type, key: str, value: Any) -> None:
    from quarl.core.file_schema import parse_record

    try:
        record = parse_record(record_type, {key: value}, "config.yml")
    except QuarlError as exc:
        assert _one_line(exc, "config.yml: field ").startswith(f"config.yml: field {key}")
        return
    fields = record.model_dump()
    if isinstance(record, ZooConfig):
        assert fields["frame_stack"] is None or 1 <= fields["frame_stack"] <= 64
        assert fields["policy_kwargs"] is None or isinstance(fields["policy_kwargs"], (str, dict))
    if isinstance(record, EnvKwargs):
        steps = fields["max_episode_steps"]
        assert steps is None or (type(steps) is int and 1 <= steps <= 10**6)
    if isinstance(record, ZooArgs):
        assert fields["env"] is None or isinstance(fields["env"], str)


@FUZZ
@given(steps=HOSTILE_SCALARS, extra=st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6), JSONISH, max_size=3),
       where=st.sampled_from(["args.yml", "env_kwargs.yml"]))
def test_a_run_folders_env_kwargs_are_what_the_file_says_or_one_line(tmp_path: Path, steps: Any, extra: dict,
                                                                      where: str) -> None:
    """The env kwargs of args.yml and env_kwargs.yml reach the EnvSpec as written (the YAML
    loader's values), or the file is refused in one line naming it and max_episode_steps."""
    import yaml

    kwargs = {**extra, "max_episode_steps": steps}
    args: dict[str, Any] = {"env": "CartPole-v1"}
    (tmp_path / "env_kwargs.yml").unlink(missing_ok=True)  # tmp_path is shared by the examples
    if where == "args.yml":
        args["env_kwargs"] = kwargs
    else:
        (tmp_path / "env_kwargs.yml").write_text(yaml.safe_dump(kwargs))
    (tmp_path / "args.yml").write_text(yaml.safe_dump(args))
    try:
        spec = zoo_env_spec(tmp_path, "CartPole-v1", ZooConfig())
    except QuarlError as exc:
        text = _one_line(exc, str(tmp_path / where))
        assert f"field {'env_kwargs.' if where == 'args.yml' else ''}max_episode_steps: max_episode_steps=" in text
        assert not (type(steps) is int and 1 <= steps <= 10**6) and steps is not None
        return
    assert spec.env_kwargs == yaml.safe_load(yaml.safe_dump(kwargs))
    assert steps is None or (type(steps) is int and 1 <= steps <= 10**6)


def test_a_deep_yaml_value_is_kept_where_quarl_does_not_read_it_and_one_line_where_it_does() -> None:
    from quarl.core.file_schema import parse_record

    deep = _deep()
    assert parse_record(ZooConfig, {"n_envs": deep}, "config.yml").model_extra == {"n_envs": deep}
    with pytest.raises(QuarlError, match=r"^config.yml: field frame_stack: frame_stack=\[+\.\.\.\]+ must be a whole "
                                         r"number in 1..64$"):
        parse_record(ZooConfig, {"frame_stack": deep}, "config.yml")
    with pytest.raises(QuarlError, match=r"^env_kwargs.yml: field max_episode_steps: max_episode_steps=\[\[\[\["):
        parse_record(EnvKwargs, {"max_episode_steps": deep}, "env_kwargs.yml")


# ---------------------------------------------------------------------------- export sidecar

GOOD_SIDECAR = {
    "format": "quarl-policy/1", "algo": "ppo", "precision": "fp32", "head": "argmax", "n_quantiles": 0,
    "input": {"name": "obs", "shape": [None, 4], "dtype": "float32"}, "scale_images": False,
    "observation_space": {"type": "box", "shape": [4], "low": [-4.8, None, -0.42, None],
                          "high": [4.8, None, 0.42, None]},
    "action_space": {"type": "discrete", "n": 2},
    "obs_normalizer": {"mean": [0.0, 0.1, 0.0, 0.0], "var": [1.0, 2.0, 1.0, 1.0], "clip": 10.0, "epsilon": 1e-8,
                       "dtype": "float64", "formula": "clip((obs - mean) / sqrt(var + epsilon), -clip, clip)"},
    "onnx_sha256": "0" * 64, "quant": {"mode": "int8-block"}, "acting": "greedy",
    "env": {"env_id": "CartPole-v1", "env_kwargs": {}, "wrappers": [], "frame_stack": 1},
}


@FUZZ
@given(text=_mutated(GOOD_SIDECAR))
def test_a_sidecar_is_spaces_and_statistics_that_mean_something_or_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(text)
    try:
        record = read_sidecar(path)
    except QuarlError as exc:
        _one_line(exc, str(path))
        return
    assert isinstance(record, SidecarRecord)
    observation, action = record.observation_space.space(), record.action_space.space()
    assert 1 <= math.prod(observation.shape or ()) <= 10**7 and action.shape is not None
    assert 0 <= record.n_quantiles <= 10_000
    norm = record.obs_normalizer
    if norm is not None:
        n = math.prod(observation.shape or ())
        assert len(norm.mean) == len(norm.var) == n and min(norm.var) >= 0 and norm.clip > 0 and norm.epsilon > 0
        assert all(math.isfinite(v) for v in [*norm.mean, *norm.var, norm.clip, norm.epsilon])


def test_the_good_sidecar_reads_as_written_and_a_deep_one_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(GOOD_SIDECAR))
    record = read_sidecar(path)
    box = record.observation_space.space()
    assert box.low.tolist()[0] == pytest.approx(-4.8) and math.isinf(box.high[1]) and record.action_space.space().n == 2
    path.write_text(json.dumps({**GOOD_SIDECAR, "obs_normalizer": {**GOOD_SIDECAR["obs_normalizer"],
                                                                   "mean": [0.0] * 3}}))
    with pytest.raises(QuarlError, match=r"policy.json: field obs_normalizer.mean: obs_normalizer mean has 3 values; "
                                         r"the observation has 4$"):
        read_sidecar(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(QuarlError, match=r"policy.json: (JSON nested too deeply|not JSON)"):
        read_sidecar(path)


# ---------------------------------------------------------------------------- ActorQ summary.json

GOOD_SUMMARY = actorq_summary(
    config={"algo": "dqn", "env_id": "CartPole-v1", "actor_precision": "int8", "actors": 2},
    evals=[[1.5, 1, 20.0, 500], [3.0, 2, 35.0, 1000]], final_running_mean=27.5, env_steps=1000, learner_steps=50,
    broadcast={"bytes": 4e6, "build_s": 0.2, "version": 2.0}, actor_nodes={"0": ["local"], "1": ["local"]},
    mismatch={"kl": 0.01, "rho_mean": 1.0})


@FUZZ
@given(text=_mutated(GOOD_SUMMARY))
def test_a_summary_is_counts_and_times_that_mean_something_or_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "summary.json"
    path.write_text(text)
    try:
        summary = ActorQSummary.read(path)
    except QuarlError as exc:
        _one_line(exc, str(path))
        return
    for name in ("env_steps", "learner_steps", "weight_versions", "pulls", "loads", "restarts", "episodes"):
        count = getattr(summary, name)
        assert type(count) is int and count >= 0
    for name in ("elapsed_s", "env_steps_per_s", "actor_busy_ms_per_step", "learner_busy_s"):
        value = getattr(summary, name)
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    assert all(isinstance(row, list) and 3 <= len(row) <= 4 for row in summary.evals)
    assert summary.to_json() == {**json.loads(text), **{k: v for k, v in summary.to_json().items()
                                                        if k not in json.loads(text)}}  # kept as stored


@FUZZ
@given(text=_mutated(GOOD_SUMMARY))
def test_an_actorq_runs_algo_and_env_are_strings_or_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "summary.json"
    path.write_text(text)
    try:
        config = read_run_config(path)
    except QuarlError as exc:
        _one_line(exc, str(path))
        return
    stored = json.loads(text)["config"]
    assert (config.algo, config.env_id) == (stored["algo"], stored["env_id"])


def test_the_summary_record_is_the_summarys_fields() -> None:
    import dataclasses

    assert set(ActorQSummaryRecord.model_fields) == {f.name for f in dataclasses.fields(ActorQSummary)}


# ---------------------------------------------------------------------------- results.jsonl

KEY = {"precision": "int8", "episodes": 3, "seed": 5, "max_steps": 200, "policy_sha256": "ab" * 32,
       "config": {"bits": 8}, "env": {"env_id": "CartPole-v1"}, "format": 14}
GOOD_LINE = {**KEY, "algo": "ppo", "checkpoint": "a.zip", "env_id": "CartPole-v1", "mean": 28.0,
             "std": math.sqrt(8 / 3), "returns": [26.0, 30.0, 28.0], "lengths": [26, 30, 28],
             "quant": {"mode": "int8-block"},
             "steps_per_s": 1000.0, "latency_us": 12.5, "model_bytes": 232, "build_s": 0.5,
             "endings": ["a", "b", "c"], "acting": "greedy", "sticky_actions": None, "provenance": {"quarl": "0"}}
MEASURED = [k for k in GOOD_LINE if k not in KEY]


@FUZZ
@given(field=st.sampled_from(MEASURED), value=JSONISH, junk=st.lists(st.one_of(st.text(max_size=20), JSONISH.map(
    json.dumps)), max_size=3))
def test_a_stored_cell_is_its_measurements_or_one_line_naming_its_line(tmp_path: Path, field: str, value: Any,
                                                                       junk: list[str]) -> None:
    path = tmp_path / "results.jsonl"
    line = {**GOOD_LINE, field: value}
    content = "".join(j + "\n" for j in junk) + json.dumps(line) + "\n"
    path.write_text(content)
    try:
        found = ResultsLog(path).find(StoredCell, **KEY)
    except QuarlError as exc:
        assert _one_line(exc, f"{path} line {len(content.splitlines())}: field {field}")
        return
    if disagreement(json.loads(json.dumps(line))):  # a mean that is not its returns', or a non-finite return
        assert found is None  # evaluated again, never reused as it is
        return
    assert found == json.loads(json.dumps(line))  # as stored
    record = EvalRecord.from_dict(found)
    assert all(type(n) is int and n >= 0 for n in record.lengths) and isinstance(record.env_id, str)
    assert record.steps_per_s is None or (math.isfinite(record.steps_per_s) and record.steps_per_s >= 0)


def test_results_lines_that_are_no_record_are_skipped_and_a_wrong_type_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('[1, 2]\n"x"\n{"precision": \n' + "[" * 100_000 + "\n")
    assert ResultsLog(path).find(StoredCell, **KEY) is None
    path.write_text(json.dumps(GOOD_LINE) + "\n" + json.dumps({**GOOD_LINE, "lengths": [26, "30", 28]}) + "\n")
    with pytest.raises(QuarlError, match=r"results.jsonl line 2: field lengths.1: Input should be a valid integer "
                                         r"\(got '30'\)$"):
        ResultsLog(path).find(StoredCell, **KEY)
    assert ResultsLog(path).find(StoredCell, **{**KEY, "seed": 6}) is None  # another cell's line is not read


def test_a_stored_cell_is_checked_by_the_eval_records_own_fields() -> None:
    import dataclasses

    measured = [f.name for f in dataclasses.fields(EvalRecord)]
    assert list(StoredCell.model_fields)[-len(measured):] == measured  # made from it: no second definition


# ---------------------------------------------------------------------------- the study store


def _store_record() -> StudyRecord:
    result = EvalRecord.from_dict(GOOD_LINE)
    return StudyRecord("a.zip", "ab" * 32, "int8", "k1", 5, 3, 200, "ppo CartPole-v1", "ppo", result, 3.5, "host",
                       {"quarl": "0"}, "2025-01-01T00:00:00")


SQL_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True),
                       st.text(max_size=12), JSONISH.map(json.dumps))


@FUZZ
@given(column=st.sampled_from(["seed", "episodes", "max_steps", "policy", "mean", "std", "returns", "lengths",
                               "quant", "steps_per_s", "model_bytes", "endings", "wall_s", "host", "provenance",
                               "finished_at"]), value=SQL_VALUES)
def test_a_store_row_is_a_study_record_or_one_line_naming_the_row(tmp_path: Path, column: str, value: Any) -> None:
    path = tmp_path / "study.sqlite"
    for stale in tmp_path.glob("study.sqlite*"):  # tmp_path is shared by the examples
        stale.unlink()
    store = StudyStore(path)
    try:
        store.insert(_store_record())
        try:
            with store.db:
                store.db.execute(f"UPDATE cells_v2 SET {column} = ?", [value])
        except sqlite3.IntegrityError:  # NOT NULL: SQLite itself keeps it out
            assume(False)
        try:
            records = store.records()
        except QuarlError as exc:
            _one_line(exc, f"{path} (cells_v2 row 1)")
            return
    finally:
        store.close()
    if not records:  # left out: its mean or std is not that of its finite returns
        assert column in ("mean", "std", "returns", "lengths")
        return
    (record,) = records
    assert isinstance(record.seed, int) and isinstance(record.result.returns, list)
    assert disagreement(record.result.to_dict()) is None
    assert record.wall_s is None or (math.isfinite(record.wall_s) and record.wall_s >= 0)
    assert record.provenance is None or isinstance(record.provenance, dict)


def test_the_stored_record_reads_back_as_written(tmp_path: Path) -> None:
    store = StudyStore(tmp_path / "study.sqlite")
    store.insert(_store_record())
    assert store.records() == [_store_record()]
    with store.db:
        store.db.execute("UPDATE cells_v2 SET returns = ?", ["[1.0, 2.0"])
    with pytest.raises(QuarlError, match=r"study.sqlite \(cells_v2 row 1\) column returns: not JSON"):
        store.records()
    store.close()


# ---------------------------------------------------------------------------- recovery files


def _good_state() -> dict[str, Any]:
    rounds = [RoundStats(0, 100, 100, 0.25, 0.9, 30.0, 1.5, "keeps").to_dict()]
    spec = {"mode": "int8-block", "keep": [], "block_size": 32, "int8_weights": "asymmetric", "compute_int8": True}
    return {"format": RECOVERY_FORMAT, "teacher": "ab" * 32, "spec": spec, "config": {"rounds": 2},
            "student": {"w": torch.zeros(2, 2)}, "optimizer": {"state": {}, "param_groups": []},
            "states": torch.zeros(100, 4), "heldout": torch.zeros(10, 4), "history": rounds, "best_agreement": 0.9,
            "best_round": 0, "best_student": {"w": torch.ones(2, 2)}, "updates": 100, "seeds": [20000, 20001],
            "target": 0.8}


@FUZZ
@given(key=st.sampled_from(list(_good_state()) + ["history.0.loss", "history.0.round", "unknown"]),
       value=st.one_of(HOSTILE_SCALARS, st.lists(HOSTILE_SCALARS, max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                               HOSTILE_SCALARS,
                                                                                               max_size=3)))
def test_a_recovery_state_is_a_resumable_round_or_one_line(tmp_path: Path, key: str, value: Any) -> None:
    saved = _good_state()
    if key.startswith("history."):
        saved["history"][0][key.split(".")[-1]] = value
    else:
        saved[key] = value
    path = tmp_path / "state.pt"
    torch.save(saved, path)
    try:
        state = read_state(path)
    except QuarlError as exc:
        text = _one_line(exc, str(path))
        assert text.endswith("start afresh") or text.endswith("start the recovery afresh")
        return
    assert state["format"] == RECOVERY_FORMAT and isinstance(state["states"], torch.Tensor)
    assert all(type(h) is RoundStats and isinstance(h.loss, float) for h in state["history"])
    assert type(state["updates"]) is int and state["updates"] >= 0


GOOD_RECOVERY = {**_good_record(), "automatic_choice": {"mode": "int4-block", "agreement": 0.9}, "shipped": "student",
                 "shipped_stage": "distill", "against_ptq": {"kept": True, "verdict": "at least as good", "e": 1.5,
                                                             "low": -2.0, "high": None, "episodes": 32,
                                                             "means": [10.0, 10.5]},
                 "distill_stopped": "target", "best_round": 0}
"""A whole recovery.json (every field of RecoveryJson) of a student written."""


def test_the_whole_recovery_record_reads_back_as_written(tmp_path: Path) -> None:
    """The record the fuzz test damages is one recover could have written: it reads back whole."""
    path = tmp_path / "recovery.json"
    path.write_text(json.dumps(GOOD_RECOVERY))
    assert read_recovery_record(path) == GOOD_RECOVERY
    path.write_text(json.dumps({**GOOD_RECOVERY, "kernel": {**GOOD_RECOVERY["kernel"], "keep": [0.5]}}))
    with pytest.raises(QuarlError, match=r"recovery.json: field kernel.keep.0: Input should be a valid integer"):
        read_recovery_record(path)


@FUZZ
@given(text=_mutated(GOOD_RECOVERY))
def test_a_recovery_record_names_its_hashes_or_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "recovery.json"
    path.write_text(text)
    try:
        record = read_recovery_record(path)
    except QuarlError as exc:
        _one_line(exc, str(path))
        return
    assert record == json.loads(text)  # as written
    assert record["precision"] in ("int8", "int4") and isinstance(record["kernel"]["block_size"], int)
    assert all(isinstance(h, str) for h in (record["original"]["zip_sha256"], record["recovered"]["zip_sha256"],
                                            record["recovered"]["onnx_sha256"]))
    # what the CLI prints again when the folder is reused: finite, printable, consistent
    assert all(0 <= x <= 1 for x in (record["agreement"], record["ptq_agreement"], record["target_agreement"]))
    for test in (record["against_fp32"], record["against_ptq"], *(s["against_ptq"] for s in record["stages"])):
        assert all(abs(test.get(x) or 0) <= 1e12 for x in ("e", "low", "high"))
        assert "means" not in test or (len(test["means"]) == 2 and test.get("episodes"))
    budget = record["budget"]
    assert -1 <= record["best_round"] <= len(record["rounds"]) <= budget["rounds_played"] <= budget["rounds"]
    assert record["shipped"] == "ptq" or record["shipped_stage"]
