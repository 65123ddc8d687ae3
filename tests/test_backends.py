"""Every real backend against its simulated reference, and the quantize() entry point."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.evaluation.episodes import evaluate
from quarl.policies.base import Policy
from quarl.quant.backends.onnxruntime import OrtEngine, export_onnx, has_vnni, quantize_dynamic_int8
from quarl.quant.backends.reference import simulate_dynamic_int8
from quarl.quant.primitives import quantize_dequantize
from quarl.quantization.api import quantize
from quarl.quantization.config import QuantConfig
from quarl.quantization.precisions import quantize_weights
from tests.conftest import zoo_run


def _rollout_states(run, n: int = 2000) -> tuple[Policy, np.ndarray]:
    ckpt = load_checkpoint(run)
    result = evaluate(ckpt.policy, ckpt.env_spec, episodes=4, seed=123, keep_observations=n)
    return ckpt.policy, result.observations


@pytest.mark.parametrize(
    "algo,env",
    [("dqn", "CartPole-v1"), ("ppo", "LunarLander-v2"), ("sac", "Pendulum-v1"), ("ppo", "HalfCheetah-v3")],
)
@pytest.mark.parametrize("weights", ["asymmetric", "symmetric"])
def test_dynamic_int8_engine_matches_simulated_reference_on_rollout(algo: str, env: str, weights: str) -> None:
    if weights == "symmetric" and not has_vnni():
        pytest.skip("u8 x s8 kernels saturate int16 sums on CPUs without VNNI: symmetric int8 is inexact here")
    policy, states = _rollout_states(zoo_run(algo, env))
    int8 = quantize(policy, QuantConfig("int8", mode="dyn-tensor", int8_weights=weights))
    real = int8.forward(states)
    with torch.inference_mode():
        ref = simulate_dynamic_int8(policy.network, weights)(torch.from_numpy(states)).numpy()
    scale = np.abs(ref).max()
    assert np.abs(real - ref).max() <= 1e-3 * scale  # int32 vs float accumulation only
    a_real, a_ref = int8.postprocess(real), int8.postprocess(ref)
    if policy.head == "argmax":
        assert np.mean(a_real == a_ref) >= 0.99
    else:
        # float vs int32 sums can flip one rounding step of a later layer's input on a rare state
        assert np.abs(a_real - a_ref).max() <= 5e-3 * np.abs(a_ref).max() + 1e-6
        assert np.median(np.abs(a_real - a_ref)) <= 1e-5 * np.abs(a_ref).max()


def test_int8_runs_integer_kernels_and_is_smaller() -> None:
    import onnx

    net = nn.Sequential(nn.Linear(17, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 6))
    fp32 = export_onnx(net, (17,))
    int8 = quantize_dynamic_int8(fp32)
    ops = {n.op_type for n in onnx.load_from_string(int8).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    assert len(int8) < 0.4 * len(fp32)


def test_int8_rows_are_independent() -> None:
    """Row-by-row dynamic quantization: a batch gives what batch-1 calls give."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 3))
    engine = OrtEngine(quantize_dynamic_int8(export_onnx(net, (8,))), per_row=True)
    x = (np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
         * np.linspace(0.1, 10, 16)[:, None].astype(np.float32))
    batch = engine(x)
    single = np.concatenate([engine(x[i : i + 1]) for i in range(16)])
    assert np.array_equal(batch, single)


def test_cnn_int8_static_close_to_fp32() -> None:
    torch.manual_seed(0)
    from quarl.policies.sb3 import _features  # NatureCNN builder

    sd = {}
    ref_cnn = nn.Sequential(
        nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 1), nn.ReLU()
    )
    for i, m in enumerate(ref_cnn):
        if isinstance(m, nn.Conv2d):
            sd[f"cnn.{i}.weight"], sd[f"cnn.{i}.bias"] = m.weight.detach(), m.bias.detach()
    lin = nn.Linear(3136, 512)
    sd["linear.0.weight"], sd["linear.0.bias"] = lin.weight.detach(), lin.bias.detach()
    net = nn.Sequential(*_features(sd, "", (4, 84, 84)), nn.Linear(512, 6))
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    policy = Policy(net, space, gym.spaces.Discrete(6), "argmax", scale_images=True)
    rng = np.random.default_rng(0)
    # smooth "frames": random blobs, so that activations have structure
    base = rng.integers(0, 256, (64, 4, 21, 21)).astype(np.float32)
    frames = np.repeat(np.repeat(base, 4, axis=2), 4, axis=3).astype(np.uint8)
    x = policy.preprocess(frames)
    int8 = quantize(policy, QuantConfig("int8"), calibration=x[:32])
    ref = policy.forward(x[32:])
    got = int8.forward(x[32:])
    # a random-init CNN sums 3136 noisy features into tiny outputs: judge by correlation
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.95
    assert np.abs(got - ref).max() <= 0.25 * np.abs(ref).max()
    with pytest.raises(QuarlError, match="calibration"):
        quantize(policy, QuantConfig("int8"))


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_float_precisions_track_fp32(precision: str) -> None:
    policy, states = _rollout_states(zoo_run("ppo", "HalfCheetah-v3"), 500)
    q = quantize(policy, QuantConfig(precision))
    tol = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 5e-2}[precision]
    ref = policy.forward(states)
    assert np.abs(q.forward(states) - ref).max() <= tol * np.abs(ref).max()
    assert q.precision == precision and policy.precision == "fp32"


def test_nbit_policy_runs_rounded_weights() -> None:
    policy, states = _rollout_states(zoo_run("ppo", "CartPole-v1"), 200)
    cfg = QuantConfig("nbit", bits=4)
    q = quantize(policy, cfg)
    lin = [m for m in q.network if isinstance(m, nn.Linear)]
    orig = [m for m in policy.network if isinstance(m, nn.Linear)]
    for a, b in zip(lin, orig, strict=True):
        assert torch.equal(a.weight, quantize_dequantize(b.weight, 4, "quarl"))
        assert torch.equal(a.bias, b.bias)
        assert len(torch.unique(a.weight)) <= 2**4 + 1
    with torch.inference_mode():
        ref = q.network(torch.from_numpy(states)).numpy()
    assert np.allclose(q.forward(states), ref, atol=1e-5)  # ONNX Runtime on the rounded weights


def test_activation_quantization_uses_calibrated_ranges() -> None:
    policy, states = _rollout_states(zoo_run("ppo", "CartPole-v1"), 300)
    q = quantize(policy, QuantConfig("nbit", bits=3, activations=True), calibration=states)
    with torch.inference_mode():
        h = torch.from_numpy(states)
        outs = []
        for m in q.network:
            h = m(h)
            if type(m).__name__ == "ActivationFakeQuant":
                outs.append(h)
    assert len(outs) == 3
    for o in outs:
        assert len(torch.unique(o)) <= 2**3  # clamped affine: at most 2^n levels
    with pytest.raises(QuarlError, match="calibration"):
        quantize(policy, QuantConfig("nbit", bits=3, activations=True))


def test_quantize_weights_leaves_input_untouched() -> None:
    net = nn.Sequential(nn.Linear(3, 4))
    before = net[0].weight.clone()
    quantize_weights(net, QuantConfig("nbit", bits=2))
    assert torch.equal(net[0].weight, before)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"precision": "int5"}, "unknown precision 'int5'"),
        ({"precision": "int4", "mode": "static"}, "unknown int4 mode 'static'"),
        ({"precision": "fp16", "mode": "block"}, "a mode .* is for int8 / int4 only"),
        ({"precision": "int4", "block_size": 24}, "block size 24 is not allowed: 16, 32, 64, 128 or 256"),
        ({"precision": "int4", "block_size": 8}, "block size 8 is not allowed"),
        ({"precision": "nbit", "bits": 1}, r"bits=1 is out of range: allowed 2\.\.16"),
        ({"precision": "nbit", "bits": 17}, r"bits=17 is out of range"),
        ({"precision": "nbit", "scheme": "log"}, "unknown scheme 'log'"),
        ({"precision": "nbit", "granularity": "row"}, "unknown granularity 'row'"),
        ({"precision": "int8", "int8_weights": "int4"}, "unknown int8 weight format"),
        ({"precision": "fp16", "activations": True}, "activations=True needs precision 'nbit'"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(QuarlError, match=message):
        QuantConfig(**kwargs)


def test_config_parse_labels() -> None:
    assert QuantConfig.parse("INT8") == QuantConfig("int8")
    assert QuantConfig.parse("int4") == QuantConfig("int4", bits=4)
    assert QuantConfig.parse("int8-dyn-channel").mode == "dyn-channel"
    assert QuantConfig.parse("int4-weight-only").label == "int4-weight-only"
    assert QuantConfig.parse("sim4") == QuantConfig("nbit", bits=4)
    assert QuantConfig.parse("sim4").label == "sim4"
    with pytest.raises(QuarlError, match="unknown precision 'fp8'"):
        QuantConfig.parse("fp8")
    with pytest.raises(QuarlError, match=r"int6 has no real kernel: sim6 simulates it"):
        QuantConfig.parse("int6")
    with pytest.raises(QuarlError, match="unknown precision 'sim1'"):
        QuantConfig.parse("sim1")


def test_building_an_nbits_model_leaves_the_root_logger_alone() -> None:
    """ONNX Runtime's MatMulNBits quantizer configures the root logger at INFO when its
    module is imported; quarl puts it back, so a user's program is not flooded with INFO lines."""
    import logging
    import subprocess
    import sys

    code = ("import logging, numpy as np, torch\n"
            "from quarl.quant.backends.onnxruntime import export_onnx, quantize_nbits\n"
            "net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))\n"
            "quantize_nbits(export_onnx(net, (64,)), 4)\n"
            "root = logging.getLogger()\n"
            "print(len(root.handlers), root.level)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", str(logging.WARNING)]


@pytest.mark.parametrize("mode", ["int4-weight-only", "int8-weight-only"])
def test_a_portable_export_dequantizes_to_the_very_weights_matmulnbits_uses(mode: str, tiny_run: Path,
                                                                           tmp_path: Path) -> None:
    """--portable: MatMulNBits as standard blocked DequantizeLinear + MatMul (opset 21), the
    same codes, scales and zero points; run in fp32 arithmetic it gives what the weight-only
    kernel gives (to float rounding), and quarl ptq plays it."""
    import json

    import onnx
    import onnxruntime as ort

    from tests.conftest import run_cli

    out = tmp_path / "p"
    r = run_cli("export", str(tiny_run), "--precision", mode, "--portable", "--out", str(out))
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "policy.json").read_text())
    proto = onnx.load(str(out / "policy.onnx"))
    onnx.checker.check_model(proto)
    assert {n.domain for n in proto.graph.node} == {""} and "DequantizeLinear" in meta["ops"]["ai.onnx"]
    assert meta["runtimes"] == "any ONNX runtime with these opsets" and meta["opsets"]["ai.onnx"] == 21
    check = meta["portable"]["fp32_arithmetic"]
    assert check["action_agreement"] == 1.0 and check["max_abs_diff"] < 1e-4
    # against the contrib model of the same mode, exported again (the mode's weights are deterministic)
    contrib = tmp_path / "c"
    assert run_cli("export", str(tiny_run), "--precision", mode, "--out", str(contrib)).returncode == 0
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = ort.InferenceSession(str(contrib / "policy.onnx"), providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
    b = ort.InferenceSession(str(out / "policy.onnx"), plain,
                             providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    assert run_cli("ptq", str(out), "--episodes", "2").returncode == 0


def test_an_fp16_export_holds_fp16_weights_and_computes_as_fp16(tiny_run: Path, tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort

    from quarl.checkpoints import load_checkpoint
    from tests.conftest import run_cli

    out = tmp_path / "f16"
    assert run_cli("export", str(tiny_run), "--precision", "fp16", "--out", str(out)).returncode == 0
    proto = onnx.load(str(out / "policy.onnx"))
    weights = [t for t in proto.graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    x = np.random.default_rng(0).normal(size=(128, 4)).astype(np.float32)
    got = ort.InferenceSession(str(out / "policy.onnx"), providers=["CPUExecutionProvider"]).run(None, {"obs": x})[0]
    network = load_checkpoint(tiny_run).policy.network
    with torch.no_grad():
        want = network.half()(torch.from_numpy(x).half()).float().numpy()
        full = load_checkpoint(tiny_run).policy.network(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() < 2e-2 * max(1.0, np.abs(want).max())
    assert np.abs(got - full).max() > 0  # fp16 arithmetic, not fp32 behind a label
    assert run_cli("ptq", str(out), "--episodes", "2").returncode == 0
