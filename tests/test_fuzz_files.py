"""Property tests over the file readers: generated hostile content (random JSON shapes, wrong
types, huge numbers, NaN, deep nesting, truncated and bit-flipped zips, arrays claiming
terabytes) ends either in the documented result or in a QuarlError of one line; a file
that claims a big size takes no memory for it (peak memory of a child process)."""

from __future__ import annotations

import io
import json
import math
import os
import resource
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from quarl.actorq.run_state import RunState, RunStateRecord
from quarl.actorq.run_state import check_state as _check_state
from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_json, parse_record
from quarl.core.limits import check_tensors, open_zip, read_capped, read_zip_entry
from quarl.quantization.config import QATConfig, QATState
from quarl.training.checkpoint_arrays import ARRAYS_CAP, ReplayPosition, load_arrays, load_replay, replay_arrays
from quarl.training.hyperparams import ZooEntry
from quarl.training.periodic_saves import CheckpointData
from quarl.training.qat_sb3 import read_qat_state

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

HOSTILE_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([10**400, -(10**400), 0, -1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]),
    st.text(max_size=12), st.sampled_from(["1", "nan", "Infinity", "", "[/]", "²"]),
)
JSONISH = st.recursive(HOSTILE_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


def _one_line(exc: QuarlError, starts: str) -> str:
    text = str(exc)
    assert "\n" not in text and text.startswith(starts), text
    return text


# ---------------------------------------------------------------------------- records


RECORDS = [QATState, RunStateRecord, CheckpointData, ZooEntry, ReplayPosition]


@FUZZ
@given(record_type=st.sampled_from(RECORDS), data=JSONISH)
def test_any_parsed_object_is_a_record_or_one_line_naming_the_field(record_type: type, data: Any) -> None:
    try:
        record = parse_record(record_type, data, "f.json")
    except QuarlError as exc:
        text = _one_line(exc, "f.json: ")
        assert text.startswith("f.json: field ") or "nested too deeply" in text, text
        return
    assert isinstance(record, record_type)
    for value in record.model_dump().values():  # strict and finite: what was accepted means something
        if isinstance(value, float):
            assert math.isfinite(value) or record_type is QATState


def test_deep_nesting_is_one_line() -> None:
    deep: Any = 0
    for _ in range(100_000):  # built without recursion; deeper than Python's stack
        deep = [deep]
    for record_type in (QATState, RunStateRecord, ReplayPosition, CheckpointData):
        with pytest.raises(QuarlError) as caught:
            parse_record(record_type, {"layers": deep, "config": deep, "env_steps": deep, "pos": deep}, "f.json")
        _one_line(caught.value, "f.json: field ")
    # a zoo entry keeps the keys quarl does not act on as they are (they go to SB3's checks)
    assert parse_record(ZooEntry, {"gamma": deep}, "f.json").model_extra == {"gamma": deep}
    with pytest.raises(QuarlError,
                       match=r"^f.json: field n_envs: Input should be a valid integer \(got \[\[\[\.\.\.\]\]\]\)$"):
        parse_record(ZooEntry, {"n_envs": deep}, "f.json")
    with pytest.raises(QuarlError, match="^f.json: JSON nested too deeply: refused$|^f.json: not JSON"):
        parse_json("[" * 100_000 + "]" * 100_000, "f.json")


# ---------------------------------------------------------------------------- qat.json

GOOD_QAT = {"config": {"bits": 4, "quant_delay": 100, "scheme": "quarl", "granularity": "auto", "critic": False},
            "enabled": True,
            "layers": {"q_net.q_net.0": {"quantize": True, "out_min": -1.0, "out_max": 2.0, "w_min": -0.5,
                                         "w_max": 0.5},
                       "q_net.q_net.2": {"quantize": True, "out_min": math.inf, "out_max": -math.inf, "w_min": -1.0,
                                         "w_max": 1.0}}}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    return out


def _mutated(good: dict[str, Any], text_edits: bool = True) -> st.SearchStrategy[str]:
    """JSON text: ``good`` with one value (or the whole) replaced by something hostile, one
    key dropped, or (``text_edits``) the text cut short or a byte flipped."""

    @st.composite
    def build(draw: Any) -> str:
        state = json.loads(json.dumps(good))
        kinds = ["replace", "replace", "drop"] + (["truncate", "flip"] if text_edits else [])
        kind = draw(st.sampled_from(kinds))
        if kind in ("replace", "drop"):
            path = draw(st.sampled_from(_paths(state)))
            if not path:
                return json.dumps(draw(JSONISH))
            parent = state
            for key in path[:-1]:
                parent = parent[key]
            if kind == "drop":
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(JSONISH)
            return json.dumps(state)
        text = json.dumps(state)
        cut = draw(st.integers(0, len(text) - 1))
        if kind == "truncate":
            return text[:cut]
        return text[:cut] + chr(ord(text[cut]) ^ (1 << draw(st.integers(0, 6)))) + text[cut + 1:]

    return build()


def _range_ok(lo: float, hi: float) -> bool:
    return (lo == math.inf and hi == -math.inf) or (math.isfinite(lo) and math.isfinite(hi) and hi > lo)


@FUZZ
@given(text=_mutated(GOOD_QAT))
def test_a_qat_state_is_ranges_that_mean_something_or_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "qat.json"
    path.write_text(text)
    try:
        state = read_qat_state(path, QATConfig(4, 100))
    except QuarlError as exc:
        _one_line(exc, str(path))
        return
    assert isinstance(state.config, QATConfig)
    for layer in state.layers.values():
        assert isinstance(layer.quantize, bool)
        assert _range_ok(layer.out_min, layer.out_max) and _range_ok(layer.w_min, layer.w_max), layer


# ---------------------------------------------------------------------------- limits.py


@FUZZ
@given(size=st.integers(0, 5000), cap=st.integers(0, 5000))
def test_read_capped_reads_what_fits_and_refuses_the_rest(tmp_path: Path, size: int, cap: int) -> None:
    path = tmp_path / "side.json"
    content = os.urandom(size)
    path.write_bytes(content)
    if size <= cap:
        assert read_capped(path, cap, "a side file") == content
    else:
        with pytest.raises(QuarlError, match=rf"has {size} bytes, more than the {cap} allowed"):
            read_capped(path, cap, "a side file")


def _zip_bytes(compression: int) -> tuple[bytes, dict[str, bytes]]:
    entries = {"data": json.dumps({"num_timesteps": 100, "x": list(range(50))}).encode(), "policy.pth": os.urandom(300)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return buffer.getvalue(), entries


@FUZZ
@given(compression=st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]), kind=st.sampled_from(["cut", "flip",
       "overwrite"]), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7), junk=st.binary(min_size=1,
       max_size=16))
def test_a_damaged_zip_reads_as_written_or_is_one_line(tmp_path: Path, compression: int, kind: str, where: float,
                                                       bit: int, junk: bytes) -> None:
    blob, entries = _zip_bytes(compression)
    at = int(where * len(blob))
    if kind == "cut":
        blob = blob[:at]
    elif kind == "flip":
        blob = blob[:at] + bytes([blob[at] ^ (1 << bit)]) + blob[at + 1:]
    else:
        blob = blob[:at] + junk + blob[at + len(junk):]
    path = tmp_path / "model.zip"
    path.write_bytes(blob)
    try:
        with open_zip(path, "a checkpoint") as archive:
            for name, content in entries.items():
                assert read_zip_entry(archive, name, str(path)) == content  # as written, or refused
    except QuarlError as exc:
        _one_line(exc, str(path))


@FUZZ
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=3), value=st.sampled_from([0.5, math.nan, math.inf]),
       cut=st.booleans())
def test_tensors_are_whole_and_finite_or_one_line(shape: list[int], value: float, cut: bool) -> None:
    import torch

    # cut: one stored value posing, by zero strides, as a whole layer
    tensor = torch.full((1,), value).expand(*shape) if cut and shape else torch.full(shape, value)
    try:
        check_tensors({"w": tensor}, "f.pth")
    except QuarlError as exc:
        _one_line(exc, "f.pth: ")
        assert tensor.numel() > tensor.untyped_storage().nbytes() // 4 or not math.isfinite(value)
        return
    assert tensor.numel() == 0 or (math.isfinite(value) and tensor.untyped_storage().nbytes() >= 4 * tensor.numel())


# ---------------------------------------------------------------------------- replay / normalization arrays


def _buffer():
    from stable_baselines3.common.buffers import ReplayBuffer

    return ReplayBuffer(16, gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2), device="cpu")


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@FUZZ
@given(kind=st.sampled_from(["cut", "flip", "value"]), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7),
       key=st.sampled_from(["pos", "full", "rewards", "observations"]), value=JSONISH)
def test_a_replay_checkpoint_restores_a_buffer_that_means_something_or_is_one_line(
        tmp_path: Path, kind: str, where: float, bit: int, key: str, value: Any) -> None:
    saved = _buffer()
    saved.observations[:5] = 0.25
    saved.pos = 5
    arrays = replay_arrays(saved)
    if kind == "value":
        try:
            arrays[key] = np.asarray(value)
        except (ValueError, OverflowError):
            arrays[key] = np.asarray(value, dtype=object)
        if arrays[key].dtype == object:
            assume(False)  # np.savez would pickle it: not a file quarl writes or reads
    blob = _npz(arrays)
    if kind != "value":
        at = int(where * len(blob))
        blob = blob[:at] if kind == "cut" else blob[:at] + bytes([blob[at] ^ (1 << bit)]) + blob[at + 1:]
    path = tmp_path / "rl_model_5_steps.replay.npz"
    path.write_bytes(blob)
    buffer = _buffer()
    try:
        load_replay(buffer, load_arrays(path), path)
    except QuarlError as exc:
        _one_line(exc, str(path))
        return
    assert 0 <= buffer.pos < buffer.buffer_size and isinstance(buffer.full, bool)
    assert buffer.observations.shape == saved.observations.shape and np.isfinite(buffer.rewards).all()


# ---------------------------------------------------------------------------- ActorQ state


@FUZZ
@given(key=st.sampled_from(["env_steps", "learner_steps", "version", "elapsed_s", "evals", "actor_steps", "restarts",
                            "actor_times", "time_to_reward_s", "unknown"]), value=JSONISH)
def test_an_actorq_state_is_counters_that_mean_something_or_one_line(key: str, value: Any) -> None:
    raw = {"env_steps": 1000, "learner_steps": 50, "version": 3, "elapsed_s": 12.5, "evals": [(1.0, 1, 20.0, 500)]}
    raw[key] = value
    try:
        state = _check_state(Path("checkpoint.pt"), raw)
    except QuarlError as exc:
        _one_line(exc, "checkpoint.pt")
        return
    assert isinstance(state, RunState)
    for name in ("env_steps", "learner_steps", "version", "restarts"):
        count = getattr(state, name)
        assert isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 10**15
    assert math.isfinite(state.elapsed_s) and state.elapsed_s >= 0


# ---------------------------------------------------------------------------- memory


def _npy_claiming(shape: tuple[int, ...], data: bytes = b"\0" * 64) -> bytes:
    from numpy.lib import format as npy

    buffer = io.BytesIO()
    npy.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


CHILD_ADDRESS_SPACE = 3 << 30
"""Bytes of address space the reading child may map: torch and SB3 imported take ~1.5 GB."""
CHILD = r"""
import sys, zipfile
from pathlib import Path
from quarl.core.errors import QuarlError
from quarl.core.limits import open_zip, read_zip_entry
from quarl.training.checkpoint_arrays import load_arrays
for name in sys.argv[1:]:
    path = Path(name)
    try:
        if path.suffix == ".npz":
            load_arrays(path)
        else:
            with open_zip(path, "a checkpoint") as archive:
                read_zip_entry(archive, "data", name)
        print("READ", name)
    except QuarlError as exc:
        print(exc)
"""


def test_files_claiming_huge_sizes_take_no_memory_for_them(tmp_path: Path) -> None:
    """An npz whose array header claims 8 TB, one that claims just over the arrays' cap and
    deflates from a few kB, and a zip entry whose header declares 10^12 bytes: each one line,
    and the child that read all three peaked far below the sizes claimed."""
    files = []
    terabytes = tmp_path / "a.replay.npz"
    with zipfile.ZipFile(terabytes, "w") as archive:
        archive.writestr("observations.npy", _npy_claiming((10**6, 10**6)))
    files.append(terabytes)
    over_cap = tmp_path / "b.replay.npz"
    with zipfile.ZipFile(over_cap, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("rewards.npy", _npy_claiming((ARRAYS_CAP // 8 + 16,), b"\0" * (8 << 20)))
    files.append(over_cap)
    declared = tmp_path / "c.zip"
    with zipfile.ZipFile(declared, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", b"{}")
    blob = bytearray(declared.read_bytes())
    central = blob.rindex(b"PK\x01\x02")
    blob[central + 24: central + 28] = (2**32 - 1).to_bytes(4, "little")  # uncompressed size: 4 GB
    declared.write_bytes(bytes(blob))
    files.append(declared)
    def bounded() -> None:  # the child may map at most this much, whatever a file claims
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))

    proc = subprocess.Popen([sys.executable, "-c", CHILD, *map(str, files)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=bounded)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = out.splitlines()
    assert proc.returncode == 0 and len(lines) == 3, out[-2000:]
    assert "array 'observations.npy' brings the arrays to 8,000,000,000,000 bytes, more than the" in lines[0]
    assert f"array 'rewards.npy' brings the arrays to {ARRAYS_CAP + 128:,} bytes" in lines[1]
    assert "entry 'data' declares 4294967295 bytes" in lines[2] and "zip bomb" in lines[2]
    assert usage.ru_maxrss / 1024 < 1024, usage.ru_maxrss  # MB, against 8 TB, 1 GB and 4 GB claimed


# ---------------------------------------------------------------------------- int mode choice cache

_SUMMARY = {"mode": "int8-block", "fp32_layers": [2], "agreement": 1.0, "kl": 0.0, "sampled_agreement": 1.0,
            "latency_us": 23.5, "fp32_ort_latency_us": 30.1, "model_bytes": 4096, "calibration_return": 500.0,
            "calibration_episodes": 4, "calibration_verdict": "keeps"}
GOOD_CHOICE = {"mode": "int8-block", "keep": [2], "chosen": _SUMMARY,
               "tried": [_SUMMARY, {**_SUMMARY, "fp32_layers": []}]}
_MODES = {"int8-block", "int8-dyn-channel"}


def _load_choice(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> dict | None:
    from quarl.quantization import choice_cache

    folder = tmp_path / "cache"
    folder.mkdir(exist_ok=True)
    (folder / "k.json").write_text(text)
    monkeypatch.setenv(choice_cache.CACHE_ENV, str(folder))
    return choice_cache.load("k", _MODES, 3)


def _uses_like_quantize_int(entry: dict) -> None:
    """What a cache hit does with an entry (quarl.quantization.precisions: _rebuild's numbers,
    _explain's lines over every mode tried): no KeyError, ValueError or TypeError."""
    from quarl.quantization.precisions import _explain

    chosen = entry["chosen"]
    for name in ("latency_us", "fp32_ort_latency_us", "calibration_return"):
        assert chosen[name] is None or math.isfinite(float(chosen[name]))
    int(chosen["calibration_episodes"] or 0), str(chosen["calibration_verdict"] or "")
    assert entry["mode"] in _MODES and all(isinstance(i, int) and 0 <= i < 3 for i in entry["keep"])
    _explain("int8", chosen, entry["tried"], True)


@st.composite
def _choice_texts(draw: Any) -> str:
    """A stored choice with one field anywhere (a mode tried included) of a hostile value,
    a field dropped, the text cut or flipped, or a value nested 100 to 100,000 deep."""
    kind = draw(st.sampled_from(["mutated", "tried", "deep"]))
    if kind == "mutated":
        return draw(_mutated(GOOD_CHOICE))
    state = json.loads(json.dumps(GOOD_CHOICE))
    where = draw(st.sampled_from(["chosen", "tried", "keep", "mode", "top"]) if kind == "deep" else st.just("tried"))
    field = draw(st.sampled_from(sorted(_SUMMARY)))
    if kind == "tried":
        state["tried"][draw(st.integers(0, 1))][field] = draw(JSONISH)
        return json.dumps(state)
    depth = draw(st.sampled_from([100, 1_000, 100_000]))
    deep = "[" * depth + "]" * depth
    if where == "top":
        return deep
    if where == "tried":
        state["tried"][0][field] = "DEEP"
    else:
        state[where] = "DEEP"
    return json.dumps(state).replace('"DEEP"', deep)


@FUZZ
@given(text=_choice_texts())
def test_a_cached_choice_is_one_that_fits_or_is_ignored_with_a_warning(tmp_path: Path, text: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Issue 38: a cache entry nested 100,000 deep raised RecursionError, one with a field of
    the wrong type KeyError / ValueError on a cache hit. The cache is only a cache: an entry
    that is no stored choice is ignored (a warning naming the file) and the choice made
    afresh; one that is read works as a cache hit uses it."""
    caplog.clear()
    with pytest.MonkeyPatch.context() as monkeypatch:
        with caplog.at_level("WARNING", logger="quarl.quantization.choice_cache"):
            entry = _load_choice(tmp_path, text, monkeypatch)
    if entry is None:
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "ignoring the int mode cache entry" in warned[0] and "k.json" in warned[0]
        assert "choosing afresh" in warned[0] and "\n" not in warned[0]
        return
    _uses_like_quantize_int(entry)


def test_the_good_cached_choice_reads_as_written_and_deep_ones_are_ignored(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load_choice(tmp_path, json.dumps(GOOD_CHOICE), monkeypatch) == GOOD_CHOICE
    older = json.loads(json.dumps(GOOD_CHOICE))
    for summary in (older["chosen"], *older["tried"]):  # lacks measures: chosen afresh, never half-read
        del summary["kl"], summary["sampled_agreement"]
    assert _load_choice(tmp_path, json.dumps(older), monkeypatch) is None
    for depth in (65, 100_000):
        text = json.dumps({**GOOD_CHOICE, "chosen": "DEEP"}).replace('"DEEP"', "[" * depth + "]" * depth)
        assert _load_choice(tmp_path, text, monkeypatch) is None
    bad = {**GOOD_CHOICE, "chosen": {**_SUMMARY, "latency_us": "fast"}}
    assert _load_choice(tmp_path, json.dumps(bad), monkeypatch) is None


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_a_zip_whose_data_nests_deep_is_one_line(tmp_path: Path, depth: int) -> None:
    """An SB3 zip whose ``data`` entry nests 100,000 deep raised RecursionError: one line,
    whatever reads it (loading a policy, or the training checkpoint reader)."""
    import stable_baselines3 as sb3

    from quarl.checkpoints import load_checkpoint
    from quarl.training.periodic_saves import read_checkpoint_data

    good = tmp_path / "ppo.zip"
    sb3.PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu", n_steps=64).save(good)
    with zipfile.ZipFile(good) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    data = json.loads(entries["data"])
    data["policy_kwargs"] = "DEEP"
    entries["data"] = json.dumps(data).replace('"DEEP"', "[" * depth + "]" * depth).encode()
    crafted = tmp_path / "deep.zip"
    with zipfile.ZipFile(crafted, "w") as z:
        for name, blob in entries.items():
            z.writestr(name, blob)
    for read in (load_checkpoint, read_checkpoint_data):
        with pytest.raises(QuarlError) as caught:
            read(crafted)
        text = _one_line(caught.value, str(crafted))
        assert "nested" in text and "refused" in text, text
