"""``quarl actorq``: distributed actor-learner training with quantized actors (``run``),
the same run per actor precision (``compare``), and the scaling model (``model``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from quarl import outputs
from quarl.cli import registry_options
from quarl.cli.actorq_options import ActorQCommand, given
from quarl.cli.actorq_settings import RunSettings
from quarl.cli.app import app
from quarl.cli.command import QuarlGroup, command
from quarl.cli.common import console, out_console, setup, user_errors
from quarl.cli.settings import GymPackages, Verbose
from quarl.core import validate

if TYPE_CHECKING:  # the run's modules load torch; the CLI imports this one at start
    from quarl.actorq.run_log import Progress

actorq_app = typer.Typer(cls=QuarlGroup, no_args_is_help=True, help="ActorQ: distributed actor-learner training with a "
                         "full-precision learner and quantized actors, on Ray.")
app.add_typer(actorq_app, name="actorq")

RENAMES = {"--eval-every": "--eval-seconds", "--eval-every-steps": "--eval-freq"}


def run_options(ctx: typer.Context) -> dict[str, Any]:
    """The options of the run (each by its name, as :func:`quarl.actorq.launch.prepare` takes
    them): the shared ones click parsed (:class:`~quarl.cli.actorq_settings.RunSettings`) and
    the algorithm's own given."""
    return {**RunSettings.parsed(ctx).run_options(), **given(ctx)}


def number(value: float | None) -> str:
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


def start(env_id: str, compare: bool, options: dict[str, Any], verbose: bool) -> tuple[Any, Path]:
    """Set up, check everything (one line for a bad option) and say what starts."""
    from quarl.actorq.launch import prepare

    setup(verbose)
    config, out = prepare(env_id, options, compare)
    where = ("in this process" if config.local else f"on the Ray cluster at {config.address}" if config.address
             else "on a local Ray cluster")
    actors = str(config.actors) if compare else f"{config.actors} {config.actor_precision}"
    each = " for each run" if compare else ""
    console.print(f"starting {actors} actors and a {config.learner_device} learner {where}{each}; a progress line "
                  "every 2 s", highlight=False, soft_wrap=True)
    return config, out


@command(actorq_app, "run", renames=RENAMES, path="actorq run", cls=ActorQCommand)
@user_errors
def actorq_run(
    ctx: typer.Context,
    env_id: Annotated[str, typer.Argument(
        help="environment id, e.g. CartPole-v1 or dm_control/cartpole-balance-v0")],
    *,
    resume: Annotated[bool, typer.Option("--resume", help="continue from OUT/checkpoint.pt")] = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
) -> None:
    """Train with a full-precision learner and quantized actors until the target reward.

    Example: quarl actorq run CartPole-v1 --algo dqn --actors 2 --actor-precision int8 --policy-layers 256,256
    """
    config, out = start(env_id, False, run_options(ctx), verbose)
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


@command(actorq_app, "compare", renames={**RENAMES, "--precision": "--precisions"}, path="actorq compare",
         cls=ActorQCommand)
@user_errors
def actorq_compare(
    ctx: typer.Context,
    env_id: Annotated[str, typer.Argument(help="environment id")],
    *,
    precisions: Annotated[str, typer.Option("--precisions", help="actor precisions, one run each")] = "fp32,int8",
    repeats: Annotated[int, typer.Option("--repeats", help="runs per precision (seeds seed, seed+1, ...)")] = 3,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
) -> None:
    """The same run once per actor precision and repeat, then the paper's table (time to
    reward, speedup, actor steps/s, where actor time goes), convergence, breakdown and
    energy plots. Finished runs are reused, so an interrupted comparison resumes.

    Example: quarl actorq compare CartPole-v1 --precisions fp32,int8 --repeats 3 --policy-layers 256,256
    """
    labels = registry_options.actor_precisions(precisions)
    validate.repeats(repeats)
    config, out = start(env_id, True, run_options(ctx), verbose)
    from quarl.actorq.compare import run_compare
    from quarl.evaluation.reports import print_table

    result = run_compare(config, labels, repeats, out,
                         on_run=lambda p, r: console.print(f"[bold]{p} actors, run {r + 1}/{repeats}[/bold]"),
                         on_progress=progress_line)
    print_table(result.table, f"ActorQ {config.algo} {env_id}: {config.actors} actors, policy "
                f"{RunSettings.parsed(ctx).policy_layers}", out_console)
    print_table(result.breakdown, "share of the actors' wall time per part (and the learner's busy share)",
                out_console)
    out_console.print(f"wrote {out}/compare.csv, compare.md, compare.json, breakdown.csv, breakdown.md, "
                      "breakdown.json, convergence.png, breakdown.png, energy.png")


@command(actorq_app, "model")
@user_errors
def actorq_model(
    runs: Annotated[list[Path], typer.Argument(
        help="run or compare folders whose summary.json give the component costs")],
    actors: Annotated[str, typer.Option("--actors", help="actor counts to predict")] = "1,2,4,8,16,32,64,128",
    nodes: Annotated[int, typer.Option("--nodes", help="nodes the actors are spread over")] = 1,
    cores_per_node: Annotated[int | None, typer.Option(
        "--cores-per-node", help="CPU cores per node (default: this machine's)")] = None,
    learner_speedup: Annotated[float, typer.Option(
        "--learner-speedup", help="learner steps this many times faster than measured (a GPU)")] = 1.0,
    bandwidth_gbps: Annotated[float | None, typer.Option(
        "--bandwidth-gbps", help="broadcaster-to-actor network, Gbit/s (default: the measured same-machine pulls)")
    ] = None,
    wire_bits: Annotated[str, typer.Option(
        "--wire-bits", help="also model float actors pulling weights at these widths, e.g. 16,8,4")] = "",
    validate_runs: Annotated[list[Path] | None, typer.Option(
        "--validate", help="runs to predict from RUNS' costs (e.g. 2-actor runs)")] = None,
    out: Annotated[Path, typer.Option("--out", help="output folder")] = outputs.ACTORQ_MODEL,
    verbose: Verbose = False,
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
