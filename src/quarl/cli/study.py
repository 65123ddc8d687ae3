"""``quarl demo`` (every zoo agent at each precision, the paper's table) and ``quarl study``
(a stored grid of agents x precisions x seeds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.common import console, log, out_console, progress, say_reused, setup, user_errors
from quarl.cli.groups import (
    agents_acting_options,
    common_options,
    deciding_options,
    int_mode_options,
    loading_options,
    with_options,
)
from quarl.cli.options import PRECISIONS_HELP, MaxStepsOpt, NEnvsOpt, TrustGymPackagesOpt, WideOpt, WorkersOpt
from quarl.cli.ptq import budget_note, judging_of, warm
from quarl.core import validate

if TYPE_CHECKING:
    from quarl.evaluation.record import CellRecord

DemoEpisodesOpt = typer.Option(20, "--episodes", help="episodes per precision (episode i uses env seed i)")
StudyEpisodesOpt = typer.Option(20, "--episodes", help="episodes per cell (for --seeds s, episode i uses env seed "
                                                       "100000 × s + i)")
DEMO_N_ENVS = 8
DEMO_DECIDE_EPISODES, STUDY_DECIDE_EPISODES = 320, 640
DEMO_DECIDING = deciding_options(DEMO_DECIDE_EPISODES, 1.0)
STUDY_DECIDING = deciding_options(STUDY_DECIDE_EPISODES, 60.0)


@user_errors
@with_options(DEMO_DECIDING, agents_acting_options, common_options)
def demo(
    zoo: Optional[Path] = typer.Option(None, help="folder of trained agents: RL Zoo (ALGO/ENV_1/) or legacy "
                                                  "(ALGO/ENV.pkl); default ../shared/zoo, else a PPO CartPole trained here"),
    *,
    precisions: str = typer.Option("fp32,fp16,int8", help="precisions of the table"),
    episodes: int = DemoEpisodesOpt,
    decide_episodes: Optional[int],
    decide_minutes: float,
    insure: float,
    return_range: Optional[str],
    workers: Optional[int] = WorkersOpt,
    sticky_actions: Optional[float],
    stochastic: Optional[bool],
    out: Path = typer.Option(outputs.DEMO, "--out", parser=validate.out_option),
    train_steps: int = typer.Option(60_000, help="PPO CartPole steps when no zoo agents are found"),
    wide: bool = WideOpt,
    trust_gym_packages: bool = TrustGymPackagesOpt,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """The main job: every zoo agent at each precision, as the paper's table
    (policy | fp32 | fp16 | E_fp16 | int8 | E_int8). Without a zoo folder it first trains
    PPO on CartPole-v1 with Stable-Baselines3 (a few minutes).

    Example: quarl demo --zoo ../shared/zoo --episodes 20
    """
    setup(verbose)
    registry_options.check_eval_values(episodes, 0, DEMO_N_ENVS, None)  # before torch loads: a typo answers at once
    worker_count = validate.workers(workers)
    early.precisions(precisions)
    from quarl.demo import demo_agents, run_demo
    from quarl.evaluation.reports import print_table

    labels = registry_options.precisions(precisions)
    settings = registry_options.eval_settings(episodes, 0, DEMO_N_ENVS, None, worker_count)
    validate.out_folder(out)
    decide_episodes = validate.decide_episodes(decide_episodes, default=DEMO_DECIDE_EPISODES)
    decide_seconds = validate.decide_minutes(decide_minutes)
    judging = judging_of(insure, return_range)

    def say_training(where: Path) -> None:
        console.print(f"no zoo agents under {where}: training PPO on CartPole-v1 for {train_steps} steps")

    runs = demo_agents(zoo, out, train_steps, say_training)
    warm(settings.workers)
    with progress() as bar:
        def on_policy(name: str, cells: list[str]) -> Callable[[str, int], None]:
            tasks = {c: bar.add_task(f"{name} {c}", total=episodes) for c in cells}
            return lambda c, n: bar.update(tasks[c], completed=n, total=max(n, bar.tasks[tasks[c]].total or 0))

        played: list[CellRecord] = []
        rows = run_demo(runs, labels, settings, out, on_policy, decide_episodes, stochastic, sticky_actions,
                        decide_seconds, judging, on_records=lambda folder, records: played.extend(records))
    budget = budget_note(decide_episodes, decide_seconds)
    print_table(rows, f"mean return over {episodes}+ episodes" + (f" ({budget} per agent)" if budget else "")
                + " (E = (R_fp32 - R_q) / |R_fp32|, %)", out_console, wide)
    say_reused(played, out / "*" / "results.jsonl")
    out_console.print(f"wrote {out}/table.csv, table.md, table.json, table.png")


@user_errors
@with_options(STUDY_DECIDING, agents_acting_options, int_mode_options, loading_options, common_options)
def study(
    agents: list[Path] = typer.Argument(..., help="checkpoints, or folders of agents (RL Zoo ALGO/ENV_1, legacy ALGO/ENV.pkl)"),
    *,
    precisions: str = typer.Option("fp32,fp16,bf16,int8,int4,sim6", help=PRECISIONS_HELP + "; rec-int8, rec-int4: "
                                   "the agent recovered by quarl recover at that precision (once per agent, under "
                                   "OUT/recovered), its real kernel against the original fp32"),
    seeds: str = typer.Option("0,1,2", help="evaluation seeds: seed s runs episode i on env seed 100000 × s + i"),
    episodes: int = StudyEpisodesOpt,
    n_envs: int = NEnvsOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    int8_weights: str,
    block_size: int,
    trust_pickle: bool,
    trust_gym_packages: bool,
    workers: int = typer.Option(1, help="cells at once; more than 1 runs them on a local Ray"),
    address: Optional[str] = typer.Option(None, help="run the cells on this Ray cluster"),
    out: Path = typer.Option(outputs.STUDY, "--out", parser=validate.out_option,
                             help="folder of study.sqlite, the table and the plot"),
    decide_episodes: Optional[int],
    decide_minutes: float,
    insure: float,
    return_range: Optional[str],
    sticky_actions: Optional[float],
    stochastic: Optional[bool],
    wide: bool = WideOpt,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """A grid of (agent, precision, seed) cells stored in OUT/study.sqlite, one row per
    cell as it finishes; a rerun evaluates only the missing cells. Writes the paper's
    table (mean over seeds) and study.png (E% per precision, spread over seeds).

    Example: quarl study ../shared/zoo ../shared/paper-agents --precisions fp32,fp16,int8,int4 --seeds 0,1,2
    """
    setup(verbose)
    early.precisions(precisions)
    from quarl.evaluation.reports import print_table
    from quarl.study.grid import StudyConfig, find_agents, run_study
    from quarl.study.grid import cells as study_cells
    from quarl.study.store import StudyRecord
    from quarl.workflows import write_study_report

    options = registry_options.quant_options(int8_weights, block_size)
    seed_list = validate.seed_list(seeds)
    validate.count(max_steps, 1, "--max-steps")
    found = tuple(find_agents(agents))
    validate.out_folder(outputs.apart_from_inputs(out, found))
    labels = registry_options.precisions(precisions, recovered=True, **options)
    registry_options.eval_settings(episodes, 0, n_envs, max_steps)
    validate.check_workers(workers)  # before a Ray is asked for that many CPUs
    decide_episodes = validate.decide_episodes(decide_episodes, default=STUDY_DECIDE_EPISODES)
    decide_seconds = validate.decide_minutes(decide_minutes)
    judging = judging_of(insure, return_range)
    config = StudyConfig(found, tuple(labels), tuple(seed_list), episodes, n_envs, max_steps,
                         int8_weights, block_size, trust_pickle, workers, address, out, decide_episodes, stochastic,
                         sticky_actions, decide_seconds, judging)
    evaluated = 0
    with progress() as bar:
        task = bar.add_task("cells", total=len(study_cells(config)))

        def on_cell(record: StudyRecord, done: int, total: int) -> None:
            nonlocal evaluated
            evaluated += 1
            bar.update(task, completed=done, total=total)  # deciding verdicts adds cells
            log.info("%s %s seed %d: %.2f", record.policy, record.precision, record.seed, record.result.mean)

        records = run_study(config, on_cell)
        bar.update(task, completed=len(records))
    rows = write_study_report(records, labels, out, len(seed_list), judging)
    budget = budget_note(decide_episodes, decide_seconds)
    print_table(rows, f"mean return over {episodes} episodes x {len(seed_list)}+ seeds" + (f" ({budget})" if budget else "")
                + " (E%: reward lost against fp32)", out_console, wide)
    reused = len(records) - evaluated
    if reused > 0:  # a rerun evaluates only the cells the store lacks: say so, as ptq does
        out_console.print(f"reused {reused} finished cell{'s' * (reused != 1)} from {out}/study.sqlite (same policy "
                          "content, config and settings)")
    out_console.print(f"wrote {out}/study.sqlite ({len(records)} cells), table.csv, table.md, table.json, study.png")
