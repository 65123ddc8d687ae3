"""The DAgger rounds: the teacher plays, the student (its real kernel) plays, every state is
labelled and trained on, held-out states judge each round; the state written after every
round and read again on resume."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_record
from quarl.envs import EnvSpec
from quarl.evaluation.calibration import DISTILLATION_SEEDS, calibration_inputs, calibration_returns
from quarl.evaluation.episodes import evaluate
from quarl.policies.base import Policy
from quarl.quant.backends.onnxruntime import OrtEngine
from quarl.quant.modes import MODES, get_mode, int8_compute
from quarl.quant.student import KernelSpec, make_student, real_model, student_mode
from quarl.quant.summary import QuantSummary
from quarl.quantization.candidates import action_agreement, fp32_actions
from quarl.recovery.config import MIN_HELDOUT, RECOVERY_FORMAT, RecoverConfig
from quarl.recovery.losses import distill_loss, loss_scale
from quarl.recovery.report import RecoveryState, RoundStats, StateFile
from quarl.verdict import sequential_keeps

log = logging.getLogger(__name__)


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
    stopped: Literal["target", "budget"]
    """Why the loop ended: ``target`` (agreement and calibration return reached) or ``budget``."""
    labelled_states: int = 0
    updates: int = 0
    wall_s: float = 0.0
    finetune_s: float | None = None
    """The fine-tune's seconds, where this result is a fine-tuned student
    (:func:`quarl.recovery.workflow.finetune_stage`)."""
    heldout: np.ndarray | None = field(default=None, repr=False)
    """The held-out states the agreement was measured on."""


Progress = Callable[[RoundStats], None]


def pick_spec(policy: Policy, env_spec: EnvSpec, config: RecoverConfig) -> tuple[KernelSpec, QuantSummary | None]:
    """The kernel the student reproduces: a named mode, or the automatic choice's (what
    ``quarl ptq`` would run), replaced by the mode whose student stands in where it has none
    (:func:`quarl.quant.modes.student_mode_for`), and by its fallback where this CPU cannot run it."""
    from quarl.quant.backends import onnxruntime as ortb
    from quarl.quantization.api import quantize
    from quarl.quantization.choice import keep_options

    qconfig = config.quant_config()
    chosen: QuantSummary | None = None
    if qconfig.mode == "auto":
        calibration = calibration_inputs(policy, env_spec)
        quantized = quantize(policy, qconfig, calibration=calibration, returns=calibration_returns(env_spec))
        quant: QuantSummary = quantized.meta["quant"]  # what the choice ran (quantization.precisions.quantize_int)
        label, keep, chosen = str(quant["mode"]), frozenset(int(i) for i in quant["fp32_layers"]), quant
    else:
        label, keep = qconfig.label, keep_options(policy.network)[0]
    mode_label = student_mode(label)
    if mode_label != label:
        log.warning("%s has no student (its activation ranges are calibrated, not computed): recovering %s instead",
                    label, mode_label)
    mode = get_mode(mode_label).runnable(policy.network)  # its fallback where this CPU cannot run it
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
    from quarl.quantization.config import QuantConfig
    from quarl.quantization.precisions import get

    half = get("fp16").build(policy, QuantConfig("fp16"), None, None)
    with torch.inference_mode():
        actions = half.postprocess(half.network(torch.from_numpy(states).half()).float().numpy())
    return action_agreement(policy, fp32_actions(policy, states), actions, tolerance)


def kernel_policy(policy: Policy, spec: KernelSpec, model: bytes) -> Policy:
    """``policy`` acting with ``model``, a real ONNX Runtime model of ``spec``'s mode (a
    student's, or PTQ's own: :func:`ptq_model`), its ``quant`` naming the mode and its fp32
    layers: what plays distillation's rounds and recovery's tests."""
    meta = policy.meta.copy()
    meta["quant"] = {"mode": spec.mode, "fp32_layers": sorted(spec.keep)}
    return dataclasses.replace(policy, network=copy.deepcopy(policy.network), precision=spec.mode,
                               engine=OrtEngine(model, per_row=MODES[spec.mode].per_row), meta=meta)


def agreement_on(policy: Policy, acting: Policy, states: np.ndarray, reference: np.ndarray, tolerance: float) -> float:
    """The share of ``states`` on which ``acting`` (:func:`kernel_policy`) takes ``reference``'s
    actions (the teacher's, :func:`quarl.quantization.candidates.fp32_actions`), continuous actions
    within ``tolerance`` of their range (:func:`quarl.quantization.candidates.action_agreement`)."""
    return action_agreement(policy, reference, acting.act_rows(states), tolerance)


def _state_bytes(policy: Policy) -> int:
    return 4 * int(np.prod(policy.input_shape) or 1)


def _max_states(policy: Policy, config: RecoverConfig) -> int:
    """States a distillation of ``policy`` keeps: ``config.max_states``, ~2 GiB at most."""
    return min(config.max_states, max(10_000, (2 << 30) // _state_bytes(policy)))


def state_cap(policy: Policy, config: RecoverConfig) -> int:
    """Bytes the recovery state of ``policy`` under ``config`` may inflate to: its states and
    held-out states (``_max_states`` rows each), the student's tensors four times over (the
    student, the best one, Adam's two moments; twice the teacher's values for the student's
    scales) and room for the rest. torch.save stores records unpacked: a real state is
    about its size on disk."""
    from quarl.core.limits import ENTRY_FLOOR

    values = sum(int(t.numel()) for t in policy.network.state_dict().values())
    return 2 * _max_states(policy, config) * _state_bytes(policy) + 4 * 4 * 2 * values + ENTRY_FLOOR


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


def ptq_model(policy: Policy, spec: KernelSpec) -> bytes:
    """PTQ's own model of ``spec``'s mode: the real kernel built from the teacher's weights
    rounded to the grid, without distillation (the untrained student equals the mode's PTQ
    reference: tested)."""
    return real_model(make_student(policy.network, spec), spec, policy.input_shape)


@dataclass
class _Run:
    """What a distillation carries from round to round (and :func:`_save_state` writes)."""

    student: nn.Module
    optimizer: torch.optim.Optimizer
    states: np.ndarray
    """The aggregated states, at most ``max_states``."""
    heldout: np.ndarray
    target: float | None
    """The held-out agreement to reach; None until the first round measures fp16's."""
    history: list[RoundStats] = field(default_factory=list)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    """(held-out agreement, round, the student's weights) of the round written."""
    updates: int = 0
    seeds: list[int] = field(default_factory=list)
    labels: torch.Tensor | None = None
    """The teacher's outputs on ``states``, row for row (None until the first round labels them)."""
    reference_held: np.ndarray | None = None
    """The teacher's actions on ``heldout`` as the last round measured them."""


def _distill(policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec | None,
             state_path: Path | None, progress: Progress | None, rounds: int, keep_going: bool) -> RecoveryResult:
    started = time.perf_counter()
    if spec is None:
        spec, _ = pick_spec(policy, env_spec, config)
    max_states = _max_states(policy, config)
    student = make_student(policy.network, spec)
    run = _Run(student, torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=config.lr),
               np.zeros((0, *policy.input_shape), np.float32), np.zeros((0, *policy.input_shape), np.float32),
               config.target_agreement)
    fingerprint = policy.fingerprint()
    if state_path is not None and state_path.is_file():
        _resume(run, state_path, policy, spec, config, fingerprint, max_states)
        started -= sum(h.wall_s for h in run.history)  # the wall time counts the rounds before the break
        log.info("resuming recovery at round %d from %s", len(run.history), state_path)
    # the same mode built from the teacher's own weights (PTQ): the start and the yardstick
    ptq = kernel_policy(policy, spec, ptq_model(policy, spec))
    stop_at_target = config.stop_at_target and not keep_going
    finished = stop_at_target and bool(run.history) and _at_target(run.history[-1], run.target, len(run.heldout),
                                                                   config)
    for r in range(len(run.history), rounds):
        if finished:
            break
        stats = _round(run, r, policy, env_spec, config, spec, max_states)
        target = run.target
        assert target is not None  # the round measured it
        finished = stop_at_target and _at_target(stats, target, len(run.heldout), config)
        if state_path is not None:
            _save_state(state_path, run.student, run.optimizer, run.states, run.heldout, run.history, run.best,
                        run.updates, run.seeds, target, fingerprint, spec, config)
        log.info("round %d: %d states, loss %.4g, held-out agreement %.1f%% (target %.1f%%) %s", r, len(run.states),
                 stats.loss, 100 * stats.agreement, 100 * target, stats.calibration_verdict)
        if progress is not None:
            progress(stats)
    return _result(run, policy, spec, config, ptq, finished, started)


def _at_target(stats: RoundStats, target: float | None, heldout: int, config: RecoverConfig) -> bool:
    """Has a round reached the target: the held-out agreement, enough held-out states, and
    (closed loop) the teacher's return kept on calibration episodes?"""
    return stats.agreement >= (target or 0.0) and heldout >= MIN_HELDOUT and (stats.kept or not config.closed_loop)


def _resume(run: _Run, state_path: Path, policy: Policy, spec: KernelSpec, config: RecoverConfig, fingerprint: str,
            max_states: int) -> None:
    """``run`` as the state at ``state_path`` left it, every claim checked before any of it is used."""
    saved = _load_state(state_path, fingerprint, spec, config, state_cap(policy, config))
    from quarl.recovery.resume import check_resume

    check_resume(state_path, saved, policy, run.student, run.optimizer, config, max_states)  # before any of it is used
    try:
        run.student.load_state_dict(saved["student"])
        run.optimizer.load_state_dict(dict(saved["optimizer"]))
        run.states, run.heldout = saved["states"].numpy(), saved["heldout"].numpy()
        run.history = list(saved["history"])  # read back as rounds (read_state checked each one)
        run.best = (float(saved["best_agreement"]), int(saved["best_round"]), saved["best_student"])
        run.updates, run.seeds = int(saved["updates"]), [int(s) for s in saved["seeds"]]
        run.target = float(saved["target"]) if saved["target"] >= 0 else None
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise QuarlError(f"{state_path} is not a complete recovery state ({exc.__class__.__name__}: {exc}): remove "
                         "it to start afresh") from None
    if run.states.shape[1:] != tuple(policy.input_shape) or run.heldout.shape[1:] != tuple(policy.input_shape) or \
            not run.history or run.best[1] < 0:
        raise QuarlError(f"{state_path} holds states of another shape or no finished round: remove it to start "
                         "afresh")


def _round(run: _Run, r: int, policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec,
           max_states: int) -> RoundStats:
    """Round ``r``: play and label (:func:`_gather`), train (:func:`_train`), then measure
    the real kernel built from the student on the held-out states (and, at the target, on
    calibration episodes); the round is recorded in ``run``."""
    t0 = time.perf_counter()
    rng = np.random.default_rng([config.seed, r])  # per round: a resumed run draws what an unbroken one draws
    new, played = _gather(run, r, policy, env_spec, config, spec, max_states)
    losses = _train(run, r, policy, config, rng)
    run.updates += config.updates_per_round
    model = real_model(run.student, spec, policy.input_shape)
    acting = kernel_policy(policy, spec, model)
    run.reference_held = fp32_actions(policy, run.heldout)
    agreement = agreement_on(policy, acting, run.heldout, run.reference_held, config.action_tolerance)
    if run.target is None:
        run.target = min(config.min_agreement, _fp16_agreement(policy, run.heldout, config.action_tolerance))
    verdict, kept = "", None
    if agreement >= run.target and config.closed_loop and len(run.heldout) >= MIN_HELDOUT:
        returns = calibration_returns(env_spec)
        outcome = sequential_keeps(lambda n: returns(policy, n), lambda n: returns(acting, n),
                                   env_id=env_spec.env_id)
        verdict, kept = outcome.label(), outcome.kept  # label: "keeps" only where the verdict decided
    stats = RoundStats(round=r, states=len(run.states), new_states=new, loss=float(np.mean(losses)),
                       agreement=agreement, played_return=played, wall_s=time.perf_counter() - t0,
                       calibration_verdict=verdict, calibration_kept=kept)
    run.history.append(stats)
    if run.best is None or agreement >= run.best[0] or stats.kept:  # ties: the later round (more states)
        run.best = (agreement, r, copy.deepcopy(run.student.state_dict()))
    return stats


def _gather(run: _Run, r: int, policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec,
            max_states: int) -> tuple[int, float]:
    """Round ``r``'s episodes: the teacher (round 0) or the student's real kernel plays its
    training and held-out seeds; the new states are labelled by the teacher and aggregated.
    Returns (the new states, the mean return played)."""
    per_round = config.episodes_per_round
    held_first = DISTILLATION_SEEDS.start + 9_000  # held-out episodes: their own seeds
    model = real_model(run.student, spec, policy.input_shape)
    actor = policy if r == 0 else kernel_policy(policy, spec, model)
    train_seeds = range(DISTILLATION_SEEDS.start + r * per_round, DISTILLATION_SEEDS.start + (r + 1) * per_round)
    held_seeds = range(held_first + r, held_first + r + 1)
    cap = max(1, max_states // max(config.rounds, 1))
    new, played = _play(actor, env_spec, train_seeds, config.max_episode_steps, cap)
    held, _ = _play(actor, env_spec, held_seeds, config.max_episode_steps, cap)
    run.seeds += [*train_seeds, *held_seeds]
    # only the new states are labelled (the teacher is fixed); a resumed run labels its saved ones once
    labels = run.labels
    fresh = _teacher_outputs(policy, new if labels is not None else np.concatenate([run.states, new]))
    labels = fresh if labels is None else torch.cat([labels, fresh]) if len(fresh) else labels
    run.states = np.concatenate([run.states, new])[-max_states:]
    run.labels = labels[-max_states:]
    run.heldout = np.concatenate([run.heldout, held])[-max_states // 4:]
    return len(new), played


def _train(run: _Run, r: int, policy: Policy, config: RecoverConfig, rng: np.random.Generator) -> list[float]:
    """One round's Adam updates on minibatches of every state; returns their losses."""
    labels = run.labels
    assert labels is not None  # _gather labelled the states
    states, student, optimizer = run.states, run.student, run.optimizer
    scale = loss_scale(policy, labels)
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
    return losses


def _result(run: _Run, policy: Policy, spec: KernelSpec, config: RecoverConfig, ptq: Policy, finished: bool,
            started: float) -> RecoveryResult:
    """The best round's student and its real model, or PTQ's own model where distillation
    made it no better on the held-out states."""
    assert run.best is not None
    student = run.student
    student.load_state_dict(run.best[2])
    model = real_model(student, spec, policy.input_shape)
    reference_held = run.reference_held if run.reference_held is not None else fp32_actions(policy, run.heldout)
    best_round, agreement = run.best[1], run.best[0]
    ptq_agreement = float("nan")
    if len(run.heldout):
        ptq_agreement = agreement_on(policy, ptq, run.heldout, reference_held, config.action_tolerance)
        agreement = agreement_on(policy, kernel_policy(policy, spec, model), run.heldout, reference_held,
                               config.action_tolerance)
        if ptq_agreement > agreement:  # distillation made it no better: PTQ's own model is written
            engine = ptq.engine
            assert isinstance(engine, OrtEngine)  # kernel_policy builds PTQ's model on ONNX Runtime
            student, model, best_round, agreement = make_student(policy.network, spec), engine.model, -1, \
                ptq_agreement
    target = run.target if run.target is not None else config.target_agreement or config.min_agreement
    return RecoveryResult(spec, student, model, run.history, best_round, agreement, ptq_agreement, float(target),
                          run.seeds, "target" if finished else "budget", labelled_states=len(run.states),
                          updates=run.updates, wall_s=time.perf_counter() - started, heldout=run.heldout)


def _save_state(path: Path, student: nn.Module, optimizer: torch.optim.Optimizer, states: np.ndarray,
                heldout: np.ndarray, history: list[RoundStats], best: tuple[float, int, dict[str, torch.Tensor]] | None,
                updates: int, seeds: list[int], target: float | None, fingerprint: str, spec: KernelSpec,
                config: RecoverConfig) -> None:
    """The run after a round, written whole to a temporary file and renamed (a kill never
    leaves half a state); its rounds as their dicts (plain containers: it loads with ``weights_only``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    adam = optimizer.state_dict()  # torch's own container: {"state": ..., "param_groups": ...}
    state: RecoveryState = {"format": RECOVERY_FORMAT, "teacher": fingerprint, "spec": spec.to_dict(),
                "config": dataclasses.asdict(config), "student": student.state_dict(),
                "optimizer": {"state": adam["state"], "param_groups": adam["param_groups"]},
                "states": torch.from_numpy(states), "heldout": torch.from_numpy(heldout),
                "history": history,
                "best_agreement": best[0] if best else -1.0, "best_round": best[1] if best else -1,
                "best_student": best[2] if best else {}, "updates": updates, "seeds": seeds,
                "target": -1.0 if target is None else float(target)}
    image = {**state, "history": [h.to_dict() for h in history]}
    write_atomic(path, lambda tmp: torch.save(image, tmp))  # a full disk: the last good state stays


STATE_CAP = 16 << 30
"""Bytes a recovery state may have (its aggregated states are capped at about 2 GiB)."""


def read_state(path: Path, cap: int = STATE_CAP) -> RecoveryState:
    """A recovery state file, as plain tensors and containers (nothing unpickled): a regular
    file holding this format whose records inflate to at most ``cap`` bytes (a resume passes
    :func:`state_cap` of its policy), else one line saying to remove it."""
    from quarl.core.limits import load_torch

    if path.is_symlink() or not path.is_file():
        raise QuarlError(f"{path} is not a regular file: remove it to start the recovery afresh")
    try:
        saved = load_torch(path, cap, "a recovery state", unreadable=lambda error: f"{path} cannot be read as a "
                           f"recovery state ({error}): remove it to start afresh")
    except QuarlError as exc:
        text = str(exc)
        raise QuarlError(text if text.endswith("start afresh") else f"{text}: remove it to start afresh") from None
    if not isinstance(saved, dict) or saved.get("format") != RECOVERY_FORMAT:
        raise QuarlError(f"{path} is not a quarl recovery state (format {RECOVERY_FORMAT}): remove it to start afresh")
    try:
        return parse_record(StateFile, saved, path).root  # its fields checked: RecoveryState
    except QuarlError as exc:
        raise QuarlError(f"{exc}: remove it to start afresh") from None


def _load_state(path: Path, fingerprint: str, spec: KernelSpec, config: RecoverConfig, cap: int) -> RecoveryState:
    saved = read_state(path, cap)
    if saved.get("teacher") != fingerprint:
        raise QuarlError(f"{path} belongs to another policy (its teacher's content differs): use another --out")
    if RecoverConfig.from_record(saved["config"]) != config:
        raise QuarlError(f"{path} was written with other recovery options: rerun with the same options or another "
                         "--out")
    # the same options, another kernel: the CPU (or the automatic choice) differs
    if saved.get("spec") != spec.to_dict():
        was: dict[str, object] = dict(saved["spec"])
        changed = ", ".join(f"{key} {was.get(key)} -> {value}" for key, value in spec.to_dict().items()
                            if was.get(key) != value)
        raise QuarlError(f"{path} was written for another kernel than this run picks ({changed}: another CPU, "
                         f"QUARL_CPU_KIND or automatic choice): resume it where it was written, or use another --out")
    return saved
