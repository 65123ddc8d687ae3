"""Recovering what post-training quantization loses: quantization-aware distillation of a
trained policy onto the grid of the real kernel it will run on.

The fp32 policy is the *teacher*; the *student* is a copy whose forward computes what one
real int mode computes (:mod:`quarl.quant.student`: the mode the automatic choice picks for
the policy, its fp32 layers, block size, activation rounding), trained with a
straight-through gradient. The loop, DAgger (Ross, Gordon and Bagnell, 2011)::

    round 0:   the teacher plays episodes on distillation seeds; its states are kept
    round r:   the student (its real kernel) plays; its states are added (aggregated)
    each round: every state labelled by the teacher's network, ``updates`` Adam steps on
               minibatches of all states, then the real model built from the student's
               integers is checked on held-out states (their own seeds): stop when it
               agrees with the teacher at least as often as the teacher's own fp16 copy
               does (or ``target_agreement``) and keeps the teacher's return on
               calibration episodes (the automatic choice's sequential test); else go on,
               up to ``rounds``. The best round (held-out agreement) is what is written.

Seeds: distillation episodes reset with :data:`quarl.measure.DISTILLATION_SEEDS`, which no
evaluation may use (:class:`quarl.measure.EvalSettings` refuses them); VecNormalize
statistics are the teacher's, frozen. The loss depends on the action head
(:func:`distill_loss`). A run writes its state after every round and resumes from it.

The output is an RL Zoo run folder (:func:`write_recovered`) whose zip holds the student's
weights on the grid, with the real-kernel export beside it and the original policy
recorded by content hash; ``quarl ptq`` on it plays the ORIGINAL fp32 policy as its fp32
row and the recovered real kernel at its precision.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import logging
import math
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field
from torch import nn

from quarl.envs import EnvSpec
from quarl.errors import QuarlError
from quarl.evaluation import evaluate
from quarl.file_schema import Record, parse_json, parse_record
from quarl.measure import DISTILLATION_SEEDS, calibration_inputs, calibration_returns
from quarl.policies.base import Policy
from quarl.quant.backends.onnxruntime import OrtEngine
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.modes import MODES, action_agreement, fp32_actions, get_mode, int8_compute
from quarl.quant.student import (STUDENT_MODES, KernelSpec, make_student, plain_network, real_model, sb3_tensors,
                                 student_mode)
from quarl.verdict import TOLERANCE, Sequential, sequential_at_least, sequential_keeps

log = logging.getLogger(__name__)

Q_ALGOS = ("dqn", "qrdqn")
"""Algorithms whose discrete head is action values (a margin loss), not logits (KL)."""
RECOVERY_FILE = "recovery.json"
ORIGINAL_ZIP = "original.zip"
EXPORT_DIR = "export"
STATE_FILE = "state.pt"
RECOVERY_FORMAT = 1
MIN_HELDOUT = 256
"""Held-out states needed before a round may end the run: one short episode (a failing
CartPole's 10 steps) agreeing on every state says little."""
TRAIN_SEEDS_END = DISTILLATION_SEEDS.start + 8_000
"""Distillation's training episodes stay below this seed (20,000..27,999)."""
TEST_SEEDS = range(TRAIN_SEEDS_END, DISTILLATION_SEEDS.start + 9_000)
"""Recovery's own calibration episodes (28,000..28,999): the paired tests that choose what
is written (a student against PTQ's own model) and when recovery stops (against the
original fp32). Reserved like every distillation seed (no evaluation may play them) and
never trained on. ptq's calibration episodes (10,100..10,199) are too few: the confidence
sequence needs about 100 clean episodes before it may exclude an unseen failure."""
TEST_FIRST = 16
"""Episodes of a test's first look (then doubled while undecided)."""
TEST_STEPS = 160_000
"""Steps a test may play per policy: its cap is this over the reference's mean episode
length, within :data:`TEST_CAPS` (CartPole at 500 steps: 320 episodes; MuJoCo: 160)."""
TEST_CAPS = (128, 512)
"""Fewer than 128 clean episodes cannot decide *keeps*; more than 512 is a long wait."""


@dataclass(frozen=True)
class RecoverConfig:
    """How a policy is recovered (see the module docstring)."""

    precision: str = "int4"
    """``int8`` / ``int4`` (the mode the automatic choice picks; a mode without a student,
    such as ``int8-static``, is replaced by the block mode of its bits) or a mode label
    (``int4-block``, ``int8-dyn-channel``...)."""
    rounds: int = 12
    """DAgger rounds at most (round 0 is the teacher's)."""
    episodes_per_round: int = 4
    """Episodes played per round for training states (one more for held-out states)."""
    max_episode_steps: int = 1000
    """Distillation episodes are cut here (states, not returns, are what is collected)."""
    updates_per_round: int = 400
    """Adam steps per round."""
    batch_size: int = 256
    lr: float = 5e-4
    target_agreement: float | None = None
    """Held-out agreement that ends the run; None: the teacher's fp16 agreement with
    itself, at most ``min_agreement``."""
    min_agreement: float = 0.99
    action_tolerance: float = 0.02
    """Continuous actions agree when every dimension is within this share of its range."""
    max_states: int = 200_000
    """Aggregated states kept at most (the oldest student states are dropped first)."""
    block_size: int = 32
    int8_weights: str = "auto"
    seed: int = 0
    """Seeds the minibatch order and the student's initial noise-free copy (torch RNG)."""
    closed_loop: bool = True
    """Also require the student to keep the teacher's return on calibration episodes."""
    stop_at_target: bool = True
    """End at the first round that reaches the target (False: play every round, keep the best)."""
    finetune_steps: int = 20_000
    """Env steps of QAT fine-tuning with the agent's own algorithm (:mod:`quarl.training.finetune`;
    0: none), run where the distillation rounds ended without keeping fp32's return. The
    fine-tuned student is a candidate like the distilled ones: written only where it plays
    at least as well as PTQ's own model."""
    q_loss: str = "rank"
    """Q-value heads (DQN, QR-DQN): ``rank`` (a hinge on the teacher's greedy action, one on
    every pair of actions the teacher orders with states weighted by the teacher's action
    gap, and the values' squared error) or ``margin`` (the first and the last only). On a
    DQN LunarLander at int4 (docs/recover.md, "Q-value heads") ``rank`` raised held-out
    agreement from 87.9 % to 92.1 % and kept fp32's return where ``margin`` was undecided."""
    max_rounds: int | None = None
    """DAgger rounds in all, the continuations included (None: three times ``rounds``):
    where ``rounds`` end without keeping fp32's return, distillation goes on ``rounds`` more
    at a time, up to this."""
    budget_minutes: float = 15.0
    """Wall-clock budget: no new stage (more rounds, the fine-tune) starts after it."""

    def __post_init__(self) -> None:
        from quarl.quant.config import QuantConfig

        for name in ("rounds", "episodes_per_round", "max_episode_steps", "updates_per_round", "batch_size",
                     "max_states"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise QuarlError(f"{name}={value!r} must be a whole number of at least 1")
        if self.rounds > 1000 or self.episodes_per_round > 1000 or self.updates_per_round > 1_000_000:
            raise QuarlError(f"rounds {self.rounds}, episodes per round {self.episodes_per_round} or updates "
                             f"{self.updates_per_round} is beyond the allowed 1000 / 1000 / 1,000,000")
        if not (self.lr > 0 and np.isfinite(self.lr)):
            raise QuarlError(f"learning rate {self.lr!r} must be a positive number")
        if self.target_agreement is not None and not 0.0 < self.target_agreement <= 1.0:
            raise QuarlError(f"target agreement {self.target_agreement!r} must be in (0, 1]")
        if isinstance(self.finetune_steps, bool) or not isinstance(self.finetune_steps, int) or \
                not 0 <= self.finetune_steps <= 100_000_000:
            raise QuarlError(f"finetune_steps={self.finetune_steps!r} must be a whole number in 0..100,000,000")
        if self.q_loss not in ("margin", "rank"):
            raise QuarlError(f"q_loss={self.q_loss!r} is not a Q-value loss: allowed margin, rank")
        if self.max_rounds is not None and (isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int)
                                            or not self.rounds <= self.max_rounds <= 1000):
            raise QuarlError(f"max_rounds={self.max_rounds!r} must be a whole number from rounds ({self.rounds}) to 1000")
        if self.total_rounds * self.episodes_per_round > TRAIN_SEEDS_END - DISTILLATION_SEEDS.start:
            raise QuarlError(f"{self.total_rounds} rounds of {self.episodes_per_round} episodes would play past the "
                             f"distillation's training seeds ({DISTILLATION_SEEDS.start}..{TRAIN_SEEDS_END - 1}): "
                             "fewer rounds or episodes per round")
        if not (isinstance(self.budget_minutes, (int, float)) and 0 < self.budget_minutes <= 7 * 24 * 60):
            raise QuarlError(f"budget_minutes={self.budget_minutes!r} must be a number of minutes in (0, 10080]")
        if self.max_states > 10_000_000:
            raise QuarlError(f"max states {self.max_states} is beyond the allowed 10,000,000")
        config = QuantConfig.parse(self.precision, block_size=self.block_size, int8_weights=self.int8_weights,
                                   min_agreement=self.min_agreement, action_tolerance=self.action_tolerance)
        if config.precision not in ("int8", "int4"):
            raise QuarlError(f"recover precision {self.precision!r} is not a real int precision: allowed int8, int4 "
                             f"or a mode ({', '.join(m for m in MODES if m.split('-', 1)[1] in STUDENT_MODES)})")

    @property
    def total_rounds(self) -> int:
        """DAgger rounds at most, the continuations included."""
        if self.max_rounds is not None:
            return self.max_rounds
        room = (TRAIN_SEEDS_END - DISTILLATION_SEEDS.start) // self.episodes_per_round  # the training seeds' room
        return max(self.rounds, min(3 * self.rounds, room, 1000))

    def quant_config(self):
        from quarl.quant.config import QuantConfig

        return QuantConfig.parse(self.precision, block_size=self.block_size, int8_weights=self.int8_weights,
                                 min_agreement=self.min_agreement, action_tolerance=self.action_tolerance).resolved()


# ------------------------------------------------------------------ losses


def _q_values(policy: Policy, out: torch.Tensor) -> torch.Tensor:
    if policy.head == "quantile_argmax":
        return out.reshape(out.shape[0], policy.n_quantiles, -1).mean(1)
    return out


def _margin(student: torch.Tensor, teacher: torch.Tensor, scale: float) -> torch.Tensor:
    """Hinge on the teacher's greedy action: the student's value of it must lead every other
    action by half the teacher's own lead (at most ``scale``); states where the teacher
    itself is tied (lead below 1e-3 of ``scale``) ask nothing."""
    top2 = teacher.topk(2, dim=1)
    best = top2.indices[:, 0]
    lead_t = top2.values[:, 0] - top2.values[:, 1]
    chosen = student.gather(1, best[:, None])[:, 0]
    others = student.scatter(1, best[:, None], float("-inf")).amax(dim=1)
    want = torch.clamp(0.5 * lead_t, max=scale)
    untied = (lead_t > 1e-3 * scale).float()
    return (torch.relu(want - (chosen - others)) * untied).sum() / (untied.sum().clamp(min=1.0) * scale)


def _ranking(student: torch.Tensor, teacher: torch.Tensor, scale: float) -> torch.Tensor:
    """A hinge on every pair of actions the teacher orders (``i`` above ``j``): the student
    keeps ``i`` above ``j`` by half the teacher's gap (at most ``scale``), each state
    weighted by the teacher's own action gap (its lead, over ``scale``; at most 1), so the
    states where a flipped greedy action costs return weigh most and ties ask nothing."""
    gap_t = teacher[:, :, None] - teacher[:, None, :]  # [b, i, j]: how far the teacher puts i above j
    gap_s = student[:, :, None] - student[:, None, :]
    ordered = (gap_t > 1e-3 * scale).float()
    want = torch.clamp(0.5 * gap_t, max=scale)
    top2 = teacher.topk(2, dim=1).values
    weight = torch.clamp((top2[:, 0] - top2[:, 1]) / scale, max=1.0)  # the teacher's action gap
    per_state = (torch.relu(want - gap_s) * ordered).sum((1, 2)) / ordered.sum((1, 2)).clamp(min=1.0)
    return (weight * per_state).sum() / (weight.sum().clamp(min=1e-6) * scale)


def distill_loss(policy: Policy, student_out: torch.Tensor, teacher_out: torch.Tensor, scale: float,
                 q_loss: str = "margin") -> torch.Tensor:
    """The loss of one minibatch, by the policy's action head:

    - Q-values (DQN, QR-DQN: the mean over quantiles): the teacher's argmax kept with a
      margin (:func:`_margin`), plus the values' squared error over ``scale**2`` (an anchor);
    - logits (A2C / PPO / TRPO / ARS discrete): KL(teacher || student), plus the margin;
    - Gaussian means (``clip`` head): squared error of the clipped actions in units of the
      action range, plus a tenth of the raw means' (a gradient where both are clipped);
    - squashed actors (SAC, TQC, TD3, DDPG: ``unscale``, a tanh output): squared error in
      the squashed space [-1, 1];
    - several categoricals (MultiDiscrete): the KL and margin of each sub-action, summed;
      Bernoulli bits (MultiBinary): the KL of each bit's distribution, averaged."""
    if policy.head == "multi_argmax":
        from quarl.policies.base import action_nvec

        sizes = [int(n) for n in action_nvec(policy.action_space)]
        total = student_out.new_zeros(())
        for s, t in zip(student_out.split(sizes, dim=1), teacher_out.split(sizes, dim=1)):
            kl = nn.functional.kl_div(torch.log_softmax(s, 1), torch.log_softmax(t, 1), log_target=True,
                                      reduction="batchmean")
            total = total + kl + (_margin(s, t, scale) if s.shape[1] > 1 else 0.0)
        return total
    if policy.head == "bernoulli":  # KL(teacher || student) of each bit's Bernoulli
        p_t = torch.sigmoid(teacher_out)
        log_s1, log_s0 = nn.functional.logsigmoid(student_out), nn.functional.logsigmoid(-student_out)
        log_t1, log_t0 = nn.functional.logsigmoid(teacher_out), nn.functional.logsigmoid(-teacher_out)
        return (p_t * (log_t1 - log_s1) + (1 - p_t) * (log_t0 - log_s0)).mean()
    if policy.head in ("argmax", "quantile_argmax"):
        s, t = _q_values(policy, student_out), _q_values(policy, teacher_out)
        margin = _margin(s, t, scale)
        if policy.algo in Q_ALGOS:
            anchor = nn.functional.mse_loss(student_out, teacher_out) / scale**2
            if q_loss == "rank":
                return margin + _ranking(s, t, scale) + anchor
            return margin + anchor
        kl = nn.functional.kl_div(torch.log_softmax(s, 1), torch.log_softmax(t, 1), log_target=True,
                                  reduction="batchmean")
        return kl + margin
    if policy.head == "clip":
        low = torch.as_tensor(policy.action_space.low, dtype=torch.float32)
        high = torch.as_tensor(policy.action_space.high, dtype=torch.float32)
        width = torch.where(torch.isfinite(high - low) & (high > low), high - low, torch.full_like(low, 2.0))
        s_c = torch.maximum(torch.minimum(student_out, high), low)
        t_c = torch.maximum(torch.minimum(teacher_out, high), low)
        return (((s_c - t_c) / width) ** 2).mean() + 0.1 * (((student_out - teacher_out) / width) ** 2).mean()
    return ((student_out - teacher_out) ** 2).mean()


def _loss_scale(policy: Policy, labels: torch.Tensor) -> float:
    """Spread of the teacher's action values (Q-heads), the unit of the margin and anchor."""
    if policy.head not in ("argmax", "quantile_argmax"):
        return 1.0
    q = _q_values(policy, labels)
    spread = float((q.amax(1) - q.amin(1)).mean())
    return spread if spread > 0 else 1.0


# ------------------------------------------------------------------ the run


@dataclass
class RoundStats:
    """What one round did and measured."""

    round: int
    states: int
    """States in the aggregated set after this round."""
    new_states: int
    loss: float
    agreement: float
    """Held-out agreement of the real kernel built from the student with the teacher."""
    played_return: float
    """Mean return of the episodes played this round (the teacher's in round 0)."""
    wall_s: float
    calibration_verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RecoveryResult:
    spec: KernelSpec
    student: nn.Module
    model: bytes
    """The real ONNX Runtime model built from the student's integers."""
    history: list[RoundStats]
    best_round: int
    """The round whose student is written; -1: none beat the untrained student (PTQ itself)."""
    agreement: float
    """Held-out agreement of the written model with the teacher (on the final held-out set)."""
    ptq_agreement: float
    """Held-out agreement of the same mode built from the teacher (PTQ), for comparison."""
    target: float
    seeds: list[int]
    """Every env seed distillation reset an episode with."""
    stopped: str
    """Why the loop ended: ``target`` (agreement and calibration return reached) or ``budget``."""
    labelled_states: int = 0
    updates: int = 0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    heldout: np.ndarray | None = field(default=None, repr=False)
    """The held-out states the agreement was measured on."""


Progress = Callable[[RoundStats], None]


def pick_spec(policy: Policy, env_spec: EnvSpec, config: RecoverConfig) -> tuple[KernelSpec, dict[str, Any] | None]:
    """The kernel the student reproduces: a named mode, or the automatic choice's (what
    ``quarl ptq`` would run), replaced by the block mode where it has no student."""
    from quarl.quant.api import quantize
    from quarl.quant.backends import onnxruntime as ortb
    from quarl.quant.choice import keep_options

    qconfig = config.quant_config()
    chosen: dict[str, Any] | None = None
    if qconfig.mode == "auto":
        calibration = calibration_inputs(policy, env_spec)
        quantized = quantize(policy, qconfig, calibration=calibration, returns=calibration_returns(env_spec))
        chosen = quantized.meta.get("quant") or {}
        label, keep = str(chosen["mode"]), frozenset(int(i) for i in chosen["fp32_layers"])
    else:
        label, keep = qconfig.label, keep_options(policy.network)[0]
    mode_label = student_mode(label)
    if mode_label != label:
        log.warning("%s has no student (its activation ranges are calibrated, not computed): recovering %s instead",
                    label, mode_label)
    mode = get_mode(mode_label)
    reason = mode.unsupported(policy.network)
    if reason is not None:
        mode = get_mode(mode_label.replace("-block", "-weight-only"))
    keep = keep | ortb.conv_layers(policy.network) if not mode.convolutions else keep
    spec = KernelSpec(mode.label, frozenset(keep), qconfig.block_size, qconfig.int8_weights,
                      int8_compute(mode.bits) == "int8")
    return spec, chosen


def _play(policy: Policy, env_spec: EnvSpec, seeds: range, max_steps: int, cap: int) -> tuple[np.ndarray, float]:
    """Preprocessed states of episodes reset with ``seeds`` (every step), and their mean return."""
    for seed in seeds:
        if seed not in DISTILLATION_SEEDS:
            raise QuarlError(f"seed {seed} is outside the distillation seeds {DISTILLATION_SEEDS.start}.."
                             f"{DISTILLATION_SEEDS.stop - 1}")
    result = evaluate(policy, env_spec, episodes=len(seeds), seed=seeds.start, n_envs=min(len(seeds), 32),
                      max_steps=max_steps, keep_observations=cap, keep_every=1)
    states = result.observations if result.observations is not None else np.zeros((0, *policy.input_shape), np.float32)
    return states, result.mean


def _teacher_outputs(policy: Policy, states: np.ndarray) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([policy.network(torch.from_numpy(states[i:i + 4096])).float()
                          for i in range(0, len(states), 4096)]) if len(states) else torch.zeros(0)


def _fp16_agreement(policy: Policy, states: np.ndarray, tolerance: float) -> float:
    from quarl.quant.precisions import get
    from quarl.quant.config import QuantConfig

    half = get("fp16").build(policy, QuantConfig("fp16"), None, None)
    with torch.inference_mode():
        actions = half.postprocess(half.network(torch.from_numpy(states).half()).float().numpy())
    return action_agreement(policy, fp32_actions(policy, states), actions, tolerance)


def _acting(policy: Policy, spec: KernelSpec, model: bytes) -> Policy:
    acting = policy.with_network(copy.deepcopy(policy.network), spec.mode,
                                 OrtEngine(model, per_row=MODES[spec.mode].per_row))
    acting.meta["quant"] = {"mode": spec.mode, "fp32_layers": sorted(spec.keep)}
    return acting


def _agreement(policy: Policy, acting: Policy, states: np.ndarray, reference: np.ndarray, tolerance: float) -> float:
    return action_agreement(policy, reference, acting.act_rows(states), tolerance)


def _state_bytes(policy: Policy) -> int:
    return 4 * int(np.prod(policy.input_shape) or 1)


def distill(policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec | None = None,
            state_path: Path | None = None, progress: Progress | None = None, rounds: int | None = None,
            keep_going: bool = False) -> RecoveryResult:
    """Distil ``policy`` (the teacher, fp32) into a student on ``spec``'s kernel (default:
    :func:`pick_spec`); see the module docstring. With ``state_path`` the run writes its
    state there after every round and continues from it when it exists. ``rounds``: play
    up to this many rounds in all (default ``config.rounds``; a continuation passes more);
    ``keep_going``: do not stop at the target (a continuation after the target was reached
    without keeping fp32's return)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small batches: one thread is faster, two on two cores far slower (measured 2-5x)
    try:
        return _distill(policy, env_spec, config, spec, state_path, progress, rounds or config.rounds, keep_going)
    finally:
        torch.set_num_threads(threads)


def _ptq_model(policy: Policy, spec: KernelSpec) -> bytes:
    """PTQ's own model of ``spec``'s mode: the real kernel built from the teacher's weights
    rounded to the grid, without distillation (the untrained student equals the mode's PTQ
    reference: tested)."""
    return real_model(make_student(policy.network, spec), spec, policy.input_shape)


def _distill(policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec | None,
             state_path: Path | None, progress: Progress | None, rounds: int, keep_going: bool) -> RecoveryResult:
    started = time.perf_counter()
    if spec is None:
        spec, _ = pick_spec(policy, env_spec, config)
    max_states = min(config.max_states, max(10_000, (2 << 30) // _state_bytes(policy)))  # ~2 GiB of states at most
    student = make_student(policy.network, spec)
    optimizer = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=config.lr)
    per_round = config.episodes_per_round
    held_first = DISTILLATION_SEEDS.start + 9_000  # held-out episodes: their own seeds
    history: list[RoundStats] = []
    states = np.zeros((0, *policy.input_shape), np.float32)
    heldout = np.zeros((0, *policy.input_shape), np.float32)
    best: tuple[float, int, dict] | None = None
    updates = 0
    seeds: list[int] = []
    fingerprint = policy.fingerprint()
    target = config.target_agreement
    if state_path is not None and state_path.is_file():
        saved = _load_state(state_path, fingerprint, spec, config)
        try:
            student.load_state_dict(saved["student"])
            optimizer.load_state_dict(saved["optimizer"])
            states, heldout = saved["states"].numpy(), saved["heldout"].numpy()
            history = [RoundStats(**h) for h in saved["history"]]
            best = (float(saved["best_agreement"]), int(saved["best_round"]), saved["best_student"])
            updates, seeds = int(saved["updates"]), [int(s) for s in saved["seeds"]]
            target = float(saved["target"]) if saved["target"] >= 0 else None
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
            raise QuarlError(f"{state_path} is not a complete recovery state ({exc.__class__.__name__}: {exc}): remove "
                             "it to start afresh") from None
        if states.shape[1:] != tuple(policy.input_shape) or heldout.shape[1:] != tuple(policy.input_shape) or \
                not history or best[1] < 0:
            raise QuarlError(f"{state_path} holds states of another shape or no finished round: remove it to start "
                             "afresh")
        started -= sum(h.wall_s for h in history)  # the wall time counts the rounds before the break
        log.info("resuming recovery at round %d from %s", len(history), state_path)
    # the same mode built from the teacher's own weights (PTQ): the start and the yardstick
    ptq = _acting(policy, spec, _ptq_model(policy, spec))
    reference_held = None
    labels: torch.Tensor | None = None  # the teacher's outputs on ``states``, row for row
    ptq_agreement = float("nan")
    stop_at_target = config.stop_at_target and not keep_going
    finished = stop_at_target and bool(history) and history[-1].agreement >= (target or 0.0) and \
        len(heldout) >= MIN_HELDOUT and (
        history[-1].calibration_verdict == "keeps" or not config.closed_loop)
    for r in range(len(history), rounds):
        if finished:
            break
        t0 = time.perf_counter()
        rng = np.random.default_rng([config.seed, r])  # per round: a resumed run draws what an unbroken one draws
        model = real_model(student, spec, policy.input_shape)
        actor = policy if r == 0 else _acting(policy, spec, model)
        train_seeds = range(DISTILLATION_SEEDS.start + r * per_round, DISTILLATION_SEEDS.start + (r + 1) * per_round)
        held_seeds = range(held_first + r, held_first + r + 1)
        cap = max(1, max_states // max(config.rounds, 1))
        new, played = _play(actor, env_spec, train_seeds, config.max_episode_steps, cap)
        held, _ = _play(actor, env_spec, held_seeds, config.max_episode_steps, cap)
        seeds += [*train_seeds, *held_seeds]
        # only the new states are labelled (the teacher is fixed); a resumed run labels its saved ones once
        fresh = _teacher_outputs(policy, new if labels is not None else np.concatenate([states, new]))
        labels = fresh if labels is None else torch.cat([labels, fresh]) if len(fresh) else labels
        states = np.concatenate([states, new])[-max_states:]
        labels = labels[-max_states:]
        heldout = np.concatenate([heldout, held])[-max_states // 4:]
        scale = _loss_scale(policy, labels)
        x_all = torch.from_numpy(states)
        student.eval()  # no train-mode behaviour (batch renorm) leaks in; gradients still flow
        losses = []
        for step in range(config.updates_per_round):
            # cosine from lr to 0 within each round: at a constant rate the latent weights keep hopping across
            # rounding steps and the loss stalls (measured on a SAC HalfCheetah at int4: 0.0025 flat, 0.00055
            # annealed, held-out agreement 21 % -> 39 %); each round's student is evaluated settled
            for group in optimizer.param_groups:
                group["lr"] = config.lr * 0.5 * (1.0 + math.cos(math.pi * step / config.updates_per_round))
            idx = torch.from_numpy(rng.integers(0, len(states), size=min(config.batch_size, len(states))))
            loss = distill_loss(policy, student(x_all[idx]), labels[idx], scale, config.q_loss)
            if not torch.isfinite(loss):
                raise QuarlError(f"the distillation loss became {loss.item()} at round {r}: lower --lr")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        updates += config.updates_per_round
        model = real_model(student, spec, policy.input_shape)
        acting = _acting(policy, spec, model)
        reference_held = fp32_actions(policy, heldout)
        agreement = _agreement(policy, acting, heldout, reference_held, config.action_tolerance)
        if target is None:
            target = min(config.min_agreement, _fp16_agreement(policy, heldout, config.action_tolerance))
        verdict = ""
        if agreement >= target and config.closed_loop and len(heldout) >= MIN_HELDOUT:
            returns = calibration_returns(env_spec)
            outcome = sequential_keeps(lambda n: returns(policy, n), lambda n: returns(acting, n),
                                       env_id=env_spec.env_id)
            verdict = outcome.verdict.label() if not outcome.kept else "keeps"
        stats = RoundStats(r, len(states), len(new), float(np.mean(losses)), agreement, played,
                           time.perf_counter() - t0, verdict)
        history.append(stats)
        if best is None or agreement >= best[0] or verdict == "keeps":  # ties: the later round (more states)
            best = (agreement, r, copy.deepcopy(student.state_dict()))
        finished = stop_at_target and agreement >= target and len(heldout) >= MIN_HELDOUT and (
            verdict == "keeps" or not config.closed_loop)
        if state_path is not None:
            _save_state(state_path, student, optimizer, states, heldout, history, best, updates, seeds, target,
                        fingerprint, spec, config)
        log.info("round %d: %d states, loss %.4g, held-out agreement %.1f%% (target %.1f%%) %s", r, len(states),
                 stats.loss, 100 * agreement, 100 * target, verdict)
        if progress is not None:
            progress(stats)
    assert best is not None
    student.load_state_dict(best[2])
    model = real_model(student, spec, policy.input_shape)
    if reference_held is None:
        reference_held = fp32_actions(policy, heldout)
    best_round, agreement = best[1], best[0]
    if len(heldout):
        ptq_agreement = _agreement(policy, ptq, heldout, reference_held, config.action_tolerance)
        agreement = _agreement(policy, _acting(policy, spec, model), heldout, reference_held, config.action_tolerance)
        if ptq_agreement > agreement:  # distillation made it no better: PTQ's own model is written
            student, model, best_round, agreement = make_student(policy.network, spec), ptq.engine.model, -1, \
                ptq_agreement
    if target is None:
        target = config.target_agreement or config.min_agreement
    return RecoveryResult(spec, student, model, history, best_round, agreement, ptq_agreement, float(target), seeds,
                          "target" if finished else "budget", labelled_states=len(states), updates=updates,
                          wall_s=time.perf_counter() - started, heldout=heldout)


def _save_state(path: Path, student: nn.Module, optimizer: torch.optim.Optimizer, states: np.ndarray,
                heldout: np.ndarray, history: list[RoundStats], best: tuple[float, int, dict] | None, updates: int,
                seeds: list[int], target: float | None, fingerprint: str, spec: KernelSpec,
                config: RecoverConfig) -> None:
    """The run after a round, written whole to a temporary file and renamed (a kill never
    leaves half a state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"format": RECOVERY_FORMAT, "teacher": fingerprint, "spec": spec.to_dict(),
                "config": dataclasses.asdict(config), "student": student.state_dict(),
                "optimizer": optimizer.state_dict(), "states": torch.from_numpy(states),
                "heldout": torch.from_numpy(heldout), "history": [h.to_dict() for h in history],
                "best_agreement": best[0] if best else -1.0, "best_round": best[1] if best else -1,
                "best_student": best[2] if best else {}, "updates": updates, "seeds": seeds,
                "target": -1.0 if target is None else float(target)}, tmp)
    tmp.replace(path)


_Count = Annotated[int, Field(ge=0)]


class RoundRecord(Record):
    """One :class:`RoundStats` as a state or ``recovery.json`` holds it."""

    round: _Count
    states: _Count
    new_states: _Count
    loss: float
    agreement: Annotated[float, Field(ge=0, le=1)]
    played_return: Annotated[float, Field(allow_inf_nan=True)]
    wall_s: Annotated[float, Field(ge=0)]
    calibration_verdict: str = ""


class RecoveryStateRecord(Record):
    """What :func:`_save_state` writes after each round (tensors and plain containers)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    format: Literal[1]
    teacher: str
    spec: dict[str, Any]
    config: dict[str, Any]
    student: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    states: torch.Tensor
    heldout: torch.Tensor
    history: list[RoundRecord]
    best_agreement: float
    best_round: int = Field(ge=-1)
    best_student: dict[str, torch.Tensor]
    updates: _Count
    seeds: list[int]
    target: float


STATE_CAP = 16 << 30
"""Bytes a recovery state may have (its aggregated states are capped at about 2 GiB)."""


def read_state(path: Path) -> dict[str, Any]:
    """A recovery state file, as plain tensors and containers (nothing unpickled): a regular
    file of bounded size holding this format, else one line saying to remove it."""
    from quarl.limits import check_file_size

    if path.is_symlink() or not path.is_file():
        raise QuarlError(f"{path} is not a regular file: remove it to start the recovery afresh")
    check_file_size(path, STATE_CAP, "a recovery state")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise QuarlError(f"{path} cannot be read as a recovery state ({exc.__class__.__name__}): remove it to start "
                         "afresh") from None
    if not isinstance(saved, dict) or saved.get("format") != RECOVERY_FORMAT:
        raise QuarlError(f"{path} is not a quarl recovery state (format {RECOVERY_FORMAT}): remove it to start afresh")
    try:
        parse_record(RecoveryStateRecord, saved, path)
    except QuarlError as exc:
        raise QuarlError(f"{exc}: remove it to start afresh") from None
    return saved


def _load_state(path: Path, fingerprint: str, spec: KernelSpec, config: RecoverConfig) -> dict[str, Any]:
    saved = read_state(path)
    if saved.get("teacher") != fingerprint:
        raise QuarlError(f"{path} belongs to another policy (its teacher's content differs): use another --out")
    if saved.get("spec") != spec.to_dict() or saved.get("config") != dataclasses.asdict(config):
        raise QuarlError(f"{path} was written with other recovery options: rerun with the same options or another "
                         "--out")
    return saved


# ------------------------------------------------------------------ the recovered folder


def sha256_file(path: Path) -> str:
    """SHA-256 of a regular file, read in chunks (a FIFO or device is refused, never waited on)."""
    if not path.is_file():
        raise QuarlError(f"{path} is not a regular file")
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _zoo_paths(checkpoint: Path) -> tuple[Path, Path | None]:
    """(the agent's zip, its RL Zoo config folder or None)."""
    from quarl.policies.sb3 import _zoo_files

    zip_path, config_dir, _ = _zoo_files(checkpoint)
    if zip_path.suffix != ".zip":
        raise QuarlError(f"recover takes a Stable-Baselines3 .zip or an RL Zoo run folder, not {checkpoint}")
    return zip_path, config_dir


def _write_zip(source: Path, target: Path, tensors: dict[str, torch.Tensor]) -> None:
    """``source`` with its ``policy.pth`` tensors replaced by ``tensors`` (and the same
    names under a ``*_target`` network, so DQN / TD3 targets match); every other entry copied."""
    from quarl.limits import open_zip, read_zip_entry

    with open_zip(source, "a Stable-Baselines3 checkpoint") as archive:
        sd = torch.load(io.BytesIO(read_zip_entry(archive, "policy.pth", str(source))), map_location="cpu",
                        weights_only=True)
        for name, value in tensors.items():
            if name not in sd:
                raise QuarlError(f"{source} has no tensor {name!r} to write the recovered weights into")
            head, _, rest = name.partition(".")
            for key in (name, f"{head}_target.{rest}"):
                if key in sd:
                    sd[key] = value.to(sd[key].dtype).reshape(sd[key].shape)
        buffer = io.BytesIO()
        torch.save(sd, buffer)
        tmp = target.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in archive.infolist():
                data = buffer.getvalue() if info.filename == "policy.pth" else read_zip_entry(archive, info.filename,
                                                                                               str(source))
                out.writestr(info, data)
    tmp.replace(target)


def write_recovered(checkpoint: Path, policy: Policy, env_spec: EnvSpec, result: RecoveryResult, out: Path,
                    config: RecoverConfig, chosen: dict[str, Any] | None = None,
                    report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the recovered RL Zoo run folder ``OUT``: ``ENV.zip`` (the student's weights on
    the grid, loadable by SB3 and ``rl_zoo3.enjoy``), ``ENV/`` (the original's zoo files,
    its zip as ``original.zip`` and ``recovery.json``) and ``export/`` (the real-kernel
    model built from the student's integers, with its sidecar). Returns recovery.json."""
    from quarl.deploy import write_artifact
    from quarl.provenance import provenance

    zip_path, config_dir = _zoo_paths(checkpoint)
    # an RL Zoo folder keeps its names; a bare zip's folder is named after its env, as the zoo names ENV.zip
    name = zip_path.stem if config_dir is not None else env_spec.env_id.replace("/", "_")
    out.mkdir(parents=True, exist_ok=True)
    zoo = out / name
    zoo.mkdir(exist_ok=True)
    if config_dir is not None:
        for item in ("config.yml", "args.yml", "env_kwargs.yml", "vecnormalize.pkl"):
            if (config_dir / item).is_file():
                shutil.copyfile(config_dir / item, zoo / item)
    if not (zoo / "args.yml").exists():  # a bare zip: the env it was recovered on, as the zoo writes it
        from quarl.envs import gym_packages

        # the modules that register a custom env, as rl_zoo3 records them: the folder loads on its own
        packages = "".join(f"    - - {name}\n" if i == 0 else f"      - {name}\n" for i, name in enumerate(gym_packages()))
        (zoo / "args.yml").write_text(f"!!python/object/apply:collections.OrderedDict\n- - - algo\n    - {policy.algo}\n"
                                      f"  - - env\n    - {env_spec.env_id}\n"
                                      + (f"  - - gym_packages\n{packages}" if packages else ""))
        (zoo / "config.yml").write_text("!!python/object/apply:collections.OrderedDict\n- []\n")
    shutil.copyfile(zip_path, zoo / ORIGINAL_ZIP)
    _write_zip(zip_path, out / f"{name}.zip", sb3_tensors(policy.network, result.student))
    recovered = policy.with_network(plain_network(result.student, on_grid=True), "fp32",
                                    TorchEngine(plain_network(result.student, on_grid=True)))
    quant = {"mode": result.spec.mode, "fp32_layers": sorted(result.spec.keep), "agreement": result.agreement,
             "block_size": result.spec.block_size, "int8_weights": result.spec.int8_weights,
        "recovered": True}
    precision = f"int{result.spec.bits}"
    sidecar = write_artifact(recovered, precision, out / EXPORT_DIR / "policy", result.model, quant, env_spec)
    record = {
        "format": RECOVERY_FORMAT,
        "precision": precision,
        "kernel": result.spec.to_dict(),
        "original": {"path": str(checkpoint), "zip_sha256": sha256_file(zip_path), "policy_sha256": policy.fingerprint(),
                     "algo": policy.algo},
        "recovered": {"zip_sha256": sha256_file(out / f"{name}.zip"), "onnx_sha256": sidecar["onnx_sha256"],
                      "export": f"{EXPORT_DIR}/policy.onnx"},
        "env": dataclasses.asdict(env_spec),
        "config": dataclasses.asdict(config),
        "automatic_choice": None if chosen is None else {k: v for k, v in chosen.items() if k != "tried"},
        # what was written (the student, or PTQ's own model where no student was shown at least as good) and why the
        # run ended (its verdict against the original fp32 kept, or its budget was spent): recover_stages' report
        **(report or {"shipped": "ptq" if result.best_round < 0 else "student", "stopped": "budget"}),
        "distill_stopped": result.stopped,
        "best_round": result.best_round,
        "target_agreement": result.target,
        "ptq_agreement": result.ptq_agreement,
        "agreement": result.agreement,
        "labelled_states": result.labelled_states,
        "heldout_states": 0 if result.heldout is None else len(result.heldout),
        "updates": result.updates,
        "wall_s": round(result.wall_s, 2),
        "seeds": [min(result.seeds), max(result.seeds)] if result.seeds else [],
        "rounds": [h.to_dict() for h in result.history],
        "provenance": provenance(),
    }
    (zoo / RECOVERY_FILE).write_text(json.dumps(record, indent=1, allow_nan=False, default=_nan_as_null))
    return record


def _nan_as_null(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


# ------------------------------------------------------------------ reading a recovered folder


@dataclass
class Recovered:
    """What ``quarl ptq`` needs of a recovered folder."""

    original: Policy
    """The original fp32 policy (its zip copied at recovery, checked against its hash)."""
    kernel: Policy
    """The recovered policy on its real kernel (the export built from the student's integers)."""
    precision: str
    record: dict[str, Any]


def find_recovery(checkpoint: Path) -> Path | None:
    """``ENV/recovery.json`` of a recovered run folder (or its zip), else None."""
    try:
        zip_path, config_dir = _zoo_paths(checkpoint)
    except QuarlError:
        return None
    candidate = zip_path.parent / zip_path.stem / RECOVERY_FILE
    if candidate.is_file():
        return candidate
    if (candidate.parent / ORIGINAL_ZIP).exists():  # a recovered folder that lost its record: never judge it as fp32
        raise QuarlError(f"{zip_path.parent} holds {candidate.parent.name}/{ORIGINAL_ZIP} but no {RECOVERY_FILE}: a "
                         "recovered folder that lost its record; run quarl recover again")
    return None


class OriginalRecord(Record):
    model_config = ConfigDict(extra="allow")
    zip_sha256: str
    policy_sha256: str | None = None


class RecoveredRecord(Record):
    model_config = ConfigDict(extra="allow")
    zip_sha256: str
    onnx_sha256: str


class RecoveryRecord(Record):
    """The fields of ``recovery.json`` (:func:`write_recovered`) that reading a recovered
    folder and reusing a finished recovery act on; the others are a report, kept as written."""

    model_config = ConfigDict(extra="allow")
    format: Literal[1]
    precision: Literal["int8", "int4"]
    original: OriginalRecord
    recovered: RecoveredRecord
    env: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    rounds: list[RoundRecord] = []


RECORD_CAP = 4 << 20
"""Bytes a recovery.json may have (quarl writes a few kilobytes)."""


def read_recovery_record(path: Path) -> tuple[dict[str, Any], RecoveryRecord]:
    """(the record as written, its :class:`RecoveryRecord`) of ``recovery.json``, or one
    line naming the file (and the field)."""
    from quarl.limits import read_capped

    record = parse_json(read_capped(path, RECORD_CAP, "a recovery record"), path)
    if not isinstance(record, dict) or record.get("format") != RECOVERY_FORMAT:
        raise QuarlError(f"{path} is not a quarl recovery record (format {RECOVERY_FORMAT})")
    original, recovered = record.get("original"), record.get("recovered")
    if not (isinstance(original, dict) and "zip_sha256" in original and isinstance(recovered, dict)
            and "onnx_sha256" in recovered and "zip_sha256" in recovered):
        raise QuarlError(f"{path} lacks the original's or the export's hash")
    if record.get("precision") not in ("int8", "int4"):
        raise QuarlError(f"{path}: precision {record.get('precision')!r} is not int8 or int4")
    return record, parse_record(RecoveryRecord, record, path)


def load_recovered(checkpoint: Path, trust_pickle: bool = False) -> Recovered | None:
    """The original and the recovered kernel of a folder written by :func:`write_recovered`
    (None for any other checkpoint); a file that does not match its recorded hash is refused."""
    from quarl.limits import model_file_cap, read_capped
    from quarl.policies.onnx_artifact import load_artifact
    from quarl.policies.sb3 import load_checkpoint

    path = find_recovery(checkpoint)
    if path is None:
        return None
    record, typed = read_recovery_record(path)
    original_sha, onnx_sha = typed.original.zip_sha256, typed.recovered.onnx_sha256
    recovered_sha, precision = typed.recovered.zip_sha256, typed.precision
    original_zip = path.parent / ORIGINAL_ZIP
    if not original_zip.is_file() or sha256_file(original_zip) != original_sha:
        raise QuarlError(f"{original_zip} is missing or is not the original policy recorded in {path.name}")
    zip_path, _ = _zoo_paths(checkpoint)
    if sha256_file(zip_path) != recovered_sha:
        raise QuarlError(f"{zip_path} is not the recovered policy recorded in {path.name} (its SHA-256 differs): run "
                         "quarl recover again")
    export = zip_path.parent / EXPORT_DIR
    for name in ("policy.onnx", "policy.json"):
        if not (export / name).is_file():
            raise QuarlError(f"{export / name} is missing: the recovered folder is incomplete; run quarl recover again")
    # the original acts as its own folder did: the same zoo files, its own weights
    original = load_checkpoint(checkpoint, trust_pickle=trust_pickle, zip_override=original_zip).policy
    kernel, _ = load_artifact(export)
    digest = hashlib.sha256(read_capped(export / "policy.onnx", model_file_cap(), "an ONNX model")).hexdigest()
    if digest != onnx_sha:
        raise QuarlError(f"{export / 'policy.onnx'} is not the recovered model recorded in {path.name}: run quarl "
                         "recover again")
    kernel.precision = precision
    if "exploration_rate" in original.meta:  # a stochastic DQN explores as its original does
        kernel.meta["exploration_rate"] = original.meta["exploration_rate"]
    return Recovered(original, kernel, precision, record)


# ------------------------------------------------------------------ what is written, and when recovery stops


class TestEpisodes:
    """Per-episode returns on recovery's calibration episodes (:data:`TEST_SEEDS`, episode
    ``i`` reset with seed ``28,000 + i``), played on demand and kept per policy, so the
    original fp32 policy and PTQ's model play each episode once for the whole run."""

    def __init__(self, env_spec: EnvSpec, max_steps: int | None = None) -> None:
        from quarl.measure import CALIBRATION_EPISODE_STEPS

        self.env_spec = env_spec
        self.max_steps = min(max_steps or CALIBRATION_EPISODE_STEPS, CALIBRATION_EPISODE_STEPS)
        self._played: dict[int, tuple[Policy, list[float], list[int]]] = {}

    def __call__(self, policy: Policy, n: int) -> np.ndarray:
        if n > len(TEST_SEEDS):
            raise QuarlError(f"{n} test episodes are more than recovery's {len(TEST_SEEDS)} test seeds")
        _, returns, lengths = self._played.setdefault(id(policy), (policy, [], []))
        if len(returns) < n:
            more = n - len(returns)
            result = evaluate(policy, self.env_spec, episodes=more, seed=TEST_SEEDS.start + len(returns),
                              n_envs=min(more, 32), max_steps=self.max_steps)
            returns.extend(result.returns.tolist())
            lengths.extend(result.lengths.tolist())
        return np.asarray(returns[:n], np.float64)

    def cap(self, policy: Policy) -> int:
        """Episodes a test against ``policy`` may play: :data:`TEST_STEPS` over its mean
        episode length in the first look, within :data:`TEST_CAPS`."""
        self(policy, TEST_FIRST)
        lengths = self._played[id(policy)][2][:TEST_FIRST]
        low, high = TEST_CAPS
        return int(np.clip(TEST_STEPS // max(float(np.mean(lengths)), 1.0), low, min(high, len(TEST_SEEDS))))


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _outcome(outcome: Sequential, episodes: TestEpisodes, a: Policy, b: Policy, tolerance: float) -> dict[str, Any]:
    """A sequential test as recovery.json records it (E and its interval in percent; the
    two means over the episodes it played)."""
    v, n = outcome.verdict, outcome.episodes
    label = v.label()
    if outcome.kept and v.verdict != "keeps":
        label = "tied (the same return on every episode)"
    elif tolerance == 0:  # the label's own wording is about the 5 % tolerance
        label = label.replace("(E near 5 %)", "(E near 0)")
    return {"kept": bool(outcome.kept), "verdict": label, "e": _finite(v.e), "low": _finite(v.low),
            "high": _finite(v.high), "episodes": n, "seeds": [TEST_SEEDS.start, TEST_SEEDS.start + n - 1],
            "means": [float(np.mean(episodes(a, n))), float(np.mean(episodes(b, n)))]}


@dataclass
class Candidate:
    """A student one stage of the run made (its weights, its real model) and what the
    paired tests said of it."""

    stage: str
    result: RecoveryResult
    acting: Policy
    against_ptq: dict[str, Any]


class Judge:
    """The paired sequential tests on :class:`TestEpisodes` that decide what recovery
    writes and when it stops (:func:`quarl.verdict.sequential_at_least`,
    :func:`quarl.verdict.sequential_keeps`):

    - a student is a candidate only where it plays at least as well as PTQ's own model of
      the mode (the confidence sequence shows it scoring more, or both play the same
      returns): a repair never ships what it could not show is no worse than PTQ;
    - of the candidates, the one with the highest mean return on the episodes both played
      is written; else PTQ's own model;
    - recovery stops where what it would write keeps the ORIGINAL fp32 policy's return
      (strict: undecided at the cap is not kept)."""

    def __init__(self, policy: Policy, env_spec: EnvSpec, spec: KernelSpec, max_steps: int | None = None) -> None:
        self.policy, self.env_spec, self.spec = policy, env_spec, spec
        self.episodes = TestEpisodes(env_spec, max_steps)
        self.ptq_model = _ptq_model(policy, spec)
        self.ptq = _acting(policy, spec, self.ptq_model)
        self.candidates: list[Candidate] = []
        self._keeps: dict[int, dict[str, Any]] = {}

    def offer(self, stage: str, result: RecoveryResult) -> dict[str, Any]:
        """Test ``result``'s student against PTQ's model; a candidate where it is at least
        as good. Returns the test's record (``same`` where the student is PTQ's model)."""
        if result.model == self.ptq_model or result.best_round < 0:
            return {"kept": False, "verdict": "the student is PTQ's own model", "same": True}
        acting = _acting(self.policy, self.spec, result.model)
        cap = self.episodes.cap(self.ptq)
        outcome = sequential_at_least(lambda n: self.episodes(self.ptq, n), lambda n: self.episodes(acting, n),
                                      first=TEST_FIRST, cap=cap, env_id=self.env_spec.env_id)
        record = _outcome(outcome, self.episodes, self.ptq, acting, 0.0)
        if outcome.kept:
            self.candidates.append(Candidate(stage, result, acting, record))
        log.info("%s against PTQ's own model on %d test episodes: %s (E %s, means %.2f / %.2f): %s", stage,
                 outcome.episodes, outcome.verdict.label(), record["e"], *record["means"],
                 "a candidate" if outcome.kept else "not shown at least as good, not written")
        return record

    def best(self) -> Candidate | None:
        """The candidate written: the highest mean on the episodes every candidate played."""
        if not self.candidates:
            return None
        n = min(c.against_ptq["episodes"] for c in self.candidates)
        return max(reversed(self.candidates), key=lambda c: float(np.mean(self.episodes(c.acting, n))))

    def keeps(self) -> dict[str, Any]:
        """Does what would be written keep the original fp32 policy's return (strict)?"""
        chosen = self.best()
        acting = self.ptq if chosen is None else chosen.acting
        if id(acting) not in self._keeps:
            cap = self.episodes.cap(self.policy)
            outcome = sequential_keeps(lambda n: self.episodes(self.policy, n), lambda n: self.episodes(acting, n),
                                       first=TEST_FIRST, cap=cap, env_id=self.env_spec.env_id, strict=True)
            self._keeps[id(acting)] = _outcome(outcome, self.episodes, self.policy, acting, TOLERANCE)
        return self._keeps[id(acting)]


def _test_text(test: dict[str, Any]) -> str:
    if "means" not in test:
        return str(test.get("verdict", ""))
    e = "" if test.get("e") is None else f", E {test['e']:.1f} %"
    interval = "" if test.get("low") is None or test.get("high") is None else \
        f" [{test['low']:.1f}, {test['high']:.1f}]"
    return (f"{test['verdict']}{e}{interval}, means {test['means'][0]:.2f} / {test['means'][1]:.2f} over "
            f"{test['episodes']} test episodes")


def shipped_line(record: dict[str, Any]) -> str:
    """What recovery.json says was written and why the run ended, in one line."""
    mode = record.get("kernel", {}).get("mode", f"int{record.get('precision', '')}")
    if "shipped" not in record or "against_fp32" not in record:
        return f"wrote {'PTQ' if record.get('shipped') == 'ptq' else 'the student'} ({mode})"
    if record["shipped"] == "ptq":
        tried = [f"{s['stage']}: {_test_text(s['against_ptq'])}" for s in record.get("stages", [])
                 if not s["against_ptq"].get("same")]
        what = (f"wrote PTQ's own {mode} model, not a student: no student was shown to play at least as well on "
                f"recovery's test episodes ({'; '.join(tried) or 'distillation did not beat PTQ on held-out states'})")
    else:
        stage = str(record["shipped_stage"])
        name = {"distill": "distilled", "finetune": "fine-tuned"}.get(stage, f"distilled ({stage})")
        what = (f"wrote the {name} student: it plays at least as well as PTQ's own {mode} model on "
                f"recovery's test episodes (PTQ / student {_test_text(record['against_ptq'])})")
    budget = record.get("budget", {})
    tuned = record.get("finetune", {})
    spent = f"{budget.get('rounds_played', '?')} of {budget.get('rounds', '?')} rounds"
    if tuned:
        spent += ", fine-tune " + (f"{tuned['steps']:,} steps" if "skipped" not in tuned else f"skipped: {tuned['skipped']}")
    stopped = "kept" if record["stopped"] == "kept" else f"budget spent ({spent}, {record.get('total_s', 0):.0f} s)"
    return (f"{what}; stopped: {stopped}: against the original fp32 (fp32 / written) "
            f"{_test_text(record['against_fp32'])}")


# ------------------------------------------------------------------ the workflow


def run_recover(checkpoint: Path, env_spec: EnvSpec, policy: Policy, config: RecoverConfig, out: Path,
                settings: Any = None, progress: Progress | None = None,
                episode_progress: Callable[[str, int], None] | None = None,
                trust_pickle: bool = False, wait: bool = False, decide_episodes: int = 0,
                decide_seconds: float | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``quarl recover``: distil ``policy`` (loaded from ``checkpoint``) onto its kernel,
    write the recovered folder ``OUT`` (resuming from ``OUT/.recover/state.pt``), then,
    given ``settings`` (:class:`quarl.measure.EvalSettings`), judge it as ``quarl ptq OUT``
    does: the original fp32 policy against the recovered kernel on the evaluation seeds
    (``OUT/verdict/``), playing on while undecided up to ``decide_episodes`` /
    ``decide_seconds`` (:func:`quarl.ptq.decide`). A finished recovery of the same policy and options in ``OUT`` is
    reused as it is; ``wait``: wait for another run holding ``OUT`` instead of refusing.
    Returns (recovery.json, the verdict's records)."""
    from quarl.measure import output_lock
    from quarl.ptq import run_ptq

    preflight(checkpoint, out)
    with output_lock(out, wait=wait):
        record = finished_record(out, policy, config, env_spec)
        if record is None:
            spec, chosen = pick_spec(policy, env_spec, config)
            result, report = recover_stages(_zoo_paths(checkpoint)[0], policy, env_spec, config, spec,
                                            out / ".recover" / STATE_FILE, progress)
            record = write_recovered(checkpoint, policy, env_spec, result, out, config, chosen, report)
        else:
            log.info("%s holds this recovery, finished: reused", out)
    records: list[dict[str, Any]] = []
    if settings is not None:
        recovered = load_recovered(out, trust_pickle=trust_pickle)
        assert recovered is not None
        records = run_ptq(recovered.original, env_spec, [recovered.precision], settings, out / "verdict",
                          progress=episode_progress, source=str(out),
                          fixed={"fp32": recovered.original, recovered.precision: recovered.kernel},
                          decide_episodes=decide_episodes, decide_seconds=decide_seconds)
    return record, records


def preflight(checkpoint: Path, out: Path) -> None:
    """Refuse, before any work, what recovery would refuse later: a checkpoint that is not
    a zip or zoo folder, a recovered folder as the policy, an unreadable state in ``out``."""
    _zoo_paths(checkpoint)
    if find_recovery(checkpoint) is not None:
        raise QuarlError(f"{checkpoint} is itself a recovered folder: recover its original policy (ENV/{ORIGINAL_ZIP}"
                         " records it)")
    state = out / ".recover" / STATE_FILE
    if state.exists() or state.is_symlink():
        read_state(state)


def finished_record(out: Path, policy: Policy, config: RecoverConfig, env_spec: EnvSpec) -> dict[str, Any] | None:
    """``OUT``'s recovery.json where it records a finished recovery of this very policy
    (content hash), env and options whose files are all intact, else None."""
    for path in sorted(out.glob(f"*/{RECOVERY_FILE}")):
        try:
            recovered = load_recovered(path.parent.parent / f"{path.parent.name}.zip")
        except QuarlError:
            return None
        if recovered is None:
            return None
        record = recovered.record
        same = (record.get("original", {}).get("policy_sha256") == policy.fingerprint()
                and record.get("config") == json.loads(json.dumps(dataclasses.asdict(config)))
                and record.get("env") == json.loads(json.dumps(dataclasses.asdict(env_spec))))
        return record if same else None
    return None


RECOVERED_PREFIX = "rec-"
"""A study precision ``rec-int4`` is ``quarl recover --precision int4`` then its real kernel."""


def recovered_precision(label: str) -> str | None:
    """``int4`` for ``rec-int4`` (checked as ``--precision`` is), None for other labels."""
    if not label.lower().startswith(RECOVERED_PREFIX):
        return None
    precision = label.lower().removeprefix(RECOVERED_PREFIX)
    RecoverConfig(precision=precision)  # one line for a bad one
    return precision


def recovered_kernel(checkpoint: Path, policy: Policy, env_spec: EnvSpec, precision: str, out: Path,
                     trust_pickle: bool = False, **options: Any) -> Policy:
    """The real kernel of ``policy`` recovered at ``precision`` into ``out`` (recovered
    there once, reused by every later call; concurrent calls wait for the first)."""
    config = RecoverConfig(precision=precision, **options)
    run_recover(checkpoint, env_spec, policy, config, out, trust_pickle=trust_pickle, wait=True)
    recovered = load_recovered(out, trust_pickle=trust_pickle)
    assert recovered is not None
    recovered.kernel.precision = f"{RECOVERED_PREFIX}{precision}"
    return recovered.kernel


def recover_stages(zip_path: Path, policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec,
                   state_path: Path | None = None, progress: Progress | None = None
                   ) -> tuple[RecoveryResult, dict[str, Any]]:
    """Distil, then go on until what would be written keeps the ORIGINAL fp32 policy's
    return on recovery's test episodes or the budget is spent: ``config.rounds`` more DAgger
    rounds at a time up to ``config.total_rounds``, then ``config.finetune_steps`` of the
    agent's own algorithm (:func:`finetune_stage`), no stage starting after
    ``config.budget_minutes``. Each stage's student is written only where it plays at least
    as well as PTQ's own model (:class:`Judge`); else PTQ's model is. Returns (the result
    written, the report recovery.json records: ``shipped``, ``stopped``, the tests)."""
    if state_path is None:  # each stage continues the one before from its state: kept in a temporary folder
        import tempfile

        with tempfile.TemporaryDirectory(prefix="quarl-recover-") as tmp:
            return recover_stages(zip_path, policy, env_spec, config, spec, Path(tmp) / STATE_FILE, progress)
    started = time.perf_counter()
    deadline = started + 60.0 * config.budget_minutes
    judge = Judge(policy, env_spec, spec)
    stages: list[dict[str, Any]] = []

    def stage(name: str, result: RecoveryResult, extra: dict[str, Any] | None = None) -> bool:
        against_ptq = judge.offer(name, result)
        keeps = judge.keeps()
        stages.append({"stage": name, "rounds": len(result.history), "agreement": result.agreement,
                       "against_ptq": against_ptq, "written": "ptq" if judge.best() is None else judge.best().stage,
                       "against_fp32": keeps, "wall_s": round(time.perf_counter() - started, 2), **(extra or {})})
        return bool(keeps["kept"])

    limit = config.rounds
    result = distill(policy, env_spec, config, spec, state_path, progress, rounds=limit)
    kept = stage("distill", result)
    last = result
    while not kept and limit < config.total_rounds and time.perf_counter() < deadline:
        limit = min(limit + config.rounds, config.total_rounds)
        last = distill(policy, env_spec, config, spec, state_path, progress, rounds=limit, keep_going=True)
        kept = stage(f"rounds {limit}", last)
    finetune_note: dict[str, Any] | None = None
    if not kept and config.finetune_steps and time.perf_counter() < deadline:
        start = judge.best().result if judge.best() is not None else last
        try:
            tuned = finetune_stage(zip_path, policy, env_spec, config, start)
        except QuarlError as exc:  # an algorithm quarl does not train, reward statistics it cannot read...
            finetune_note = {"steps": config.finetune_steps, "skipped": str(exc)}
            log.warning("no fine-tune: %s", exc)
        else:
            kept = stage("finetune", tuned, {"steps": config.finetune_steps})
            finetune_note = {"steps": config.finetune_steps, "wall_s": tuned.extra.get("finetune_s"),
                             "from": "ptq" if start.best_round < 0 else "distilled"}
    best = judge.best()
    if best is not None:
        written = best.result
    else:  # PTQ's own model: the real kernel ptq runs for this mode, no distillation
        written = dataclasses.replace(last, student=make_student(policy.network, spec), model=judge.ptq_model,
                                      best_round=-1, agreement=last.ptq_agreement)
    written = dataclasses.replace(written, wall_s=last.wall_s)
    report = {
        "shipped": "ptq" if best is None else "student",
        "shipped_stage": None if best is None else best.stage,
        "stopped": "kept" if kept else "budget",
        "against_ptq": {"verdict": "no student was shown at least as good"} if best is None else best.against_ptq,
        "against_fp32": judge.keeps(),
        "stages": stages,
        "budget": {"rounds": config.total_rounds, "rounds_played": len(last.history),
                   "finetune_steps": config.finetune_steps, "minutes": config.budget_minutes},
        "total_s": round(time.perf_counter() - started, 2),
        **({"finetune": finetune_note} if finetune_note else {}),
    }
    log.info("recovery wrote %s (%s); %s against the original fp32 on %d test episodes: %s",
             report["shipped"], report["shipped_stage"] or "PTQ's own model", report["stopped"],
             report["against_fp32"]["episodes"], report["against_fp32"]["verdict"])
    return written, report


def finetune_stage(zip_path: Path, policy: Policy, env_spec: EnvSpec, config: RecoverConfig,
                   result: RecoveryResult) -> RecoveryResult:
    """The student of ``result`` fine-tuned ``config.finetune_steps`` env steps with the
    agent's own algorithm, fake quantization on (:func:`quarl.training.finetune.finetune`),
    as a result of its own (its agreement on ``result``'s held-out states); whether it is
    written is the :class:`Judge`'s call."""
    from quarl.training.finetune import finetune

    started = time.perf_counter()
    start = None if result.best_round < 0 else result.student
    tuned = finetune(zip_path, policy, env_spec, result.spec, start, config.finetune_steps, config.seed)
    model = real_model(tuned, result.spec, policy.input_shape)
    agreement = result.agreement
    if result.heldout is not None and len(result.heldout):
        agreement = _agreement(policy, _acting(policy, result.spec, model), result.heldout,
                               fp32_actions(policy, result.heldout), config.action_tolerance)
    took = time.perf_counter() - started
    log.info("fine-tuned %d steps in %.0f s: held-out agreement %.1f%%", config.finetune_steps, took, 100 * agreement)
    return dataclasses.replace(result, student=tuned, model=model, agreement=agreement, best_round=len(result.history),
                               extra={**result.extra, "finetune_s": round(took, 2)})
