"""What recover reads back is checked against what it describes before it is used: the
tensors of ``.recover/state.pt`` (typed, shaped, finite, sized against the policy and the
run's options) and the report fields of a reused ``recovery.json`` (finite, printable,
consistent). Each bad claim is one line, within bounded memory; a healthy resume is unchanged."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec
from quarl.policies.base import Policy
from quarl.quant.modes import MODES, int8_compute
from quarl.quant.student import KernelSpec, make_student
from quarl.recovery import RecoverConfig, distill, read_recovery_record
from tests.test_fuzz_files import HOSTILE_SCALARS

CARTPOLE = EnvSpec("CartPole-v1")
CONFIG = RecoverConfig(precision="int4-block", rounds=3, episodes_per_round=2, updates_per_round=10,
                       closed_loop=False, stop_at_target=False)
SPEC = KernelSpec("int4-block", frozenset({0}), 32, "asymmetric", int8_compute(MODES["int4-block"].bits) == "int8")


def _policy() -> Policy:
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    return Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax", algo="dqn")


@pytest.fixture(scope="module")
def one_round(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state of a 3-round run stopped after its first round."""
    state = tmp_path_factory.mktemp("state") / "state.pt"

    def stop(stats: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(_policy(), CARTPOLE, CONFIG, SPEC, state_path=state, progress=stop)
    return state


def _zero_stride(rows: int) -> Callable[[dict[str, Any]], None]:
    def damage(saved: dict[str, Any]) -> None:
        saved["states"] = saved["states"][:1].expand(rows, 4)  # one row of storage claiming ``rows``

    return damage


def _first(saved: dict[str, Any], key: str) -> str:
    return next(iter(saved[key]))


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda saved: saved.__setitem__(key, value)


STATE_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "float64 states": (lambda s: s.__setitem__("states", s["states"].double()), "states: float64"),
    "float64 held-out": (lambda s: s.__setitem__("heldout", s["heldout"].double()), "heldout: float64"),
    "zero-stride view claiming 10^9 rows": (_zero_stride(10**9), "states"),
    "zero-stride view of few rows": (_zero_stride(10), "states"),
    "states of another width": (lambda s: s.__setitem__("states", torch.zeros(10, 5)), "states"),
    "NaN states": (lambda s: s["states"].__setitem__((0, 0), float("nan")), "states"),
    "wrong-shape best student": (lambda s: s["best_student"].__setitem__(_first(s, "best_student"), torch.zeros(3, 3)),
                                 "best_student"),
    "best student missing a tensor": (lambda s: s["best_student"].pop(_first(s, "best_student")), "best_student"),
    "NaN best student": (lambda s: s["best_student"][_first(s, "best_student")].fill_(float("nan")), "best_student"),
    "NaN student": (lambda s: s["student"][_first(s, "student")].fill_(float("nan")), "student"),
    "wrong-shape student": (lambda s: s["student"].__setitem__(_first(s, "student"), torch.zeros(3, 3)), "student"),
    "NaN optimizer moment": (lambda s: [v["exp_avg"].fill_(float("nan")) for v in s["optimizer"]["state"].values()],
                             "optimizer"),
    "wrong-shape optimizer moment": (lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg", torch.zeros(7)),
                                     "optimizer"),
    "best_round 9999": (_set("best_round", 9999), "best_round"),
    "1,000 rounds in a 3-round run": (lambda s: s.__setitem__("history", [dict(s["history"][0], round=i)
                                                                          for i in range(1000)]), "history"),
    "rounds out of order": (lambda s: s["history"][0].__setitem__("round", 2), "history"),
    "best_agreement 7": (_set("best_agreement", 7.0), "best_agreement"),
    "target 1e308": (_set("target", 1e308), "target"),
    "a seed outside distillation's": (lambda s: s["seeds"].__setitem__(0, 12), "seeds"),
    "more updates than rounds made": (_set("updates", 10**12), "updates"),
}


@contextlib.contextmanager
def _address_space_grows_at_most(extra: int) -> Iterator[None]:
    """This process may map at most ``extra`` more bytes meanwhile (a claim of 10^9 rows
    believed would ask for 16 GB and fail with MemoryError, not with quarl's line)."""
    size = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_a_state_whose_tensors_or_counts_do_not_fit_is_one_line(one_round: Path, tmp_path: Path, case: str) -> None:
    damage, field = STATE_CASES[case]
    saved = torch.load(one_round, weights_only=True)
    damage(saved)
    state = tmp_path / "state.pt"
    torch.save(saved, state)
    assert state.stat().st_size < 1 << 20  # the claims are cheap: the file is small
    with _address_space_grows_at_most(1 << 30), pytest.raises(QuarlError) as caught:
        distill(_policy(), CARTPOLE, CONFIG, SPEC, state_path=state)
    message = str(caught.value)
    assert "\n" not in message and str(state) in message and field in message, message
    assert message.endswith("start afresh"), message


def test_a_healthy_state_resumes(one_round: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.pt"
    shutil.copy(one_round, state)
    rounds: list[int] = []
    result = distill(_policy(), CARTPOLE, CONFIG, SPEC, state_path=state, progress=lambda s: rounds.append(s.round))
    assert rounds == [1, 2] and len(result.history) == 3


# ------------------------------------------------------------------ a reused recovery.json's report


def _good_record() -> dict[str, Any]:
    """A whole recovery.json as recover writes it (every field of RecoveryJson), to damage."""
    test = {"kept": True, "verdict": "keeps", "e": -3.7, "low": -13.3, "high": 4.6, "episodes": 64,
            "seeds": [28000, 28063], "means": [11.77, 12.2]}
    return {"format": 1, "precision": "int4",
            "kernel": {"mode": "int4-block", "keep": [0], "block_size": 32, "int8_weights": "symmetric",
                       "compute_int8": True},
            "original": {"path": "a.zip", "zip_sha256": "1" * 64, "policy_sha256": "2" * 64, "algo": "ppo"},
            "recovered": {"zip_sha256": "3" * 64, "onnx_sha256": "4" * 64, "export": "export/policy.onnx"},
            "env": {"env_id": "CartPole-v1", "env_kwargs": {}, "wrappers": [], "frame_stack": 1},
            "config": {"rounds": 1},
            "automatic_choice": None, "shipped": "ptq", "shipped_stage": None, "stopped": "kept",
            "against_ptq": {"verdict": "no student was shown at least as good"}, "against_fp32": test,
            "stages": [{"stage": "distill", "rounds": 1, "agreement": 0.86,
                        "against_ptq": {"kept": False, "verdict": "the student is PTQ's own model", "same": True},
                        "written": "ptq", "against_fp32": dict(test), "wall_s": 3.5}],
            "budget": {"rounds": 1, "rounds_played": 1, "finetune_steps": 0, "minutes": 15.0}, "total_s": 3.56,
            "distill_stopped": "budget", "best_round": -1, "target_agreement": 0.99, "ptq_agreement": 0.857,
            "agreement": 0.857, "labelled_states": 53, "heldout_states": 14, "updates": 20, "wall_s": 3.22,
            "seeds": [20000, 29000],
            "rounds": [{"round": 0, "states": 53, "new_states": 53, "loss": 2.6, "agreement": 0.64,
                        "played_return": 13.25, "wall_s": 0.2, "calibration_verdict": ""}],
            "provenance": {"versions": {"quarl": "0.1", "ray": None}, "python": "3.11.7", "cpu": "x86_64",
                           "cpu_flags": ["avx2"], "cores": 2, "host": "h"},
            "files": {"CartPole-v1.zip": "5" * 64}}


RECORD_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "agreement NaN": (lambda r: r.__setitem__("agreement", float("nan")), "agreement"),
    "agreement 1e308": (lambda r: r.__setitem__("agreement", 1e308), "agreement"),
    "wall_s 1e308": (lambda r: r.__setitem__("wall_s", 1e308), "wall_s"),
    "labelled_states 1e308": (lambda r: r.__setitem__("labelled_states", 1e308), "labelled_states"),
    "E NaN": (lambda r: r["against_fp32"].__setitem__("e", float("nan")), "against_fp32.e"),
    "E 1e308": (lambda r: r["against_fp32"].__setitem__("e", 1e308), "against_fp32.e"),
    "a mean 1e308": (lambda r: r["against_fp32"]["means"].__setitem__(0, 1e308), "against_fp32.means"),
    "one mean (was IndexError)": (lambda r: r["against_fp32"].__setitem__("means", [1.0]), "against_fp32.means"),
    "means without episodes (was KeyError)": (lambda r: r["against_fp32"].pop("episodes"), "against_fp32"),
    "no stopped (was KeyError)": (lambda r: r.pop("stopped"), "stopped"),
    "no agreement (was KeyError)": (lambda r: r.pop("agreement"), "agreement"),
    "no against_fp32": (lambda r: r.pop("against_fp32"), "against_fp32"),
    "a kernel without its mode (was KeyError)": (lambda r: r.__setitem__("kernel", {}), "kernel.mode"),
    "ptq_agreement a string (was ValueError)": (lambda r: r.__setitem__("ptq_agreement", "x"), "ptq_agreement"),
    "updates a string (was ValueError)": (lambda r: r.__setitem__("updates", "many"), "updates"),
    "a stage without its test (was KeyError)": (lambda r: r["stages"][0].pop("against_ptq"), "stages.0.against_ptq"),
    "budget a string": (lambda r: r.__setitem__("budget", "x"), "budget"),
    "a fine-tune without steps (was KeyError)": (lambda r: r.__setitem__("finetune", {"x": 1}), "finetune.steps"),
    "a student shipped from no stage": (lambda r: r.__setitem__("shipped", "student"), "stage"),
    "best_round 9999": (lambda r: r.__setitem__("best_round", 9999), "best_round"),
    "1,000 rounds in a 1-round run": (lambda r: r.__setitem__("rounds", [dict(r["rounds"][0], round=i)
                                                                         for i in range(1000)]), "rounds"),
    "best round past the last": (lambda r: r.__setitem__("best_round", 5), "best round 5 of 1 rounds"),
    "more rounds played than the budget": (lambda r: r["budget"].__setitem__("rounds_played", 7), "budget"),
    "a field quarl never writes": (lambda r: r.__setitem__("shipped_by", "hand"), "shipped_by"),
    "a kernel's block size a string": (lambda r: r["kernel"].__setitem__("block_size", "32"), "kernel.block_size"),
    "a stage's means without episodes": (lambda r: r["stages"][0]["against_fp32"].pop("episodes"),
                                         "stages.0.against_fp32"),
    "precision int2": (lambda r: r.__setitem__("precision", "int2"), "precision"),
    "a hash that is not one": (lambda r: r["files"].__setitem__("CartPole-v1.zip", "5" * 63), "files.CartPole-v1.zip"),
}


@pytest.mark.parametrize("case", list(RECORD_CASES))
def test_a_reused_records_report_fields_are_checked_in_one_line(tmp_path: Path, case: str) -> None:
    path = tmp_path / "recovery.json"
    path.write_text(json.dumps(_good_record()))
    record = read_recovery_record(path)
    assert record == _good_record() and record["agreement"] == 0.857 and record["stopped"] == "kept"
    damage, field = RECORD_CASES[case]
    bad = _good_record()
    damage(bad)
    path.write_text(json.dumps(bad))
    with pytest.raises(QuarlError) as caught:
        read_recovery_record(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and field in message, message


# ------------------------------------------------------------------ property tests over the new checks

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TENSORS = st.sampled_from([torch.zeros(0, 4), torch.zeros(3, 4, dtype=torch.float64), torch.zeros(2, 4, 1),
                           torch.zeros(1, 4).expand(10**6, 4), torch.full((2, 4), float("inf")), torch.zeros(2, 4),
                           torch.zeros(32, 4), torch.zeros(3, 3)])


@FUZZ
@given(key=st.sampled_from(["states", "heldout", "student", "best_student", "optimizer", "history", "best_round",
                            "best_agreement", "target", "seeds", "updates"]),
       value=st.one_of(HOSTILE_SCALARS, TENSORS, st.lists(st.integers(-5, 30_000), max_size=6),
                       st.dictionaries(st.text("abw.0", max_size=6), TENSORS, max_size=3)))
def test_a_states_claims_are_what_the_run_holds_or_one_line(one_round: Path, tmp_path: Path, key: str,
                                                           value: Any) -> None:
    """Any value in any checked field, read as a resume reads it (read_state, then
    check_resume): one line naming the file and the field, or what a resume can use (the
    tensors float32 rows of the policy's shape that their storage holds, the weights the
    student's, the counts the run's)."""
    from quarl.recovery import read_state
    from quarl.recovery.resume import check_resume

    saved = torch.load(one_round, weights_only=True)
    saved[key] = value
    path = tmp_path / "state.pt"
    torch.save(saved, path)
    policy = _policy()
    student = make_student(policy.network, SPEC)
    optimizer = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=CONFIG.lr)
    try:
        check_resume(path, read_state(path), policy, student, optimizer, CONFIG, 10_000)
    except QuarlError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc) and key in str(exc), (key, str(exc))
        return
    for field in ("states", "heldout"):
        t = saved[field]
        assert t.dtype == torch.float32 and t.shape[1:] == (4,) and t.is_contiguous() and len(t) <= 10_000
    assert {k: v.shape for k, v in saved["best_student"].items()} == \
        {k: v.shape for k, v in student.state_dict().items()}
    assert 0 <= saved["best_round"] < len(saved["history"]) <= CONFIG.total_rounds


@FUZZ
@given(files=st.dictionaries(st.sampled_from(["CartPole-v1.zip", "CartPole-v1/original.zip", "export/policy.json",
                                              "../x", "/etc/hostname", "", ".", "CartPole-v1", "export/none"]),
                             st.sampled_from(["0" * 64, "f" * 64]), max_size=5),
       keep=st.booleans())
def test_a_manifest_vouches_for_exactly_the_folders_files_or_is_one_line(recovered_files: Path, files: dict,
                                                                          keep: bool) -> None:
    """A hostile ``files``: refused in one line, or every file of the folder has exactly its hash."""
    from quarl.recovery.folder import check_manifest, folder_files, sha256_file

    record = recovered_files / "CartPole-v1" / "recovery.json"
    true = {rel: sha256_file(recovered_files / rel) for rel in folder_files(recovered_files, "CartPole-v1")}
    claimed = {**true, **files} if keep else files
    try:
        check_manifest(record, claimed)
    except QuarlError as exc:
        assert "\n" not in str(exc)
        return
    assert claimed == true


@pytest.fixture(scope="module")
def recovered_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as a recovered one (the manifest's check reads only files)."""
    out = tmp_path_factory.mktemp("layout")
    for rel, data in {"CartPole-v1.zip": b"zip", "CartPole-v1/original.zip": b"orig", "CartPole-v1/args.yml": b"a",
                      "CartPole-v1/recovery.json": b"{}", "export/policy.onnx": b"onnx",
                      "export/policy.json": b"{}"}.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return out
