"""Quantization-aware distillation (quarl recover): the student computes what its real
kernel computes, recovery restores what PTQ flips, seeds stay apart, the recovered folder
loads in SB3 and judges against the original, and a broken run resumes where it stopped."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec
from quarl.policies.base import Policy
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.modes import MODES, BuildRequest, int8_compute, student_modes
from quarl.quant.student import KernelSpec, make_student, plain_network, real_model
from quarl.recovery import RecoverConfig, distill
from tests.conftest import skip_where_the_cpu_cannot_run

CARTPOLE = EnvSpec("CartPole-v1")
STUDENT_LABELS = [mode.label for mode in student_modes()]


def _spec(label: str, keep: frozenset[int], weights: str = "asymmetric") -> KernelSpec:
    return KernelSpec(label, keep, 32, weights, int8_compute(MODES[label].bits) == "int8")


def _mlp(sizes=(4, 70, 64, 3), seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).eval()


def _cartpole_states(n: int = 256) -> np.ndarray:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=123)
    rng, states = np.random.default_rng(0), []
    while len(states) < n:
        states.append(obs)
        obs, _, term, trunc, _ = env.step(int(rng.integers(2)))
        if term or trunc:
            obs, _ = env.reset()
    return np.asarray(states, np.float32)


def _max_error(student: nn.Module, spec: KernelSpec, x: np.ndarray, shape: tuple[int, ...]) -> tuple[float, float]:
    """(student vs its real kernel, student vs the same net in fp32) over the rows, leaving
    out the 2 % of rows farthest apart: where an activation sits on a rounding tie, the
    kernel's float order may round it the other way (one step of one activation); every
    other row must be 10x closer to the student than the fp32 net is."""
    engine = ortb.OrtEngine(real_model(student, spec, shape), per_row=MODES[spec.mode].per_row)
    with torch.inference_mode():
        want = student.eval()(torch.from_numpy(x)).numpy()
        fp32 = plain_network(student, on_grid=False)(torch.from_numpy(x)).numpy()
    per_row = np.sort(np.abs(engine(x) - want).reshape(len(x), -1).max(1))
    return float(per_row[int(0.98 * len(x)) - 1]), float(np.abs(fp32 - want).max())


def _perturb(student: nn.Module, seed: int = 7) -> None:
    """A trained student: its weights are no longer the teacher's."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))


@pytest.mark.parametrize("keep", [frozenset(), frozenset({0})], ids=["all-layers", "first-fp32"])
@pytest.mark.parametrize("label", STUDENT_LABELS)
def test_the_real_kernel_built_from_the_students_integers_computes_what_the_student_computes(
        label: str, keep: frozenset) -> None:
    skip_where_the_cpu_cannot_run(label)
    net = _mlp()
    spec = _spec(label, keep)
    student = make_student(net, spec)
    _perturb(student)
    for x in (np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32) * 2, _cartpole_states()):
        err, to_fp32 = _max_error(student, spec, x, (4,))
        assert to_fp32 > 1e-4  # the grid really rounds something
        assert err <= max(0.1 * to_fp32, 1e-6), (label, err, to_fp32)


@pytest.mark.skipif(not ortb.has_vnni(), reason="symmetric int8 weights are exact only on a CPU with VNNI")
@pytest.mark.parametrize("label", ["int8-dyn-tensor", "int8-dyn-channel"])
def test_symmetric_int8_weights_too(label: str) -> None:
    spec = _spec(label, frozenset(), "symmetric")
    err, to_fp32 = _max_error(make_student(_mlp(), spec), spec, np.random.default_rng(2).normal(size=(64, 4))
                              .astype(np.float32), (4,))
    assert err <= max(0.1 * to_fp32, 1e-6)


def test_a_cnn_student_keeps_its_convolutions_fp32_and_matches_its_kernel() -> None:
    skip_where_the_cpu_cannot_run("int4-block")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 64), nn.ReLU(),
                        nn.Linear(64, 5)).eval()
    spec = _spec("int4-block", frozenset({0}))
    student = make_student(net, spec)
    x = np.random.default_rng(3).random((16, 4, 10, 10)).astype(np.float32)
    err, to_fp32 = _max_error(student, spec, x, (4, 10, 10))
    assert err <= max(0.1 * to_fp32, 1e-6)


@pytest.mark.parametrize("label", ["int4-block", "int8-dyn-channel", "int4-weight-only"])
def test_an_untrained_student_is_post_training_quantization(label: str) -> None:
    """Before any update the student computes what the mode's reference (PTQ) computes."""
    net = _mlp()
    mode = MODES[label]
    request = BuildRequest(net, ortb.export_onnx(net, (4,)), None, "asymmetric", 32, frozenset({0}))
    x = torch.from_numpy(_cartpole_states(64))
    with torch.inference_mode():
        reference = mode.reference(request, mode.build(request))(x)
        student = make_student(net, _spec(label, frozenset({0})))(x)
    assert torch.allclose(student, reference, atol=1e-5)


def _near_tied_policy() -> Policy:
    """A Q-network whose two action values differ by about 1 % of their size: int4 PTQ
    flips many greedy actions."""
    net = _mlp((4, 64, 64, 2), seed=5)
    with torch.no_grad():
        last = net[-1]
        last.weight[1] = last.weight[0] + 0.01 * torch.randn(64, generator=torch.Generator().manual_seed(1))
        last.bias[1] = last.bias[0]
    return Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax", algo="dqn")


def test_recovery_restores_the_greedy_actions_that_int4_rounding_flips() -> None:
    policy = _near_tied_policy()
    config = RecoverConfig(precision="int4-block", rounds=4, episodes_per_round=16, updates_per_round=300,
                           closed_loop=False, target_agreement=1.0)
    result = distill(policy, CARTPOLE, config, _spec("int4-block", frozenset({0})))
    assert result.ptq_agreement < 0.8, result.ptq_agreement  # PTQ flips many near-tied argmaxes
    assert result.history[result.best_round].agreement >= 0.95, [h.agreement for h in result.history]
    states = _cartpole_states(512)  # states of a random walk, never seen in distillation
    engine = ortb.OrtEngine(result.model)
    with torch.inference_mode():
        teacher = policy.network(torch.from_numpy(states)).argmax(1).numpy()
    assert np.mean(engine(states).argmax(1) == teacher) >= 0.9


def test_distillation_never_plays_an_evaluation_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    import quarl.evaluation.calibration as calibration
    import quarl.recovery.dagger as distilling
    import quarl.recovery.judge as judging
    from quarl.evaluation.calibration import CALIBRATION_SEEDS, DISTILLATION_SEEDS
    from quarl.evaluation.cells import EvalSettings

    seen: list[range] = []
    for module in (distilling, judging, calibration):  # every module of recovery that plays episodes
        real = module.evaluate

        def spy(policy, spec, episodes=20, seed=0, _real=real, **kwargs):
            seen.append(range(seed, seed + episodes))
            return _real(policy, spec, episodes=episodes, seed=seed, **kwargs)

        monkeypatch.setattr(module, "evaluate", spy)
    config = RecoverConfig(precision="int4-block", rounds=2, updates_per_round=20, target_agreement=0.5)
    distill(_near_tied_policy(), CARTPOLE, config, _spec("int4-block", frozenset({0})))
    used = {s for r in seen for s in r}
    assert used and all(s in DISTILLATION_SEEDS or s in CALIBRATION_SEEDS for s in used)
    assert any(s in DISTILLATION_SEEDS for s in used)
    with pytest.raises(QuarlError, match="distillation seeds 20000..29999"):
        EvalSettings(episodes=20, seed=19_990)


def test_a_broken_run_resumes_after_its_last_round_and_ends_as_an_unbroken_one(tmp_path: Path) -> None:
    policy = _near_tied_policy()
    config = RecoverConfig(precision="int4-block", rounds=3, episodes_per_round=4, updates_per_round=50,
                           closed_loop=False, stop_at_target=False)
    spec = _spec("int4-block", frozenset({0}))
    unbroken = distill(policy, CARTPOLE, config, spec)
    state = tmp_path / "state.pt"

    def kill_after_round_1(stats) -> None:
        if stats.round == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(policy, CARTPOLE, config, spec, state_path=state, progress=kill_after_round_1)
    rounds_run = []
    resumed = distill(policy, CARTPOLE, config, spec, state_path=state, progress=lambda s: rounds_run.append(s.round))
    assert rounds_run == [2]
    assert [h.loss for h in resumed.history] == [h.loss for h in unbroken.history]
    assert [h.agreement for h in resumed.history] == [h.agreement for h in unbroken.history]
    assert resumed.model == unbroken.model
    with pytest.raises(QuarlError, match="other recovery options"):
        distill(policy, CARTPOLE, RecoverConfig(precision="int4-block", rounds=5), spec, state_path=state)
    state.write_bytes(b"not a torch file")
    with pytest.raises(QuarlError, match="cannot be read as a recovery state"):
        distill(policy, CARTPOLE, config, spec, state_path=state)


@pytest.fixture(scope="module")
def tiny_dqn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stable_baselines3 import DQN

    torch.set_num_threads(1)
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [64, 64]}, learning_starts=200, seed=0,
                train_freq=4, target_update_interval=200, device="cpu")
    model.learn(2_000)
    path = tmp_path_factory.mktemp("agent") / "dqn-cartpole.zip"
    model.save(path)
    return path


def test_the_recovered_folder_loads_in_sb3_and_judges_against_the_original(tiny_dqn: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from stable_baselines3 import DQN

    monkeypatch.setattr("quarl.training.finetune.REFILL_STEPS", 1_000)  # the buffer refill before the fine-tune's
    # updates: its size does not matter here (5,000 steps of play took 3.6 s)

    import quarl
    from quarl.evaluation.cells import EvalSettings
    from quarl.recovery import load_recovered, run_recover

    agent = quarl.load(tiny_dqn, env="CartPole-v1")
    out = tmp_path / "recovered"
    # a fine-tune of 600 steps where the rounds do not keep fp32's return (the default 20,000 took 26 s of this test)
    config = RecoverConfig(precision="int4", rounds=2, updates_per_round=50, closed_loop=False, finetune_steps=600)
    record, records = run_recover(tiny_dqn, agent.env_spec, agent.policy, config, out,
                                  EvalSettings(episodes=4, n_envs=4))
    assert record["original"]["policy_sha256"] == agent.policy.fingerprint()
    # recovery.json holds exactly the fields its type names (the fine-tune's where one was tried)
    from quarl.recovery.report import RecoveryJson

    assert set(record) - {"finetune"} == set(RecoveryJson.__annotations__) - {"finetune"}
    assert record.get("finetune", {"steps": 600})["steps"] == 600
    import json

    assert set(json.loads((out / "CartPole-v1" / "recovery.json").read_text())) == set(record)
    # SB3 loads the recovered zip, and its Q-network holds the student's weights on the grid
    # a bare zip recovered: named after its env, as the zoo names it
    sb3 = DQN.load(out / "CartPole-v1.zip", device="cpu")
    states = _cartpole_states(64)
    recovered = load_recovered(out)
    assert recovered is not None and recovered.precision == "int4"
    with torch.inference_mode():
        sb3_q = sb3.q_net(torch.from_numpy(states)).numpy()
    kernel_q = recovered.kernel.forward(states)
    assert np.abs(sb3_q - kernel_q).max() <= 0.1 * np.abs(sb3_q).max() / 15 + 1e-5  # the grid's own kernel
    assert recovered.original.fingerprint() == agent.policy.fingerprint()  # fp32 is the ORIGINAL policy
    by_label = {r["precision"]: r for r in records}
    assert by_label["fp32"]["policy_sha256"] == agent.policy.fingerprint()
    assert by_label["int4"]["policy_sha256"] == recovered.kernel.fingerprint()
    assert len(by_label["int4"]["returns"]) == 4
    # a tampered export is refused
    (out / "export" / "policy.onnx").write_bytes(b"x")
    with pytest.raises(QuarlError):
        load_recovered(out)


def test_recover_options_are_checked_in_one_line() -> None:
    with pytest.raises(QuarlError, match="not a real int precision"):
        RecoverConfig(precision="fp16")
    with pytest.raises(QuarlError, match="rounds=0"):
        RecoverConfig(rounds=0)
    with pytest.raises(QuarlError, match="learning rate"):
        RecoverConfig(lr=float("nan"))


def test_recover_parses_its_precision_once_and_compares_configs_as_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The precision label becomes a QuantConfig once, where the config is checked; a file's
    ``config`` (its fields) is read back as a config and compared as one: the same fields and
    values or nothing (an older quarl's fields, a value no config takes)."""
    from quarl.quantization.config import QuantConfig

    parsed: list[str] = []
    parse = QuantConfig.parse

    def counted(label: str, **options: object) -> QuantConfig:
        parsed.append(label)
        return parse(label, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(QuantConfig, "parse", counted)
    config = RecoverConfig(precision="int4-block", block_size=64, rounds=3)
    assert config.quant_config() == config.quant_config() and config.quant.mode == "block"
    assert config.quant_config().block_size == 64 and config.quant_config().int8_weights != "auto"
    assert parsed == ["int4-block"]  # at construction, never again
    fields = dataclasses.asdict(config)
    assert "quant" not in fields and RecoverConfig.from_record(fields) == config
    assert RecoverConfig.from_record({**fields, "rounds": 4}) == RecoverConfig(precision="int4-block", block_size=64,
                                                                               rounds=4) != config
    older = {key: value for key, value in fields.items() if key != "budget_minutes"}
    assert RecoverConfig.from_record(older) is None and RecoverConfig.from_record({**fields, "extra": 1}) is None
    assert RecoverConfig.from_record({**fields, "lr": "0.1"}) is None
    assert RecoverConfig.from_record({**fields, "precision": "fp16"}) is None


@pytest.mark.slow  # over 10 s: run with -m slow
def test_a_study_adds_a_recovered_column_recovered_once_per_agent(tiny_dqn: Path, tmp_path: Path) -> None:
    from quarl.study.grid import StudyConfig, run_study
    from quarl.study.report import study_table

    config = StudyConfig((tiny_dqn,), ("fp32", "int4", "rec-int4"), (0, 1), episodes=3, n_envs=3, out=tmp_path)
    with pytest.raises(QuarlError, match="bare checkpoint"):  # a bare zip names no env: refused before any work
        run_study(config)
    folder = tmp_path / "agent" / "dqn" / "CartPole-v1_1"  # as an RL Zoo folder, the study finds its env
    folder.mkdir(parents=True)
    (folder / "CartPole-v1.zip").write_bytes(tiny_dqn.read_bytes())
    (folder / "CartPole-v1").mkdir()
    (folder / "CartPole-v1" / "args.yml").write_text("env: CartPole-v1\n")
    (folder / "CartPole-v1" / "config.yml").write_text("{}\n")
    config = StudyConfig((folder,), ("fp32", "int4", "rec-int4"), (0, 1), episodes=3, n_envs=3, out=tmp_path / "s")
    records = run_study(config)
    recovered = [r for r in records if r["precision"] == "rec-int4"]
    assert len(recovered) == 2 and all(r["quant"]["recovered"] for r in recovered)
    assert len(list((tmp_path / "s" / "recovered").iterdir())) == 1  # one recovery for both seeds
    row = study_table(records, ["int4", "rec-int4"])[0]
    assert "rec-int4 verdict" in row and row["fp32"] == pytest.approx(np.mean([r["mean"] for r in records
                                                                               if r["precision"] == "fp32"]), abs=0.01)


def test_fine_tuning_with_the_agents_own_algorithm_trains_on_the_kernels_grid(tiny_dqn: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import quarl
    from quarl.training.finetune import finetune

    monkeypatch.setattr("quarl.training.finetune.REFILL_STEPS", 1_000)  # fewer steps of play before the updates

    agent = quarl.load(tiny_dqn, env="CartPole-v1")
    kernel = MODES["int4-block"].runnable(agent.policy.network)  # as recover picks it: its fallback where this CPU
    spec = _spec(kernel.label, frozenset({0}))  # cannot run it (int4-weight-only)
    student = finetune(tiny_dqn, agent.policy, agent.env_spec, spec, None, steps=600)
    start = make_student(agent.policy.network, spec)
    moved = [float((a - b).detach().abs().max()) for a, b in zip(student.parameters(), start.parameters(), strict=True)]
    assert max(moved) > 0  # DQN's own updates changed the acting network
    err, to_fp32 = _max_error(student, spec, _cartpole_states(), (4,))
    assert err <= max(0.1 * to_fp32, 1e-6)  # and its real kernel computes what it computes
    with pytest.raises(QuarlError, match="must be in 1..100,000,000"):
        finetune(tiny_dqn, agent.policy, agent.env_spec, spec, None, steps=0)


@pytest.mark.slow
def test_quarl_recover_killed_mid_run_resumes_after_its_last_round(tiny_dqn: Path, tmp_path: Path) -> None:
    """SIGKILL to a running ``quarl recover`` (no cleanup at all): the rerun continues after
    the last round written to OUT/.recover/state.pt and ends with every round recorded."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "rec"
    args = [sys.executable, "-m", "quarl.cli", "recover", str(tiny_dqn), "--env", "CartPole-v1", "--precision",
            "int4-block", "--rounds", "8", "--updates", "300", "--episodes", "3", "--workers", "1", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / ".recover" / "state.pt"
    deadline = time.monotonic() + 300
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert state.exists()
    rounds_before = len(torch.load(state, weights_only=True)["history"])
    assert 1 <= rounds_before < 8
    rerun = subprocess.run([*args, "-v"], env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"resuming recovery at round {rounds_before}" in rerun.stdout + rerun.stderr
    record = json.loads((out / "CartPole-v1" / "recovery.json").read_text())
    assert [r["round"] for r in record["rounds"]] == list(range(len(record["rounds"])))


@pytest.mark.slow  # over 10 s: run with -m slow
def test_ptq_says_how_to_recover_where_int4_loses_and_recover_keeps_the_zoo_dqn(tmp_path: Path) -> None:
    """The zoo's DQN CartPole loses at int4 (near-tied Q-values); ptq prints the command,
    and that command's verdict keeps the ORIGINAL fp32 policy's 500 at real int4."""
    from tests.conftest import run_cli, zoo_run
    from tests.test_cli import read_csv

    agent = zoo_run("dqn", "CartPole-v1")
    r = run_cli("ptq", str(agent), "--precisions", "int4", "--episodes", "5", "--out", str(tmp_path / "ptq"))
    assert r.returncode == 0, r.stderr
    assert f"int4 loses: recover it with quarl recover {agent} --precision int4" in r.stdout.replace("\n", " ")
    out = tmp_path / "rec"
    r = run_cli("recover", str(agent), "--precision", "int4", "--episodes", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = {row["precision"]: row for row in read_csv(out / "verdict" / "ptq.csv")}
    assert float(rows["fp32"]["mean"]) == 500.0 and float(rows["int4"]["mean"]) == 500.0
    # 500 on 5 of 5 seeds: no loss seen, but 5 clean episodes cannot exclude one (about 100 can)
    assert rows["int4"]["verdict"].startswith("undecided (~") and rows["int4"]["mode"].startswith("int4-")
    # ptq on the recovered folder plays the original at fp32 and the recovered kernel at int4
    r = run_cli("ptq", str(out), "--precisions", "fp32,int4", "--episodes", "5", "--out", str(tmp_path / "again"))
    assert r.returncode == 0 and "fp32 is the original policy" in r.stdout.replace("\n", " ")
    again = {row["precision"]: row for row in read_csv(tmp_path / "again" / "ptq.csv")}
    assert again["int4"]["verdict"].startswith("undecided") and float(again["int4"]["mean"]) == 500.0


def test_a_damaged_recovered_folder_is_refused_never_judged_with_another_fp32(tiny_dqn: Path, tmp_path: Path) -> None:
    import shutil

    import quarl
    from quarl.recovery import load_recovered, run_recover

    agent = quarl.load(tiny_dqn, env="CartPole-v1")
    out = tmp_path / "rec"
    config = RecoverConfig(precision="int4", rounds=1, updates_per_round=20, finetune_steps=0)  # not a fine-tune
    run_recover(tiny_dqn, agent.env_spec, agent.policy, config, out)
    assert load_recovered(out) is not None
    cases = {
        "no record": lambda d: (d / "CartPole-v1" / "recovery.json").unlink(),
        "no export": lambda d: (d / "export" / "policy.onnx").unlink(),
        "another zip": lambda d: shutil.copy(d / "CartPole-v1" / "original.zip", d / "CartPole-v1.zip"),
    }
    for name, damage in cases.items():
        broken = tmp_path / name.replace(" ", "-")
        shutil.copytree(out, broken)
        damage(broken)
        with pytest.raises(QuarlError, match="recover again"):
            load_recovered(broken)


def test_fine_tuning_prices_the_checkpoints_declared_architecture_before_building(tiny_dqn: Path,
                                                                                  tmp_path: Path) -> None:
    """A zip whose data entry declares net_arch [10**7, 10**7] (its tensors stay small) is
    refused in one line before SB3 allocates anything."""
    import json
    import zipfile

    import quarl
    from quarl.training.finetune import finetune

    crafted = tmp_path / "crafted.zip"
    with zipfile.ZipFile(tiny_dqn) as src, zipfile.ZipFile(crafted, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "data":
                entry = json.loads(data)
                entry["policy_kwargs"]["net_arch"] = [10**7, 10**7]
                data = json.dumps(entry).encode()
            dst.writestr(info, data)
    agent = quarl.load(crafted, env="CartPole-v1")
    with pytest.raises(QuarlError, match="net_arch"):
        finetune(crafted, agent.policy, agent.env_spec, _spec("int4-block", frozenset({0})), None, steps=100)


@pytest.fixture(scope="module")
def balancing_dqn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DQN zip whose Q-network is a hand-set CartPole controller (push toward the lean):
    500 on every seed at fp32 and at int4, no training needed."""
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [8]}, seed=0, device="cpu")
    lean = torch.tensor([0.1, 0.5, 10.0, 2.0])
    with torch.no_grad():
        for net in (model.q_net, model.q_net_target):
            first, last = net.q_net[0], net.q_net[2]
            for p in (first.weight, first.bias, last.weight, last.bias):
                p.zero_()
            first.weight[0], first.weight[1] = lean, -lean
            last.weight[1, 0] = last.weight[0, 1] = 1.0
    path = tmp_path_factory.mktemp("controller") / "dqn-cartpole.zip"
    model.save(path)
    return path


def _worse_students(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Distillation made deliberately harmful: every student it returns has its action
    values swapped (it pushes away from the lean), while its round still counts as trained."""
    import quarl.recovery.workflow as workflow
    from quarl.quant.student import quantized_layers

    real, calls = workflow.distill, []

    def worse(policy, env_spec, config, spec=None, *args, **kwargs):
        result = real(policy, env_spec, config, spec, *args, **kwargs)
        student = copy.deepcopy(result.student)
        with torch.no_grad():
            last = quantized_layers(student)[-1].layer
            last.weight.copy_(last.weight.flip(0))
            last.bias.copy_(last.bias.flip(0))
        calls.append(len(result.history))
        return dataclasses.replace(result, student=student, model=real_model(student, result.spec, policy.input_shape),
                                   best_round=max(result.best_round, 0))

    monkeypatch.setattr(workflow, "distill", worse)  # where the stages call it
    return calls


def test_recover_writes_ptqs_own_model_where_the_student_plays_worse(balancing_dqn: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A student that plays worse than PTQ's own model is never written: the paired test on
    recovery's test seeds says so, PTQ's model is written (zip and export), recovery.json
    records it with the test's numbers, and the run stops because PTQ's model keeps fp32."""
    import json

    import quarl
    from quarl.quant.student import sb3_tensors
    from quarl.recovery import TEST_SEEDS, load_recovered, run_recover, shipped_line, workflow

    calls = _worse_students(monkeypatch)
    agent = quarl.load(balancing_dqn, env="CartPole-v1")
    config = RecoverConfig(precision="int4-block", rounds=1, updates_per_round=5, max_rounds=2, finetune_steps=0)
    # PTQ keeps fp32 here: recover ships it without a round
    record, _ = run_recover(balancing_dqn, agent.env_spec, agent.policy, config, tmp_path / "as-is")
    assert calls == [] and record["shipped"] == "ptq" and record["stopped"] == "kept" and record["stages"] == []
    assert record["rounds"] == [] and record["budget"]["rounds_played"] == 0 and record["against_fp32"]["kept"]
    assert record["sizes"]["shipped"] == record["sizes"]["ptq"] > 0  # a tiny net: the graph outweighs its weights
    assert "as it is" in shipped_line(record) and "it already keeps the original fp32's return" in shipped_line(record)
    assert shipped_line(record).endswith("stopped: kept, nothing to repair")
    _in_the_docs(shipped_line(record))
    assert load_recovered(tmp_path / "as-is") is not None
    # asked to repair anyway (as where PTQ's first look were undecided), the worse student is still never written
    monkeypatch.setattr(workflow, "ptq_keeps", lambda judge: False)
    out = tmp_path / "rec"
    record, _ = run_recover(balancing_dqn, agent.env_spec, agent.policy, config, out)
    assert calls == [1]  # PTQ's model keeps fp32: no second stage
    assert record["shipped"] == "ptq" and record["stopped"] == "kept" and record["best_round"] == -1
    stage = record["stages"][0]
    test = stage["against_ptq"]
    assert not test["kept"] and test["verdict"] == "loses" and test["means"][0] == 500.0 and test["means"][1] < 100
    assert test["high"] < 0 or test["low"] > 0  # decided: E's interval excludes 0
    assert TEST_SEEDS.start == test["seeds"][0] and test["seeds"][1] < TEST_SEEDS.stop
    keeps = record["against_fp32"]
    assert keeps["kept"] and keeps["verdict"] == "keeps" and keeps["means"] == [500.0, 500.0]
    assert keeps["episodes"] >= 60  # clean episodes enough to exclude an unseen failure (one-sided: log(20) / 0.05)
    assert json.loads((out / "CartPole-v1" / "recovery.json").read_text())["shipped"] == "ptq"
    # what was written is PTQ's own model: the zip's weights on the grid and the export's kernel
    recovered = load_recovered(out)
    assert recovered is not None
    spec = KernelSpec.from_dict(record["kernel"])
    ptq = make_student(agent.policy.network, spec)
    assert (out / "export" / "policy.onnx").read_bytes() == real_model(ptq, spec, (4,))
    states = _cartpole_states(64)
    assert np.array_equal(recovered.kernel.forward(states).argmax(1),
                          agent.policy.network(torch.from_numpy(states)).argmax(1).numpy())
    from stable_baselines3 import DQN

    sb3 = DQN.load(out / "CartPole-v1.zip", device="cpu")
    for name, value in sb3_tensors(agent.policy.network, ptq).items():
        assert torch.equal(sb3.policy.state_dict()[name], value.reshape(sb3.policy.state_dict()[name].shape))
    line = shipped_line(record)
    kernel = MODES["int4-block"].runnable(agent.policy.network).label  # its fallback where this CPU cannot run it
    assert spec.mode == kernel and line.startswith(f"wrote PTQ's own {kernel} model, ")
    assert f"bytes (fp32 {record['sizes']['fp32']:,}), not a student" in line
    assert "stopped: kept" in line
    _in_the_docs(line)


def _in_the_docs(line: str) -> None:
    """docs/recover.md shows ``line`` as printed (its model sizes, which the ONNX version
    decides, and the int4 kernel, which this CPU decides, left out of the comparison)."""
    from tests.conftest import ROOT

    def sizes_out(text: str) -> str:
        text = re.sub(r"\bint4-(block|weight-only)\b", "int4-KERNEL", text)
        return re.sub(r"[\d,]+ bytes \(fp32 [\d,]+\)", "N bytes (fp32 M)", text)

    docs = sizes_out((ROOT / "docs" / "recover.md").read_text())
    assert sizes_out(line) in docs.splitlines(), sizes_out(line)


def test_recover_goes_on_until_kept_or_its_budget_is_spent_and_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where nothing keeps fp32's return, every stage runs (more rounds to max_rounds, then
    the fine-tune) and the report says the budget was spent; the stages and budget are recorded."""
    from quarl.recovery import recover_stages, shipped_line

    calls = _worse_students(monkeypatch)
    # the controller with its two action values 0.05 apart on a common 5: int4 rounds the lead to 0 (PTQ pushes
    # one way and falls), and distillation is made harmful: nothing keeps fp32's 500
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        lean = torch.tensor([0.1, 0.5, 10.0, 2.0])
        net[0].weight[0], net[0].weight[1], net[0].bias[7] = lean, -lean, 1.0
        net[2].weight[1, 0] = net[2].weight[0, 1] = 0.05
        net[2].weight[:, 7] = 5.0
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax",
                    algo="dqn")
    config = RecoverConfig(precision="int4-block", rounds=1, updates_per_round=5, max_rounds=3, finetune_steps=0)
    spec = _spec("int4-block", frozenset({0}))
    result, report = recover_stages(Path("unused.zip"), policy, CARTPOLE, config, spec)
    # distill, then (a DQN at int4) the repairs' kernels a round each (the mixed int4/int8 head, blocks of 16, both),
    # then a round more at a time up to max_rounds
    assert calls == [1, 1, 1, 1, 2, 3]
    assert report["stopped"] == "budget" and not report["against_fp32"]["kept"]
    stages = [s["stage"] for s in report["stages"]]
    assert stages[:4] == ["distill", "int4-block-head8", "blocks of 16", "int4-block-head8, blocks of 16"]
    assert [(s.get("mode"), s.get("block_size")) for s in report["stages"][:4]] == [
        (None, None), ("int4-block-head8", 32), ("int4-block", 16), ("int4-block-head8", 16)]
    # the rounds go on with the kernel of the best candidate (here all fall at once: a tie with PTQ is a candidate)
    assert [s.split(" ")[:2] for s in stages[4:]] == [["rounds", "2"], ["rounds", "3"]]
    assert report["budget"]["rounds_played"] == 3
    fp32, written = report["against_fp32"]["means"]
    assert fp32 == 500.0 and written < 100
    # whatever was written plays at least as well as PTQ's model (here both fall at once)
    assert report["shipped"] == "ptq" or report["against_ptq"]["kept"]
    assert "stopped: budget spent (3 of 3 rounds" in shipped_line({"kernel": {"mode": spec.mode}, **report})
    from quarl.recovery.report import RecoveryReport, StageReport, TestOutcome

    assert set(report) == set(RecoveryReport.__annotations__) - {"finetune"}  # no fine-tune was asked for
    assert all(set(s) | {"mode", "block_size"} == set(StageReport.__annotations__) - {"steps"}
               for s in report["stages"])
    assert all(set(s[t]) <= set(TestOutcome.__annotations__) for s in report["stages"] for t in ("against_ptq",
                                                                                                  "against_fp32"))


def test_the_ranking_loss_asks_the_teachers_order_of_every_action_weighted_by_its_gap() -> None:
    from quarl.recovery.losses import _ranking

    teacher = torch.tensor([[3.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    ordered = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 5.0, 1.0, 2.0]])  # a tied teacher's state asks nothing
    assert float(_ranking(ordered, teacher, 1.0)) == 0.0
    last_two_swapped = torch.tensor([[3.0, 2.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert float(_ranking(last_two_swapped, teacher, 1.0)) > 0.0  # a pair below the greedy action counts too
    # a state counts by the teacher's action gap: the same flip costs more where the teacher leads by more
    wide, narrow = torch.tensor([[3.0, 0.0]]), torch.tensor([[3.0, 2.9]])
    flipped = torch.tensor([[0.0, 3.0]])
    both = _ranking(torch.cat([flipped, flipped]), torch.cat([wide, narrow]), 3.0)
    assert float(both) > 0.5 * float(_ranking(flipped, wide, 3.0) + _ranking(flipped, narrow, 3.0))
