"""Hostile use: stored results never shown for another policy, one output folder per
run, and every user mistake answered with one line and exit status 2 (never a traceback)."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
import stable_baselines3 as sb3
from typer.testing import CliRunner

from quarl.cli import app
from quarl.core.errors import QuarlError
from tests.conftest import forget_a_command_that_showed_help, one_command_per_test
from tests.test_cli import quarl, read_csv

runner = CliRunner()


def _cli(*args: str):
    """``quarl ARGS`` in this process; the click command typer makes of the app is made once
    per test (the fuzz's 240 and the properties' 80 commands: 0.1 s each to make, most of
    what a refused command costs), afresh after a help."""
    with one_command_per_test():
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    forget_a_command_that_showed_help(result)
    return result


def _untrained(tmp_path: Path, name: str, seed: int) -> Path:
    """A CartPole PPO that never learned (its returns differ from a trained one's)."""
    path = tmp_path / f"{name}.zip"
    sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), seed=seed, device="cpu").save(path)
    return path


def test_another_policy_in_the_same_out_is_evaluated_anew(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "shared-out"
    weak = _untrained(tmp_path, "weak", 0)
    first = _cli("ptq", str(weak), "--env", "CartPole-v1", "--precisions", "fp32", "--episodes", "5", "--out", str(out))
    assert first.exit_code == 0, first.output
    weak_mean = float(read_csv(out / "ptq.csv")[0]["mean"])
    second = _cli("ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "5", "--out", str(out))
    assert second.exit_code == 0, second.output
    alone = _cli("ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "5", "--out", str(tmp_path / "alone"))
    assert alone.exit_code == 0, alone.output
    trained_mean = float(read_csv(tmp_path / "alone" / "ptq.csv")[0]["mean"])
    assert trained_mean != weak_mean  # the probe can tell the two apart
    assert float(read_csv(out / "ptq.csv")[0]["mean"]) == trained_mean
    assert "reused" not in second.output
    again = _cli("ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "5", "--out", str(out))
    assert "reused 1 finished cell from" in again.output  # the same policy is reused, and says so


def test_a_checkpoint_replaced_in_place_is_evaluated_anew_in_a_study(tiny_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "ppo" / "CartPole-v1_1"
    shutil.copytree(tiny_run, run)
    out = tmp_path / "study"
    args = ["study", str(run), "--precisions", "fp32", "--seeds", "0", "--episodes", "3", "--out", str(out)]
    assert _cli(*args).exit_code == 0
    before = float(read_csv(out / "table.csv")[0]["fp32"])
    shutil.copy(_untrained(tmp_path, "other", 1), run / "CartPole-v1.zip")  # same path, other weights
    r = _cli(*args)
    assert r.exit_code == 0, r.output
    after = float(read_csv(out / "table.csv")[0]["fp32"])
    fresh = ["study", str(run), "--precisions", "fp32", "--seeds", "0", "--episodes", "3", "--out", str(tmp_path / "f")]
    assert _cli(*fresh).exit_code == 0
    assert after == float(read_csv(tmp_path / "f" / "table.csv")[0]["fp32"]) and after != before


def test_a_second_run_on_a_folder_in_use_fails_in_one_line(tiny_run: Path, tmp_path: Path) -> None:
    from quarl.evaluation.cells import output_lock

    out = tmp_path / "busy"
    with output_lock(out):  # as a running ptq holds it
        r = quarl("ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "2", "--out", str(out))
    assert r.returncode == 2 and "is being written by another quarl run" in r.stderr
    assert "Traceback" not in r.stderr and not (out / "results.jsonl").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_learner_without_a_gpu_is_one_line() -> None:
    r = _cli("actorq", "run", "CartPole-v1", "--learner-device", "cuda", "--policy-layers", "8")
    assert r.exit_code == 2 and "--learner-device cuda: this machine has no CUDA GPU" in r.output, r.output


@pytest.mark.parametrize("args,message", [
    (["study", "no/such/agent"], "does not exist"),
    (["study", "{run}", "--precisions", "int17"], "unknown precision 'int17'"),
    (["study", "{run}", "--precisions", "int8x"], "unknown precision 'int8x'"),
    (["study", "{run}", "--episodes", "-2"], "--episodes -2 must be at least 1"),
    (["study", "{run}", "--seeds", "a,b"], "--seeds: 'a' is not a non-negative integer"),
    (["study", "{run}", "--workers", "0"], "--workers 0 must be in 1..256"),
    (["study", "{empty}"], "no agents to study"),
    (["study", "{run}", "--block-size", "20"], "block size 20 is not allowed"),
    (["actorq", "run", "CartPole-v1", "--lr", "-1"], "learning_rate=-1.0 must be > 0"),
    (["actorq", "compare", "CartPole-v1", "--learner-device", "tpu"], "--learner-device 'tpu' is not a device"),
    (["actorq", "run", "CartPole-v1", "--learner-device", "cuda:x"], "is not a device: allowed cpu, cuda, cuda:N"),
    (["actorq", "CartPole-v1"], "No such command 'CartPole-v1'"),
    (["ptq", "{run}", "--out", "{file}"], "--out {file} is a file: give a folder"),
    (["bench", "{run}", "--budget", "0"], "--budget 0.0 must be a positive number of seconds"),
    (["bench", "{run}", "--budget", "1e999"], "--budget inf must be a positive number of seconds, at most 600"),
    (["bench", "{run}", "--batches", "1,99999999"], "batch size '99999999' must be an integer in 1..65536"),
    (["ptq", "{run}", "--max-steps", "-1"], "max steps -1 must be in 1..1,000,000,000"),
    (["export", "{run}", "--precision", "sim4"], "has no ONNX model"),
    (["ptq", "{missing_onnx}"], "has no sidecar"),
    (["ptq", "{run}", "--seed", "-1"], "--seed -1 is out of range: allowed 0.."),
    (["ptq", "{run}", "--block-size", "1048576"], "block size 1048576 is not allowed: 16, 32, 64, 128 or 256"),
    (["ptq", "{run}", "--out", ""], "--out '' is empty: give a folder"),
    (["export", "{run}", "--out", ""], "--out '' is empty: give a folder"),
    (["study", "{run}", "--out", "{file}/sub"], "--out {file}/sub cannot be created: Not a directory"),
    (["study", "{run}", "--seeds", "0,99999999999"], "--seeds 99999999999 is out of range"),
    (["study", "{run}", "--workers", "99999999999"], "--workers 99999999999 must be in 1..256"),
    (["train", "ppo", "CartPole-v1", "--hp", "n_envs=-1"], "--hp n_envs=-1: must be a whole number in 1.."),
    (["train", "ppo", "CartPole-v1", "--hp", "batch_size=0"], "--hp batch_size=0: must be a whole number in 1.."),
    (["train", "ppo", "CartPole-v1", "--hp", "gamma=1e999"], "--hp gamma=inf: must be a finite number"),
    (["train", "ppo", "CartPole-v1", "--hp", "gamma=1.5"], "--hp gamma=1.5: must be in [0, 1]"),
    (["train", "ppo", "CartPole-v1", "-n", "99999999999999999999"], "--timesteps 99999999999999999999 is out of range"),
    (["actorq", "run", "CartPole-v1", "--seed", "-3"], "--seed -3 is out of range"),
])
def test_bad_input_one_line(tiny_run: Path, tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    paths = {"run": str(tiny_run), "empty": str(tmp_path / "empty"), "file": str(tmp_path / "file"),
             "missing_onnx": str(tmp_path / "model.onnx")}
    r = _cli(*[a.format(**paths) for a in args])
    assert r.exit_code == 2, r.output
    assert message.format(**paths) in r.output and "Traceback" not in r.output
    assert isinstance(r.exception, SystemExit)


# ---------------------------------------------------------------------------- fuzz

BAD_VALUES = ["-1", "0", "abc", "", "1e999", "nan", "int1", "2,x", "../../etc/passwd", "🙂", "--", "9" * 30]
COMMAND_OPTIONS = {
    "ptq": ["--precisions", "--episodes", "--seed", "--n-envs", "--max-steps", "--int8-weights", "--block-size",
            "--env"],
    "sweep": ["--bits", "--scheme", "--granularity", "--episodes", "--n-envs", "--max-steps", "--block-size"],
    "analyze": ["--bits", "--scheme", "--granularity"],
    "export": ["--precision", "--int8-weights", "--block-size", "--env"],
    "bench": ["--precisions", "--batches", "--budget"],
    "study": ["--precisions", "--seeds", "--episodes", "--n-envs", "--max-steps", "--workers", "--block-size"],
    "train": ["--timesteps", "-n", "--train-precision", "--hyperparams", "--save-freq", "--qat-bits", "--quant-delay",
              "--hp", "--eval-freq", "--eval-episodes"],
    "qat": ["--bits", "--timesteps", "--episodes", "--quant-delay"],
    "actorq": ["--algo", "--actors", "--actor-precision", "--wire-bits", "--policy-layers", "--lr", "--batch-size",
               "--min-replay", "--samples-per-insert", "--replay", "--priority-exponent", "--max-minutes",
               "--learner-device", "--wire-bits"],
    "demo": ["--zoo", "--precisions", "--episodes"],
}
# commands whose valid argument lists start long work get one bad option for sure
GUARD = {"train": ["--timesteps", "0"], "qat": ["--timesteps", "0"], "actorq": ["--max-minutes", "-1"],
         "demo": ["--episodes", "0"]}
POSITIONAL = {"ptq": ["{run}"], "sweep": ["{run}"], "analyze": ["{run}"], "export": ["{run}"], "bench": ["{run}"],
              "study": ["{run}"], "train": ["ppo", "CartPole-v1"], "qat": ["ppo", "CartPole-v1"],
              "actorq": ["run", "CartPole-v1"], "demo": []}


def corpus(n: int = 240, seed: int = 0) -> list[list[str]]:
    """Argument lists with at least one bad value each (so none starts a long valid run)."""
    rng = random.Random(seed)
    out = []
    commands = list(COMMAND_OPTIONS)
    while len(out) < n:
        command = commands[len(out) % len(commands)]
        args = [command, *POSITIONAL[command]]
        if rng.random() < 0.15 and args[1:]:
            args[1] = rng.choice(["no/such/thing", "Nope-v0", "", "bogus"])
        for option in rng.sample(COMMAND_OPTIONS[command], k=rng.randint(1, 2)):
            args += [option, rng.choice(BAD_VALUES)]
        if rng.random() < 0.1:
            args.append("--no-such-option")
        out.append(args + GUARD.get(command, []))
    return out


@pytest.mark.timeout(600)
def test_cli_fuzz_never_tracebacks(tiny_run: Path, tmp_path: Path) -> None:
    """240 generated argument lists over every command: exit 0 or 2, never a traceback."""
    (tmp_path / "out").mkdir()
    failures = []
    for args in corpus():
        args = [a.format(run=str(tiny_run)) for a in args]
        r = _cli(*args, *(["--out", str(tmp_path / "out" / args[0])] if args[0] != "analyze" else []))
        if r.exit_code not in (0, 2) or (r.exception is not None and not isinstance(r.exception, SystemExit)):
            failures.append((args, r.exit_code, repr(r.exception)))
    assert not failures, json.dumps(failures[:5], indent=1)


def test_a_truncated_pickle_under_trust_pickle_is_one_line(tmp_path: Path) -> None:
    import pickle

    from quarl.core.errors import QuarlError
    from quarl.policies.safe_load import load_vecnormalize

    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(pickle.dumps({"obs_rms": {"mean": [0.0] * 100}})[:20])
    with pytest.raises(QuarlError, match="cannot be unpickled"):
        load_vecnormalize(path, trust_pickle=True)


def test_an_int_result_from_another_cpu_is_not_reused(tiny_run: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from quarl.quant import modes

    args = ("ptq", str(tiny_run), "--precisions", "int8", "--episodes", "2", "--out", str(tmp_path / "out"))
    assert _cli(*args).exit_code == 0
    assert "reused 2 finished cells" in _cli(*args).output  # fp32 and int8, same machine
    monkeypatch.setattr(modes, "runtime_key", lambda: {"onnxruntime": "0.0", "cpu": "other", "vnni": "False"})
    again = _cli(*args)
    assert "reused 1 finished cell from" in again.output  # fp32 only: the int8 cell is evaluated anew


# ---------------------------------------------------------------------------- properties

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from quarl.core.validate import MAX_SEED  # noqa: E402

BLOCK_SIZES = (16, 32, 64, 128, 256)


def _reserved(seed: int) -> bool:
    from quarl.evaluation.calibration import RESERVED_SEEDS

    return any(seeds[0] <= seed <= seeds[-1] for seeds in RESERVED_SEEDS.values())
# option -> (valid values that run in a moment, any integer is otherwise judged by this rule)
INT_OPTIONS = {
    "--episodes": (st.integers(1, 3), lambda v: v >= 1),
    # the calibration and distillation seeds are never evaluation seeds (one episode: seed v alone)
    "--seed": (st.integers(0, MAX_SEED).filter(lambda v: not _reserved(v)),
               lambda v: 0 <= v <= MAX_SEED and not _reserved(v)),
    "--n-envs": (st.integers(1, 16), lambda v: v >= 1),
    "--max-steps": (st.integers(1, 40), lambda v: v >= 1),
    "--block-size": (st.sampled_from(BLOCK_SIZES), lambda v: v in BLOCK_SIZES),
}


@st.composite
def ptq_option(draw) -> tuple[str, str, bool]:
    """(option, value as typed, whether it is valid): valid values small enough to run, or
    any integer (negative, zero, huge), float text, NaN, inf, or junk."""
    option = draw(st.sampled_from(sorted(INT_OPTIONS)))
    valid_values, rule = INT_OPTIONS[option]
    kind = draw(st.sampled_from(["valid", "int", "text"]))
    if kind == "valid":
        return option, str(draw(valid_values)), True
    if kind == "int":
        value = draw(st.integers(-(2**70), 2**70))
        runs_long = option in ("--episodes", "--n-envs", "--max-steps") and value > 40
        return option, str(value), rule(value) and not runs_long if not runs_long else None
    return option, draw(st.sampled_from(["nan", "inf", "-inf", "1e999", "2.5", "", "x", "0x10", "🙂"])), False


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=ptq_option())
def test_every_ptq_option_value_is_run_or_refused_in_one_line(tiny_run: Path, tmp_path: Path, case) -> None:
    """Property: a valid value runs (exit 0); any other ends in exit 2 with one line and no
    traceback, before any episode is played."""
    option, value, valid = case
    if valid is None:  # a valid but long run (a million episodes): not what this test is about
        return
    args = ["ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "1", "--max-steps", "20",
            "--out", str(tmp_path / "out"), option, value]
    r = _cli(*args)
    if valid:
        assert r.exit_code == 0, (args, r.output)
    else:
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
        assert len([line for line in r.output.strip().splitlines() if line.strip()]) == 1, r.output


@st.composite
def bad_command_line(draw) -> list[str]:
    """A command, its positional arguments and one or two of its options given bad values
    (plus the command's guard, so no valid long run starts)."""
    command = draw(st.sampled_from(sorted(COMMAND_OPTIONS)))
    options = draw(st.lists(st.sampled_from(COMMAND_OPTIONS[command]), min_size=1, max_size=2, unique=True))
    args = [command, *POSITIONAL[command]]
    for option in options:
        args += [option, draw(st.sampled_from(BAD_VALUES))]
    return args + GUARD.get(command, [])


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=bad_command_line())
def test_every_command_refuses_bad_values_in_one_line(tiny_run: Path, tmp_path: Path, args: list[str]) -> None:
    """Property over every command's options: exit 0 (a value that happens to be valid) or
    exit 2 with exactly one line and no traceback."""
    args = [a.format(run=str(tiny_run)) for a in args]
    out = [] if args[0] == "analyze" else ["--out", str(tmp_path / "out" / args[0])]
    r = _cli(*args, *out)
    assert r.exit_code in (0, 2), (args, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    if r.exit_code == 2:
        lines = [line for line in r.output.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in r.output, (args, r.output)


@pytest.mark.slow
def test_evaluation_workers_die_with_a_killed_quarl(tmp_path) -> None:
    """SIGKILL to ``quarl ptq --workers 2`` mid-evaluation: its workers (children of the
    fork server, not of quarl) and the fork server are gone within seconds instead of
    playing on under init."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.conftest import zoo_run

    agent = zoo_run("ppo", "HalfCheetah-v3")
    proc = subprocess.Popen([sys.executable, "-m", "quarl.cli", "ptq", str(agent), "--precisions", "fp32,fp16,bf16",
                             "--episodes", "3000", "--workers", "2", "--out", str(tmp_path / "out")],
                            env={**os.environ, "QUARL_WORKERS": "2"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    main = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300  # a loaded machine starts the fork server late; the bound is not the point
    workers: list[psutil.Process] = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            tree = main.children(recursive=True)
            workers = [p for p in tree if "forkserver" in " ".join(p.cmdline())]
            if len(workers) >= 3:  # the server and its two workers
                break
            time.sleep(0.2)
        assert len(workers) >= 3, "the workers never started"
        time.sleep(2)  # they are playing episodes
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, [p.pid for p in alive]
    finally:  # a failed assertion never leaves 3,000 episodes playing under the rest of the suite
        for p in [*workers, main]:
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.mark.parametrize("kind", ["zip", "vecnormalize", "config", "results", "cache"])
def test_a_named_pipe_or_device_in_place_of_a_file_is_refused_without_blocking(kind: str, tmp_path: Path,
                                                                              tiny_run: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO where quarl reads a file would block forever, /dev/zero would never end: each
    is refused in one line (or, for a cache entry, ignored) at once."""
    from quarl.checkpoints import load_checkpoint
    from quarl.core.records import ResultsLog

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    zip_path = next(run.glob("*.zip"))
    if kind == "zip":
        zip_path.unlink()
        os.mkfifo(zip_path)
        with pytest.raises(QuarlError, match="named pipe"):
            load_checkpoint(run)
    elif kind == "vecnormalize":
        from quarl.policies.safe_load import load_vecnormalize

        target = next(run.rglob("config.yml")).parent / "vecnormalize.pkl"
        target.unlink(missing_ok=True)
        target.symlink_to("/dev/zero")
        with pytest.raises(QuarlError, match="device"):
            load_vecnormalize(target, obs_shape=(4,))
    elif kind == "config":
        config = next(run.rglob("config.yml"))
        config.unlink()
        os.mkfifo(config)
        with pytest.raises(QuarlError, match="named pipe"):
            load_checkpoint(run)
    elif kind == "results":
        log = tmp_path / "results.jsonl"
        os.mkfifo(log)
        with pytest.raises(QuarlError, match="named pipe"):
            ResultsLog(log).load()
    else:
        from quarl.quantization import choice_cache

        folder = tmp_path / "cache"
        folder.mkdir()
        # set for this test only: deleting it afterwards (as this did) left later tests on the shared ~/.cache
        monkeypatch.setenv(choice_cache.CACHE_ENV, str(folder))
        os.mkfifo(folder / "abc.json")
        assert choice_cache.load("abc", {"int8-block"}) is None
        (folder / "def.json").symlink_to("/dev/zero")
        assert choice_cache.load("def", {"int8-block"}) is None


@pytest.mark.parametrize("args", [["sweep", "BITS", "--bits", "8,²"], ["study", "--seeds", "٣"],
                                  ["bench", "--batches", "1,²"], ["ptq", "--precisions", "int²"]])
def test_digits_are_ascii_digits(args: list[str], tmp_path: Path) -> None:
    """A superscript or another script's digit passes str.isdigit but is not a number a user
    meant: one line naming it, exit 2."""
    zoo = Path(__file__).resolve().parents[1].parent / "shared" / "zoo" / "dqn" / "CartPole-v1_1"
    if not zoo.exists():
        pytest.skip("../shared/zoo is not beside the checkout")
    args = [a for a in args if a != "BITS"]
    argv = [args[0], str(zoo), *args[1:]] + (["--out", str(tmp_path / "s")] if args[0] == "study" else [])
    result = _cli(*argv)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and ("²" in result.output or "٣" in result.output)


@pytest.mark.parametrize("args,message", [
    (["train", "ppo", "CartPole-v1", "--hp", "n_envs=100000", "-n", "1000"], "--hp n_envs=100000: must be a whole "
                                                                           "number in 1..1,024"),
    (["actorq", "run", "CartPole-v1", "--actors", "1000000"], "--actors 1000000 must be in 1..4096"),
    (["actorq", "run", "CartPole-v1", "--actors", "100", "--local"], "--actors 100 must be in 1..64 in one process"),
    (["actorq", "compare", "CartPole-v1", "--repeats", "1000000000"], "--repeats 1,000,000,000 is more runs"),
    (["study", "AGENT", "--seeds", ",".join(map(str, range(300)))], "--seeds lists 300 distinct items: at most 256"),
])
def test_counts_that_would_exhaust_the_machine_are_refused(args: list[str], message: str, tmp_path: Path,
                                                          tiny_run: Path) -> None:
    """Each took gigabytes or ran without end before: one line, exit 2, nothing started."""
    args = [str(tiny_run) if a == "AGENT" else a for a in args]
    result = _cli(*args, "--out" if args[0] != "train" else "-f", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output[-500:]
    assert message in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("text,message", [
    (",".join(["8"] * 10_000), "--bits lists 10,000 widths: at most 15 (each of 2..16 once)"),
    (",".join(str(b) for b in range(2, 17)) + ",8", "--bits lists 16 widths: at most 15 (each of 2..16 once)"),
    ("8,4,8,2", "--bits lists 8 twice: each width at most once (allowed integers 2..16)"),
    ("8,08", "--bits lists 8 twice: each width at most once"),
])
def test_a_repeated_or_endless_bits_list_is_one_line(text: str, message: str) -> None:
    """Ten thousand 8s ran (exit 0) as one sweep, silently: a repeated width, or more widths
    than exist, is refused naming the value and what is allowed (issue 38)."""
    from quarl.core.errors import QuarlError
    from quarl.quantization.config import bit_widths as _parse_bits

    with pytest.raises(QuarlError) as caught:
        _parse_bits(text)
    assert str(caught.value) == message or str(caught.value).startswith(message), caught.value
    assert (_parse_bits("8,4,2") == [8, 4, 2]
            and _parse_bits(",".join(map(str, range(16, 1, -1)))) == list(range(16, 1, -1)))


def test_sweep_with_ten_thousand_bits_is_one_line(tiny_run: Path, tmp_path: Path) -> None:
    result = _cli("sweep", str(tiny_run), "--bits", ",".join(["8"] * 10_000), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output[-500:]
    assert "--bits lists 10,000 widths: at most 15" in result.output and not (tmp_path / "out").exists()


def test_layer_widths_are_a_sequence_not_a_set() -> None:
    from quarl.core.validate import layer_widths as _parse_layers

    assert _parse_layers("2048,2048,2048") == (2048, 2048, 2048)  # a deduplicated list was one layer


@pytest.mark.parametrize("where", ["env_kwargs.yml", "args.yml"])
def test_an_endless_episode_limit_in_a_folder_is_refused(where: str, tmp_path: Path, tiny_run: Path) -> None:
    """max_episode_steps 10^12 made one evaluation episode endless; args.yml's env_kwargs
    (which rl_zoo3.enjoy reads) were ignored before: both are read and bounded."""
    import yaml

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    config_dir = next(run.rglob("config.yml")).parent
    if where == "args.yml":
        args = yaml.safe_load((config_dir / "args.yml").read_text())
        (config_dir / "args.yml").write_text(yaml.safe_dump({**args, "env_kwargs": {"max_episode_steps": 10**12}}))
    else:
        (config_dir / "env_kwargs.yml").write_text("max_episode_steps: 1000000000000\n")
    result = _cli("ptq", str(run), "--episodes", "1", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "max_episode_steps=1000000000000 must be a whole number in 1..1,000,000" in \
        result.output and len(result.output.strip().splitlines()) == 1


def test_paths_and_labels_with_markup_print_as_they_are(tmp_path: Path, tiny_run: Path) -> None:
    """[/] and [bold] in a checkpoint's path and --out made rich raise after the results were
    written (exit 1): they are text."""
    run = tmp_path / "[bold]x" / "[/]run"
    shutil.copytree(tiny_run, run)
    out = tmp_path / "[/]y" / "[bold]out"
    result = _cli("ptq", str(run), "--precisions", "fp32", "--episodes", "1", "--out", str(out))
    assert result.exit_code == 0, result.output[-800:]
    assert f"wrote {out}/results.jsonl" in result.output
    (out / "results.jsonl").open("a").write('[1, 2]\n"x"\n')  # lines that are no record are skipped
    assert _cli("ptq", str(run), "--precisions", "fp32", "--episodes", "1", "--out", str(out)).exit_code == 0


def test_actorq_model_options_are_checked(tmp_path: Path) -> None:
    from tests.conftest import actorq_summary

    run = tmp_path / "run"
    run.mkdir()
    summary = actorq_summary(config={"actor_precision": "fp32", "actors": 1, "batch_size": 64,
                                     "samples_per_insert": 0.25, "push_period": 25, "update_period": 300},
                             broadcast={"bytes": 4e6, "build_s": 0.2}, evaluator_busy_s=1.0, elapsed_s=10.0)
    (run / "summary.json").write_text(json.dumps(summary))
    for args, message in ((["--wire-bits", "1"], "--wire-bits 1 is not a width actors pull"),
                          (["--wire-bits", "99"], "--wire-bits 99 is not a width actors pull"),
                          (["--cores-per-node", "0"], "--cores-per-node 0 must be at least 1"),
                          (["--learner-speedup", "inf"], "--learner-speedup inf must be a finite number above 0")):
        result = _cli("actorq", "model", str(run), *args, "--out", str(tmp_path / "m"))
        assert result.exit_code == 2 and message in result.output, (args, result.output[-500:])


def test_a_seed_in_the_calibration_range_is_refused_in_one_line(tiny_run: Path, tmp_path: Path) -> None:
    result = _cli("ptq", str(tiny_run), "--precisions", "fp32", "--episodes", "1", "--seed", "10000",
                  "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "would reach the calibration seeds 10000..10199" in result.output
