"""Real integer execution modes, one registry, and the automatic choice among them.

Each :class:`IntMode` is something ONNX Runtime really executes on this CPU, with a
PyTorch reference (:mod:`quarl.quant.backends.reference`) it is tested against:

================  ====  =====================================================================
mode              bits  what runs
================  ====  =====================================================================
dyn-tensor         8    MatMulInteger, weights per tensor, activations uint8 per call (range
                        of the whole row)
dyn-channel        8    as dyn-tensor with weights per output channel
block              8/4  MatMulNBits, weights per block of ``block_size`` inputs, activations
                        int8 per row and block (``accuracy_level`` 4)
weight-only        8/4  MatMulNBits with fp32 activations: only the weights are rounded (the
                        paper's PTQ); 8-bit has no fast kernel on CPU, 4-bit beats fp32 on
                        large layers
static             8    QDQ, weights per channel, activation ranges calibrated (CNNs)
mixed              4    per layer: convolutions as ``static`` (int8), Linear layers as
                        ``block`` (4-bit MatMulNBits); CNNs only
================  ====  =====================================================================

On a CNN the MatMul modes (dyn-*, block, weight-only) quantize its Linear layers only and
keep the convolutions in fp32 (ONNX Runtime's ConvInteger is slower than fp32): a
NatureCNN's one Linear layer holds 95 % of its weights, so int4 block on it cuts the model
4x while ``mixed`` also runs the convolutions, most of the work, in int8. On a CNN the
modes that quantize convolutions are tried first, with each choice of fp32 layers, before
the MatMul modes.

``static`` fixes activation ranges from observations, so states beyond them saturate: the
automatic choice uses it for CNNs only (where it is the one fast mode), and checks it on
calibration states it was not fit to. Measured: an A2C CartPole MLP whose static int8
agreed with fp32 on the very states its ranges came from scored 144 instead of 500.

``int8`` / ``int4`` without a mode is *automatic* (:func:`choose`): every mode the policy
supports is built and run on calibration states (fp32 rollouts on seeds disjoint from
evaluation), and the fastest at batch 1 on this CPU (:func:`_ranked`: near ties keep
:data:`MODES` order) whose actions agree with fp32 is used, and stored for this policy,
CPU and ONNX Runtime (:mod:`quarl.quant.choice_cache`): at least
``min_agreement`` of the states must give the same greedy action (discrete) or actions
within ``action_tolerance`` of the action range (continuous), and, where calibration
episodes can be run, the mode must keep fp32's return on them: a paired sequential test
(:func:`quarl.verdict.sequential_keeps`: 4 episodes, doubled while the 95 % interval of
E straddles 5 %, up to about 20k steps' worth: 16 to 64 episodes) must find it keeps, or at
the cap lose at most 5 % on average. Chaotic games need many episodes: on a MinAtar
SpaceInvaders PPO agent, int8-static's E was 14.8 % over 100 evaluation seeds and 2.8 % over
400, undecided both times (one flipped action sends an episode elsewhere). A few states decide an episode (measured: a DDPG MountainCar policy's int8-block agreed on every
calibration state and lost 5.5 % of its return over 20 evaluation episodes). When no mode agrees with
every layer quantized, each is tried again with the last, the first, then both layers
kept in fp32 (the layers most sensitive to rounding). When none agrees then (a DQN whose
action values nearly tie everywhere flips greedy actions under any rounding), the closed
loop decides: the four most faithful candidates act for whole calibration episodes and
the first (same rule) whose return is within 5 % of fp32's on those episodes wins (else the best
scoring, with a warning). Measured on the zoo's DQN CartPole: int8-block agreed on 82 %
of states and int8-dyn-tensor on 75 %; acting, block kept 500 and dyn-tensor fell to 139.

Adding a mode is one :data:`MODES` entry: a builder from the fp32 ONNX model, a reference
and what it supports.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from typing import Callable, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from quarl.errors import QuarlError
from quarl.policies.base import Policy, linear_layers
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.backends.reference import simulate_dynamic_int8, simulate_nbits, simulate_qdq
from quarl.timing import median_us
from quarl.verdict import sequential_keeps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildRequest:
    """What a mode needs to build its model."""

    network: nn.Module
    model: bytes
    """The fp32 ONNX export of ``network``."""
    calibration: np.ndarray | None
    """Preprocessed observations (network inputs) for static activation ranges."""
    weights: str = "asymmetric"
    """8-bit weight format of the MatMulInteger / QDQ modes: asymmetric (uint8) or symmetric (int8)."""
    block_size: int = 32
    keep: frozenset[int] = frozenset()
    """Indices of the weight layers (Linear / Conv2d, in order) left in fp32."""

    def excluded_nodes(self) -> list[str]:
        names = ortb.weight_node_names(self.model)
        return [names[i] for i in sorted(self.keep)]


@dataclass(frozen=True)
class IntMode:
    name: str
    bits: int
    summary: str
    build: Callable[[BuildRequest], bytes]
    reference: Callable[[BuildRequest, bytes], nn.Module] | None
    """``(request, built model) -> a PyTorch module computing the same in float`` (static
    modes read their calibrated grids back from the model)."""
    per_row: bool = False
    """The engine must run rows one by one (activation ranges per call would mix rows)."""
    convolutions: bool = False
    """Whether it quantizes convolutions (True) or leaves a CNN's convolutions in fp32."""
    needs_conv: bool = False
    """Meaningful only for networks with convolutions (a per-layer mix)."""
    needs_calibration: bool = False
    cpu_unsupported: Callable[[], str | None] = lambda: None
    """Why this CPU cannot run the mode exactly (probed at run time), or None."""

    @property
    def label(self) -> str:
        return f"int{self.bits}-{self.name}"

    def unsupported(self, network: nn.Module) -> str | None:
        """Why this mode cannot run ``network`` (None when it can)."""
        if self.needs_conv and not ortb.has_conv(network):
            return f"{self.label} mixes convolution and Linear kernels: this network has no convolutions"
        return self.cpu_unsupported()

    def request_for(self, request: "BuildRequest") -> "BuildRequest":
        """``request`` with a CNN's convolutions kept in fp32 when this mode does not quantize them."""
        if self.convolutions:
            return request
        return replace(request, keep=request.keep | ortb.conv_layers(request.network))


def _dynamic(per_channel: bool) -> Callable[[BuildRequest], bytes]:
    return lambda r: ortb.quantize_dynamic_int8(r.model, r.weights, per_channel, r.excluded_nodes())


def _nbits(bits: int, compute_int8: bool) -> Callable[[BuildRequest], bytes]:
    return lambda r: ortb.quantize_nbits(r.model, bits, r.block_size, compute_int8, r.excluded_nodes())


@functools.lru_cache(maxsize=None)
def int8_compute(bits: int) -> str:
    """What ONNX Runtime's MatMulNBits at ``accuracy_level`` 4 really does on this CPU,
    probed once on a small layer: ``"int8"`` (activations rounded per block, as the
    reference says), ``"fp32"`` (the level is a hint; without int8 kernels it computes in
    fp32) or ``"inexact"`` (neither: e.g. saturating u8 x s8 sums)."""
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(96, 24)).eval()
    x = torch.randn(16, 96) * 3
    real = ortb.OrtEngine(ortb.quantize_nbits(ortb.export_onnx(layer, (96,)), bits, 32, True))(x.numpy())
    with torch.inference_mode():
        as_int8 = simulate_nbits(layer, bits, 32, True)(x).numpy()
        as_fp32 = simulate_nbits(layer, bits, 32, False)(x).numpy()
    scale = float(np.abs(as_fp32).max())
    if np.abs(real - as_int8).max() <= 1e-4 * scale:
        return "int8"
    if np.abs(real - as_fp32).max() <= 1e-4 * scale:
        return "fp32"
    return "inexact"


@functools.lru_cache(maxsize=None)
def runtime_key() -> dict[str, str]:
    """What, besides the config, decides a real int cell: the runtime's version and the CPU
    (kernels, the int8-compute probe and the latency order differ between them). Part of
    every stored int result's key, so a results folder moved to another machine is not
    reused there."""
    import onnxruntime

    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        pass
    return {"onnxruntime": onnxruntime.__version__, "cpu": cpu, "vnni": str(ortb.has_vnni())}


def _block_cpu(bits: int) -> Callable[[], str | None]:
    def check() -> str | None:
        if int8_compute(bits) == "inexact":
            return (f"int{bits}-block: this CPU's MatMulNBits int8 kernels are not exact (they match neither int8 nor "
                    "fp32 arithmetic); use weight-only")
        return None

    return check


def _block_reference(bits: int) -> Callable[[BuildRequest, bytes], nn.Module]:
    """What block computes here: int8 activations per block where the CPU has the kernels."""
    return lambda r, model: simulate_nbits(r.network, bits, r.block_size, int8_compute(bits) == "int8", r.keep)


def _mixed_reference(bits: int) -> Callable[[BuildRequest, bytes], nn.Module]:
    def reference(r: BuildRequest, model: bytes) -> nn.Module:
        compute = int8_compute(bits) == "int8"
        return simulate_qdq(r.network, model, lambda layer: simulate_nbits(layer, bits, r.block_size, compute))

    return reference


def _static(r: BuildRequest) -> bytes:
    if r.calibration is None:
        raise QuarlError("int8-static needs calibration observations (static activation ranges)")
    return ortb.quantize_static_int8(r.model, r.calibration, r.weights, r.excluded_nodes())


def _mixed(bits: int) -> Callable[[BuildRequest], bytes]:
    """Convolutions static int8 (QDQ), then the Linear layers block-wise ``bits`` (MatMulNBits)."""

    def build(r: BuildRequest) -> bytes:
        if r.calibration is None:
            raise QuarlError(f"int{bits}-mixed needs calibration observations (its convolutions' activation ranges)")
        names = ortb.weight_node_names(r.model)
        linear = [n for i, n in enumerate(names) if i not in ortb.conv_layers(r.network)]
        convs_int8 = ortb.quantize_static_int8(r.model, r.calibration, r.weights, [*r.excluded_nodes(), *linear])
        return ortb.quantize_nbits(convs_int8, bits, r.block_size, int8_compute(bits) == "int8", r.excluded_nodes())

    return build


MODES: dict[str, IntMode] = {
    mode.label: mode
    for mode in (
        IntMode("block", 8, "MatMulNBits, weights and activations int8 per block", _nbits(8, True),
                _block_reference(8), cpu_unsupported=_block_cpu(8)),
        IntMode("dyn-channel", 8, "MatMulInteger, weights per output channel, activations uint8 per call",
                _dynamic(True), lambda r, _: simulate_dynamic_int8(r.network, r.weights, True, r.keep), per_row=True),
        IntMode("dyn-tensor", 8, "MatMulInteger, weights per tensor, activations uint8 per call", _dynamic(False),
                lambda r, _: simulate_dynamic_int8(r.network, r.weights, False, r.keep), per_row=True),
        IntMode("weight-only", 8, "MatMulNBits, 8-bit block weights, fp32 activations", _nbits(8, False),
                lambda r, _: simulate_nbits(r.network, 8, r.block_size, False, r.keep)),
        IntMode("static", 8, "QDQ, weights per channel, calibrated activation ranges", _static,
                lambda r, model: simulate_qdq(r.network, model),
                convolutions=True, needs_calibration=True),
        IntMode("mixed", 4, "convolutions QDQ int8, Linear layers MatMulNBits 4-bit block", _mixed(4), _mixed_reference(4),
                convolutions=True, needs_calibration=True, needs_conv=True, cpu_unsupported=_block_cpu(4)),
        IntMode("block", 4, "MatMulNBits, 4-bit block weights, activations int8 per block", _nbits(4, True),
                _block_reference(4), cpu_unsupported=_block_cpu(4)),
        IntMode("weight-only", 4, "MatMulNBits, 4-bit block weights, fp32 activations", _nbits(4, False),
                lambda r, _: simulate_nbits(r.network, 4, r.block_size, False, r.keep)),
    )
}
"""Every real integer mode by label (``int8-dyn-channel``...), in order of preference:
expected speed, measured on this project's machines (block-wise int8 compute is the
fastest on large layers and as fast as any on small ones; 8-bit weight-only has no fast
CPU kernel)."""


def modes_for(bits: int) -> list[IntMode]:
    return [m for m in MODES.values() if m.bits == bits]


def get_mode(label: str) -> IntMode:
    if label not in MODES:
        raise QuarlError(f"unknown int mode {label!r}: allowed {', '.join(MODES)}")
    return MODES[label]


@dataclass
class Candidate:
    """One mode built and checked on the calibration states."""

    mode: str
    keep: tuple[int, ...]
    agreement: float
    latency_us: float = float("nan")
    model_bytes: int = 0
    calibration_return: float = float("nan")
    """Mean return on calibration episodes (closed-loop check only)."""
    calibration_episodes: int = 0
    """Calibration episodes the sequential test played (0: not judged in closed loop)."""
    calibration_verdict: str = ""
    """What the sequential test found against fp32 (keeps, loses, undecided...)."""
    calibration_kept: bool | None = None
    kl: float = float("nan")
    """Mean KL divergence per state from fp32's action distribution to this mode's, on the
    check states (categorical heads; NaN elsewhere): how far a sampling policy moves."""
    sampled_agreement: float = float("nan")
    """How often a sampled action stays the same (categorical heads; NaN elsewhere): fp32 and
    this mode drawing with shared Gumbel noise, as quarl's paired evaluation draws, on the
    check states (:func:`sampled_agreement`). The automatic choice judges a sampling policy by it."""
    fp32_ort_latency_us: float = float("nan")
    """ONNX Runtime fp32's batch-1 latency, timed beside the chosen mode (automatic choice only)."""
    engine: ortb.OrtEngine | None = field(default=None, repr=False)
    reference: nn.Module | None = field(default=None, repr=False)

    def fidelity(self, sampled: bool) -> float:
        """What the automatic choice compares with its agreement bar: the sampled agreement
        for a policy that samples from a categorical head, the greedy actions' otherwise."""
        return self.sampled_agreement if sampled and self.sampled_agreement == self.sampled_agreement \
            else self.agreement

    def summary(self) -> dict:
        def num(x: float, digits: int) -> float | None:  # JSON has no NaN: unmeasured is null
            return None if x != x else round(x, digits)

        return {"mode": self.mode, "fp32_layers": list(self.keep), "agreement": num(self.agreement, 4),
                "kl": num(self.kl, 6), "sampled_agreement": num(self.sampled_agreement, 4),
                "latency_us": num(self.latency_us, 1), "fp32_ort_latency_us": num(self.fp32_ort_latency_us, 1),
                "model_bytes": self.model_bytes,
                "calibration_return": num(self.calibration_return, 3),
                "calibration_episodes": self.calibration_episodes, "calibration_verdict": self.calibration_verdict}


def action_agreement(policy: Policy, reference: np.ndarray, actions: np.ndarray, tolerance: float) -> float:
    """Share of states where ``actions`` agree with ``reference`` (fp32): the same greedy
    action, or every action dimension within ``tolerance`` of its range (``high - low``;
    2 where unbounded, the width of a tanh output)."""
    if policy.head in ("argmax", "quantile_argmax"):
        return float(np.mean(np.asarray(actions) == np.asarray(reference)))
    if policy.head in ("multi_argmax", "bernoulli"):  # every sub-action (bit) the same
        same = np.asarray(actions) == np.asarray(reference)
        return float(np.mean(same.reshape(len(same), -1).all(axis=1)))
    space = cast(gym.spaces.Box, policy.action_space)  # a continuous head acts in a Box
    width = np.asarray(space.high, dtype=np.float64) - np.asarray(space.low, dtype=np.float64)
    width = np.where(np.isfinite(width) & (width > 0), width, 2.0)
    deviation = np.abs(np.asarray(actions, np.float64) - reference) / width
    return float(np.mean(deviation.reshape(len(deviation), -1).max(axis=1) <= tolerance))


def fp32_actions(policy: Policy, calibration: np.ndarray) -> np.ndarray:
    """The fp32 policy's actions on preprocessed observations (the reference of agreement)."""
    with torch.inference_mode():
        return policy.postprocess(policy.network(torch.from_numpy(calibration)).float().numpy())


def split_calibration(mode: IntMode, calibration: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(states the mode is built from, states its agreement is checked on): a mode that
    fits ranges on observations is checked on the other half, never on what it was fit to."""
    if calibration is None or not mode.needs_calibration:
        return calibration, calibration
    return calibration[0::2], calibration[1::2]


def build_candidate(policy: Policy, mode: IntMode, request: BuildRequest, check: np.ndarray | None = None,
                    tolerance: float = 0.02) -> Candidate:
    """Build ``mode`` and, given ``check`` states (preprocessed observations), measure how
    often its actions agree with fp32's on them."""
    request = mode.request_for(request)
    model = mode.build(request)
    engine = ortb.OrtEngine(model, per_row=mode.per_row)
    agreement = kl = sampled = float("nan")
    if check is not None:
        out = engine(check)
        actions = policy.postprocess(out)
        agreement = action_agreement(policy, fp32_actions(policy, check), actions, tolerance)
        kl = categorical_kl(policy, check, out)
        sampled = sampled_agreement(policy, check, out)
    simulated = mode.reference(request, model) if mode.reference is not None else None
    return Candidate(mode.label, tuple(sorted(request.keep)), agreement, model_bytes=len(model), kl=kl, engine=engine,
                     reference=simulated, sampled_agreement=sampled)


def categorical_kl(policy: Policy, states: np.ndarray, out: np.ndarray) -> float:
    """Mean per-state KL(fp32 || quantized) of a categorical head's action distributions
    (softmax of the logits) on ``states``; NaN for heads that are not categorical."""
    from quarl.policies.base import categorical

    if not categorical(policy):
        return float("nan")
    with torch.inference_mode():
        p = torch.log_softmax(policy.network(torch.from_numpy(states)).double(), dim=1)
    q = torch.log_softmax(torch.from_numpy(np.asarray(out, np.float64)), dim=1)
    return float((p.exp() * (p - q)).sum(dim=1).mean())


SAMPLED_DRAWS = 64
"""Gumbel draws per state for :func:`sampled_agreement` (its standard error on 1,000 states is
below 0.3 %)."""


def sampled_agreement(policy: Policy, states: np.ndarray, out: np.ndarray) -> float:
    """How often fp32 and the quantized logits ``out`` sample the same action on ``states``
    when both draw with the same Gumbel noise (Gumbel-max, as quarl's paired evaluation
    samples, :func:`quarl.policies.base.sample_actions`), averaged over
    :data:`SAMPLED_DRAWS` draws per state from a fixed stream; NaN for heads that are not
    categorical. For two actions it is 1 - the total variation distance, exactly in expectation."""
    from quarl.policies.base import categorical

    if not categorical(policy) or len(states) == 0:
        return float("nan")
    with torch.inference_mode():
        p = policy.network(torch.from_numpy(states)).double().numpy()
    q = np.asarray(out, np.float64)
    gumbel = np.random.default_rng(0).gumbel(size=(SAMPLED_DRAWS, *p.shape))
    return float(np.mean((p + gumbel).argmax(-1) == (q + gumbel).argmax(-1)))


def keep_options(network: nn.Module) -> list[frozenset[int]]:
    """Which layers stay fp32, tried in turn. An MLP keeps the layer that reads the
    observations in fp32 from the start: its input features have unrelated scales (a
    position in metres beside a velocity in cm/s) that one activation range or block scale
    cannot serve, and its weights are few (obs_dim x width). Measured: the paper's DDPG
    MountainCar with its 2-feature input layer in int8-block missed the goal in some
    episodes (-2.7 % over 40) while agreeing with fp32 on every calibration state. Then the
    last layer (the one that writes the actions) too. A CNN starts fully quantized (its
    first convolution is most of the work), then last, first, both."""
    n = len(linear_layers(network))
    if ortb.has_conv(network):
        options = [frozenset(), frozenset({n - 1}), frozenset({0}), frozenset({0, n - 1})]
    else:
        options = [frozenset({0}), frozenset({0, n - 1})]
    kept = [o for o in options if len(o) < n]
    return list(dict.fromkeys(kept)) or [frozenset()]  # a single-layer policy is quantized whole


Returns = Callable[[Policy, int], np.ndarray]
"""``(policy, n)`` -> the policy's returns on the first ``n`` calibration episodes (seeds
apart from evaluation's; the same seeds for every policy)."""
SEQUENTIAL_FIRST = 4
SEQUENTIAL_CAP = 16
"""The sequential test of a candidate's return starts with 4 calibration episodes and
doubles them while undecided, up to the cap the returns' ``episode_cap(policy)`` gives
(:class:`quarl.measure.CalibrationEpisodes`: a step budget), else 16."""
CLOSED_LOOP_CANDIDATES = 4


SWITCH_MARGIN = 0.05
"""A mode later in registry order replaces an earlier one when it is more than 5 % faster
at batch 1 on this CPU..."""
SWITCH_SAVING_US = 2.0
"""...and saves at least this much per call: differences within timer noise keep the
registry order. The choice is then stored (:mod:`quarl.quant.choice_cache`), so a near tie
cannot flip between commands (measured before the cache: int8-block 27 / 23 / 39 us
against int8-dyn-channel 16 / 31 / 36 us in three builds of one PPO CartPole policy)."""
TIMING_ROUNDS = 5


def _time_interleaved(candidates: list[Candidate], sample: np.ndarray, budget_s: float) -> None:
    """Batch-1 latency of each candidate not yet timed, measured in interleaved rounds
    (every candidate once per round) so a burst of load slows them all alike; a candidate's
    latency is its fastest round's median (measured: with the median of the rounds, the same
    small engines timed twice moved by 30 %, with the fastest round by a few percent)."""
    todo = [c for c in candidates if c.latency_us != c.latency_us]
    if not todo:
        return
    samples: dict[int, list[float]] = {id(c): [] for c in todo}
    for _ in range(TIMING_ROUNDS):
        for c in todo:
            samples[id(c)].append(median_us(_engine(c), sample, budget_s / TIMING_ROUNDS))
    for c in todo:
        c.latency_us = float(np.min(samples[id(c)]))


def _ranked(candidates: list[Candidate], sample: np.ndarray, budget_s: float) -> list[Candidate]:
    """Candidates fastest first at batch 1 on this CPU (timed in interleaved rounds, the
    median of each), where a later one in registry order moves ahead of an earlier one only
    when more than :data:`SWITCH_MARGIN` faster *and* at least :data:`SWITCH_SAVING_US`
    faster: the first is within about 5 % of the fastest."""
    _time_interleaved(candidates, sample, budget_s)
    rest, ranked = list(candidates), []
    while rest:
        best = rest[0]
        for c in rest[1:]:
            faster = c.latency_us < best.latency_us * (1 - SWITCH_MARGIN)
            if faster and best.latency_us - c.latency_us >= SWITCH_SAVING_US:
                best = c
        ranked.append(best)
        rest.remove(best)
    return ranked


def _engine(candidate: Candidate) -> ortb.OrtEngine:
    assert candidate.engine is not None  # every built candidate has its ONNX Runtime engine
    return candidate.engine


def _as_policy(policy: Policy, candidate: Candidate) -> Policy:
    network = candidate.reference if candidate.reference is not None else policy.clone_network()
    return policy.with_network(network, candidate.mode, _engine(candidate))


LOW_AGREEMENT = 0.9
"""A mode chosen on episodes alone that agrees with fp32 on fewer states than this is warned of."""


def choose(policy: Policy, bits: int, calibration: np.ndarray, weights: str, block_size: int,
           min_agreement: float, tolerance: float, returns: Returns | None = None,
           timing_budget_s: float = 0.05, sampled: bool = False) -> tuple[Candidate, list[Candidate]]:
    """The first (see :func:`_ranked`) mode of ``bits`` whose actions agree with fp32 on
    ``calibration`` (preprocessed observations) and, given ``returns``, whose return on
    calibration episodes keeps fp32's (the sequential test); see the module docstring. When none
    agrees, the most faithful candidates are judged on the episodes alone. ``sampled``: the
    policy will sample its actions, so a categorical head's agreement is that of sampled
    actions (:func:`sampled_agreement`: the distributions, not only their argmax, must stay).
    Returns the choice and every candidate tried."""
    fp32_model = ortb.export_onnx(policy.network, policy.input_shape)  # every candidate is built from it
    chosen, tried = _choose(policy, fp32_model, bits, calibration, weights, block_size, min_agreement, tolerance,
                            returns, timing_budget_s, sampled)
    _against_fp32(chosen, ortb.OrtEngine(fp32_model), calibration[:1], timing_budget_s, bits)
    return chosen, tried


def _against_fp32(chosen: Candidate, fp32: ortb.OrtEngine, sample: np.ndarray, budget_s: float, bits: int) -> None:
    """ONNX Runtime fp32's batch-1 latency beside the chosen mode's, timed in the same
    interleaved rounds (:attr:`Candidate.fp32_ort_latency_us`); a mode slower than it is
    said in a warning: its gain there is the model's size, not speed."""
    mine = Candidate(chosen.mode, chosen.keep, chosen.agreement, engine=chosen.engine)
    base = Candidate("fp32-ort", (), 1.0, engine=fp32)
    _time_interleaved([mine, base], sample, budget_s)
    chosen.fp32_ort_latency_us = base.latency_us
    if mine.latency_us > base.latency_us * (1 + SWITCH_MARGIN) and mine.latency_us - base.latency_us >= SWITCH_SAVING_US:
        log.warning("int%d: the chosen mode %s (%.1f us per call at batch 1) is slower than ONNX Runtime fp32 (%.1f us) "
                    "on this CPU: its gain here is the model's size", bits, chosen.mode, mine.latency_us,
                    base.latency_us)


def _choose(policy: Policy, fp32_model: bytes, bits: int, calibration: np.ndarray, weights: str, block_size: int,
            min_agreement: float, tolerance: float, returns: Returns | None, timing_budget_s: float,
            sampled: bool) -> tuple[Candidate, list[Candidate]]:
    """The automatic choice itself (see :func:`choose`), its candidates built from ``fp32_model``."""
    network = policy.network
    conv = ortb.has_conv(network)
    modes = [m for m in modes_for(bits) if m.unsupported(network) is None and (conv or not m.needs_calibration)]
    if not modes:
        reasons = "; ".join(m.unsupported(network) or "" for m in modes_for(bits))
        raise QuarlError(f"int{bits} cannot run this policy: {reasons}")
    sample = calibration[:1]

    def keeps_return(c: Candidate) -> bool:
        """The paired sequential test (:func:`quarl.verdict.sequential_keeps`): more calibration
        episodes only while it cannot tell whether the candidate keeps fp32's return."""
        if returns is None:
            return True
        if c.calibration_kept is None:
            acting = _as_policy(policy, c)
            cap_for = getattr(returns, "episode_cap", None)
            cap = cap_for(policy, SEQUENTIAL_FIRST) if cap_for is not None else SEQUENTIAL_CAP
            outcome = sequential_keeps(lambda n: returns(policy, n), lambda n: returns(acting, n), SEQUENTIAL_FIRST, cap)
            c.calibration_return = float(np.mean(returns(acting, outcome.episodes)))
            c.calibration_episodes = outcome.episodes
            c.calibration_verdict = outcome.verdict.label()
            c.calibration_kept = outcome.kept
        return c.calibration_kept

    tried: list[Candidate] = []
    built: set[tuple[str, frozenset[int]]] = set()
    # a CNN tries every fp32-layer option of the modes that run its convolutions in int8 before
    # the modes that keep them fp32: a Linear-only mode that agrees at once would otherwise
    # win over a static mode that agrees with the last layer kept (measured: a PPO Breakout
    # agent's static agreed on 98.4 % with every layer quantized, block on its Linear layers 100 %)
    groups = ([m for m in modes if m.convolutions], [m for m in modes if not m.convolutions]) if conv else (modes,)
    for group, keep in [(g, k) for g in groups if g for k in keep_options(network)]:
        agreeing = []
        for mode in group:
            fit, check = split_calibration(mode, calibration)
            request = mode.request_for(BuildRequest(network, fp32_model, fit, weights, block_size, keep))
            if (mode.label, request.keep) in built:  # a CNN's fp32 convolutions already kept by this mode
                continue
            built.add((mode.label, request.keep))
            candidate = build_candidate(policy, mode, request, check, tolerance)
            tried.append(candidate)
            if candidate.fidelity(sampled) >= min_agreement:
                agreeing.append(candidate)
        # agreeing on states is necessary, not enough: a few states decide an episode
        # (where a DDPG car starts to push), so the pick must also keep the return
        for candidate in _ranked(agreeing, sample, timing_budget_s):
            if keeps_return(candidate):
                return candidate, tried
    if returns is not None:
        # near-tied action values (DQN) make state agreement a poor judge: which states flip
        # matters, and only acting for whole episodes tells
        closest = sorted(tried, key=lambda c: -c.fidelity(sampled))[:CLOSED_LOOP_CANDIDATES]
        kept = [c for c in tried if any(c is k for k in closest) and keeps_return(c)]  # registry order
        if kept:
            chosen = _ranked(kept, sample, timing_budget_s)[0]
            # a chosen mode far from fp32's actions is worth a warning, one near the bar a note (-v)
            say = log.warning if chosen.fidelity(sampled) < LOW_AGREEMENT else log.info
            say("int%d: no mode agrees with fp32 on %.0f%% of the calibration states; %s (layers %s in fp32) "
                        "agrees on only %.1f%% but keeps fp32's return on %d calibration episodes", bits,
                        100 * min_agreement, chosen.mode, list(chosen.keep), 100 * chosen.fidelity(sampled),
                        chosen.calibration_episodes)
            return chosen, tried
        scored = [c for c in tried if c.calibration_return == c.calibration_return]
        best = max(scored, key=lambda c: c.calibration_return)
        log.warning("int%d: no mode keeps fp32's return (%.2f) on the calibration episodes; the best, %s with layers "
                    "%s in fp32, scores %.2f", bits, float(np.mean(returns(policy, best.calibration_episodes))),
                    best.mode, list(best.keep), best.calibration_return)
        best.latency_us = median_us(_engine(best), sample, timing_budget_s)
        return best, tried
    best = max(tried, key=lambda c: c.fidelity(sampled))
    log.warning("int%d: no mode agrees with fp32 on %.0f%% of the calibration states; the closest, %s with "
                "layers %s in fp32, agrees on %.1f%%", bits, 100 * min_agreement, best.mode, list(best.keep),
                100 * best.fidelity(sampled))
    best.latency_us = median_us(_engine(best), calibration[:1], timing_budget_s)
    return best, tried
