"""``quarl recover``: the stages (rounds, more rounds, the fine-tune) until the written model
keeps fp32 or the budget is spent, the verdict on evaluation seeds, and the study's
recovered columns."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec
from quarl.evaluation.record import CellRecord
from quarl.policies.base import Policy
from quarl.quant.modes import head_index, wider_head_mode
from quarl.quant.student import KernelSpec, make_student, real_model
from quarl.quantization.candidates import fp32_actions
from quarl.recovery.config import ORIGINAL_ZIP, Q_ALGOS, RECOVERY_FILE, STATE_FILE, RecoverConfig
from quarl.recovery.dagger import (
    STATE_CAP,
    Progress,
    RecoveryResult,
    agreement_on,
    distill,
    kernel_policy,
    pick_spec,
    read_state,
    state_cap,
)
from quarl.recovery.folder import check_out_folders, find_recovery, load_recovered, write_recovered, zoo_paths
from quarl.recovery.judge import Judge
from quarl.recovery.report import FinetuneNote, RecoveryJson, RecoveryReport, SizesReport, StageReport
from quarl.verdict import Judging

if TYPE_CHECKING:
    from quarl.evaluation.cells import EvalSettings

log = logging.getLogger(__name__)


def run_recover(checkpoint: Path, env_spec: EnvSpec, policy: Policy, config: RecoverConfig, out: Path,
                settings: EvalSettings | None = None, progress: Progress | None = None,
                episode_progress: Callable[[str, int], None] | None = None,
                trust_pickle: bool = False, wait: bool = False, decide_episodes: int = 0,
                decide_seconds: float | None = None, judging: Judging = Judging()
                ) -> tuple[RecoveryJson, list[CellRecord]]:
    """``quarl recover``: distil ``policy`` (loaded from ``checkpoint``) onto its kernel,
    write the recovered folder ``OUT`` (resuming from ``OUT/.recover/state.pt``), then,
    given ``settings`` (:class:`quarl.evaluation.cells.EvalSettings`), judge it as ``quarl ptq OUT``
    does: the original fp32 policy against the recovered kernel on the evaluation seeds
    (``OUT/verdict/``), playing on while undecided up to ``decide_episodes`` /
    ``decide_seconds`` (:func:`quarl.ptq.run.decide`), its verdicts judged under ``judging``.
    A finished recovery of the same policy and options in ``OUT`` is reused as it is;
    ``wait``: wait for another run holding ``OUT`` instead of refusing.
    Returns (recovery.json, the verdict's records)."""
    from quarl.evaluation.cells import output_lock
    from quarl.ptq.run import run_ptq

    preflight(checkpoint, out, policy, config)
    check_out_folders(out, checkpoint, env_spec)  # a link there would have recover write (and remove) elsewhere
    with output_lock(out, wait=wait):
        record = finished_record(out, policy, config, env_spec)
        if record is None:
            spec, chosen = pick_spec(policy, env_spec, config)
            result, report = recover_stages(zoo_paths(checkpoint)[0], policy, env_spec, config, spec,
                                            out / ".recover" / STATE_FILE, progress)
            record = write_recovered(checkpoint, policy, env_spec, result, out, config, chosen, report)
        else:
            log.info("%s holds this recovery, finished: reused", out)
    records: list[CellRecord] = []
    if settings is not None:
        recovered = load_recovered(out, trust_pickle=trust_pickle)
        assert recovered is not None
        records = run_ptq(recovered.original, env_spec, [recovered.precision], settings, out / "verdict",
                          progress=episode_progress, source=str(out),
                          fixed={"fp32": recovered.original, recovered.precision: recovered.kernel},
                          decide_episodes=decide_episodes, decide_seconds=decide_seconds, judging=judging)
    return record, records


def preflight(checkpoint: Path, out: Path, policy: Policy | None = None, config: RecoverConfig | None = None) -> None:
    """Refuse, before any work, what recovery would refuse later: a checkpoint that is not
    a zip or zoo folder, a recovered folder as the policy, an unreadable state in ``out``
    (bounded by what a state of ``policy`` under ``config`` holds, where given)."""
    zoo_paths(checkpoint)
    if find_recovery(checkpoint) is not None:
        raise QuarlError(f"{checkpoint} is itself a recovered folder: recover its original policy (ENV/{ORIGINAL_ZIP}"
                         " records it)")
    state = out / ".recover" / STATE_FILE
    if state.exists() or state.is_symlink():
        read_state(state, state_cap(policy, config or RecoverConfig()) if policy is not None else STATE_CAP)


def finished_record(out: Path, policy: Policy, config: RecoverConfig, env_spec: EnvSpec) -> RecoveryJson | None:
    """``OUT``'s recovery.json where it records a finished recovery of this very policy
    (content hash), env and options whose files are all intact, else None (a folder whose
    files differ from its manifest is said in one line, then written again). What the
    record claims of the original is checked, not trusted: its original.zip, loaded with
    the folder's zoo files, must be this policy (a folder whose original is another policy
    claiming this one's hash would make the verdict's fp32 row that other policy's)."""
    for path in sorted(out.glob(f"*/{RECOVERY_FILE}")):
        try:
            recovered = load_recovered(path.parent.parent / f"{path.parent.name}.zip")
        except QuarlError as exc:
            reason = re.sub(r"[:;,] (remove it, or )?run quarl recover again$", "", str(exc))
            log.warning("%s: recovering again", reason)
            return None
        if recovered is None:
            return None
        record = recovered.record
        fingerprint = policy.fingerprint()
        if record.get("original", {}).get("policy_sha256") == fingerprint != recovered.original.fingerprint():
            log.warning("%s holds another policy than its %s says (its content hash differs): recovering again",
                        path.parent / ORIGINAL_ZIP, RECOVERY_FILE)
            return None
        same = (record.get("original", {}).get("policy_sha256") == fingerprint
                and recovered.original.fingerprint() == fingerprint
                and RecoverConfig.from_record(record["config"]) == config
                and record.get("env") == env_spec.to_json())
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
    return dataclasses.replace(recovered.kernel, precision=f"{RECOVERED_PREFIX}{precision}")


FINE_BLOCK = 16
"""The smallest block MatMulNBits takes (ONNX Runtime: a power of two, at least 16)."""


def mixed_spec(policy: Policy, spec: KernelSpec) -> KernelSpec | None:
    """The mixed int4/int8 repair of a Q-value agent's ``spec``: its mode with the head in
    8-bit blocks (:func:`quarl.quant.modes.wider_head_mode`: ``int4-block`` ->
    ``int4-block-head8``), where the head is quantized; None elsewhere. One 4-bit rounding
    of the head moves every action's value at once, and where values nearly tie (LunarLander,
    MountainCar) it flips the greedy action on many states (docs/recover.md, "Q-value heads")."""
    wider = wider_head_mode(spec.kernel)
    if wider is None or policy.algo not in Q_ALGOS or head_index(policy.network) in spec.keep:
        return None
    return dataclasses.replace(spec, mode=wider.label)


def finer_spec(policy: Policy, spec: KernelSpec) -> KernelSpec | None:
    """The finer-grid repair of a Q-value agent's ``spec``: the same kernel in blocks of
    :data:`FINE_BLOCK` inputs (twice the scales and zero points of 32, the same 4-bit codes),
    where its grid is blocks of a size it does not fix, larger than that; None elsewhere."""
    grid = spec.kernel.student
    if grid is None or grid.weights != "block" or grid.block_size is not None or spec.block_size <= FINE_BLOCK \
            or policy.algo not in Q_ALGOS:
        return None
    return dataclasses.replace(spec, block_size=FINE_BLOCK)


def repairs(policy: Policy, spec: KernelSpec) -> list[tuple[str, KernelSpec]]:
    """The kernels recover distils into after ``spec``'s own, in order, each with its stage
    name: the mixed int4/int8 head (:func:`mixed_spec`), blocks of 16 (:func:`finer_spec`),
    then both (a QR-DQN MountainCar at 80k steps that neither kept alone: -134 and -121 against
    fp32's -97; both: -96)."""
    found = []
    mixed = mixed_spec(policy, spec)
    if mixed is not None:
        found.append((mixed.mode, mixed))
    finer = finer_spec(policy, spec)
    if finer is not None:
        found.append((f"blocks of {finer.block_size}", finer))
    if mixed is not None and finer is not None:
        found.append((f"{mixed.mode}, blocks of {finer.block_size}", dataclasses.replace(mixed,
                                                                                         block_size=finer.block_size)))
    return found


def _state_path(state_path: Path, base: KernelSpec, spec: KernelSpec) -> Path:
    """Where the distillation onto ``spec`` keeps its state (``base``'s own: ``state_path``)."""
    if spec == base:
        return state_path
    return state_path.with_name(f"{state_path.stem}-{spec.mode}-b{spec.block_size}{state_path.suffix}")


def recover_stages(zip_path: Path, policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec,
                   state_path: Path | None = None, progress: Progress | None = None
                   ) -> tuple[RecoveryResult, RecoveryReport]:
    """PTQ's own model where it already keeps the ORIGINAL fp32 policy's return on recovery's
    test episodes; else the repairs until what would be written keeps it or the budget is
    spent: ``config.rounds`` DAgger rounds on ``spec``'s kernel, then (a Q-value agent at
    int4) as many on the mixed int4/int8 kernel (:func:`mixed_spec`), then ``config.rounds``
    more at a time on the kernel of the best candidate up to ``config.total_rounds``, then
    ``config.finetune_steps`` of the agent's own algorithm (:func:`finetune_stage`), no stage
    starting after ``config.budget_minutes``. A stage's student is a candidate only where it
    plays at least as well as PTQ's own model of ``spec`` (:class:`Judge`); the best
    candidate is written, else PTQ's model. Returns (the result written, the report
    recovery.json records: ``shipped``, ``ptq_mode``, ``sizes``, ``stopped``, the tests)."""
    if state_path is None:  # each stage continues the one before from its state: kept in a temporary folder
        import tempfile

        with tempfile.TemporaryDirectory(prefix="quarl-recover-") as tmp:
            return recover_stages(zip_path, policy, env_spec, config, spec, Path(tmp) / STATE_FILE, progress)
    started = time.perf_counter()
    deadline = started + 60.0 * config.budget_minutes
    judge = Judge(policy, env_spec, spec)
    stages: list[StageReport] = []

    def stage(name: str, result: RecoveryResult, steps: int | None = None) -> bool:
        against_ptq = judge.offer(name, result)
        keeps = judge.keeps()
        best = judge.best()
        report: StageReport = {"stage": name, "rounds": len(result.history), "agreement": result.agreement,
                               "against_ptq": against_ptq, "written": "ptq" if best is None else best.stage,
                               "against_fp32": keeps, "wall_s": round(time.perf_counter() - started, 2)}
        if result.spec != spec:  # another kernel than the run's (a repair's)
            report["mode"] = result.spec.mode
            report["block_size"] = result.spec.block_size
        if steps is not None:
            report["steps"] = steps
        stages.append(report)
        return bool(keeps["kept"])

    if ptq_keeps(judge):  # nothing to repair: PTQ's own model is shipped as it is
        written = ptq_result(policy, env_spec, config, spec, judge.ptq_model)
        return written, _report(judge, written, config, stages, True, None, started, len(written.history))
    limit = config.rounds
    last = {spec: distill(policy, env_spec, config, spec, state_path, progress, rounds=limit)}
    kept = stage("distill", last[spec])
    names = {spec: ""}
    for name, other in repairs(policy, spec):  # other kernels, each judged by the same paired tests
        if kept or time.perf_counter() >= deadline:
            break
        names[other] = f" {name}"
        last[other] = distill(policy, env_spec, config, other, _state_path(state_path, spec, other), progress,
                              rounds=limit)
        kept = stage(name, last[other])
    while not kept and limit < config.total_rounds and time.perf_counter() < deadline:
        limit = min(limit + config.rounds, config.total_rounds)
        chosen = judge.best()
        on = chosen.result.spec if chosen is not None else spec  # go on with the kernel that plays best
        last[on] = distill(policy, env_spec, config, on, _state_path(state_path, spec, on), progress, rounds=limit,
                           keep_going=True)
        kept = stage(f"rounds {limit}{names[on]}", last[on])
    finetune_note: FinetuneNote | None = None
    if not kept and config.finetune_steps and time.perf_counter() < deadline:
        chosen = judge.best()
        start = chosen.result if chosen is not None else last[spec]
        try:
            tuned = finetune_stage(zip_path, policy, env_spec, config, start)
        except QuarlError as exc:  # an algorithm quarl does not train, reward statistics it cannot read...
            finetune_note = {"steps": config.finetune_steps, "skipped": str(exc)}
            log.warning("no fine-tune: %s", exc)
        else:
            kept = stage("finetune", tuned, config.finetune_steps)
            finetune_note = {"steps": config.finetune_steps, "wall_s": tuned.finetune_s,
                             "from": "ptq" if start.best_round < 0 else "distilled"}
    best = judge.best()
    if best is not None:
        written = best.result
    else:  # PTQ's own model: the real kernel ptq runs for this mode, no distillation
        written = dataclasses.replace(last[spec], student=make_student(policy.network, spec), model=judge.ptq_model,
                                      best_round=-1, agreement=last[spec].ptq_agreement)
    played = max(len(r.history) for r in last.values())
    written = dataclasses.replace(written, wall_s=max(r.wall_s for r in last.values()))
    return written, _report(judge, written, config, stages, kept, finetune_note, started, played)


def ptq_keeps(judge: Judge) -> bool:
    """Whether PTQ's own model already keeps the original fp32's return on recovery's test
    episodes (strict: undecided is not kept), before any repair is tried."""
    return bool(judge.keeps()["kept"])


def ptq_result(policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec, model: bytes
               ) -> RecoveryResult:
    """PTQ's own model of ``spec`` as a result of no rounds (its agreement with the teacher
    on the calibration states)."""
    from quarl.evaluation.calibration import calibration_inputs

    states = calibration_inputs(policy, env_spec)
    agreement = agreement_on(policy, kernel_policy(policy, spec, model), states, fp32_actions(policy, states),
                           config.action_tolerance)
    target = config.target_agreement or config.min_agreement
    return RecoveryResult(spec, make_student(policy.network, spec), model, [], -1, agreement, agreement, target, [],
                          "target")


def model_sizes(policy: Policy, ptq_model: bytes, written: bytes) -> SizesReport:
    """Bytes of the fp32 ONNX model, PTQ's own model and the written one (initializers and graph)."""
    from quarl.quant.backends.onnxruntime import export_onnx

    return {"fp32": len(export_onnx(policy.network, policy.input_shape)), "ptq": len(ptq_model),
            "shipped": len(written)}


def _report(judge: Judge, written: RecoveryResult, config: RecoverConfig, stages: list[StageReport], kept: bool,
            finetune_note: FinetuneNote | None, started: float, played: int) -> RecoveryReport:
    """recovery.json's report of a run (what :func:`recover_stages` returns beside the result)."""
    best = judge.best()
    against_fp32 = judge.keeps()
    report: RecoveryReport = {
        "shipped": "ptq" if best is None else "student",
        "shipped_stage": None if best is None else best.stage,
        "ptq_mode": judge.spec.mode,
        "sizes": model_sizes(judge.policy, judge.ptq_model, written.model),
        "stopped": "kept" if kept else "budget",
        "against_ptq": {"verdict": "no student was shown at least as good"} if best is None else best.against_ptq,
        "against_fp32": against_fp32,
        "stages": stages,
        "budget": {"rounds": config.total_rounds, "rounds_played": played,
                   "finetune_steps": config.finetune_steps, "minutes": config.budget_minutes},
        "total_s": round(time.perf_counter() - started, 2),
    }
    if finetune_note:
        report["finetune"] = finetune_note
    log.info("recovery wrote %s (%s, %s, %d bytes); %s against the original fp32 on %d test episodes: %s",
             report["shipped"], report["shipped_stage"] or "PTQ's own model", written.spec.mode,
             len(written.model), report["stopped"], against_fp32.get("episodes", 0), against_fp32["verdict"])
    return report


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
        agreement = agreement_on(policy, kernel_policy(policy, result.spec, model), result.heldout,
                               fp32_actions(policy, result.heldout), config.action_tolerance)
    took = time.perf_counter() - started
    log.info("fine-tuned %d steps in %.0f s: held-out agreement %.1f%%", config.finetune_steps, took, 100 * agreement)
    return dataclasses.replace(result, student=tuned, model=model, agreement=agreement, best_round=len(result.history),
                               finetune_s=round(took, 2))
