"""QAT pieces: observers, the quantization delay, straight-through gradients, convert."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quarl.quant.observers import MinMaxObserver, MovingAverageMinMaxObserver
from quarl.quant.primitives import quantize_dequantize
from quarl.quant.qat import convert, prepare_qat, qat_layers, set_quantization


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


def test_observers_record_ranges() -> None:
    mm = MinMaxObserver()
    mm(torch.tensor([-1.0, 2.0]))
    mm(torch.tensor([0.5, 3.0]))
    assert (float(mm.min_val), float(mm.max_val)) == (-1.0, 3.0)
    ema = MovingAverageMinMaxObserver(averaging_constant=0.5)
    ema(torch.tensor([-2.0, 2.0]))
    ema(torch.tensor([0.0, 4.0]))
    assert (float(ema.min_val), float(ema.max_val)) == (-1.0, 3.0)
    with pytest.raises(ValueError, match="averaging_constant=0"):
        MovingAverageMinMaxObserver(0)


def test_nothing_is_quantized_during_the_delay_and_everything_after() -> None:
    net = _net()
    qat = prepare_qat(net, bits=3).train()
    x = torch.randn(64, 6)
    assert torch.equal(qat(x), net(x))  # monitoring only: fp32 output
    layers = qat_layers(qat)
    assert len(layers) == 3 and all(layer.output_observer.initialized for layer in layers)
    set_quantization(qat, True)
    y = qat(x)
    assert not torch.allclose(y, net(x))
    assert len(torch.unique(y)) <= 2**3  # the last layer's output is on an n-bit grid
    for layer in layers:
        assert len(torch.unique(layer.quantized_weight())) <= 2**3 + 1


def test_gradients_pass_straight_through() -> None:
    qat = prepare_qat(_net(), bits=4).train()
    x = torch.randn(32, 6)
    qat(x)
    set_quantization(qat, True)
    qat(x).sum().backward()
    for layer in qat_layers(qat):
        assert layer.layer.weight.grad is not None and layer.layer.weight.grad.abs().sum() > 0


def test_convert_matches_fake_quantized_network() -> None:
    qat = prepare_qat(_net(), bits=4).train()
    for _ in range(5):
        qat(torch.randn(64, 6))
    set_quantization(qat, True)
    qat.eval()
    x = torch.randn(100, 6)
    plain = convert(qat)
    assert not any(type(m).__name__ == "QATLayer" for m in plain.modules())
    assert torch.allclose(plain(x), qat(x), atol=1e-6)
    first = plain[0][0].weight
    assert torch.equal(first, quantize_dequantize(qat_layers(qat)[0].layer.weight, 4, "quarl"))


def test_a_qat_network_runs_at_fp16_and_bf16() -> None:
    """Its fake-quantized outputs keep the dtype they are given (a float32 grid scale made an
    fp16 copy fail with 'mat1 and mat2 must have the same dtype')."""
    import gymnasium as gym
    import numpy as np

    from quarl.policies.base import Policy
    from quarl.quantization.api import quantize
    from quarl.quantization.config import QuantConfig
    from quarl.quantization.precisions import with_activation_quant

    torch.manual_seed(0)
    net = with_activation_quant(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)),
                                {"0": (-2.0, 2.0), "2": (-3.0, 3.0)}, 4)
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    reference = policy.forward(x)
    for precision in ("fp16", "bf16"):
        out = quantize(policy, QuantConfig(precision)).forward(x)
        assert out.dtype == np.float32 and np.abs(out - reference).max() < 0.1, precision
