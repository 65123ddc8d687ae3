"""The quantization maths against the paper's formula, written out independently."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from quarl.quant import primitives as P


def paper_formula(w: np.ndarray, n: int) -> np.ndarray:
    """QuaRL: delta = (|min(W,0)| + |max(W,0)|) / 2^n, W_q = round(W / delta) * delta."""
    delta = (abs(min(w.min(), 0.0)) + abs(max(w.max(), 0.0))) / 2**n
    return np.round(w / delta) * delta


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8, 12, 16])
@pytest.mark.parametrize("shift", [0.0, 0.7, -0.7])
def test_quarl_scheme_matches_paper_formula(bits: int, shift: float) -> None:
    rng = np.random.default_rng(bits)
    w = (rng.standard_normal((64, 33)) + shift).astype(np.float32)
    got = P.quantize_dequantize(torch.from_numpy(w), bits, "quarl", "tensor").numpy()
    want = paper_formula(w.astype(np.float64), bits)
    delta = (abs(min(w.min(), 0)) + abs(max(w.max(), 0))) / 2**bits
    # float32 vs float64 arithmetic may move a value sitting on a rounding tie by one step
    assert np.mean(np.isclose(got, want, atol=1e-6 * delta + 1e-7)) > 0.999
    assert np.max(np.abs(got - want)) <= delta * 1.01 + 1e-6  # at most one step, on a tie


def test_quarl_scheme_on_real_policy_weights() -> None:
    from quarl.checkpoints import load_checkpoint
    from tests.conftest import zoo_run

    policy = load_checkpoint(zoo_run("dqn", "CartPole-v1")).policy
    for layer in [m for m in policy.network if isinstance(m, torch.nn.Linear)]:
        w = layer.weight.detach()
        for bits in (8, 4, 2):
            got = P.quantize_dequantize(w, bits, "quarl").numpy()
            assert np.allclose(got, paper_formula(w.double().numpy(), bits), atol=1e-6)


def test_quarl_codes_are_unclamped_and_zero_point_is_floor() -> None:
    w = torch.tensor([-0.2, 0.0, 0.5, 1.0])
    qp = P.qparams(w, 2, "quarl")
    assert math.isclose(float(qp.scale), 1.2 / 4, rel_tol=1e-6)
    assert float(qp.zero_point) == math.floor(0.2 / 0.3)
    codes = P.quantize(w, qp)
    assert codes.tolist() == [-1, 0, 2, 3]  # round(w / delta), nothing clamped
    assert torch.allclose(P.dequantize(codes, qp), torch.tensor([-0.3, 0.0, 0.6, 0.9]))


def test_all_positive_tensor_spans_two_to_the_n_plus_one_levels() -> None:
    w = torch.linspace(0, 1, 1000)
    codes = P.quantize(w, P.qparams(w, 3, "quarl"))
    assert codes.min() == 0 and codes.max() == 8  # 2^3 + 1 levels: the paper's scheme does not clamp


@pytest.mark.parametrize("scheme", P.SCHEMES)
@pytest.mark.parametrize("granularity", P.GRANULARITIES)
def test_idempotent(scheme: str, granularity: str) -> None:
    w = torch.randn(32, 16, generator=torch.Generator().manual_seed(0)) * 0.3 + 0.05
    once = P.quantize_dequantize(w, 4, scheme, granularity)
    twice = P.quantize_dequantize(once, 4, scheme, granularity)
    assert torch.allclose(once, twice, atol=1e-6)


def test_per_channel_uses_each_rows_range() -> None:
    w = torch.stack([torch.linspace(-1, 1, 50), torch.linspace(-0.01, 0.01, 50)])
    per_tensor = P.quantize_dequantize(w, 4, "quarl", "tensor")
    per_channel = P.quantize_dequantize(w, 4, "quarl", "channel")
    # the narrow row collapses to zero with the tensor's step but not with its own
    assert torch.count_nonzero(per_tensor[1]) == 0
    assert torch.count_nonzero(per_channel[1]) > 40
    assert torch.allclose(per_channel[0], per_tensor[0])
    qp = P.qparams(w, 4, "quarl", "channel")
    assert qp.scale.shape == (2, 1)
    for row in range(2):
        assert torch.allclose(per_channel[row], P.quantize_dequantize(w[row], 4, "quarl", "tensor"))


def test_per_channel_conv_weight_broadcasts_over_kernel() -> None:
    w = torch.randn(8, 3, 5, 5)
    qp = P.qparams(w, 6, "quarl", "channel")
    assert qp.scale.shape == (8, 1, 1, 1)
    out = P.quantize_dequantize(w, 6, "quarl", "channel")
    assert torch.allclose(out[3], P.quantize_dequantize(w[3], 6, "quarl", "tensor"))


@pytest.mark.parametrize("scheme", P.SCHEMES)
def test_sixteen_bits_is_within_float_tolerance(scheme: str) -> None:
    w = torch.randn(128, 64)
    rel = (P.quantize_dequantize(w, 16, scheme) - w).abs().max() / w.abs().max()
    assert rel < 5e-5


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_affine_and_symmetric_clamp_to_their_integer_range(bits: int) -> None:
    w = torch.randn(1000)
    a = P.quantize(w, P.qparams(w, bits, "affine"))
    assert a.min() >= 0 and a.max() <= 2**bits - 1
    s = P.quantize(w, P.qparams(w, bits, "symmetric"))
    assert s.abs().max() <= 2 ** (bits - 1) - 1
    # affine error bound: half a step
    qp = P.qparams(w, bits, "affine")
    assert (P.dequantize(a, qp) - w).abs().max() <= float(qp.scale) / 2 + 1e-6


def test_error_shrinks_with_bits() -> None:
    w = torch.randn(256, 256)
    errors = [float((P.quantize_dequantize(w, n) - w).abs().mean()) for n in range(2, 9)]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False))  # consecutive pairs: one fewer


def test_zero_tensor_is_left_alone() -> None:
    w = torch.zeros(4, 4)
    for scheme in P.SCHEMES:
        assert torch.equal(P.quantize_dequantize(w, 4, scheme), w)


def test_straight_through_gradient() -> None:
    x = torch.linspace(-1, 1, 11, requires_grad=True)
    qp = P.qparams_from_range(torch.tensor(-0.5), torch.tensor(0.5), 4, "affine")
    P.fake_quantize(x, qp).sum().backward()
    inside = (x.detach() >= -0.5) & (x.detach() <= 0.5)
    assert torch.equal(x.grad, inside.float())
    y = torch.linspace(-1, 1, 11, requires_grad=True)  # the paper's scheme never clamps
    P.quantize_dequantize(y, 3, "quarl").sum().backward()
    assert torch.equal(y.grad, torch.ones(11))


def test_fake_quantize_equals_dequantize_of_quantize() -> None:
    x = torch.randn(50)
    for scheme in P.SCHEMES:
        qp = P.qparams(x, 5, scheme)
        assert torch.equal(P.fake_quantize(x, qp), P.dequantize(P.quantize(x, qp), qp))


def test_float_casts() -> None:
    x = torch.tensor([1.0 + 2**-12, 1.0 + 2**-9])
    assert P.cast_roundtrip(x, "fp16")[0] == 1.0 and P.cast_roundtrip(x, "fp16")[1] == x[1]
    assert P.cast_roundtrip(x, "bf16")[1] == 1.0  # bf16 keeps 8 bits of mantissa
    with pytest.raises(ValueError, match="allowed fp32, fp16, bf16"):
        P.cast_roundtrip(x, "fp8")


@pytest.mark.parametrize("bits", [1, 17, 0, -3])
def test_bits_out_of_range(bits: int) -> None:
    with pytest.raises(ValueError, match=r"out of range: allowed 2\.\.16"):
        P.qparams(torch.ones(3), bits)


def test_kl_grid_has_at_least_two_to_the_bits_bins_for_every_width() -> None:
    """One KL grid per sweep, never coarser than the widest width's levels: 8-bit weights of
    a Gaussian layer then sit close to fp32 and each bit fewer moves them further."""
    from torch import nn

    from quarl.quant.analysis import KL_BINS, kl_bins, kl_by_bits

    assert kl_bins([6, 4, 2]) == KL_BINS and kl_bins([8, 4]) == 256 and kl_bins([10]) == 1024
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 256))
    rows = kl_by_bits(net, [8, 6, 4, 2])
    kl = {r.bits: r.kl for r in rows}
    assert kl[8] < 0.05 < kl[6] < kl[4] < kl[2]
    assert kl_by_bits(net, [8])[0].kl == kl[8]  # the grid depends on the widest width alone
