"""The automatic choice of a real int mode (``int8`` / ``int4`` without a mode), in small steps.

Every mode of :data:`quarl.quant.modes.MODES` the policy supports is built and run on
calibration states (fp32 rollouts on seeds disjoint from evaluation), and the fastest at
batch 1 on this CPU (:func:`ranked`: near ties keep registry order) whose actions agree with
fp32 is used, and stored for this policy, CPU and ONNX Runtime (:mod:`quarl.quantization.choice_cache`):
at least ``min_agreement`` of the states must give the same greedy action (discrete) or
actions within ``action_tolerance`` of the action range (continuous), and, where calibration
episodes can be run, the mode must keep fp32's return on them: a paired sequential test
(:func:`quarl.verdict.sequential_keeps`: 4 episodes, doubled while the 95 % interval of E
straddles 5 %, up to about 20k steps' worth: 16 to 64 episodes) must find it keeps, or at the
cap lose at most 5 % on average. Chaotic games need many episodes: on a MinAtar
SpaceInvaders PPO agent, int8-static's E was 14.8 % over 100 evaluation seeds and 2.8 % over
400, undecided both times (one flipped action sends an episode elsewhere). A few states
decide an episode (measured: a DDPG MountainCar policy's int8-block agreed on every
calibration state and lost 5.5 % of its return over 20 evaluation episodes).

When no mode agrees with every layer quantized, each is tried again with the last, the
first, then both layers kept in fp32 (:func:`keep_options`: the layers most sensitive to
rounding). When none agrees then (a DQN whose action values nearly tie everywhere flips
greedy actions under any rounding), the closed loop decides (:func:`judged_on_episodes`): the
four most faithful candidates act for whole calibration episodes and the first (same rule)
whose return is within 5 % of fp32's on those episodes wins (else the best scoring, with a
warning). Measured on the zoo's DQN CartPole: int8-block agreed on 82 % of states and
int8-dyn-tensor on 75 %; acting, block kept 500 and dyn-tensor fell to 139.

The steps, in order: :func:`supported_modes`, :func:`mode_groups` x :func:`keep_options`
(:func:`build_group` then :func:`ranked` and :func:`keeps_return`), else
:func:`judged_on_episodes` or :func:`closest`; then :func:`against_fp32`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.timing import median_us
from quarl.policies.base import Policy
from quarl.quant.backends import onnxruntime as ortb
from quarl.quant.layers import linear_layers
from quarl.quant.modes import BuildRequest, IntMode, modes_for
from quarl.quantization.candidates import Candidate, build_candidate, split_calibration
from quarl.verdict import sequential_keeps

log = logging.getLogger(__name__)

Returns = Callable[["Policy", int], np.ndarray]
"""``(policy, n)`` -> the policy's returns on the first ``n`` calibration episodes (seeds
apart from evaluation's; the same seeds for every policy)."""
SEQUENTIAL_FIRST = 4
SEQUENTIAL_CAP = 16
"""The sequential test of a candidate's return starts with 4 calibration episodes and
doubles them while undecided, up to the cap the returns' ``episode_cap(policy)`` gives
(:class:`quarl.evaluation.calibration.CalibrationEpisodes`: a step budget), else 16."""
CLOSED_LOOP_CANDIDATES = 4

SWITCH_MARGIN = 0.05
"""A mode later in registry order replaces an earlier one when it is more than 5 % faster
at batch 1 on this CPU..."""
SWITCH_SAVING_US = 2.0
"""...and saves at least this much per call: differences within timer noise keep the
registry order. The choice is then stored (:mod:`quarl.quantization.choice_cache`), so a near tie
cannot flip between commands (measured before the cache: int8-block 27 / 23 / 39 us
against int8-dyn-channel 16 / 31 / 36 us in three builds of one PPO CartPole policy)."""
TIMING_ROUNDS = 5

LOW_AGREEMENT = 0.9
"""A mode chosen on episodes alone that agrees with fp32 on fewer states than this is warned of."""


@dataclass(frozen=True)
class ChoiceRequest:
    """One automatic choice's inputs (see :func:`choose`)."""

    policy: Policy
    fp32_model: bytes
    """The fp32 ONNX export of the policy's network: every candidate is built from it."""
    bits: int
    calibration: np.ndarray
    weights: str
    block_size: int
    min_agreement: float
    tolerance: float
    returns: Returns | None
    timing_budget_s: float
    sampled: bool

    @property
    def sample(self) -> np.ndarray:
        """The one state candidates are timed on (batch 1)."""
        return self.calibration[:1]


def choose(policy: Policy, bits: int, calibration: np.ndarray, weights: str, block_size: int,
           min_agreement: float, tolerance: float, returns: Returns | None = None,
           timing_budget_s: float = 0.05, sampled: bool = False) -> tuple[Candidate, list[Candidate]]:
    """The first (see :func:`ranked`) mode of ``bits`` whose actions agree with fp32 on
    ``calibration`` (preprocessed observations) and, given ``returns``, whose return on
    calibration episodes keeps fp32's (the sequential test); see the module docstring. When none
    agrees, the most faithful candidates are judged on the episodes alone. ``sampled``: the
    policy will sample its actions, so a categorical head's agreement is that of sampled
    actions (:func:`quarl.quantization.candidates.sampled_agreement`: the distributions, not only their
    argmax, must stay). Returns the choice and every candidate tried."""
    request = ChoiceRequest(policy, ortb.export_onnx(policy.network, policy.input_shape), bits, calibration, weights,
                            block_size, min_agreement, tolerance, returns, timing_budget_s, sampled)
    chosen, tried = choose_among_modes(request)
    against_fp32(chosen, ortb.OrtEngine(request.fp32_model), request.sample, timing_budget_s, bits)
    return chosen, tried


def choose_among_modes(request: ChoiceRequest) -> tuple[Candidate, list[Candidate]]:
    """The choice itself (see :func:`choose`): the first agreeing candidate that keeps the
    return, else the closed loop's pick, else the closest; and every candidate tried."""
    modes = supported_modes(request.policy.network, request.bits)
    tried: list[Candidate] = []
    chosen = first_agreeing(request, modes, tried)
    if chosen is not None:
        return chosen, tried
    if request.returns is not None:
        return judged_on_episodes(request, tried), tried
    return closest(request, tried), tried


def supported_modes(network: nn.Module, bits: int) -> list[IntMode]:
    """The registered modes of ``bits`` this network and CPU can run; a mode that fits
    activation ranges (``static``, ``mixed``) only for a CNN, where it is the one fast mode
    (an MLP's states beyond the calibrated ranges would saturate)."""
    conv = ortb.has_conv(network)
    modes = [m for m in modes_for(bits) if m.unsupported(network) is None and (conv or not m.needs_calibration)]
    if not modes:
        reasons = "; ".join(m.unsupported(network) or "" for m in modes_for(bits))
        raise QuarlError(f"int{bits} cannot run this policy: {reasons}")
    return modes


def mode_groups(modes: list[IntMode], network: nn.Module) -> list[list[IntMode]]:
    """The modes in the order their groups are tried. A CNN tries every fp32-layer option of
    the modes that run its convolutions in int8 before the modes that keep them fp32: a
    Linear-only mode that agrees at once would otherwise win over a static mode that agrees
    with the last layer kept (measured: a PPO Breakout agent's static agreed on 98.4 % with
    every layer quantized, block on its Linear layers 100 %)."""
    if not ortb.has_conv(network):
        return [modes]
    groups = ([m for m in modes if m.convolutions], [m for m in modes if not m.convolutions])
    return [group for group in groups if group]


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


def first_agreeing(request: ChoiceRequest, modes: list[IntMode], tried: list[Candidate]) -> Candidate | None:
    """Group by group and fp32-layer option by option: the fastest candidate that agrees with
    fp32 on the calibration states and keeps its return; None when none does. Every
    candidate built is appended to ``tried``."""
    built: set[tuple[str, frozenset[int]]] = set()
    for group in mode_groups(modes, request.policy.network):
        for keep in keep_options(request.policy.network):
            agreeing = build_group(request, group, keep, built, tried)
            # agreeing on states is necessary, not enough: a few states decide an episode
            # (where a DDPG car starts to push), so the pick must also keep the return
            for candidate in ranked(agreeing, request.sample, request.timing_budget_s):
                if keeps_return(request, candidate):
                    return candidate
    return None


def build_group(request: ChoiceRequest, group: list[IntMode], keep: frozenset[int],
                built: set[tuple[str, frozenset[int]]], tried: list[Candidate]) -> list[Candidate]:
    """Each mode of ``group`` built with the ``keep`` layers in fp32 (once per mode and layers:
    ``built`` remembers), checked on calibration states it was not fit to and appended to
    ``tried``; returns those whose fidelity reaches ``min_agreement``, in registry order."""
    agreeing = []
    for mode in group:
        fit, check = split_calibration(mode, request.calibration)
        build = mode.request_for(BuildRequest(request.policy.network, request.fp32_model, fit, request.weights,
                                              request.block_size, keep))
        if (mode.label, build.keep) in built:  # a CNN's fp32 convolutions already kept by this mode
            continue
        built.add((mode.label, build.keep))
        candidate = build_candidate(request.policy, mode, build, check, request.tolerance)
        tried.append(candidate)
        if candidate.fidelity(request.sampled) >= request.min_agreement:
            agreeing.append(candidate)
    return agreeing


def keeps_return(request: ChoiceRequest, candidate: Candidate) -> bool:
    """The paired sequential test (:func:`quarl.verdict.sequential_keeps`): more calibration
    episodes only while it cannot tell whether the candidate keeps fp32's return. Played once
    per candidate (what it found is kept on the candidate); True without ``returns``."""
    returns, policy = request.returns, request.policy
    if returns is None:
        return True
    if candidate.calibration_kept is None:
        acting = as_policy(policy, candidate)
        cap_for = getattr(returns, "episode_cap", None)
        cap = cap_for(policy, SEQUENTIAL_FIRST) if cap_for is not None else SEQUENTIAL_CAP
        outcome = sequential_keeps(lambda n: returns(policy, n), lambda n: returns(acting, n), SEQUENTIAL_FIRST, cap)
        candidate.calibration_return = float(np.mean(returns(acting, outcome.episodes)))
        candidate.calibration_episodes = outcome.episodes
        candidate.calibration_verdict = outcome.label()  # "estimate: ..." where the cap came first
        candidate.calibration_kept = outcome.kept
    return candidate.calibration_kept


def judged_on_episodes(request: ChoiceRequest, tried: list[Candidate]) -> Candidate:
    """No candidate agrees: near-tied action values (DQN) make state agreement a poor judge
    (which states flip matters, and only acting for whole episodes tells). The
    :data:`CLOSED_LOOP_CANDIDATES` most faithful play calibration episodes; the fastest of those
    that keep fp32's return wins (a warning when it agrees on fewer than :data:`LOW_AGREEMENT`
    of the states), else the best scoring, with a warning."""
    assert request.returns is not None  # only called with calibration episodes to play
    sampled, bits = request.sampled, request.bits
    closest_few = sorted(tried, key=lambda c: -c.fidelity(sampled))[:CLOSED_LOOP_CANDIDATES]
    kept = [c for c in tried if any(c is k for k in closest_few) and keeps_return(request, c)]  # registry order
    if kept:
        chosen = ranked(kept, request.sample, request.timing_budget_s)[0]
        # a chosen mode far from fp32's actions is worth a warning, one near the bar a note (-v)
        say = log.warning if chosen.fidelity(sampled) < LOW_AGREEMENT else log.info
        say("int%d: no mode agrees with fp32 on %.0f%% of the calibration states; %s (layers %s in fp32) "
            "agrees on only %.1f%% but plays fp32's return on %d calibration episodes (%s)", bits,
            100 * request.min_agreement, chosen.mode, list(chosen.keep), 100 * chosen.fidelity(sampled),
            chosen.calibration_episodes, chosen.calibration_verdict)
        return chosen
    scored = [c for c in tried if c.calibration_return == c.calibration_return]
    best = max(scored, key=lambda c: c.calibration_return)
    fp32_return = float(np.mean(request.returns(request.policy, best.calibration_episodes)))
    log.warning("int%d: no mode keeps fp32's return (%.2f) on the calibration episodes; the best, %s with layers "
                "%s in fp32, scores %.2f", bits, fp32_return, best.mode, list(best.keep), best.calibration_return)
    best.latency_us = median_us(engine_of(best), request.sample, request.timing_budget_s)
    return best


def closest(request: ChoiceRequest, tried: list[Candidate]) -> Candidate:
    """No candidate agrees and no episodes can be played: the most faithful, with a warning."""
    best = max(tried, key=lambda c: c.fidelity(request.sampled))
    log.warning("int%d: no mode agrees with fp32 on %.0f%% of the calibration states; the closest, %s with "
                "layers %s in fp32, agrees on %.1f%%", request.bits, 100 * request.min_agreement, best.mode,
                list(best.keep), 100 * best.fidelity(request.sampled))
    best.latency_us = median_us(engine_of(best), request.sample, request.timing_budget_s)
    return best


def time_interleaved(candidates: list[Candidate], sample: np.ndarray, budget_s: float) -> None:
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
            samples[id(c)].append(median_us(engine_of(c), sample, budget_s / TIMING_ROUNDS))
    for c in todo:
        c.latency_us = float(np.min(samples[id(c)]))


def ranked(candidates: list[Candidate], sample: np.ndarray, budget_s: float) -> list[Candidate]:
    """Candidates fastest first at batch 1 on this CPU (timed in interleaved rounds, the
    median of each), where a later one in registry order moves ahead of an earlier one only
    when more than :data:`SWITCH_MARGIN` faster *and* at least :data:`SWITCH_SAVING_US`
    faster: the first is within about 5 % of the fastest."""
    time_interleaved(candidates, sample, budget_s)
    rest, order = list(candidates), []
    while rest:
        best = rest[0]
        for c in rest[1:]:
            faster = c.latency_us < best.latency_us * (1 - SWITCH_MARGIN)
            if faster and best.latency_us - c.latency_us >= SWITCH_SAVING_US:
                best = c
        order.append(best)
        rest.remove(best)
    return order


def against_fp32(chosen: Candidate, fp32: ortb.OrtEngine, sample: np.ndarray, budget_s: float, bits: int) -> None:
    """ONNX Runtime fp32's batch-1 latency beside the chosen mode's, timed in the same
    interleaved rounds (:attr:`Candidate.fp32_ort_latency_us`); a mode slower than it is
    said in a warning: its gain there is the model's size, not speed."""
    mine = Candidate(chosen.mode, chosen.keep, chosen.agreement, engine=chosen.engine)
    base = Candidate("fp32-ort", (), 1.0, engine=fp32)
    time_interleaved([mine, base], sample, budget_s)
    chosen.fp32_ort_latency_us = base.latency_us
    slower = mine.latency_us > base.latency_us * (1 + SWITCH_MARGIN)
    if slower and mine.latency_us - base.latency_us >= SWITCH_SAVING_US:
        log.warning("int%d: the chosen mode %s (%.1f us per call at batch 1) is slower than ONNX Runtime fp32 "
                    "(%.1f us) on this CPU: its gain here is the model's size", bits, chosen.mode, mine.latency_us,
                    base.latency_us)


def engine_of(candidate: Candidate) -> ortb.OrtEngine:
    assert candidate.engine is not None  # every built candidate has its ONNX Runtime engine
    return candidate.engine


def as_policy(policy: Policy, candidate: Candidate) -> Policy:
    """The policy acting with ``candidate``'s engine (its reference network beside it)."""
    network = candidate.reference if candidate.reference is not None else policy.clone_network()
    return policy.with_network(network, candidate.mode, engine_of(candidate))
