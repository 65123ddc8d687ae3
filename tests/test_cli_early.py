"""What the CLI answers before anything heavy loads, and the smaller things a new user met
(issue 49): refusals of bad input name the value without loading torch, ONNX Runtime or
Stable-Baselines3 (they took 4.5 to 9 s; ``benchmarks/bench_cli_latency.py`` measures the
time, these tests only which modules a refusal loaded), ``--help`` loads none of them (nor gymnasium), flags
show no ``<bool>``, ``--trust-gym-packages`` and --decide-episodes' default show where they
apply, ``--stochastic --deterministic`` is refused, an export's sidecar given as the policy
says to give the export, reruns say what they reused, and ptq suggests no recovery for an
int precision that played exactly as fp32."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_cli, zoo_run

HEAVY = ("torch", "onnxruntime", "stable_baselines3")
PROBE = """
import json, sys
sys.argv = ["quarl", *json.loads(sys.argv[1])]
code = 0
try:
    from quarl.cli import main
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY + ("gymnasium",),)


def quarl_probe(args: list[str], home: Path, cwd: Path) -> tuple[int, list[str], str]:
    """``quarl ARGS`` in a fresh interpreter: its exit code, which heavy modules it had loaded
    by then, its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "QUARL_CACHE"} | {"HOME": str(home), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found["code"], found["loaded"], done.stderr


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: a run folder's name (nothing is loaded before the refusals), a text
    file, an export's two files, and an empty home (quarl keeps nothing there)."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "ppo" / "CartPole-v1_1").mkdir(parents=True)
    (folder / "notes.txt").write_text("not a policy\n")
    (folder / "export").mkdir()
    (folder / "export" / "policy.json").write_text('{"format": 1}\n')
    (folder / "export" / "policy.onnx").write_bytes(b"")
    (folder / "home").mkdir()
    return folder


AGENT = "ppo/CartPole-v1_1"
REFUSALS = [
    (["ptq", AGENT, "--precisions", "fp32,int3x"], "unknown precision 'int3x': allowed fp32, fp16, bf16, int8, int4"),
    (["export", AGENT, "--precision", "int3"], "unknown precision 'int3' (int3 has no real kernel: sim3 simulates it)"),
    (["ptq", AGENT, "--env", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0': not a registered gymnasium id"),
    (["ptq", "notes.txt"], "notes.txt is not a policy (not a zip, nor a name a format reads): give an SB3 .zip"),
    (["ptq", "export/policy.json"], "export/policy.json is the sidecar of a quarl export, not a policy: give the "
                                    "export folder (export) or its model (export/policy.onnx)"),
    (["ptq", AGENT, "--out", AGENT], f"--out {AGENT} is the input {AGENT}: an output folder may not be"),
    (["ptq", AGENT, "--workers", "0"], "--workers 0 must be in 1..256"),
    (["ptq", AGENT, "--episodes", "0"], "--episodes 0 must be at least 1"),
    (["ptq", AGENT, "--stochastic", "--deterministic"], "--stochastic and --deterministic contradict each other"),
    (["play", AGENT, "--episodes", "0"], "--episodes 0 must be at least 1"),
    (["sweep", AGENT, "--bits", "1"], "bits '1' is out of range: allowed integers 2..16"),
    (["train", "ppo", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0': not a registered gymnasium id"),
    (["train", "ppo2", "CartPole-v1"], "unknown algorithm 'ppo2': allowed a2c, ppo, dqn"),
    (["train", "ppo", "CartPole-v1", "--timesteps", "0"], "--timesteps 0 is out of range: allowed 1..10000000000"),
]


@pytest.mark.parametrize("args, says", REFUSALS, ids=[" ".join(a) for a, _ in REFUSALS])
def test_a_refusal_answers_in_one_line_before_torch_loads(user: Path, args: list[str], says: str) -> None:
    code, loaded, stderr = quarl_probe(args, user / "home", user)
    assert code == 2 and stderr.strip().splitlines() == [stderr.strip()] and says in stderr, stderr
    assert not set(loaded) & set(HEAVY), (args, loaded)


def test_the_early_precision_refusal_is_the_full_check_s_line(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process (the registries loaded) the registries refuse; the line is the one the
    built-in lists gave (quarl.cli.builtin_lists)."""
    monkeypatch.chdir(user)
    code, _, early = quarl_probe(["ptq", AGENT, "--precisions", "int3x"], user / "home", user)
    full = run_cli("ptq", AGENT, "--precisions", "int3x")
    assert code == full.returncode == 2 and early == full.stderr


@pytest.mark.parametrize("command", [[], ["ptq"], ["train"], ["actorq", "run"]], ids=" ".join)
def test_help_loads_nothing_heavy(user: Path, command: list[str]) -> None:
    """The lists in the help come from quarl.cli.builtin_lists; the home is left empty."""
    code, loaded, _ = quarl_probe([*command, "--help"], user / "home", user)
    assert code == 0 and loaded == [] and not any((user / "home").iterdir())


def test_help_shows_flags_bare_and_the_options_where_they_apply() -> None:
    for command in ("ptq", "play", "export", "sweep", "analyze", "bench", "recover", "study", "demo"):
        shown = run_cli(command, "--help").stdout
        assert "<bool>" not in shown and "--trust-gym-packages" in shown, command
    shown = run_cli("ptq", "--help").stdout
    assert "[default: (2000, or $QUARL_DECIDE_EPISODES)]" in shown
    assert "[default: (320, or $QUARL_DECIDE_EPISODES)]" in run_cli("demo", "--help").stdout
    assert "<bool>" not in run_cli("--help").stdout and "<bool>" not in run_cli("actorq", "run", "--help").stdout


@pytest.mark.parametrize("command", ["ptq", "play", "export"])
def test_both_sides_of_a_flag_are_refused(user: Path, command: str) -> None:
    for flags in (["--stochastic", "--deterministic"], ["--deterministic", "--stochastic"]):
        r = run_cli(command, str(user / AGENT), *flags)
        assert r.returncode == 2 and r.stderr.strip() == (
            f"error: {flags[0]} and {flags[1]} contradict each other: give one of them"), r.stderr


def test_an_export_s_sidecar_given_as_the_policy_says_to_give_the_export(user: Path) -> None:
    """Through the formats (this process has them loaded: the early check leaves it to them)."""
    r = run_cli("ptq", str(user / "export" / "policy.json"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: {user}/export/policy.json is the sidecar of a quarl export, not a policy: give the export folder "
        f"({user}/export) or its model ({user}/export/policy.onnx)")


def test_reruns_of_demo_and_study_say_what_they_reused(tmp_path: Path) -> None:
    zoo = tmp_path / "zoo" / "ppo"
    zoo.mkdir(parents=True)
    (zoo / "CartPole-v1_1").symlink_to(zoo_run("ppo", "CartPole-v1"))
    for round_ in (1, 2):
        demo = run_cli("demo", "--zoo", str(tmp_path / "zoo"), "--precisions", "fp32,fp16", "--episodes", "2",
                       "--workers", "1", "--out", str(tmp_path / "demo"))
        study = run_cli("study", str(tmp_path / "zoo"), "--precisions", "fp32,fp16", "--seeds", "0", "--episodes", "2",
                        "--out", str(tmp_path / "study"))
        assert demo.returncode == study.returncode == 0, demo.stderr + study.stderr
        said = [line for line in demo.stdout.splitlines() + study.stdout.splitlines() if line.startswith("reused")]
        assert said == ([] if round_ == 1 else [
            f"reused 2 finished cells from {tmp_path}/demo/*/results.jsonl (same policy content, config and settings)",
            f"reused 2 finished cells from {tmp_path}/study/study.sqlite (same policy content, config and settings)"])


def test_ptq_suggests_no_recovery_for_an_int_precision_that_played_as_fp32(tmp_path: Path) -> None:
    """The zoo's PPO CartPole returns 500 on every seed at fp32 and int8: undecided on 3
    episodes, with nothing to recover."""
    r = run_cli("ptq", str(zoo_run("ppo", "CartPole-v1")), "--precisions", "int8", "--episodes", "3",
                "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [rec["returns"] for rec in records] == [[500.0] * 3] * 2
    assert "int8 undecided: its returns equal fp32's on every episode, nothing to recover" in r.stdout
    assert "quarl recover" not in r.stdout


def test_the_recover_hint_keeps_its_suggestion_where_returns_differ(capsys: pytest.CaptureFixture[str]) -> None:
    from quarl.cli.ptq import plays_as_fp32, recover_hint
    from quarl.verdict import Decision

    fp32 = {"returns": [500.0, 480.0, 500.0, 12.0], "seed": 0}  # fp32 played on past the int cell
    assert plays_as_fp32(fp32, {"returns": [500.0, 480.0], "seed": 0})
    assert not plays_as_fp32(fp32, {"returns": [500.0, 481.0], "seed": 0})
    assert not plays_as_fp32(fp32, {"returns": [500.0, 480.0], "seed": 7})
    undecided = SimpleNamespace(verdict=Decision.UNDECIDED)
    recover_hint([("int8", undecided), ("int4", undecided)], Path("agent"), False,  # type: ignore[list-item]
                 frozenset({"int8"}))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("int8 undecided: its returns equal fp32's on every episode, nothing to recover")
    assert lines[1] == ("int4 undecided: play more episodes (a larger --decide-episodes / --decide-minutes), or "
                        "recover it with quarl recover agent --precision int4")
