"""``quarl actorq``: distributed actor-learner training with quantized actors (``run``),
the same run per actor precision (``compare``), and the scaling model (``model``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from quarl import outputs
from quarl.actorq.algorithms import algorithms_help
from quarl.cli import registry_options
from quarl.cli.actorq_options import algorithm_parameters
from quarl.cli.common import console, out_console, setup, user_errors
from quarl.cli.groups import common_options, with_options
from quarl.cli.options import OutOpt, SeedOpt, VerboseOpt
from quarl.core import validate

if TYPE_CHECKING:  # the run's modules load torch; the CLI imports this one at start
    from quarl.actorq.run_log import Progress

actorq_app = typer.Typer(no_args_is_help=True, help="ActorQ: distributed actor-learner training with a "
                         "full-precision learner and quantized actors, on Ray.")

ALGORITHMS_HELP = algorithms_help()
"""--algo's help, from the registry (quarl.actorq.algorithms)."""


def number(value: Optional[float]) -> str:
    """A progress field; '-' until there is one (no evaluation has finished yet)."""
    return "-" if value is None or value != value else f"{value:.2f}"


def progress_line(state: Any, line: Progress) -> None:
    console.print(
        f"{line.t_s:7.1f}s  env {line.env_steps:>8} ({line.env_steps_per_s:7.1f}/s)  "
        f"learner {line.learner_steps:>7} ({line.learner_steps_per_s:6.1f}/s)  "
        f"eval {number(line.last_eval):>8}  mean10 {number(line.running_mean):>8}"
        f" / {line.target if line.target is not None else '-'}  v{line.version}",
        highlight=False,
        soft_wrap=True,
    )


def actorq_options(
    algo: str = typer.Option("dqn", help=ALGORITHMS_HELP),
    actors: int = typer.Option(2, help="actor processes"),
    actor_precision: str = typer.Option("int8", help="{actor_precisions} (ONNX Runtime)"),
    wire_bits: int = typer.Option(32, help="weights sent to float actors at {wire_bits} bits"),
    update_period: int = typer.Option(300, help="actor env steps between weight pulls"),
    push_period: int = typer.Option(100, help="learner steps between weight pushes"),
    policy_layers: str = typer.Option("2048,2048,2048", help="hidden widths of the policy"),
    target_reward: Optional[float] = typer.Option(None, help="stop at this running-mean eval return (default: env's threshold)"),
    max_minutes: float = typer.Option(10.0, help="time budget of one run"),
    max_env_steps: Optional[int] = typer.Option(None, help="also stop after this many env steps"),
    learning_rate: float = typer.Option(1e-4, "--lr"),
    batch_size: int = typer.Option(256),
    checkpoint_replay: bool = typer.Option(False, "--checkpoint-replay", help="also checkpoint replay (for --resume)"),
    eval_seconds: float = typer.Option(10.0, help="seconds between evaluations (without --eval-freq)"),
    eval_freq: Optional[int] = typer.Option(
        None, help="evaluate every N env steps instead, as train's --eval-freq (fleets of different speeds compared "
                   "at the same learning progress)"),
    eval_episodes: int = typer.Option(5),
    seed: int = SeedOpt,
    address: Optional[str] = typer.Option(None, help="join this Ray cluster, HOST:PORT (default: start a local one)"),
    local: bool = typer.Option(False, "--local", help="everything in this process (no Ray)"),
    learner_device: str = typer.Option("cpu", help="cpu, or cuda / cuda:N for a GPU learner"),
    out: Optional[Path] = OutOpt,
) -> None:
    """The options ``actorq run`` and ``actorq compare`` share (typer reads this signature);
    each algorithm's own follow (:func:`algorithm_parameters`)."""


ALGORITHM_OPTIONS = algorithm_parameters()
"""--algo's own options, one per field of each entry's options (:mod:`quarl.cli.actorq_options`)."""


def start(env_id: str, compare: bool, options: dict[str, Any]) -> tuple[Any, Path]:
    """Set up, check everything (one line for a bad option) and say what starts."""
    from quarl.actorq.launch import prepare

    setup(options["verbose"])
    config, out = prepare(env_id, options, compare)
    where = ("in this process" if config.local else f"on the Ray cluster at {config.address}" if config.address
             else "on a local Ray cluster")
    actors = str(config.actors) if compare else f"{config.actors} {config.actor_precision}"
    each = " for each run" if compare else ""
    console.print(f"starting {actors} actors and a {config.learner_device} learner {where}{each}; a progress line "
                  "every 2 s", highlight=False, soft_wrap=True)
    return config, out


@actorq_app.command("run")
@user_errors
@with_options(actorq_options, ALGORITHM_OPTIONS, common_options)
def actorq_run(
    env_id: str = typer.Argument(..., help="environment id, e.g. CartPole-v1 or dm_control/cartpole-balance-v0"),
    *,
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/checkpoint.pt"),
    gym_packages: Optional[str],
    **opts: Any,
) -> None:
    """Train with a full-precision learner and quantized actors until the target reward.

    Example: quarl actorq run CartPole-v1 --algo dqn --actors 2 --actor-precision int8 --policy-layers 256,256
    """
    config, out = start(env_id, False, opts)
    from quarl.actorq.system import run_actorq

    summary = run_actorq(config, resume=resume, on_progress=progress_line)
    ttr = summary.time_to_reward_s
    out_console.print(
        (f"reached {summary.target_reward} in {ttr:.1f} s" if ttr is not None else
         f"did not reach {summary.target_reward} in {summary.elapsed_s:.0f} s")
        + f" ({summary.env_steps} env steps, {summary.learner_steps} learner steps); wrote {out}/summary.json, "
        f"evals.csv, actor_nodes.json, checkpoint.pt, policy.pt, tb/",
        soft_wrap=True,
    )


@actorq_app.command("compare")
@user_errors
@with_options(actorq_options, ALGORITHM_OPTIONS, common_options)
def actorq_compare(
    env_id: str = typer.Argument(..., help="environment id"),
    *,
    precisions: str = typer.Option("fp32,int8", help="actor precisions, one run each"),
    repeats: int = typer.Option(3, help="runs per precision (seeds seed, seed+1, ...)"),
    gym_packages: Optional[str],
    **opts: Any,
) -> None:
    """The same run once per actor precision and repeat, then the paper's table (time to
    reward, speedup, actor steps/s, where actor time goes), convergence, breakdown and
    energy plots. Finished runs are reused, so an interrupted comparison resumes.

    Example: quarl actorq compare CartPole-v1 --precisions fp32,int8 --repeats 3 --policy-layers 256,256
    """
    labels = registry_options.actor_precisions(precisions)
    validate.repeats(repeats)
    config, out = start(env_id, True, opts)
    from quarl.actorq.compare import run_compare
    from quarl.evaluation.reports import print_table

    result = run_compare(config, labels, repeats, out,
                         on_run=lambda p, r: console.print(f"[bold]{p} actors, run {r + 1}/{repeats}[/bold]"),
                         on_progress=progress_line)
    print_table(result.table, f"ActorQ {config.algo} {env_id}: {config.actors} actors, policy "
                f"{opts['policy_layers']}", out_console)
    print_table(result.breakdown, "share of the actors' wall time per part (and the learner's busy share)",
                out_console)
    out_console.print(f"wrote {out}/compare.csv, compare.md, compare.json, breakdown.csv, breakdown.md, "
                      "breakdown.json, convergence.png, breakdown.png, energy.png")


@actorq_app.command("model")
@user_errors
def actorq_model(
    runs: list[Path] = typer.Argument(..., help="run or compare folders whose summary.json give the component costs"),
    actors: str = typer.Option("1,2,4,8,16,32,64,128", help="actor counts to predict"),
    nodes: int = typer.Option(1, help="nodes the actors are spread over"),
    cores_per_node: Optional[int] = typer.Option(None, help="CPU cores per node (default: this machine's)"),
    learner_speedup: float = typer.Option(1.0, help="learner steps this many times faster than measured (a GPU)"),
    bandwidth_gbps: Optional[float] = typer.Option(None, help="broadcaster-to-actor network, Gbit/s (default: "
                                                              "the measured same-machine pulls)"),
    wire_bits: str = typer.Option("", help="also model float actors pulling weights at these widths, e.g. 16,8,4"),
    validate_runs: Optional[list[Path]] = typer.Option(None, "--validate",
                                                       help="runs to predict from RUNS' costs (e.g. 2-actor runs)"),
    out: Path = typer.Option(outputs.ACTORQ_MODEL, "--out", help="output folder"),
    verbose: bool = VerboseOpt,
) -> None:
    """Predict ActorQ at cluster scale from measured component costs: the bound (actors,
    learner, cores or network), env steps/s and time-to-reward speedup over fp32 actors for
    each actor count, validated against every measured run.

    Example: quarl actorq model results/actorq/actor-bound-dqn --learner-speedup 20 --nodes 4 --cores-per-node 16
    """
    setup(verbose)
    from quarl.actorq.launch import model_cluster
    from quarl.actorq.model import load_runs, model_report
    from quarl.evaluation.reports import print_table

    counts = validate.positive_ints(actors, "--actors")
    widths = registry_options.wire_widths(wire_bits)
    cluster = model_cluster(nodes, cores_per_node, learner_speedup, bandwidth_gbps)
    report = model_report(load_runs(runs), counts, cluster, out, load_runs(validate_runs) if validate_runs else None,
                          widths)
    print_table(report.rows, f"ActorQ model, {report.where}", out_console)
    print_table(report.validation, "measured runs against the model", out_console)
    out_console.print("wrote " + ", ".join(str(f) for f in report.files), soft_wrap=True)
