"""``quarl recover``: the stages (rounds, more rounds, the fine-tune) until the written model keeps fp32 or the budget is spent, the verdict on evaluation seeds, and the study's recovered columns."""

from __future__ import annotations

import dataclasses
import json
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
from quarl.quant.modes import fp32_actions
from quarl.quant.student import KernelSpec, make_student, real_model
from quarl.recovery.config import ORIGINAL_ZIP, RECOVERY_FILE, STATE_FILE, RecoverConfig
from quarl.recovery.dagger import (
    STATE_CAP,
    Progress,
    RecoveryResult,
    _acting,
    _agreement,
    distill,
    pick_spec,
    read_state,
    state_cap,
)
from quarl.recovery.folder import _zoo_paths, check_out_folders, find_recovery, load_recovered, write_recovered
from quarl.recovery.judge import Judge
from quarl.recovery.report import FinetuneNote, RecoveryJson, RecoveryReport, StageReport
from quarl.verdict import Judging

if TYPE_CHECKING:
    from quarl.evaluation.cells import EvalSettings

log = logging.getLogger(__name__)


def run_recover(checkpoint: Path, env_spec: EnvSpec, policy: Policy, config: RecoverConfig, out: Path,
                settings: EvalSettings | None = None, progress: Progress | None = None,
                episode_progress: Callable[[str, int], None] | None = None,
                trust_pickle: bool = False, wait: bool = False, decide_episodes: int = 0,
                decide_seconds: float | None = None, judging: Judging = Judging()) -> tuple[RecoveryJson, list[CellRecord]]:
    """``quarl recover``: distil ``policy`` (loaded from ``checkpoint``) onto its kernel,
    write the recovered folder ``OUT`` (resuming from ``OUT/.recover/state.pt``), then,
    given ``settings`` (:class:`quarl.evaluation.cells.EvalSettings`), judge it as ``quarl ptq OUT``
    does: the original fp32 policy against the recovered kernel on the evaluation seeds
    (``OUT/verdict/``), playing on while undecided up to ``decide_episodes`` /
    ``decide_seconds`` (:func:`quarl.ptq.decide`), its verdicts judged under ``judging``. A finished recovery of the same policy and options in ``OUT`` is
    reused as it is; ``wait``: wait for another run holding ``OUT`` instead of refusing.
    Returns (recovery.json, the verdict's records)."""
    from quarl.evaluation.cells import output_lock
    from quarl.ptq import run_ptq

    preflight(checkpoint, out, policy, config)
    check_out_folders(out, checkpoint, env_spec)  # a link there would have recover write (and remove) elsewhere
    with output_lock(out, wait=wait):
        record = finished_record(out, policy, config, env_spec)
        if record is None:
            spec, chosen = pick_spec(policy, env_spec, config)
            result, report = recover_stages(_zoo_paths(checkpoint)[0], policy, env_spec, config, spec,
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
    _zoo_paths(checkpoint)
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
                and record.get("config") == json.loads(json.dumps(dataclasses.asdict(config)))
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
    recovered.kernel.precision = f"{RECOVERED_PREFIX}{precision}"
    return recovered.kernel


def recover_stages(zip_path: Path, policy: Policy, env_spec: EnvSpec, config: RecoverConfig, spec: KernelSpec,
                   state_path: Path | None = None, progress: Progress | None = None
                   ) -> tuple[RecoveryResult, RecoveryReport]:
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
    stages: list[StageReport] = []

    def stage(name: str, result: RecoveryResult, steps: int | None = None) -> bool:
        against_ptq = judge.offer(name, result)
        keeps = judge.keeps()
        best = judge.best()
        report: StageReport = {"stage": name, "rounds": len(result.history), "agreement": result.agreement,
                               "against_ptq": against_ptq, "written": "ptq" if best is None else best.stage,
                               "against_fp32": keeps, "wall_s": round(time.perf_counter() - started, 2)}
        if steps is not None:
            report["steps"] = steps
        stages.append(report)
        return bool(keeps["kept"])

    limit = config.rounds
    result = distill(policy, env_spec, config, spec, state_path, progress, rounds=limit)
    kept = stage("distill", result)
    last = result
    while not kept and limit < config.total_rounds and time.perf_counter() < deadline:
        limit = min(limit + config.rounds, config.total_rounds)
        last = distill(policy, env_spec, config, spec, state_path, progress, rounds=limit, keep_going=True)
        kept = stage(f"rounds {limit}", last)
    finetune_note: FinetuneNote | None = None
    if not kept and config.finetune_steps and time.perf_counter() < deadline:
        chosen = judge.best()
        start = chosen.result if chosen is not None else last
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
        written = dataclasses.replace(last, student=make_student(policy.network, spec), model=judge.ptq_model,
                                      best_round=-1, agreement=last.ptq_agreement)
    written = dataclasses.replace(written, wall_s=last.wall_s)
    against_fp32 = judge.keeps()
    report: RecoveryReport = {
        "shipped": "ptq" if best is None else "student",
        "shipped_stage": None if best is None else best.stage,
        "stopped": "kept" if kept else "budget",
        "against_ptq": {"verdict": "no student was shown at least as good"} if best is None else best.against_ptq,
        "against_fp32": against_fp32,
        "stages": stages,
        "budget": {"rounds": config.total_rounds, "rounds_played": len(last.history),
                   "finetune_steps": config.finetune_steps, "minutes": config.budget_minutes},
        "total_s": round(time.perf_counter() - started, 2),
    }
    if finetune_note:
        report["finetune"] = finetune_note
    log.info("recovery wrote %s (%s); %s against the original fp32 on %d test episodes: %s",
             report["shipped"], report["shipped_stage"] or "PTQ's own model", report["stopped"],
             against_fp32["episodes"], against_fp32["verdict"])
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
                               finetune_s=round(took, 2))
