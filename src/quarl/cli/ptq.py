"""``quarl ptq``: a policy at several precisions, with E% and a verdict per precision."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import out_console, progress, say, say_reused, setup, user_errors
from quarl.cli.loading import load, protocol
from quarl.cli.settings import (
    EVALUATION,
    INSURE,
    INT_OPTIONS,
    LOADING,
    PRECISIONS_HELP,
    Acting,
    BlockSize,
    CheckpointArg,
    DecideMinutes,
    Deciding,
    Env,
    Episodes,
    Evaluation,
    GymPackages,
    Insure,
    Int8Weights,
    IntOptions,
    LoadBest,
    LoadCheckpoint,
    Loading,
    LoadLastCheckpoint,
    MaxSteps,
    NEnvs,
    Out,
    ReturnRange,
    Seed,
    StickyActions,
    Stochastic,
    TrustGymPackages,
    TrustPickle,
    Verbose,
    Wide,
    Workers,
    decide_episodes_option,
)
from quarl.core import validate
from quarl.verdict import Decision, Judging, Verdict

if TYPE_CHECKING:
    from quarl.envs import EnvSpec
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.record import CellRecord
    from quarl.policies.base import Policy
    from quarl.policies.checkpoint import Checkpoint
    from quarl.quantization.config import QuantConfig


DECIDE_EPISODES = 2000
"""--decide-episodes' default in ptq and recover."""
DECIDE_MINUTES = 5.0
DecideEpisodes = Annotated[int | None, decide_episodes_option(DECIDE_EPISODES)]
Precisions = Annotated[str, typer.Option("--precisions", help=PRECISIONS_HELP)]


def warm(workers: int) -> None:
    """Start the evaluation workers in the background once the policy has loaded (a bad
    checkpoint fails without starting them), so they are ready when calibration ends."""
    if workers > 1:
        from quarl.evaluation import parallel

        parallel.warm_up(workers)


def plays_as_fp32(base: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    """Whether ``record`` returned exactly what fp32 did on every episode it played (paired by
    seed: fp32's first ones, where fp32 played on)."""
    fp32, quant = list(base.get("returns") or []), list(record.get("returns") or [])
    return bool(quant) and len(fp32) >= len(quant) and base.get("seed") == record.get("seed") \
        and fp32[:len(quant)] == quant


def recover_hint(judged: Sequence[tuple[str, Verdict | None]], checkpoint: Path, recovered: bool,
                 as_fp32: frozenset[str] = frozenset()) -> None:
    """Where an int precision loses or is undecided (``judged``: each precision's verdict),
    the command that repairs it; an undecided one that played exactly as fp32 did (``as_fp32``)
    has nothing to recover: only more episodes decide it."""
    for label, verdict in judged:
        if label not in ("int8", "int4") or recovered or verdict is None:
            continue
        if verdict.verdict == Decision.UNDECIDED and label in as_fp32:
            say(f"{label} undecided: its returns equal fp32's on every episode, nothing to recover; play more episodes "
                "(a larger --decide-episodes / --decide-minutes) to decide")
        elif verdict.verdict == Decision.LOSES:
            say(f"{label} loses: recover it with quarl recover {checkpoint} --precision {label}")
        elif verdict.verdict == Decision.UNDECIDED:  # more episodes may show it keeps: say both ways out
            say(f"{label} undecided: play more episodes (a larger --decide-episodes / --decide-minutes), or recover it "
                f"with quarl recover {checkpoint} --precision {label}")


DEFAULT_PRECISIONS = "fp32,fp16,bf16,int8,int4"


@command(app, "ptq", renames={"--precision": "--precisions"})
@user_errors
def ptq(
    checkpoint: CheckpointArg,
    *,
    env: Env = None,
    precisions: Precisions = DEFAULT_PRECISIONS,
    episodes: Episodes = EVALUATION.episodes,
    decide_episodes: DecideEpisodes = None,
    decide_minutes: DecideMinutes = DECIDE_MINUTES,
    insure: Insure = INSURE,
    return_range: ReturnRange = None,
    sticky_actions: StickyActions = None,
    stochastic: Stochastic = None,
    seed: Seed = EVALUATION.seed,
    n_envs: NEnvs = EVALUATION.n_envs,
    max_steps: MaxSteps = None,
    workers: Workers = None,
    int8_weights: Int8Weights = INT_OPTIONS.int8_weights,
    block_size: BlockSize = INT_OPTIONS.block_size,
    out: Out = None,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    wide: Wide = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
    load_best: LoadBest = LOADING.load_best,
    load_checkpoint: LoadCheckpoint = None,
    load_last_checkpoint: LoadLastCheckpoint = LOADING.load_last_checkpoint,
) -> None:
    """Evaluate a policy at several precisions and print precision | mean | std | E%.

    Example: quarl ptq ../shared/zoo/ppo/LunarLander-v2_1 --precisions fp32,fp16,int8 --episodes 20
    """
    setup(verbose)
    loading = Loading(trust_pickle, load_best, load_checkpoint, load_last_checkpoint)
    checkpoint = loading.policy_path(checkpoint, env, out)
    # the plain values first, before torch loads: a typo answers at once
    evaluation = Evaluation(episodes, seed, n_envs, max_steps, workers).checked()
    worker_count = evaluation.worker_count()
    early.precisions(precisions)
    deciding = Deciding.parse(decide_episodes, decide_minutes, insure, return_range, DECIDE_EPISODES)
    settings = evaluation.settings(worker_count)
    configs = registry_options.configs(precisions, IntOptions(int8_weights, block_size).config())
    ckpt, spec = load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = protocol(ckpt.policy, spec, Acting(stochastic, sticky_actions))
    warm(settings.workers)
    out = validate.out_folder(outputs.apart_from_inputs(out, [checkpoint])) or outputs.claim(outputs.policy_folder(
        "ptq", checkpoint, spec.env_id), checkpoint)
    from quarl.policies.onnx_artifact import ExportedModel

    if ckpt.payload_of(ExportedModel) is not None:  # an exported model: evaluated as it is, nothing re-quantized
        ptq_export(checkpoint, ckpt, spec, settings, out, wide, precisions != DEFAULT_PRECISIONS)
        return
    from quarl.recovery.folder import RecoveredFolder
    from quarl.recovery.loader import recovered_cells

    folder = ckpt.payload_of(RecoveredFolder)  # a folder quarl recover wrote: fp32 the original, its kernel a column
    fixed, recovered = ({}, None) if folder is None else recovered_cells(checkpoint, folder, spec,
                                                                         ckpt.policy.stochastic, trust_pickle)
    title = ptq_title(ckpt, spec.env_id, recovered, deciding.note(episodes))
    records = play_cells(ckpt.policy, spec, configs, settings, out, deciding, str(checkpoint), fixed)
    report_cells(records, title, episodes, out, checkpoint, recovered is not None, wide, deciding.judging)


def ptq_export(checkpoint: Path, ckpt: Checkpoint, spec: EnvSpec, settings: EvalSettings, out: Path, wide: bool,
               other_precisions: bool) -> None:
    """``quarl ptq`` of an exported model: its one row, evaluated as exported (``other_precisions``:
    --precisions asked for rows an export cannot give)."""
    from quarl.evaluation.reports import print_table, ptq_rows
    from quarl.ptq.run import run_artifact

    if other_precisions:
        say(f"{checkpoint} is an exported model: evaluated as exported ({ckpt.policy.precision}), --precisions "
            "does not apply (ptq the checkpoint it came from for the other rows)")
    with progress() as bar:
        task = bar.add_task(ckpt.policy.precision, total=settings.episodes)
        records = run_artifact(ckpt.policy, spec, settings, out, lambda c, n: bar.update(task, completed=n),
                               source=str(checkpoint))
    print_table(ptq_rows(records, identity=False), f"{checkpoint.name} ({ckpt.algo} {spec.env_id}), "
                f"{settings.episodes} episodes", out_console, wide)
    say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, ptq.csv, ptq.md, ptq.json")


def ptq_title(ckpt: Checkpoint, env_id: str, recovered: str | None, budget: str) -> str:
    """The table's title (``{played}``: the episodes the cells played, known once they ran);
    ``recovered``: the precision of a folder ``quarl recover`` wrote; ``budget``: :meth:`Deciding.note`."""
    title = f"{ckpt.algo} {env_id}, {{played}}" + (f" ({budget})" if budget else "") + (
        ", stochastic" if ckpt.policy.stochastic else "")
    if recovered is not None:  # fp32 is the ORIGINAL policy, the recovered precision its real kernel
        title += f" (recovered {recovered}: fp32 is the original policy)"
    elif ckpt.policy.precision.startswith("qat"):  # a QAT run: every row starts from its fake-quantized network
        title += f" (a {ckpt.policy.precision} QAT net: fp32 is that net in fp32 arithmetic, not an fp32-trained agent)"
    return title


def play_cells(policy: Policy, spec: EnvSpec, configs: list[QuantConfig], settings: EvalSettings, out: Path,
               deciding: Deciding, source: str, fixed: dict[str, Policy]) -> list[CellRecord]:
    """fp32's and each precision's episodes (:func:`quarl.ptq.run_ptq`; ``configs``: the
    precisions, parsed once onto the int options; ``fixed``: cells played as they are, a
    recovered folder's), a progress bar per cell."""
    from quarl.ptq.run import run_ptq

    cells = list(dict.fromkeys(["fp32", *(c.label for c in configs)]))
    with progress() as bar:
        limit = f" (≤{deciding.episodes})" if deciding.episodes > settings.episodes else ""
        tasks = {c: bar.add_task(f"{c:>5}{limit}", total=settings.episodes) for c in cells}

        def on_episodes(cell: str, n: int) -> None:  # --decide-episodes: a bar grows with its cell's episodes
            bar.update(tasks[cell], completed=n, total=max(n, bar.tasks[tasks[cell]].total or 0))

        return run_ptq(policy, spec, configs, settings, out, progress=on_episodes, source=source, fixed=fixed,
                       decide_episodes=deciding.episodes, decide_seconds=deciding.seconds, judging=deciding.judging)


def report_cells(records: list[CellRecord], title: str, episodes: int, out: Path, checkpoint: Path, recovered: bool,
                 wide: bool, judging: Judging = Judging()) -> None:
    """The table, what its E pairs and its verdicts insure, how to recover a losing int
    precision, the files written."""
    from quarl.evaluation.reports import paired_verdict, print_table, ptq_rows
    from quarl.ptq.run import episodes_played

    rows = ptq_rows(records, identity=False, judging=judging)
    print_table(rows, title.replace("{played}", episodes_played(records, episodes)), out_console, wide)
    if len({r["episodes"] for r in rows}) > 1:  # deciding stopped some cells early: say what E pairs
        say("E of each row pairs its episodes with fp32's first ones of the same seeds (its episodes column); "
            "fp32's mean is over all of its own")
    base = next((r for r in records if r.precision == "fp32"), None)
    judged = [(r.precision, paired_verdict(base, r, judging)) for r in records if base is not None and r is not base]
    ranges = [v.returns for _, v in judged if v is not None and v.returns is not None]
    if ranges:
        say(f"verdicts: each decision one-sided at 95 %; insured against {ranges[0].insures()} (the range column)")
    as_fp32 = frozenset(r.precision for r in records if base is not None and r is not base and plays_as_fp32(base, r))
    recover_hint(judged, checkpoint, recovered, as_fp32)
    say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, ptq.csv, ptq.md, ptq.json"
                      + (", ptq.png" if len(records) > 1 else ""))
