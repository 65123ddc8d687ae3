"""Batches that give every row the bits of a batch of one: verified batched forms and the
certified argmax, against the engines run row by row."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quarl.checkpoints import load_checkpoint
from quarl.evaluation.episodes import evaluate
from quarl.policies.base import Policy
from quarl.quant.backends.batching import CertifiedArgmax, RowVerdicts, per_row
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quantization.api import quantize
from quarl.quantization.config import QuantConfig
from tests.conftest import skip_where_the_cpu_cannot_run, zoo_run


def _one_by_one(engine, x: np.ndarray) -> np.ndarray:
    return np.concatenate([engine(x[i : i + 1]) for i in range(len(x))])


@pytest.mark.parametrize("shape", [(4, 64), (64, 64), (64, 2), (17, 256), (256, 6), (256, 1), (8, 4)])
def test_linear_layers_give_each_row_its_batch_one_bits(shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(*shape).requires_grad_(False)
    engine = TorchEngine(nn.Sequential(layer, nn.Tanh()))
    rng = np.random.default_rng(1)
    for n in (2, 3, 5, 8, 16, 8, 3):  # the second pass runs on the verdicts reached in the first
        x = rng.standard_normal((n, shape[0])).astype(np.float32)
        assert np.array_equal(engine.rows(x), _one_by_one(engine, x))
    assert engine._verdicts.known()  # every size got a verdict


def test_a_batched_form_whose_rows_influence_each_other_is_found_and_not_used() -> None:
    """A dynamic per-tensor scale (as ONNX Runtime's dynamic int8) takes its range over the
    whole batch: its batched form must be caught on the first batch of each size."""
    def scaled(h: torch.Tensor) -> torch.Tensor:
        return torch.round(h / h.abs().max() * 127)

    verdicts = RowVerdicts()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32))
    for _ in range(3):
        out = verdicts.run("scaled", x, scaled, scaled)
        assert torch.equal(out, per_row(scaled, x))
    assert verdicts.known() == {("scaled", 6): False}
    # a form that is row by row exact is taken once checked
    verdicts.run("tanh", x, torch.tanh, torch.tanh)
    assert verdicts.verdict("tanh", 6) is True


def test_identical_live_rows_do_not_hide_rows_that_influence_each_other() -> None:
    """Atari's first frames are the same for every seed: the random probes still show it."""
    def centred(h: torch.Tensor) -> torch.Tensor:
        return h - h.mean()

    verdicts = RowVerdicts()
    x = torch.ones(4, 3)
    verdicts.run("centred", x, centred, centred)
    assert verdicts.verdict("centred", 4) is False


def _near_ties(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows whose two outputs agree to within rounding (half of them) or differ clearly."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(k).astype(np.float32)
    weight = np.stack([w0, w0 + rng.standard_normal(k).astype(np.float32) * 1e-7, rng.standard_normal(k) - 3.0])
    h = rng.standard_normal((n, k)).astype(np.float32)
    h[n // 2 :] = np.abs(h[n // 2 :])  # w0 vs w0 + tiny: near ties; the third output trails
    return torch.from_numpy(h), torch.from_numpy(weight.astype(np.float32)), torch.zeros(3)


@pytest.mark.parametrize("k", [2, 64, 256])
def test_certified_argmax_equals_the_batch_one_argmax_and_recomputes_near_ties(k: int) -> None:
    h, weight, bias = _near_ties(512, k, seed=k)
    alone = lambda row: F.linear(row, weight, bias)  # noqa: E731
    certified = CertifiedArgmax(weight, bias, alone)
    want = per_row(alone, h).numpy().argmax(axis=1)
    got = certified(h)
    assert np.array_equal(got, want)
    assert certified.rows_alone > 0  # the near ties went row by row
    assert certified.rows_alone < len(h)  # and the clear leads did not


def test_certified_argmax_passes_clear_leads_and_sends_nan_rows_alone() -> None:
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    bias = torch.zeros(2)
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0], [float("nan"), 1.0], [3.0, float("inf")]])
    alone = lambda row: F.linear(row, weight, bias)  # noqa: E731
    certified = CertifiedArgmax(weight, bias, alone)
    assert certified(h).tolist() == per_row(alone, h).numpy().argmax(axis=1).tolist()
    assert certified.rows_alone == 2


def test_weights_changed_in_place_are_seen_by_batched_forms_and_bounds() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 3)).requires_grad_(False)
    engine = TorchEngine(net)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    before = engine.argmax_rows(x)
    for p in net.parameters():
        p.mul_(-1.5)  # in place, as ActorQ's evaluator loads a new weight version
    assert np.array_equal(engine.rows(x), _one_by_one(engine, x))
    after = engine.argmax_rows(x)
    assert np.array_equal(after, _one_by_one(engine, x).argmax(axis=1))
    assert not np.array_equal(before, after)


@pytest.mark.parametrize("layers", [
    lambda: [nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)],
    lambda: [nn.Tanh(), nn.Linear(6, 32), nn.ReLU(), nn.Identity(), nn.Linear(32, 4, bias=False), nn.ReLU()],
])
def test_a_fused_mlp_gives_each_row_its_batch_one_bits_and_leaves_the_input_alone(layers) -> None:
    """The whole Linear / activation run as one verified form: equal to the layers row by
    row, the activations in place only on the layers' own products (a first Tanh must not
    write the caller's array)."""
    torch.manual_seed(0)
    engine = TorchEngine(nn.Sequential(*layers()).requires_grad_(False))
    rng = np.random.default_rng(2)
    for n in (2, 32, 7, 32):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        kept = x.copy()
        rows = engine.rows(x)
        assert np.array_equal(x, kept)
        assert np.array_equal(rows, _one_by_one(engine, x))
        if engine.argmax_rows(x) is not None:  # a last Linear layer
            assert np.array_equal(engine.argmax_rows(x), _one_by_one(engine, x).argmax(axis=1))
    stop = len(engine._steps)
    assert engine._verdicts.verdict(("fused", stop), 32) is True  # the fused form runs, not the layer-by-layer one
    assert [step.__name__ for step in engine._plans[(stop, 32)]] == ["mlp_rows"]


def test_a_cnn_policy_acts_on_a_batch_as_on_each_frame_alone() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(4, 16, 8, stride=4), nn.ReLU(), nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
                        nn.Flatten(), nn.Linear(32 * 9 * 9, 256), nn.ReLU(), nn.Linear(256, 6))
    import gymnasium as gym

    policy = Policy(net, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), "argmax",
                    scale_images=True)
    frames = np.random.default_rng(0).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8)
    x = policy.preprocess(frames)
    want = np.concatenate([policy.forward(x[i : i + 1]) for i in range(len(x))])
    for n in (8, 5, 2):
        assert np.array_equal(policy.act_rows(x[:n]), want[:n].argmax(axis=1))
    assert np.array_equal(policy.engine.rows(x), want)


_STATES: dict[tuple[str, str], tuple] = {}


def _zoo_states(algo: str, env: str) -> tuple:
    """(checkpoint, rollout states) of a zoo agent, played once per test process."""
    if (algo, env) not in _STATES:
        ckpt = load_checkpoint(zoo_run(algo, env))
        states = evaluate(ckpt.policy, ckpt.env_spec, episodes=2, seed=123, max_steps=200,
                          keep_observations=300, keep_every=1).observations
        _STATES[(algo, env)] = (ckpt, states)
    return _STATES[(algo, env)]


@pytest.mark.parametrize("algo,env", [("dqn", "CartPole-v1"), ("ppo", "LunarLander-v2"), ("sac", "Pendulum-v1"),
                                      ("ppo", "HalfCheetah-v3")])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8-static", "int8-block", "int8-dyn-tensor",
                                       "int4-weight-only"])
def test_zoo_policies_act_on_batches_as_on_each_observation_alone(algo: str, env: str, precision: str) -> None:
    skip_where_the_cpu_cannot_run(precision)
    ckpt, states = _zoo_states(algo, env)
    policy = quantize(ckpt.policy, QuantConfig.parse(precision), calibration=states)
    want = policy.postprocess(np.concatenate([policy.forward(states[i : i + 1]) for i in range(len(states))]))
    for n in (2, 3, 8, 16, 8):
        for start in range(0, len(states) - n, 37):
            assert np.array_equal(policy.act_rows(states[start : start + n]), want[start : start + n]), (n, start)


@pytest.mark.parametrize("label", ["int8-dyn-tensor", "int4-block"])
def test_a_model_that_cannot_batch_runs_its_rows_in_one_scan_call_with_their_own_bits(label: str) -> None:
    """A dynamic int8 model (activation range over the whole input) and a 4-bit model whose
    batched call rounds differently go through ONNX Scan, each row as a batch of one: the
    same bits as a call per row, the scan form verified per batch size like any other."""
    skip_where_the_cpu_cannot_run(label)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), gym.spaces.Discrete(3), "argmax")
    rng = np.random.default_rng(3)
    q = quantize(policy, QuantConfig.parse(label), rng.standard_normal((64, 6)).astype(np.float32))
    engine = q.engine
    for n in (2, 32, 5, 32):
        x = rng.standard_normal((n, 6)).astype(np.float32) * 3
        assert np.array_equal(engine.rows(x), _one_by_one(engine, x))
    if label == "int8-dyn-tensor":  # the batched model itself is never tried: its rows share a range
        assert engine._verdicts.verdict("model", 32) is None
    # a CPU where the 4-bit batched call keeps the bits runs it batched; else the rows scan
    assert engine._verdicts.verdict("model", 32) is True or engine._verdicts.verdict("scan", 32) is True


def test_a_model_onnx_runtime_cannot_scan_still_runs_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from quarl.quant.backends import onnxruntime as ortb

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), gym.spaces.Discrete(2), "argmax")
    x = np.random.default_rng(4).standard_normal((16, 6)).astype(np.float32)
    q = quantize(policy, QuantConfig.parse("int8-dyn-tensor"), x)
    monkeypatch.setattr(ortb, "row_scan_model", lambda model: b"not a model")
    assert np.array_equal(q.engine.rows(x), _one_by_one(q.engine, x))
    assert q.engine._scan_failed and q.engine._verdicts.verdict("scan", 16) is None


def test_a_model_listing_its_initializers_as_inputs_still_scans() -> None:
    """Older exporters list every initializer among the graph inputs: the scan form takes
    the policy input alone, so its rows still come in one call with their own bits."""
    import onnx

    from quarl.quant.backends.onnxruntime import OrtEngine

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 2))
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), gym.spaces.Discrete(2), "argmax")
    x = np.random.default_rng(5).standard_normal((16, 6)).astype(np.float32)
    model = onnx.load_from_string(quantize(policy, QuantConfig.parse("int8-dyn-tensor"), x).engine.model)
    model.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    engine = OrtEngine(model.SerializeToString(), per_row=True)
    assert np.array_equal(engine.rows(x), _one_by_one(engine, x))
    assert engine._verdicts.verdict("scan", 16) is True
