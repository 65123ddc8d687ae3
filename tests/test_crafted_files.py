"""Crafted files and absurd sizes are refused in one line before memory is taken: each
case runs quarl's CLI in a child interpreter (one for the module, the cases one after
another), and the case's peak memory is read from the kernel (VmHWM, reset before it)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import stable_baselines3 as sb3
import torch

from tests.conftest import run_cli

PEAK_LIMIT_MB = 1024


_SERVE = r"""
import json, os, sys, traceback

from typer.testing import CliRunner

from quarl.cli import app


def peak_kb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


for line in sys.stdin:
    args, env = json.loads(line)
    os.environ.clear()
    os.environ.update(env)
    with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark from here: this case's own peak
        refs.write("5")
    result = CliRunner().invoke(app, args)
    err = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):  # as the script prints it
        err += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(result.exception))
        code = 1
    print(json.dumps([code, err, peak_kb()]), flush=True)
"""
"""A child interpreter that runs quarl's CLI for each case sent to it, one after another, and
answers each with the exit status, stderr and the case's own peak resident memory: the kernel's
high-water mark, reset before the case (``/proc/self/clear_refs``) and read after it. One
interpreter for the module instead of one per case (each started torch, ONNX Runtime and SB3
anew: 2 s a case); the peak is the process's own, not the test worker's it was forked from."""

_server: subprocess.Popen | None = None


def _popen_peak(*args: str) -> tuple[int, str, float]:
    """(exit status, stderr, peak resident MB) of ``quarl ARGS`` run by the module's child
    interpreter (:data:`_SERVE`), in this process's environment as it is now."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert _server.stdin is not None and _server.stdout is not None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    _server.stdin.write(json.dumps([list(args), env]) + "\n")
    _server.stdin.flush()
    answer = _server.stdout.readline()
    assert answer, f"the child running quarl {' '.join(args)} ended ({_server.wait()})"
    code, err, peak_kb = json.loads(answer)
    return code, err, peak_kb / 1024


@pytest.fixture(scope="module", autouse=True)
def _stop_the_server() -> Iterator[None]:
    yield
    if _server is not None and _server.poll() is None:
        _server.stdin.close()  # type: ignore[union-attr]
        _server.wait(timeout=60)


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def _sb3_zip(tmp_path: Path) -> Path:
    path = tmp_path / "ppo.zip"
    sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu").save(path)
    return path


def _rewrite(src: Path, dst: Path, replace: dict[str, bytes | Path]) -> Path:
    """A copy of the zip ``src`` with some entries replaced (deflated)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.filename not in replace:
                zout.writestr(item, zin.read(item.filename))
        for name, content in replace.items():
            if isinstance(content, Path):
                zout.write(content, name)
            else:
                zout.writestr(name, content)
    return dst


def _policy_pth(sd: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def test_a_zip_entry_that_inflates_past_its_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    bomb = tmp_path / "zeros"
    with bomb.open("wb") as fh:  # 400 MB of zeros: ~0.4 MB deflated
        block = bytes(2**20)
        for _ in range(400):
            fh.write(block)
    crafted = _rewrite(_sb3_zip(tmp_path), tmp_path / "bomb.zip", {"policy.pth": bomb})
    bomb.unlink()
    assert crafted.stat().st_size < 3 * 2**20
    code, err, peak = _popen_peak("ptq", str(crafted), "--env", "CartPole-v1", "--episodes", "1")
    assert code == 2 and "policy.pth" in _one_line(err) and "zip bomb" in err
    assert peak < PEAK_LIMIT_MB, peak


def test_an_entry_whose_header_lies_about_its_size_is_refused(tmp_path: Path) -> None:
    crafted = _rewrite(_sb3_zip(tmp_path), tmp_path / "liar.zip", {"policy.pth": bytes(8 * 2**20)})
    raw = bytearray(crafted.read_bytes())
    central = raw.rfind(b"policy.pth", 0, raw.rfind(b"PK\x05\x06"))  # the central directory's name
    header = central - 46  # its fixed-size record precedes the name
    assert raw[header:header + 4] == b"PK\x01\x02"
    raw[header + 24:header + 28] = (1000).to_bytes(4, "little")  # uncompressed size: 1000 bytes
    crafted.write_bytes(bytes(raw))
    r = run_cli("ptq", str(crafted), "--env", "CartPole-v1", "--episodes", "1")
    assert r.returncode == 2 and "liar.zip" in _one_line(r.stderr)


def test_tensors_claiming_a_huge_layer_are_refused_before_any_is_built(tmp_path: Path) -> None:
    src = _sb3_zip(tmp_path)
    with zipfile.ZipFile(src) as z:
        sd = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True)
    sd["mlp_extractor.policy_net.0.weight"] = torch.zeros(1).expand(10**8, 4)  # one value posing as 4e8
    crafted = _rewrite(src, tmp_path / "wide.zip", {"policy.pth": _policy_pth(sd)})
    assert crafted.stat().st_size < 1 * 2**20
    code, err, peak = _popen_peak("ptq", str(crafted), "--env", "CartPole-v1", "--episodes", "1")
    line = _one_line(err)
    assert code == 2 and "mlp_extractor.policy_net.0.weight" in line and "claims shape (100000000, 4)" in line
    assert peak < PEAK_LIMIT_MB, peak


def test_too_many_parameters_in_real_tensors_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARL_MAX_PARAMETERS", "1000")
    r = run_cli("ptq", str(_sb3_zip(tmp_path)), "--env", "CartPole-v1", "--episodes", "1")
    assert r.returncode == 2 and "more than 1000 parameters" in _one_line(r.stderr)


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    src = _sb3_zip(tmp_path)
    with zipfile.ZipFile(src) as z:
        sd = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True)
    sd["action_net.weight"][0, 0] = float("nan")
    crafted = _rewrite(src, tmp_path / "nan.zip", {"policy.pth": _policy_pth(sd)})
    r = run_cli("ptq", str(crafted), "--env", "CartPole-v1", "--precisions", "int8", "--episodes", "1")
    line = _one_line(r.stderr)
    assert r.returncode == 2 and "'action_net.weight' holds 1 non-finite values" in line


@pytest.mark.parametrize("args,message", [
    (["--policy-layers", "1000000,1000000"], "hold 1000004000001 parameters, more than"),
    (["--max-minutes", "nan"], "max-minutes=nan must be a finite number"),
    (["--target-reward", "nan"], "target-reward=nan must be a finite number"),
])
def test_actorq_prices_and_checks_its_options_before_it_starts(tmp_path: Path, args: list[str], message: str) -> None:
    r = run_cli("actorq", "run", "CartPole-v1", "--local", "--out", str(tmp_path / "aq"), *args)
    assert r.returncode == 2 and message in _one_line(r.stderr)
    assert not (tmp_path / "aq" / "policy.pt").exists()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """An fp32 export of an SB3 CartPole policy with an observation normalizer in its sidecar."""
    import json

    tmp = tmp_path_factory.mktemp("export")
    r = run_cli("export", str(_sb3_zip(tmp)), "--env", "CartPole-v1", "--precision", "fp32", "--out", str(tmp / "fp32"))
    assert r.returncode == 0, r.stderr
    out = tmp / "fp32" / "policy"
    meta = json.loads(out.with_suffix(".json").read_text())
    meta["obs_normalizer"] = {"mean": [0.0] * 4, "var": [1.0] * 4, "clip": 10.0, "epsilon": 1e-8}
    out.with_suffix(".json").write_text(json.dumps(meta))
    return out


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["obs_normalizer"].update(mean=[0.0] * 3), "obs_normalizer mean has 3 values; the observation has 4"),
    (lambda m: m["obs_normalizer"].update(var=[1.0, -1.0, 1.0, 1.0]), "obs_normalizer var -1.0 must be >= 0.0"),
    (lambda m: m["obs_normalizer"].update(clip="NaN"), "obs_normalizer clip 'NaN' is not a finite number"),
    (lambda m: m["obs_normalizer"].pop("epsilon"), "obs_normalizer epsilon None is not a finite number"),
    (lambda m: m.update(n_quantiles=float("nan")), "n_quantiles nan is not a whole number"),
    (lambda m: m["observation_space"].update(shape=[10**6, 10**6]),
     "observation space size 1000000000000 is not a whole"),
    (lambda m: m["action_space"].update(n=0), "action space size 0 is not a whole number"),
    (lambda m: m.update(onnx_sha256="0" * 64), "its SHA-256 differs from the sidecar's onnx_sha256"),
    (lambda m: m.update(quant={"fp32_layers": [0], "agreement": "high"}), "field quant: not an int mode's summary"),
])
def test_an_edited_sidecar_is_refused_in_one_line(exported: Path, tmp_path: Path, edit, message: str) -> None:
    import json
    import shutil

    onnx = tmp_path / "policy.onnx"
    shutil.copy(exported.with_suffix(".onnx"), onnx)
    meta = json.loads(exported.with_suffix(".json").read_text())
    edit(meta)
    (tmp_path / "policy.json").write_text(json.dumps(meta))  # NaN is written as NaN: not strict JSON, read anyway
    r = run_cli("ptq", str(onnx), "--episodes", "1", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and message in _one_line(r.stderr)


def _crafted_graph(base: Path, kind: str) -> bytes:
    """The export's graph with a crafted end: a NaN head, a head too narrow, a broadcast of
    two fixed initializers, or a batch reshaped into a square (twice)."""
    import numpy as np
    import onnx
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh

    model = onnx.load(str(base))
    nodes, inits = list(model.graph.node), list(model.graph.initializer)
    nodes[-1].output[0] = "q"
    width = 2
    if kind == "nan":
        inits.append(nh.from_array(np.array(0, np.float32), "zero"))
        nodes += [h.make_node("Mul", ["q", "zero"], ["z"]), h.make_node("Div", ["z", "z"], ["out"])]
    elif kind == "narrow":  # the last layer's weights cut to one output
        last = nodes[-1]
        last.output[0] = "out"
        for name in last.input[1:3]:
            tensor = next(t for t in inits if t.name == name)
            array = nh.to_array(tensor)
            tensor.CopyFrom(nh.from_array(array[:1] if array.shape[0] == 2 else array[..., :1], name))
        width = 1
    elif kind == "broadcast":
        inits += [nh.from_array(np.zeros((30000, 1), np.float32), "a"),
                  nh.from_array(np.zeros((1, 30000), np.float32), "b")]
        nodes += [h.make_node("Add", ["a", "b"], ["big"]), h.make_node("ReduceMean", ["big"], ["m"], keepdims=0),
                  h.make_node("Add", ["q", "m"], ["out"])]
    else:  # square
        inits += [nh.from_array(np.array([-1, 1], np.int64), "col"), nh.from_array(np.array([1, -1], np.int64), "row"),
                  nh.from_array(np.array(0, np.float32), "zero")]
        prev = "obs"
        for i in range(2):
            nodes += [h.make_node("Reshape", [prev, "col"], [f"c{i}"]),
                      h.make_node("Reshape", [prev, "row"], [f"r{i}"]),
                      h.make_node("Add", [f"c{i}", f"r{i}"], [f"s{i}"])]
            prev = f"s{i}"
        nodes += [h.make_node("ReduceMean", [prev], ["m"], keepdims=0), h.make_node("Mul", ["m", "zero"], ["m0"]),
                  h.make_node("Add", ["q", "m0"], ["out"])]
    graph = h.make_graph(nodes, "g", list(model.graph.input), [h.make_tensor_value_info("out", TensorProto.FLOAT,
                                                                                         ["batch", width])], inits)
    return h.make_model(graph, opset_imports=model.opset_import).SerializeToString()


@pytest.mark.parametrize("kind,message", [
    ("nan", "outputs NaN or inf for an all-0 observation"),
    ("narrow", "gives outputs of shape (1,) for one observation but its action space Discrete(2) needs 2"),
    ("broadcast", "tensor 'big' holds 900000000 values per observation"),
    ("square", "grows faster than the batch"),
])
def test_an_export_whose_graph_is_no_policy_is_refused_even_with_a_matching_hash(exported: Path, tmp_path: Path,
                                                                                 kind: str, message: str) -> None:
    """Each of these was evaluated with exit 0 (NaN logits, a 1-wide head for 2 actions) or
    took gigabytes (a broadcast of two initializers, a batch squared): one line, exit 2."""
    import hashlib
    import json

    model = _crafted_graph(exported.with_suffix(".onnx"), kind)
    (tmp_path / "policy.onnx").write_bytes(model)
    meta = json.loads(exported.with_suffix(".json").read_text())
    meta["onnx_sha256"] = hashlib.sha256(model).hexdigest()
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    # --out beside the export
    code, err, peak = _popen_peak("ptq", str(tmp_path), "--episodes", "1", "--out", f"{tmp_path}-out")
    assert code == 2 and message in _one_line(err), err[-1500:]
    assert peak < PEAK_LIMIT_MB


def test_the_unedited_export_loads_and_export_refuses_an_onnx(exported: Path, tmp_path: Path) -> None:
    r = run_cli("ptq", str(exported.with_suffix(".onnx")), "--episodes", "2", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    for artifact in (exported.with_suffix(".onnx"), exported.parent):
        r = run_cli("export", str(artifact), "--out", str(tmp_path / "again"))
        assert r.returncode == 2 and "is already an exported model" in _one_line(r.stderr)


@pytest.mark.parametrize("data,message", [
    (b"[]", "its 'data' entry is a JSON list, not an object"),
    (b'"x"', "its 'data' entry is a JSON str, not an object"),
    (b"{not json", "its 'data' entry is not JSON"),
    (b'{"policy_class": {}}', "observation space is missing or unreadable"),
])
def test_a_data_entry_of_the_wrong_shape_is_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    crafted = _rewrite(_sb3_zip(tmp_path), tmp_path / "data.zip", {"data": data})
    r = run_cli("ptq", str(crafted), "--env", "CartPole-v1", "--episodes", "1")
    assert r.returncode == 2 and message in _one_line(r.stderr)


@pytest.mark.parametrize("edit,message", [
    ({"_shape": [30000, 30000], "shape": [30000, 30000], "low": "-1.0", "high": "1.0"},
     "has shape (30000, 30000) (900,000,000 values), more than the 10,000,000 allowed"),
    ({"_shape": [30000, 30000], "shape": [30000, 30000]}, "more than the 10,000,000 allowed"),
    ({"_shape": [-4], "shape": [-4]}, "expected 1 to 4 positive whole sizes"),
    ({"_shape": [4], "shape": [4], "low_repr": "[1 2 3 4 5 6 7 8]", "low": "[1 2 3 4 5 6 7 8]"},
     "space bounds hold 8 values for shape (4,)"),
])
def test_a_space_claiming_a_huge_shape_is_refused_before_any_array_of_it_exists(tmp_path: Path, edit: dict,
                                                                               message: str) -> None:
    """The 30000 x 30000 observation space a crafted data entry claimed took 7.3 GB: now one
    line, exit 2, well under the memory bound."""
    import json

    source = _sb3_zip(tmp_path)
    with zipfile.ZipFile(source) as archive:
        data = json.loads(archive.read("data"))
    data["observation_space"].update(edit)
    crafted = _rewrite(source, tmp_path / "space.zip", {"data": json.dumps(data).encode()})
    code, err, peak = _popen_peak("ptq", str(crafted), "--env", "CartPole-v1", "--episodes", "1")
    assert code == 2 and message in _one_line(err), err[-1000:]
    assert peak < PEAK_LIMIT_MB


@pytest.mark.parametrize("config,message", [
    ("frame_stack: 1000000000\n", "frame_stack=1000000000 must be a whole number in 1..64"),
    ("frame_stack: abc\n", "frame_stack='abc' must be a whole number in 1..64"),
    ("- 1\n", "a YAML list, not the mapping the RL Zoo writes"),
])
def test_a_zoo_config_never_decides_the_memory_or_crashes(tmp_path: Path, config: str, message: str) -> None:
    """A config.yml claiming a billion stacked frames is refused before one is stacked (it
    was killed for memory); other shapes are one line."""
    run = tmp_path / "ppo" / "CartPole-v1_1"
    (run / "CartPole-v1").mkdir(parents=True)
    _sb3_zip(tmp_path).rename(run / "CartPole-v1.zip")
    (run / "CartPole-v1" / "config.yml").write_text(config)
    code, err, peak = _popen_peak("ptq", str(run), "--precisions", "fp32", "--episodes", "1",
                                  "--out", str(tmp_path / "o"))
    assert code == 2 and message in _one_line(err)
    assert peak < PEAK_LIMIT_MB, peak


# --------------------------------------------------------------- side files of a zoo run


def _pickled_array_bomb(shape: tuple[int, ...]) -> bytes:
    """A 200-byte VecNormalize pickle whose statistics ask numpy for ``ndarray(shape)``."""
    import pickle

    def reduce_ndarray() -> bytes:
        return b"cnumpy\nndarray\n" + pickle.dumps(shape, 2)[2:-1] + b"\x85R"

    return (b"\x80\x02cstable_baselines3.common.vec_env.vec_normalize\nVecNormalize\n)\x81"
            b"}(X\x07\x00\x00\x00obs_rms"
            b"cstable_baselines3.common.running_mean_std\nRunningMeanStd\n)\x81"
            b"}(X\x04\x00\x00\x00mean" + reduce_ndarray() + b"X\x03\x00\x00\x00var" + reduce_ndarray() + b"ub" + b"ub.")


def _vecnormalize(tmp_path: Path, **stats) -> Path:
    """A real VecNormalize pickle of CartPole (4 observations) with some statistics replaced."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    for name, value in stats.items():
        setattr(venv.obs_rms, name, value)
    path = tmp_path / "vecnormalize.pkl"
    venv.save(str(path))
    return path


@pytest.mark.parametrize("stats,message", [
    ({"var": np.array([1.0, np.nan, 1.0, 1.0])}, "obs_rms.var holds non-finite values"),
    ({"mean": np.array([0.0, 0.0, np.inf, 0.0])}, "obs_rms.mean holds non-finite values"),
    ({"var": np.array([1.0, -2.0, 1.0, 1.0])}, "obs_rms.var holds negative variances"),
    ({"mean": np.zeros(7)}, "obs_rms.mean has shape (7,) but the policy's observations are (4,)"),
    ({"mean": np.array([0.0, None, 0.0, 0.0], dtype=object)}, "of Python objects: refused"),
])
def test_vecnormalize_statistics_are_checked_before_use(tmp_path: Path, stats: dict, message: str) -> None:
    from quarl.core.errors import QuarlError
    from quarl.policies.safe_load import load_vecnormalize

    path = _vecnormalize(tmp_path, **stats)
    with pytest.raises(QuarlError, match=re.escape(message)):
        load_vecnormalize(path, obs_shape=(4,))


def test_real_vecnormalize_statistics_load_unchanged(tmp_path: Path) -> None:
    from quarl.policies.safe_load import load_vecnormalize

    mean, var = np.array([0.5, -1.0, 0.1, 2.0]), np.array([1.0, 4.0, 0.25, 9.0])
    stats = load_vecnormalize(_vecnormalize(tmp_path, mean=mean, var=var), obs_shape=(4,))
    assert np.array_equal(stats.mean, mean) and np.array_equal(stats.var, var)
    assert type(stats.mean) is np.ndarray  # a plain array, not the checked subclass


def test_a_tiny_pickle_asking_numpy_for_8_gb_is_refused_in_one_line(tmp_path: Path) -> None:
    """It took 8 GB and 76 s, then a traceback; an object array given a short list crashed
    numpy outright."""
    run = tmp_path / "ppo" / "CartPole-v1_1"
    (run / "CartPole-v1").mkdir(parents=True)
    _sb3_zip(tmp_path).rename(run / "CartPole-v1.zip")
    (run / "CartPole-v1" / "config.yml").write_text("normalize: true\n")
    (run / "CartPole-v1" / "vecnormalize.pkl").write_bytes(_pickled_array_bomb((10**9,)))
    code, err, peak = _popen_peak("ptq", str(run), "--precisions", "fp32", "--episodes", "1",
                                  "--out", str(tmp_path / "o"))
    assert code == 2 and "asks for an array of shape (1000000000,) (8000000000 bytes)" in _one_line(err)
    assert peak < PEAK_LIMIT_MB, peak


def _alias_bomb(levels: int = 9) -> str:
    text = 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]\n'
    names = "abcdefghijklmnop"
    for low, high in zip(names[:levels], names[1 : levels + 1], strict=True):
        text += f"{high}: &{high} [" + ", ".join([f"*{low}"] * 10) + "]\n"
    return text


@pytest.mark.parametrize("name,text,message", [
    ("env_kwargs.yml", _alias_bomb(), "expands to more than 100000 values"),
    ("env_kwargs.yml", "a: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested too deeply"),
    ("args.yml", "env: CartPole-v1\n# " + "x" * 2**21 + "\n", "more than the 1048576 allowed for an RL Zoo YAML file"),
])
def test_zoo_yaml_files_are_bounded(tmp_path: Path, name: str, text: str, message: str) -> None:
    """The alias bomb (10^10 values from 500 bytes) took 4.5 GB before it was stopped; the
    2 MB comment kept PyYAML busy for minutes; the nesting was a RecursionError traceback."""
    from quarl.core.errors import QuarlError
    from quarl.policies.safe_load import load_zoo_yaml

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(QuarlError, match=re.escape(message)):
        load_zoo_yaml(path)


def test_a_zoo_yaml_with_a_few_aliases_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "env_kwargs.yml"
    path.write_text("base: &b {x: 1}\nfirst: *b\nsecond: *b\n")
    from quarl.policies.safe_load import load_zoo_yaml

    assert load_zoo_yaml(path) == {"base": {"x": 1}, "first": {"x": 1}, "second": {"x": 1}}


def _sparse(path: Path, size: int) -> Path:
    """A file claiming ``size`` bytes without taking them on disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


@pytest.mark.parametrize("kind", ["legacy", "onnx", "vecnormalize", "actorq"])
def test_files_read_whole_are_refused_past_their_cap_before_they_are_read(tmp_path: Path, kind: str,
                                                                          exported: Path) -> None:
    from quarl.core.errors import QuarlError
    from quarl.core.limits import model_file_cap

    big = model_file_cap() + 1
    with pytest.raises(QuarlError, match="more than the .* allowed for"):
        if kind == "legacy":
            from quarl.policies.legacy import load_legacy

            load_legacy(_sparse(tmp_path / "ppo2" / "CartPole-v1.pkl", big))
        elif kind == "onnx":
            import shutil

            from quarl.policies.onnx_artifact import load_artifact

            folder = tmp_path / "export"
            shutil.copytree(exported.parent, folder)
            model = next(folder.glob("*.onnx"))
            _sparse(model, big)
            load_artifact(model)
        elif kind == "vecnormalize":
            from quarl.policies.safe_load import load_vecnormalize

            load_vecnormalize(_sparse(tmp_path / "vecnormalize.pkl", 64 * 2**20 + 1))
        else:
            from quarl.actorq.run_loader import load_actorq_run

            run = tmp_path / "run"
            (run / "summary.json").parent.mkdir(parents=True)
            (run / "summary.json").write_text('{"config": {"algo": "dqn", "env_id": "CartPole-v1"}}')
            _sparse(run / "policy.pt", big)
            load_actorq_run(run)


def _bomb_onnx(kind: str) -> bytes:
    """A model with the sidecar's input and output whose graph sizes a tensor from the file's
    numbers: 10^10 floats from ConstantOfShape, a convolution padded by 10^6 pixels, or a
    broadcast sum 4.4M values wide per observation."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("obs", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 2])
    if kind == "constant":
        shape = numpy_helper.from_array(np.array([10**10], np.int64), "shape")
        nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="bomb"),
                 helper.make_node("ReduceSum", ["big"], ["total"], keepdims=1),
                 helper.make_node("Gemm", ["obs", "w"], ["out"], transB=1)]
        inits = [shape, numpy_helper.from_array(np.zeros((2, 4), np.float32), "w")]
    elif kind == "broadcast":  # 35 KB of weights, 4.4M values a row: (B, 2100, 1) + (1, 2100)
        nodes = [helper.make_node("MatMul", ["obs", "w1"], ["h"]),
                 helper.make_node("Unsqueeze", ["h", "axis"], ["column"]),
                 helper.make_node("Add", ["column", "row"], ["square"], name="grown"),
                 helper.make_node("ReduceMean", ["square", "axis"], ["back"], keepdims=0),
                 helper.make_node("Gemm", ["back", "w2"], ["out"], transB=1)]
        inits = [numpy_helper.from_array(np.zeros((4, 2100), np.float32), "w1"),
                 numpy_helper.from_array(np.array([2], np.int64), "axis"),
                 numpy_helper.from_array(np.zeros((1, 2100), np.float32), "row"),
                 numpy_helper.from_array(np.zeros((2, 2100), np.float32), "w2")]
    else:
        nodes = [helper.make_node("Reshape", ["obs", "s"], ["img"]),
                 helper.make_node("Conv", ["img", "k"], ["wide"], pads=[10**6] * 4, name="padded"),
                 helper.make_node("Flatten", ["wide"], ["flat"]),
                 helper.make_node("Gemm", ["obs", "w"], ["out"], transB=1)]
        inits = [numpy_helper.from_array(np.array([-1, 1, 2, 2], np.int64), "s"),
                 numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "k"),
                 numpy_helper.from_array(np.zeros((2, 4), np.float32), "w")]
    graph = helper.make_graph(nodes, "crafted", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("kind,message", [
    ("constant", "operator ai.onnx.ConstantOfShape (node 'bomb') is not one a policy network exports to"),
    ("padded", "node 'padded' asks for pads [1000000, 1000000, 1000000, 1000000]"),
    ("broadcast", "tensor 'square' holds 4410000 values per observation: refused (at most 4194304)"),
])
def test_an_onnx_graph_that_sizes_tensors_from_its_own_numbers_is_refused(exported: Path, tmp_path: Path, kind: str,
                                                                          message: str) -> None:
    """A crafted export with a matching sidecar (its SHA-256 updated) is refused before ONNX
    Runtime builds it: only the operators a policy network exports to, padding bounded."""
    import hashlib
    import json

    model = _bomb_onnx(kind)
    (tmp_path / "policy.onnx").write_bytes(model)
    meta = json.loads(exported.with_suffix(".json").read_text())
    meta["onnx_sha256"] = hashlib.sha256(model).hexdigest()
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    r = run_cli("ptq", str(tmp_path / "policy.onnx"), "--episodes", "1", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and message in _one_line(r.stderr)


def test_a_zip_read_closes_the_file_it_opened(tmp_path: Path) -> None:
    """open_zip hands ZipFile an open regular file; closing the archive closes it (ZipFile
    leaves a passed file open, which left one descriptor per checkpoint read to the GC)."""
    import gc
    import warnings

    from quarl.core.limits import open_zip

    path = _sb3_zip(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with open_zip(path, "a checkpoint") as archive:
            fh = archive._owned
            assert "data" in archive.namelist()
        gc.collect()
    assert fh.closed
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def _symbolic_square_onnx(levels: int, features: object = "M", contrib: bool = False) -> bytes:
    """A 1 KB model whose input is ``[N, M]`` (both axes symbolic) that squares the
    flattened batch per level (``x.reshape(-1, 1) + x.reshape(1, -1)``); its output is a
    plain (N, 2) layer, so the model runs. With ``levels=0`` it is a healthy policy with a
    symbolic feature axis; ``contrib`` adds a ``MatMulNBits`` told the wrong input width."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["N", features])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2])
    inits = [numpy_helper.from_array(np.array([-1, 1], np.int64), "col"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "row"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.full((2, 4), 0.1, np.float32), "w")]
    nodes, prev = [], "obs"
    for i in range(levels):
        nodes += [helper.make_node("Reshape", [prev, "col"], [f"c{i}"]),
                  helper.make_node("Reshape", [prev, "row"], [f"r{i}"]),
                  helper.make_node("Add", [f"c{i}", f"r{i}"], [f"s{i}"], name=f"square{i}")]
        prev = f"s{i}"
    if levels:
        nodes += [helper.make_node("ReduceMean", [prev], ["m"], keepdims=0),
                  helper.make_node("Mul", ["m", "zero"], ["m0"]),
                  helper.make_node("Gemm", ["obs", "w"], ["q"], transB=1),
                  helper.make_node("Add", ["q", "m0"], ["out"])]
    elif contrib:
        inits.append(numpy_helper.from_array(np.zeros((2, 1, 16), np.uint8), "packed"))
        inits.append(numpy_helper.from_array(np.ones((2,), np.float32), "scales"))
        nodes.append(helper.make_node("MatMulNBits", ["obs", "packed", "scales"], ["out"], domain="com.microsoft",
                                      K=32, N=2, bits=4, block_size=32, name="nbits"))
    else:
        nodes.append(helper.make_node("Gemm", ["obs", "w"], ["out"], transB=1))
    graph = helper.make_graph(nodes, "symbolic", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


@pytest.mark.parametrize("levels,features,contrib,message", [
    (3, "M", False, "tensor 's0' holds 64 values for 2 observations (16 for 1): it grows faster than the batch, "
                    "refused (at most 2 x its size for one)"),
    (4, "M", False, "tensor 's3' holds 4294967296 values per observation: refused (at most 4194304)"),
    (0, 5, False, "input 'obs' has shape ['N', 5]; an observation batch is [batch, 4]: refused"),
    (0, "M", True, "node 'nbits' takes 32 inputs but is given shape [1, 4]: refused"),
])
def test_an_onnx_export_with_a_symbolic_feature_axis_is_sized_at_the_observation(
        exported: Path, tmp_path: Path, levels: int, features: object, contrib: bool, message: str) -> None:
    """Issue 38: an input ``[N, M]`` left every tensor of unknown size, so the growth check
    saw nothing and ONNX Runtime asked for 17 GiB. Every symbolic axis is now bound to the
    observation's real size (the batch to 1, 2 and 4096) before a session exists: one line,
    exit 2, well under 1 GB."""
    import hashlib
    import json

    model = _symbolic_square_onnx(levels, features, contrib)
    assert len(model) < 2048
    (tmp_path / "policy.onnx").write_bytes(model)
    meta = json.loads(exported.with_suffix(".json").read_text())
    meta["onnx_sha256"] = hashlib.sha256(model).hexdigest()
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    # --out beside the export
    code, err, peak = _popen_peak("ptq", str(tmp_path), "--episodes", "3", "--out", f"{tmp_path}-out")
    assert code == 2 and message in _one_line(err), err[-1500:]
    assert peak < PEAK_LIMIT_MB, peak


def test_a_healthy_export_with_a_symbolic_feature_axis_still_loads(exported: Path, tmp_path: Path) -> None:
    import hashlib
    import json

    from quarl.policies.onnx_artifact import load_artifact

    model = _symbolic_square_onnx(0)
    (tmp_path / "policy.onnx").write_bytes(model)
    meta = json.loads(exported.with_suffix(".json").read_text())
    meta["onnx_sha256"] = hashlib.sha256(model).hexdigest()
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    policy, _ = load_artifact(tmp_path / "policy.onnx")
    out = policy.forward(np.ones((3, 4), np.float32))
    assert out.shape == (3, 2) and np.allclose(out, 0.4)
