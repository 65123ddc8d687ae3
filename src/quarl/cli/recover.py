"""``quarl recover``: distil the fp32 policy into a student on the real int kernel's grid,
then judge the recovered kernel against the original."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import TaskID

from quarl import outputs
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import out_console, progress, setup, user_errors
from quarl.cli.loading import read, with_env
from quarl.cli.ptq import DECIDE_EPISODES, DECIDE_MINUTES, DecideEpisodes
from quarl.cli.settings import (
    EVALUATION,
    INSURE,
    INT_OPTIONS,
    LOADING,
    BlockSize,
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
    TrustGymPackages,
    TrustPickle,
    Verbose,
    Workers,
)
from quarl.core import validate
from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from quarl.envs import EnvSpec
    from quarl.evaluation.cells import EvalSettings
    from quarl.evaluation.record import CellRecord
    from quarl.policies.base import Policy
    from quarl.policies.checkpoint import Checkpoint
    from quarl.recovery import RecoverConfig
    from quarl.recovery.report import RecoveryJson, RoundStats

RecoverCheckpoint = Annotated[Path, typer.Argument(
    help="the trained policy: an SB3 .zip (with --env) or an RL Zoo run folder (ppo/CartPole-v1_1)")]
Precision = Annotated[str, typer.Option(
    "--precision", help="int8 / int4 (the mode ptq's automatic choice runs) or a mode: int8-block, int8-dyn-channel, "
                        "int8-dyn-tensor, int8-weight-only, int4-block, int4-weight-only, int4-block-head8 (mixed "
                        "int4/int8: the head in 8-bit blocks); a DQN / QR-DQN at int4 also tries the mixed head and "
                        "blocks of 16 where int4 does not keep")]
Rounds = Annotated[int, typer.Option("--rounds", help="DAgger rounds at most (round 0 plays the teacher)")]
Updates = Annotated[int, typer.Option("--updates", help="student updates (Adam steps) per round")]
EpisodesPerRound = Annotated[int, typer.Option("--episodes-per-round", help="distillation episodes per round")]
LearningRate = Annotated[float, typer.Option("--lr", help="the student's learning rate")]
TargetAgreement = Annotated[float | None, typer.Option(
    "--target-agreement", help="held-out agreement with the teacher that ends the run (default: the teacher's fp16 "
                               "copy's, at most 0.99)")]
FinetuneSteps = Annotated[int, typer.Option(
    "--finetune-steps", help="where the rounds end without keeping fp32's return, fine-tune this many env steps with "
    "the agent's own algorithm, fake quantization on (the RL Zoo's hyperparameters, a tenth of its learning rate; 0: "
    "never)")]
MaxRounds = Annotated[int | None, typer.Option(
    "--max-rounds", help="DAgger rounds in all: where --rounds end without keeping fp32's return, go on --rounds more "
                         "at a time up to this (default: 3 x --rounds)")]
BudgetMinutes = Annotated[float, typer.Option(
    "--budget-minutes", help="no new stage (more rounds, the fine-tune) starts after this many minutes")]
QLoss = Annotated[str, typer.Option(
    "--q-loss", help="DQN / QR-DQN: rank (the greedy action's margin, a hinge on every pair of actions weighted by "
                     "the teacher's action gap, the values' error) or margin (without the pairs)")]


@command(app, "recover")
@user_errors
def recover(
    checkpoint: RecoverCheckpoint,
    *,
    env: Env = None,
    precision: Precision = "int4",
    out: Out = None,
    rounds: Rounds = 12,
    updates: Updates = 400,
    episodes_per_round: EpisodesPerRound = 4,
    lr: LearningRate = 5e-4,
    target_agreement: TargetAgreement = None,
    finetune_steps: FinetuneSteps = 20_000,
    max_rounds: MaxRounds = None,
    budget_minutes: BudgetMinutes = 15.0,
    q_loss: QLoss = "rank",
    episodes: Episodes = EVALUATION.episodes,
    decide_episodes: DecideEpisodes = None,
    decide_minutes: DecideMinutes = DECIDE_MINUTES,
    insure: Insure = INSURE,
    return_range: ReturnRange = None,
    seed: Seed = EVALUATION.seed,
    n_envs: NEnvs = EVALUATION.n_envs,
    max_steps: MaxSteps = None,
    workers: Workers = None,
    int8_weights: Int8Weights = INT_OPTIONS.int8_weights,
    block_size: BlockSize = INT_OPTIONS.block_size,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
    load_best: LoadBest = LOADING.load_best,
    load_checkpoint: LoadCheckpoint = None,
    load_last_checkpoint: LoadLastCheckpoint = LOADING.load_last_checkpoint,
) -> None:
    """Recover what quantization loses: distil the fp32 policy into a student on the real
    int kernel's grid (DAgger on distillation seeds), write OUT as an RL Zoo run folder (its
    zip on the grid, OUT/export the real kernel, the original recorded by hash), then judge
    the recovered kernel against the ORIGINAL fp32 policy on the evaluation seeds. A rerun
    resumes after the last finished round.

    Example: quarl recover ../shared/zoo/dqn/CartPole-v1_1 --precision int4 --out results/recover/dqn-cartpole-int4
    """
    setup(verbose)
    loading = Loading(trust_pickle, load_best, load_checkpoint, load_last_checkpoint)
    checkpoint = loading.policy_path(checkpoint, env, out)
    evaluation = Evaluation(episodes, seed, n_envs, max_steps, workers).checked()  # before torch loads
    worker_count = evaluation.worker_count()
    deciding = Deciding.parse(decide_episodes, decide_minutes, insure, return_range, DECIDE_EPISODES)
    from quarl.recovery import RecoverConfig

    options = IntOptions(int8_weights, block_size).checked()
    config = RecoverConfig(precision=precision.lower(), rounds=rounds, updates_per_round=updates,
                           episodes_per_round=episodes_per_round, lr=lr, target_agreement=target_agreement,
                           finetune_steps=finetune_steps, max_rounds=max_rounds, budget_minutes=budget_minutes,
                           q_loss=q_loss.lower(), **options)
    settings = evaluation.settings(worker_count)
    ckpt, spec, out = policy_and_folder(checkpoint, env, trust_pickle, out, precision, config)
    record, records = distil_and_judge(checkpoint, ckpt.policy, spec, config, out, settings, deciding, trust_pickle)
    print_verdict(record, records, f"{ckpt.algo} {spec.env_id}", episodes, deciding)
    print_recovery(record, out)


def policy_and_folder(checkpoint: Path, env: str | None, trust_pickle: bool, out: Path | None,
                      precision: str, config: RecoverConfig) -> tuple[Checkpoint, EnvSpec, Path]:
    """The checkpoint loaded (an exported model refused) and the folder its recovery writes
    (--out, else results/recover/...), refused in one line before any progress bar where
    recovery would refuse it later."""
    from quarl.policies.onnx_artifact import ExportedModel
    from quarl.recovery import preflight

    ckpt = read(checkpoint, env, trust_pickle)
    if ckpt.payload_of(ExportedModel) is not None:  # said before its env is made, as for any export
        raise QuarlError(f"{checkpoint} is an exported model: recover the checkpoint it came from (an SB3 .zip or RL "
                         "Zoo folder)")
    ckpt, spec = with_env(ckpt, env)
    folder = validate.out_folder(outputs.apart_from_inputs(out, [checkpoint])) or outputs.precision_folder(
        "recover", checkpoint, spec.env_id, precision)
    preflight(checkpoint, folder, ckpt.policy, config)  # one line before any progress bar
    return ckpt, spec, folder


def distil_and_judge(checkpoint: Path, policy: Policy, spec: EnvSpec, config: RecoverConfig, out: Path,
                     settings: EvalSettings, deciding: Deciding,
                     trust_pickle: bool) -> tuple[RecoveryJson, list[CellRecord]]:
    """:func:`quarl.recovery.run_recover` under progress bars: the rounds (their held-out
    agreement), then each verdict cell's episodes."""
    from quarl.recovery import run_recover

    with progress() as bar:
        task = bar.add_task("distil", total=config.total_rounds)
        evals: dict[str, TaskID] = {}

        def on_round(stats: RoundStats) -> None:
            bar.update(task, completed=stats.round + 1, description=f"distil: agreement {100 * stats.agreement:.1f}%")

        def on_episode(label: str, n: int) -> None:
            if label not in evals:
                evals[label] = bar.add_task(f"{label:>5}", total=settings.episodes)
            bar.update(evals[label], completed=n, total=max(n, bar.tasks[evals[label]].total or 0))

        return run_recover(checkpoint, spec, policy, config, out, settings, on_round, on_episode, trust_pickle,
                           decide_episodes=deciding.episodes, decide_seconds=deciding.seconds,
                           judging=deciding.judging)


def print_verdict(record: RecoveryJson, records: list[CellRecord], agent: str, episodes: int,
                  deciding: Deciding) -> None:
    """The verdict's table: the recovered kernel against the original fp32 policy."""
    from quarl.evaluation.reports import print_table, ptq_rows
    from quarl.ptq.run import episodes_played

    budget = deciding.note(episodes)
    print_table(ptq_rows(records, identity=False, judging=deciding.judging),
                f"{agent}: recovered {record['kernel']['mode']} against the original fp32 policy, "
                f"{episodes_played(records, episodes)}" + (f" ({budget})" if budget else ""), out_console)


def print_recovery(record: RecoveryJson, out: Path) -> None:
    """What distillation reached and why it stopped, what was written and why the run ended,
    and the files."""
    from quarl.recovery import MIN_HELDOUT, shipped_line

    if not record["rounds"] and record["shipped"] == "ptq":  # PTQ kept fp32's return: nothing was distilled
        out_console.print(f"PTQ already keeps: no distillation (agreement with the teacher on calibration states "
                          f"{100 * record['agreement']:.1f}%)", highlight=False)
        out_console.print(shipped_line(record), highlight=False, soft_wrap=True)
        out_console.print(f"wrote {out}/ (RL Zoo run folder), {out}/export/policy.onnx, {out}/verdict/ptq.csv",
                          soft_wrap=True, highlight=False)
        return
    kept = "the fine-tuned model's" if record.get("shipped_stage") == "finetune" else "the written model's"
    distilled = record.get("distill_stopped", record["stopped"])
    stopped = "target reached" if distilled == "target" else "round budget spent"
    if distilled != "target" and record.get("heldout_states", MIN_HELDOUT) < MIN_HELDOUT:
        # the target counts only once enough held-out states say so: a short env needs more rounds
        stopped += (f" before {MIN_HELDOUT} held-out states were labelled ({record['heldout_states']}): more --rounds "
                    "judge it")
    out_console.print(f"held-out agreement with the teacher ({kept}, on every held-out state): "
                      f"{100 * record['agreement']:.1f}% (PTQ {100 * record['ptq_agreement']:.1f}%, target "
                      f"{100 * record['target_agreement']:.1f}%); {record['labelled_states']:,} states labelled, "
                      f"{record['updates']:,} updates, {record['wall_s']:.0f} s ({stopped})", highlight=False)
    out_console.print(shipped_line(record), highlight=False, soft_wrap=True)
    out_console.print(f"wrote {out}/ (RL Zoo run folder), {out}/export/policy.onnx, {out}/verdict/ptq.csv; "
                      f"quarl ptq {out} --precisions fp32,{record['precision']} judges it again", soft_wrap=True,
                      highlight=False)
