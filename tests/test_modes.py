"""Real int modes against their references, and the automatic choice among them."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from quarl.core.errors import QuarlError
from quarl.policies.base import Policy
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.modes import MODES, BuildRequest
from quarl.quant.primitives import quantize_dequantize, quantize_dequantize_blocks
from quarl.quantization.api import quantize
from quarl.quantization.candidates import action_agreement
from quarl.quantization.config import QuantConfig
from tests.conftest import skip_where_the_cpu_cannot_run
from tests.test_registries import _weight_only_b64  # CONTRIBUTING's made-up mode


def _mlp(seed: int = 0, sizes=(6, 128, 96, 3)) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).eval()


MLP_MODES = [label for label, mode in MODES.items() if not mode.needs_conv]


@pytest.mark.parametrize("keep", [frozenset(), frozenset({0, 2})], ids=["all-layers", "first-last-fp32"])
@pytest.mark.parametrize("weights", ["asymmetric", "symmetric"])
@pytest.mark.parametrize("label", MLP_MODES)
def test_mode_matches_its_reference(label: str, weights: str, keep: frozenset) -> None:
    """The real kernels compute what the reference computes: 10x closer to it than to fp32
    (chained layers can flip one rounding step of a later layer's activations)."""
    if weights == "symmetric" and not ortb.has_vnni() and MODES[label].name in ("dyn-tensor", "dyn-channel", "static"):
        pytest.skip("u8 x s8 kernels saturate int16 sums on CPUs without VNNI: symmetric int8 is inexact here")
    skip_where_the_cpu_cannot_run(label)  # quarl never runs it here (its fallback instead): nothing to hold it to
    net = _mlp()
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(64, 6)).astype(np.float32) * 2)
    request = BuildRequest(net, ortb.export_onnx(net, (6,)), x.numpy(), weights, 32, keep)
    mode = MODES[label]
    model = mode.build(request)
    real = ortb.OrtEngine(model, per_row=mode.per_row)(x.numpy())
    with torch.inference_mode():
        ref = mode.reference(request, model)(x).numpy()
        fp32 = net(x).numpy()
    to_fp32 = np.abs(real - fp32).max()
    assert to_fp32 > 1e-5  # something really was rounded
    assert np.abs(real - ref).max() <= max(0.1 * to_fp32, 1e-6), (np.abs(real - ref).max(), to_fp32)


def test_block_weights_match_onnxruntime_exactly() -> None:
    """Block-wise affine rounding (padding K to whole blocks) is bit-exact with the weights
    MatMulNBits dequantizes: read back through an identity input at fp32 compute."""
    torch.manual_seed(0)
    for bits in (8, 4):
        layer = nn.Linear(100, 7, bias=False)
        with torch.no_grad():
            layer.weight[0, :40] = torch.rand(40)  # an all-positive block
            layer.weight[1, 32:64] = -torch.rand(32)  # an all-negative block
        engine = ortb.OrtEngine(ortb.quantize_nbits(ortb.export_onnx(layer, (100,)), bits, 32))
        dequantized = engine(np.eye(100, dtype=np.float32)).T
        want = quantize_dequantize_blocks(layer.weight.detach(), bits, "affine", 32).numpy()
        assert np.array_equal(dequantized, want)


def test_weight_only_graph_runs_matmulnbits_and_keeps_layers_by_name() -> None:
    net = _mlp()
    model = ortb.export_onnx(net, (6,))
    names = ortb.weight_node_names(model)
    q = onnx.load_from_string(ortb.quantize_nbits(model, 4, 32, exclude=[names[0]]))
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("MatMulNBits") == 2 and ops.count("MatMul") == 1
    assert next(n for n in q.graph.node if n.op_type == "MatMul").name == names[0]


def _dominated_policy() -> tuple[Policy, np.ndarray]:
    """A discrete policy whose input feature 0 spans +-1000 while its actions depend on
    features 1..3 (+-1): any per-tensor or per-block rounding of the input wipes them out."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3)).eval()
    with torch.no_grad():
        net[0].weight[:, 0] *= 1e-4  # feature 0 barely matters
        net[0].weight[:, 1:] *= 5.0  # features 1..3 decide
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    policy = Policy(net, space, gym.spaces.Discrete(3), "argmax")
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (512, 4)).astype(np.float32)
    obs[:, 0] *= 1000
    return policy, obs


def test_auto_avoids_per_tensor_activations_when_one_feature_dominates() -> None:
    policy, obs = _dominated_policy()
    calibration, held_out = obs[:256], obs[256:]
    per_tensor = quantize(policy, QuantConfig("int8", mode="dyn-tensor"), calibration)
    assert per_tensor.meta["quant"]["agreement"] < 0.9  # the trap is real
    auto = quantize(policy, QuantConfig("int8"), calibration)
    quant = auto.meta["quant"]
    assert quant["agreement"] >= 0.99
    assert 0 in quant["fp32_layers"], quant  # the layer reading raw observations stays fp32
    # and it holds on states it was not chosen on
    assert np.mean(auto.act(held_out) == policy.act(held_out)) >= 0.98
    tried = {(t["mode"], tuple(t["fp32_layers"])) for t in quant["tried"]}
    assert ("int8-dyn-tensor", (0,)) in tried and all(layers[:1] == (0,) for _, layers in tried)
    # fixed activation ranges saturate on states beyond them: never chosen for an MLP
    assert all(mode != "int8-static" for mode, _ in tried)


def test_a_fitted_mode_is_checked_on_states_it_was_not_fit_to() -> None:
    from quarl.quantization.candidates import split_calibration

    states = np.arange(10, dtype=np.float32)[:, None]
    fit, check = split_calibration(MODES["int8-static"], states)
    assert not set(fit.ravel()) & set(check.ravel()) and len(fit) + len(check) == 10
    fit, check = split_calibration(MODES["int8-dyn-tensor"], states)  # nothing fitted: every state checks
    assert fit is states and check is states


def test_auto_int4_records_the_mode_it_chose() -> None:
    policy, obs = _dominated_policy()
    int4 = quantize(policy, QuantConfig("int4"), obs[:256])
    assert int4.meta["quant"]["mode"] in ("int4-weight-only", "int4-block")
    assert int4.precision == "int4"
    assert int4.meta["quant"]["model_bytes"] > 0


def test_agreement_of_continuous_actions_is_relative_to_the_range() -> None:
    space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    policy = Policy(nn.Sequential(nn.Linear(3, 2)), gym.spaces.Box(-1, 1, (3,)), space, "clip")
    ref = np.zeros((4, 2))
    got = np.array([[0.0, 0.0], [0.05, 0.0], [0.0, -0.079], [0.2, 0.0]])  # range 4: 2% = 0.08
    assert action_agreement(policy, ref, got, 0.02) == 0.75


def _nature_cnn() -> tuple[Policy, np.ndarray]:
    from quarl.policies.sb3 import _features

    torch.manual_seed(0)
    sd = {}
    for i, (c_in, c_out, k) in zip((0, 2, 4), ((4, 32, 8), (32, 64, 4), (64, 64, 3)), strict=True):
        sd[f"cnn.{i}.weight"], sd[f"cnn.{i}.bias"] = torch.randn(c_out, c_in, k, k) * 0.05, torch.zeros(c_out)
    sd["linear.0.weight"], sd["linear.0.bias"] = torch.randn(512, 3136) * 0.01, torch.zeros(512)
    net = nn.Sequential(*_features(sd, "", (4, 84, 84)), nn.Linear(512, 6)).eval()
    policy = Policy(net, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), "argmax",
                    scale_images=True)
    return policy, np.random.default_rng(0).uniform(0, 1, (16, 4, 84, 84)).astype(np.float32)


def test_int4_on_a_nature_cnn_is_the_mixed_mode_or_linear_layers_alone() -> None:
    """int4-mixed: the three convolutions in QDQ int8, the two Linear layers (95 % of the
    weights) in 4-bit MatMulNBits; int4-block: the Linear layers alone, convolutions fp32.
    Each computes what its reference computes (where this CPU runs them exactly)."""
    with pytest.raises(QuarlError, match="int4-mixed mixes convolution and Linear kernels"):
        quantize(_mlp_policy()[0], QuantConfig.parse("int4-mixed"), _mlp_policy()[1])
    skip_where_the_cpu_cannot_run("int4-mixed")
    skip_where_the_cpu_cannot_run("int4-block")
    policy, calibration = _nature_cnn()
    x = calibration[8:]
    fp32 = policy.forward(x)
    sizes = {}
    for label, convs_int8 in (("int4-mixed", True), ("int4-block", False)):
        q = quantize(policy, QuantConfig.parse(label), calibration[:8])
        assert q.meta["quant"]["mode"] == label
        assert q.meta["quant"]["fp32_layers"] == ([] if convs_int8 else [0, 1, 2])  # the convolutions
        ops = [n.op_type for n in onnx.load_from_string(q.engine.model).graph.node]
        assert ops.count("MatMulNBits") == 2 and ops.count("Conv") == 3
        assert ("QuantizeLinear" in ops) is convs_int8
        real = q.forward(x)
        with torch.inference_mode():
            ref = q.network(torch.from_numpy(x)).numpy()
        assert np.abs(real - ref).max() <= 0.1 * np.abs(real - fp32).max()
        sizes[label] = q.size_bytes()
    assert sizes["int4-mixed"] < sizes["int4-block"] < policy.size_bytes() / 4


def test_block_granularity_for_simulated_widths() -> None:
    w = torch.randn(8, 70)
    blocks = quantize_dequantize(w, 4, "affine", "block", block_size=32)
    assert torch.equal(blocks, quantize_dequantize_blocks(w, 4, "affine", 32))
    per_tensor = quantize_dequantize(w, 4, "affine", "tensor")
    assert (blocks - w).abs().mean() < (per_tensor - w).abs().mean()


def test_calibration_and_evaluation_seeds_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    import quarl.evaluation.calibration as calibration_episodes  # where calibration plays its episodes
    import quarl.evaluation.cells as cells
    from quarl.envs import EnvSpec
    from quarl.evaluation import parallel

    seen = []
    real = calibration_episodes.evaluate

    def spy(policy, spec, episodes=20, seed=0, **kwargs):
        seen.append(set(range(seed, seed + episodes)))
        return real(policy, spec, episodes=episodes, seed=seed, **kwargs)

    monkeypatch.setattr(calibration_episodes, "evaluate", spy)  # calibration episodes
    monkeypatch.setattr(parallel, "evaluate_serial", spy)  # the evaluation (one process or workers)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax")
    settings = cells.EvalSettings(episodes=5, seed=7, n_envs=2)
    calibration = calibration_episodes.calibration_inputs(policy, EnvSpec("CartPole-v1"))
    cells.evaluate_config(policy, EnvSpec("CartPole-v1"), QuantConfig("int8"), settings, calibration)
    calibration_seeds, evaluation_seeds = seen[0], seen[-1]
    assert evaluation_seeds == set(range(7, 12)) and not calibration_seeds & evaluation_seeds
    with pytest.raises(QuarlError, match="would reach the calibration seeds 10000..10199"):
        cells.EvalSettings(episodes=calibration_episodes.CALIBRATION_SEED_OFFSET + 1)
    with pytest.raises(QuarlError, match="would reach the calibration seeds"):
        cells.EvalSettings(episodes=20, seed=10_150)
    assert cells.EvalSettings(episodes=20, seed=10_200).seed == 10_200  # above them: allowed


def test_every_seed_calibrates_on_the_same_seeds_so_every_command_picks_the_same_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ptq --seed 0, a study's seed 100000 s and export calibrate on the same fixed seeds."""
    import quarl.evaluation.calibration as calibration_episodes  # where calibration plays its episodes
    import quarl.evaluation.cells as cells
    from quarl.envs import EnvSpec
    from quarl.evaluation import parallel

    real, calls = calibration_episodes.evaluate, []

    def spy(policy, spec, episodes=20, seed=0, **kwargs):
        calls.append((seed, episodes))
        return real(policy, spec, episodes=episodes, seed=seed, **kwargs)

    monkeypatch.setattr(calibration_episodes, "evaluate", spy)
    monkeypatch.setattr(parallel, "evaluate_serial", spy)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), "argmax")
    calibration_by_seed = {}
    for seed in (0, 7, 100_000):
        calls.clear()
        cells.evaluate_config(policy, EnvSpec("CartPole-v1"), QuantConfig("int8"),
                              cells.EvalSettings(episodes=3, seed=seed, max_steps=50))
        calibration_by_seed[seed] = [c for c in calls if c[0] in calibration_episodes.CALIBRATION_SEEDS]
        assert calls[-1] == (seed, 3)  # the evaluation itself
    assert calibration_by_seed[0] == calibration_by_seed[7] == calibration_by_seed[100_000] != []


def test_symmetric_int8_is_refused_where_the_cpu_lacks_vnni(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ortb, "has_vnni", lambda: False)
    assert QuantConfig("int8").resolved().int8_weights == "asymmetric"
    with pytest.raises(QuarlError, match="symmetric needs a CPU with VNNI"):
        QuantConfig("int8", int8_weights="symmetric").resolved()
    monkeypatch.setattr(ortb, "has_vnni", lambda: True)
    assert QuantConfig("int8").resolved().int8_weights == "symmetric"


def test_a_mode_that_agrees_on_states_but_loses_the_return_is_passed_over() -> None:
    """The closed loop has the last word: a candidate whose calibration episodes lose more
    than 5 % of fp32's return is skipped for the next one, and what was measured is kept."""
    policy, obs = _mlp_policy()
    scores = {"fp32": 100.0}  # the first mode played (the fastest agreeing) loses half the return

    def returns(p: Policy, n: int) -> np.ndarray:
        scores.setdefault(p.precision, 50.0 if len(scores) == 1 else 99.0)
        return np.full(n, scores[p.precision])

    chosen = quantize(policy, QuantConfig("int8"), obs, returns=returns)
    quant = chosen.meta["quant"]
    loser = next(label for label, score in scores.items() if score == 50.0)
    assert quant["mode"] != loser and quant["calibration_return"] == 99.0
    lost = next(t for t in quant["tried"] if t["mode"] == loser and t["calibration_episodes"])
    assert lost["agreement"] >= 0.99 and lost["calibration_return"] == 50.0
    # a halved return is a loss the confidence sequence decides within the 16 calibration episodes (a look every
    # 4); a 1 % loss is a keep it cannot yet claim there (an unseen failure is not excluded), so the point
    # estimate chooses at the cap: a choice between candidates, not a verdict, and it says so
    assert lost["calibration_episodes"] <= 16 and lost["calibration_verdict"] == "loses"
    assert quant["calibration_episodes"] == 16 and quant["calibration_verdict"].startswith("estimate: E 1.0 % <= 5 %")


def _mlp_policy() -> tuple[Policy, np.ndarray]:
    net = _mlp(sizes=(6, 64, 64, 3))
    policy = Policy(net, gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), gym.spaces.Discrete(3), "argmax")
    return policy, np.random.default_rng(0).normal(size=(256, 6)).astype(np.float32)


@pytest.mark.parametrize("bits", [8, 4])
def test_the_int8_compute_probe_says_what_matmulnbits_computes_on_another_layer(bits: int) -> None:
    """MatMulNBits' int8 compute is a hint: the probe's answer (found on its own 96 -> 24
    layer) holds for another layer and other inputs, whose kernel output is (much) closer to
    the int8 reference than to fp32's where it says ``int8``, the other way round where it
    says ``fp32``, and near neither where it says ``inexact``. QUARL_CPU_KIND=avx2 answers
    ``inexact`` whatever the probe found."""
    from quarl.core.cpu_kind import cpu_kind
    from quarl.quant import modes
    from quarl.quant.backends.reference import simulate_nbits

    torch.manual_seed(11)
    layer = nn.Sequential(nn.Linear(160, 40)).eval()
    x = torch.from_numpy(np.random.default_rng(5).standard_t(3, size=(48, 160)).astype(np.float32))
    real = ortb.OrtEngine(ortb.quantize_nbits(ortb.export_onnx(layer, (160,)), bits, 32, True))(x.numpy())
    with torch.inference_mode():
        as_int8, as_fp32 = (simulate_nbits(layer, bits, 32, compute)(x).numpy() for compute in (True, False))
    apart = np.abs(as_int8 - as_fp32).max()  # what rounding the activations changes
    assert apart > 1e-3 * np.abs(as_fp32).max()  # the two references differ: the check below can tell them apart
    to_int8, to_fp32 = np.abs(real - as_int8).max(), np.abs(real - as_fp32).max()
    found = "int8" if to_int8 <= 0.01 * apart else "fp32" if to_fp32 <= 0.01 * apart else "inexact"
    assert modes.probe_int8_compute(bits) == found, (to_int8, to_fp32, apart)
    assert modes.int8_compute(bits) == ("inexact" if cpu_kind() == "avx2" else found)


def test_block_int8_compute_is_probed_on_this_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference follows the probe, and an inexact CPU makes block unsupported with the
    reason."""
    from quarl.quant import modes

    monkeypatch.setattr(modes, "int8_compute", lambda bits: "inexact")
    assert "not exact" in MODES["int8-block"].unsupported(_mlp())
    assert MODES["int8-dyn-channel"].unsupported(_mlp()) is None
    # where this CPU cannot run a mode, it is run as the fallback it declares
    assert MODES["int8-block"].runnable(_mlp()) is MODES["int8-weight-only"]
    assert MODES["int4-block"].runnable(_mlp()) is MODES["int4-weight-only"]
    assert MODES["int8-dyn-channel"].runnable(_mlp()) is MODES["int8-dyn-channel"]
    monkeypatch.setattr(modes, "int8_compute", lambda bits: "int8")
    assert MODES["int8-block"].runnable(_mlp()) is MODES["int8-block"]


def test_each_mode_declares_its_student_grid_fallback_and_actor_kernel() -> None:
    """What recover and ActorQ read from the registry: the student grids (a mode without one
    is recovered as the first of its width that has one), fallbacks of the same width that
    are registered, and one actor kernel per width."""
    from quarl.quant import modes

    grids = {m.label: (m.student.weights, m.student.activations) for m in modes.student_modes() if m.student}
    assert grids == {"int8-block": ("block", "int8-block"), "int8-dyn-channel": ("channel", "uint8-row"),
                     "int8-dyn-tensor": ("tensor", "uint8-row"), "int8-weight-only": ("block", "fp32"),
                     "int4-block": ("block", "int8-block"), "int4-weight-only": ("block", "fp32"),
                     "int4-block-head8": ("block", "int8-block"), "int4-weight-only-head8": ("block", "fp32")}
    assert modes.student_mode_for(MODES["int8-static"]) is MODES["int8-block"]
    assert modes.student_mode_for(MODES["int4-mixed"]) is MODES["int4-block"]
    for mode in MODES.values():
        if mode.fallback is not None:
            assert modes.get_mode(mode.fallback).bits == mode.bits and modes.get_mode(mode.fallback).fallback is None
    assert {bits: m.label for bits, m in modes.actor_modes().items()} == {8: "int8-dyn-tensor", 4: "int4-block"}


def test_calibration_episodes_play_each_seed_once_per_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32's episodes are kept for the whole run; a candidate asked for more plays only the
    episodes it has not played (on the next seeds), so the sequential test costs no replays."""
    import quarl.evaluation.calibration as calibration_episodes  # where calibration plays its episodes
    from quarl.envs import EnvSpec

    played = []

    def fake_evaluate(p, spec, episodes, seed, **kwargs):
        played.append((p, seed, episodes))
        return type("R", (), {"returns": np.arange(seed, seed + episodes, dtype=float),
                              "lengths": np.full(episodes, 500)})()

    monkeypatch.setattr(calibration_episodes, "evaluate", fake_evaluate)
    returns = calibration_episodes.calibration_returns(EnvSpec("CartPole-v1"))
    fp32, candidate = object(), object()
    first = calibration_episodes.CALIBRATION_SEED_OFFSET + 100
    assert list(returns(fp32, 4)) == [first, first + 1, first + 2, first + 3]
    assert list(returns(candidate, 4)) == list(returns(fp32, 4))  # the same seeds for every policy
    assert list(returns(candidate, 8))[4:] == [first + 4, first + 5, first + 6, first + 7]
    returns(fp32, 8)
    returns(fp32, 4)
    assert [(p is fp32, s - first, n) for p, s, n in played] == [(True, 0, 4), (False, 0, 4), (False, 4, 4),
                                                                 (True, 4, 4)]
    # the sequential test's cap: ~20k steps of 500-step episodes, within 16..64
    assert returns.episode_cap(fp32) == 40 and len(played) == 4


def test_the_fastest_mode_wins_unless_within_the_margins() -> None:
    from quarl.quantization import choice
    from quarl.quantization.candidates import Candidate

    def ranked(*latencies: float) -> list[str]:
        cands = [Candidate(f"m{i}", (), 1.0, latency_us=lat) for i, lat in enumerate(latencies)]
        return [c.mode for c in choice.ranked(cands, np.zeros((1, 4), np.float32), 0.01)]

    assert ranked(30.0, 15.0) == ["m1", "m0"]  # 2x and 15 us: the later mode wins
    assert ranked(300.0, 290.0) == ["m0", "m1"]  # 3 % faster: a near tie keeps registry order
    assert ranked(20.0, 18.5) == ["m0", "m1"]  # 7.5 % but 1.5 us: timer noise
    assert ranked(100.0, 96.0, 93.0) == ["m2", "m0", "m1"]  # m2 beats m0 by 7 %; m1 ties m0
    # the first is within 5 % of the fastest
    for latencies in [(100.0, 96.0, 93.0), (50.0, 40.0, 41.0), (10.0, 30.0, 9.8)]:
        first = latencies[int(ranked(*latencies)[0][1:])]
        assert first <= 1.05 * min(latencies) + 2.0


def test_a_mode_chosen_on_episodes_alone_with_low_agreement_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    """Near-tied outputs: no int4 mode agrees on 99 % of the states, one keeps the return on
    the calibration episodes and is chosen; its low agreement is said (a warning), not kept
    silent in a column."""
    import logging

    policy, obs = _mlp_policy()
    with torch.no_grad():  # three near-equal action values: any rounding flips the greedy one
        last = policy.network[-1]
        last.weight.copy_(last.weight[:1] + 1e-3 * last.weight)  # the rows nearly equal
        last.bias.zero_()

    reference = policy.predict(obs)[0]

    def returns(p: Policy, n: int) -> np.ndarray:
        # fp32 and the modes far from it keep the return, the closer ones (int4 on the last
        # layer alone: 95.7 %) lose it, so the choice does not hang on which one times faster
        far = p is policy or float(np.mean(p.predict(obs)[0] == reference)) < 0.9
        return np.full(n, 100.0 if far else 0.0)

    with caplog.at_level(logging.INFO, logger="quarl"):
        chosen = quantize(policy, QuantConfig("int4"), obs, returns=returns)
    import re

    agreement = chosen.meta["quant"]["agreement"]
    assert agreement < 0.9
    assert max(t["agreement"] for t in chosen.meta["quant"]["tried"]) > 0.9  # a closer one was tried and lost
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "agrees on only" in r.getMessage()]
    assert len(warned) == 1 and chosen.meta["quant"]["mode"] in warned[0].getMessage()
    said = float(re.search(r"agrees on only ([0-9.]+)%", warned[0].getMessage()).group(1))
    assert abs(said - 100 * agreement) < 0.1


def test_the_automatic_choice_is_stored_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice is keyed by policy content, calibration and options: the second quantize
    builds only the stored mode and says so; another policy, or an unreadable entry, is
    chosen afresh; QUARL_CACHE=off never stores."""
    from quarl.quant.layers import linear_layers
    from quarl.quantization import choice_cache

    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "cache"))
    policy, obs = _mlp_policy()
    first = quantize(policy, QuantConfig("int8"), obs).meta["quant"]
    files = list((tmp_path / "cache").glob("*.json"))
    assert len(files) == 1 and first["chosen_from_cache"] is False and len(first["tried"]) > 1
    second = quantize(policy, QuantConfig("int8"), obs).meta["quant"]
    assert second["chosen_from_cache"] is True
    assert ((second["mode"], second["fp32_layers"], second["tried"])
            == (first["mode"], first["fp32_layers"], first["tried"]))
    assert second["agreement"] == first["agreement"]  # rebuilt and measured again: the same model
    # an int4 choice, another policy and other options are other keys
    other, _ = _mlp_policy()
    with torch.no_grad():
        other.network[0].weight.mul_(1.01)
    quantize(other, QuantConfig("int8"), obs)
    quantize(policy, QuantConfig("int8", block_size=64), obs)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 3
    # a corrupt entry is ignored and replaced
    files[0].write_text('{"mode": "int8-bogus", "keep": [], "chosen": {}, "tried": []}')
    again = quantize(policy, QuantConfig("int8"), obs).meta["quant"]
    assert again["chosen_from_cache"] is False and again["mode"] in {t["mode"] for t in first["tried"]}
    assert choice_cache.load(choice_cache.choice_key(policy.fingerprint(), {}, obs, None), set()) is None
    # an entry keeping every layer in fp32 would run the int8 row in fp32: ignored, chosen afresh
    entry = json.loads(files[0].read_text())
    n_layers = len(linear_layers(policy.network))
    files[0].write_text(json.dumps({**entry, "mode": first["mode"], "keep": list(range(n_layers))}))
    crafted = quantize(policy, QuantConfig("int8"), obs).meta["quant"]
    assert crafted["chosen_from_cache"] is False and len(crafted["fp32_layers"]) < n_layers
    # episodes that do not say what they play are never cached
    assert choice_cache.choice_key(policy.fingerprint(), {}, obs, lambda p, n: np.zeros(n)) is None
    monkeypatch.setenv("QUARL_CACHE", "off")
    assert quantize(policy, QuantConfig("int8", block_size=128), obs).meta["quant"]["chosen_from_cache"] is False
    assert len(list((tmp_path / "cache").glob("*.json"))) == 3


def test_the_chosen_mode_is_timed_beside_onnx_runtime_fp32_and_a_slower_one_is_said(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from quarl.quantization import choice

    monkeypatch.setenv("QUARL_CACHE", "off")
    policy, obs = _mlp_policy()
    assert quantize(policy, QuantConfig("int8"), obs).meta["quant"]["fp32_ort_latency_us"] > 0

    def slow_mode(candidates, sample, budget_s):  # the mode 100 us, fp32 10 us
        for c in candidates:
            c.latency_us = 10.0 if c.mode == "fp32-ort" else 100.0

    monkeypatch.setattr(choice, "time_interleaved", slow_mode)
    with caplog.at_level(logging.WARNING, logger="quarl"):
        quant = quantize(policy, QuantConfig("int8"), obs).meta["quant"]
    assert quant["fp32_ort_latency_us"] == 10.0
    assert any("slower than ONNX Runtime fp32 (10.0 us)" in r.getMessage() for r in caplog.records)


def test_registering_a_mode_misses_a_warm_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The set of registered modes is part of the stored choice's key: with a new mode the
    automatic choice runs again and tries it; without it, the old entry is found again."""
    from quarl.quant import modes

    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "cache"))
    policy, obs = _mlp_policy()
    assert quantize(policy, QuantConfig("int8"), obs).meta["quant"]["chosen_from_cache"] is False
    assert quantize(policy, QuantConfig("int8"), obs).meta["quant"]["chosen_from_cache"] is True  # warm
    modes.register_mode(_weight_only_b64())
    try:
        quant = quantize(policy, QuantConfig("int8"), obs).meta["quant"]
        assert quant["chosen_from_cache"] is False
        assert "int8-weight-only-b64" in {t["mode"] for t in quant["tried"]}
        assert len(list((tmp_path / "cache").glob("*.json"))) == 2
    finally:
        modes.MODES.remove("int8-weight-only-b64")
    assert quantize(policy, QuantConfig("int8"), obs).meta["quant"]["chosen_from_cache"] is True


def test_register_mode_refuses_a_taken_label_a_width_and_a_name_no_label_can_reach() -> None:
    from dataclasses import replace

    from quarl.quant import modes

    mode = _weight_only_b64()
    with pytest.raises(QuarlError, match="int mode 'int8-block' is registered already"):
        modes.register_mode(replace(mode, name="block"))
    with pytest.raises(QuarlError, match="int mode 'weight-only-b64': bits=3, allowed 8, 4"):
        modes.register_mode(replace(mode, bits=3))
    with pytest.raises(QuarlError, match="int mode name 'Block64': allowed lower-case letters"):
        modes.register_mode(replace(mode, name="Block64"))
    with pytest.raises(QuarlError, match="fallback 'int4-weight-only' must be another int8 mode"):
        modes.register_mode(replace(mode, fallback="int4-weight-only"))
    with pytest.raises(QuarlError, match="fallback 'int8-weight-only-b64' must be another int8 mode"):
        modes.register_mode(replace(mode, fallback="int8-weight-only-b64"))
    assert "int8-weight-only-b64" not in modes.MODES and "int3-weight-only-b64" not in modes.MODES


def test_the_int8_compute_probe_leaves_the_global_torch_rng_as_it_was() -> None:
    """The probe draws its layer and inputs from a generator of its own: the global RNG's
    state is the same before and after (it used to be reseeded to 0)."""
    from quarl.quant import modes

    torch.manual_seed(123)
    torch.rand(7)
    before = torch.get_rng_state()
    probed = modes.probe_int8_compute.__wrapped__(8)  # the probe itself, not its cached answer
    assert torch.equal(torch.get_rng_state(), before)
    assert probed == modes.probe_int8_compute(8)
