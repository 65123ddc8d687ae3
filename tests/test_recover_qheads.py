"""Issue 50: the repairs of Q-value heads at int4 (the mixed int4/int8 head mode, blocks of
16) and how recover picks among them: its real kernel against its reference, the student
against the kernel built from its integers, the automatic choice never running it, and a
recovery that ships the mixed kernel where int4 itself cannot keep fp32's return."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import onnx
import torch
from torch import nn

from quarl.envs import EnvSpec
from quarl.policies.base import Policy
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.modes import MODES, BuildRequest, head_index, int8_compute, modes_for, wider_head_mode
from quarl.quant.student import KernelSpec, make_student, quantized_layers, real_model
from quarl.recovery import RecoverConfig
from tests.conftest import skip_where_the_cpu_cannot_run

CARTPOLE = EnvSpec("CartPole-v1")
HEAD8 = "int4-block-head8"


def _mlp(sizes: tuple[int, ...] = (6, 64, 64, 4), seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).eval()


def _bits_of_nodes(model: bytes) -> list[int | str]:
    """Each weight node in graph order: its MatMulNBits bits, or its op type."""
    nodes = [n for n in onnx.load_from_string(model).graph.node
             if n.op_type in ("MatMulNBits", "MatMul", "Gemm")]
    return [next(a.i for a in n.attribute if a.name == "bits") if n.op_type == "MatMulNBits" else n.op_type
            for n in nodes]


def test_the_mixed_mode_runs_its_head_in_8_bit_blocks_and_sits_between_int4_and_int8_in_size() -> None:
    skip_where_the_cpu_cannot_run(HEAD8)
    net = _mlp()
    request = BuildRequest(net, ortb.export_onnx(net, (6,)), None, "asymmetric", 32, frozenset())
    sizes = {label: len(MODES[label].build(request)) for label in ("int4-block", HEAD8, "int8-block")}
    assert _bits_of_nodes(MODES[HEAD8].build(request)) == [4, 4, 8]
    assert sizes["int4-block"] < sizes[HEAD8] < sizes["int8-block"]
    # the head's 4 x 64 codes at 8 bits instead of 4: 128 bytes more, its 8 zero points unpacked 4 more; the rest
    # as int4-block (a few bytes of node attributes apart)
    assert 4 * 64 // 2 + 4 <= sizes[HEAD8] - sizes["int4-block"] <= 4 * 64 // 2 + 16
    kept = BuildRequest(net, request.model, None, "asymmetric", 32, frozenset({0, 2}))  # a head in fp32: int4 alone
    assert _bits_of_nodes(MODES[HEAD8].build(kept)) == ["MatMul", 4, "MatMul"] or \
        _bits_of_nodes(MODES[HEAD8].build(kept)) == ["Gemm", 4, "Gemm"]
    x = np.random.default_rng(0).normal(size=(32, 6)).astype(np.float32)
    with torch.inference_mode():
        fp32 = net(torch.from_numpy(x)).numpy()
    real = {label: ortb.OrtEngine(MODES[label].build(request))(x) for label in ("int4-block", HEAD8)}
    # the head at 8 bits is closer to fp32 than at 4
    assert np.abs(real[HEAD8] - fp32).max() < np.abs(real["int4-block"] - fp32).max()


def test_the_automatic_choice_never_runs_the_mixed_mode_and_recover_finds_it_by_its_grid() -> None:
    assert HEAD8 not in [m.label for m in modes_for(4)] and "int4-block" in [m.label for m in modes_for(4)]
    head8 = wider_head_mode(MODES["int4-block"])
    assert head8 is not None and head8.label == HEAD8 and head8.fallback == "int4-weight-only-head8"
    assert wider_head_mode(MODES["int4-weight-only"]) is MODES["int4-weight-only-head8"]
    assert wider_head_mode(MODES["int8-block"]) is None and wider_head_mode(MODES[HEAD8]) is None
    assert head_index(_mlp()) == 2


def test_the_mixed_student_rounds_its_head_at_8_bits_and_its_kernel_computes_the_same() -> None:
    skip_where_the_cpu_cannot_run(HEAD8)
    net = _mlp()
    spec = KernelSpec(HEAD8, frozenset(), 32, "asymmetric", int8_compute(4) == "int8")
    student = make_student(net, spec)
    assert [layer.bits for layer in quantized_layers(student)] == [4, 4, 8]
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a trained student: its weights moved off the teacher's
        for p in student.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    x = np.random.default_rng(1).normal(size=(64, 6)).astype(np.float32) * 2
    real = ortb.OrtEngine(real_model(student, spec, (6,)))(x)
    with torch.inference_mode():
        want = student.eval()(torch.from_numpy(x)).numpy()
    per_row = np.sort(np.abs(real - want).max(1))
    assert per_row[int(0.98 * len(x)) - 1] < 1e-3  # a rounding tie may flip one step of one activation


def _q(algo: str = "dqn") -> Policy:
    """A CartPole controller whose two action values lie 0.05 apart on a common 5: int4's
    head rounds the lead to 0 (its step is 5 / 15) and the pole falls; 8 bits keep it (5 / 255)."""
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        lean = torch.tensor([0.1, 0.5, 10.0, 2.0])
        net[0].weight[0], net[0].weight[1], net[0].bias[7] = lean, -lean, 1.0
        net[2].weight[1, 0] = net[2].weight[0, 1] = 0.05
        net[2].weight[:, 7] = 5.0
    return Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax", algo=algo)


def test_recover_picks_the_repairs_kernels_in_order_for_q_heads_only() -> None:
    from quarl.recovery.workflow import repairs

    spec = KernelSpec("int4-block", frozenset({0}), 32, "asymmetric", True)
    assert [(name, s.mode, s.block_size) for name, s in repairs(_q(), spec)] == [
        (HEAD8, HEAD8, 32), ("blocks of 16", "int4-block", 16), (f"{HEAD8}, blocks of 16", HEAD8, 16)]
    head_fp32 = KernelSpec("int4-weight-only", frozenset({0, 1}), 32, "asymmetric", False)
    assert [name for name, _ in repairs(_q(), head_fp32)] == ["blocks of 16"]  # no head to widen
    assert [name for name, _ in repairs(_q(), KernelSpec("int4-block", frozenset(), 16, "asymmetric", True))] == [HEAD8]
    assert repairs(_q("ppo"), spec) == []  # logits heads: not this repairs


def test_recover_ships_the_mixed_head_where_int4_cannot_keep_and_says_so(tmp_path: Path) -> None:
    """int4 PTQ of the controller falls; one round of distillation on int4 does not lift it
    (its head's lead is below int4's step); the mixed kernel's model keeps fp32's 500 and
    is written, named, with its size, judged by the same paired tests."""
    from quarl.recovery import recover_stages, shipped_line

    policy = _q()
    config = RecoverConfig(precision="int4-block", rounds=1, updates_per_round=5, max_rounds=3, finetune_steps=0)
    base = MODES["int4-block"].runnable(policy.network)  # int4-weight-only where this CPU's block kernels are inexact
    mixed = wider_head_mode(base)
    assert mixed is not None
    spec = KernelSpec(base.label, frozenset({0}), 32, "asymmetric", int8_compute(4) == "int8")
    result, report = recover_stages(Path("unused.zip"), policy, CARTPOLE, config, spec, tmp_path / "state.pt")
    assert result.spec.mode == mixed.label and result.spec.block_size == 32
    assert report["stopped"] == "kept" and report["shipped"] == "student" and report["shipped_stage"] == mixed.label
    assert [s["stage"] for s in report["stages"]] == ["distill", mixed.label]  # stopped once kept: no blocks of 16
    assert report["against_fp32"]["kept"] and report["against_fp32"]["means"] == [500.0, 500.0]
    ptq, student = report["against_ptq"]["means"]
    assert student == 500.0 and ptq < 100
    assert report["ptq_mode"] == base.label and report["sizes"]["shipped"] == len(result.model)
    assert report["sizes"]["shipped"] > report["sizes"]["ptq"]  # the head's 8-bit blocks cost bytes
    line = shipped_line({"kernel": result.spec.to_dict(), **report})
    assert f"(mixed int4/int8 head: {mixed.label}, blocks of 32, {len(result.model):,} bytes" in line
    assert f"PTQ's own {base.label} model" in line and "stopped: kept" in line


def test_ptq_and_export_run_the_mixed_mode_by_its_label(tmp_path: Path) -> None:
    """``quarl ptq --precisions int4-block-head8`` and ``quarl export --precision int4-block-head8``
    build it as any mode: the policy acts on its real kernel, and the exported model is it."""
    skip_where_the_cpu_cannot_run(HEAD8)
    from quarl.export.artifact import write_artifact
    from quarl.policies.onnx_artifact import load_artifact
    from quarl.quantization.api import quantize
    from quarl.quantization.config import QuantConfig

    policy = _q()
    states = np.random.default_rng(2).normal(size=(64, 4)).astype(np.float32)
    mixed = quantize(policy, QuantConfig.parse(HEAD8), states)
    assert mixed.meta["quant"]["mode"] == HEAD8 and mixed.precision == HEAD8  # named as such in every table
    engine = mixed.engine
    assert isinstance(engine, ortb.OrtEngine) and _bits_of_nodes(engine.model)[-1] == 8
    write_artifact(mixed, mixed.precision, tmp_path / "policy", engine.model, mixed.meta["quant"], CARTPOLE)
    exported, _ = load_artifact(tmp_path)
    assert np.array_equal(exported.act_rows(states), mixed.act_rows(states))
