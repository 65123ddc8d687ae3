"""``quarl demo`` (every zoo agent at each precision, the paper's table) and ``quarl study``
(a stored grid of agents x precisions x seeds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import console, log, out_console, progress, say_reused, setup, user_errors
from quarl.cli.ptq import warm
from quarl.cli.settings import (
    EVALUATION,
    INSURE,
    INT_OPTIONS,
    PRECISIONS_HELP,
    AgentsStickyActions,
    BlockSize,
    DecideMinutes,
    Deciding,
    Evaluation,
    GymPackages,
    Insure,
    Int8Weights,
    IntOptions,
    MaxSteps,
    NEnvs,
    ReturnRange,
    Stochastic,
    TrustGymPackages,
    TrustPickle,
    Verbose,
    Wide,
    Workers,
    decide_episodes_option,
)
from quarl.core import validate

if TYPE_CHECKING:
    from quarl.evaluation.record import CellRecord

DEMO_N_ENVS = 8
DEMO_DECIDE_EPISODES, STUDY_DECIDE_EPISODES = 320, 640
DemoEpisodes = Annotated[int, typer.Option("--episodes", help="episodes per precision (episode i uses env seed i)")]
StudyEpisodes = Annotated[int, typer.Option(
    "--episodes", help="episodes per cell (for --seeds s, episode i uses env seed 100000 × s + i)")]
DemoDecideEpisodes = Annotated[int | None, decide_episodes_option(DEMO_DECIDE_EPISODES)]
StudyDecideEpisodes = Annotated[int | None, decide_episodes_option(STUDY_DECIDE_EPISODES)]
Zoo = Annotated[Path | None, typer.Option(
    "--zoo", help="folder of trained agents: RL Zoo (ALGO/ENV_1/) or legacy (ALGO/ENV.pkl); default ../shared/zoo, "
                  "else a PPO CartPole trained here")]
DemoPrecisions = Annotated[str, typer.Option("--precisions", help="precisions of the table")]
DemoOut = Annotated[Path, typer.Option("--out", parser=validate.out_option)]
TrainSteps = Annotated[int, typer.Option("--train-steps", help="PPO CartPole steps when no zoo agents are found")]


@command(app, "demo", renames={"--precision": "--precisions"})
@user_errors
def demo(
    zoo: Zoo = None,
    *,
    precisions: DemoPrecisions = "fp32,fp16,int8",
    episodes: DemoEpisodes = EVALUATION.episodes,
    decide_episodes: DemoDecideEpisodes = None,
    decide_minutes: DecideMinutes = 1.0,
    insure: Insure = INSURE,
    return_range: ReturnRange = None,
    workers: Workers = None,
    sticky_actions: AgentsStickyActions = None,
    stochastic: Stochastic = None,
    out: DemoOut = outputs.DEMO,
    train_steps: TrainSteps = 60_000,
    wide: Wide = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
) -> None:
    """The main job: every zoo agent at each precision, as the paper's table
    (policy | fp32 | fp16 | E_fp16 | int8 | E_int8). Without a zoo folder it first trains
    PPO on CartPole-v1 with Stable-Baselines3 (a few minutes).

    Example: quarl demo --zoo ../shared/zoo --episodes 20
    """
    setup(verbose)
    evaluation = Evaluation(episodes, 0, DEMO_N_ENVS, None, workers).checked()  # before torch loads: a typo answers
    worker_count = evaluation.worker_count()
    early.precisions(precisions)
    from quarl.demo.run import demo_agents, run_demo
    from quarl.evaluation.reports import print_table

    configs = registry_options.configs(precisions)
    settings = evaluation.settings(worker_count)
    validate.out_folder(out)
    deciding = Deciding.parse(decide_episodes, decide_minutes, insure, return_range, DEMO_DECIDE_EPISODES)

    def say_training(where: Path) -> None:
        console.print(f"no zoo agents under {where}: training PPO on CartPole-v1 for {train_steps} steps")

    runs = demo_agents(zoo, out, train_steps, say_training)
    warm(settings.workers)
    with progress() as bar:
        def on_policy(name: str, cells: list[str]) -> Callable[[str, int], None]:
            tasks = {c: bar.add_task(f"{name} {c}", total=episodes) for c in cells}
            return lambda c, n: bar.update(tasks[c], completed=n, total=max(n, bar.tasks[tasks[c]].total or 0))

        played: list[CellRecord] = []
        rows = run_demo(runs, configs, settings, out, on_policy, deciding.episodes, stochastic, sticky_actions,
                        deciding.seconds, deciding.judging, on_records=lambda folder, records: played.extend(records))
    budget = deciding.budget()
    print_table(rows, f"mean return over {episodes}+ episodes" + (f" ({budget} per agent)" if budget else "")
                + " (E = (R_fp32 - R_q) / |R_fp32|, %)", out_console, wide)
    say_reused(played, out / "*" / "results.jsonl")
    out_console.print(f"wrote {out}/table.csv, table.md, table.json, table.png")


@command(app, "study", renames={"--precision": "--precisions"})
@user_errors
def study(
    agents: Annotated[list[Path], typer.Argument(
        help="checkpoints, or folders of agents (RL Zoo ALGO/ENV_1, legacy ALGO/ENV.pkl)")],
    *,
    precisions: Annotated[str, typer.Option("--precisions", help=PRECISIONS_HELP + "; rec-int8, rec-int4: the agent "
        "recovered by quarl recover at that precision (once per agent, under OUT/recovered), its real kernel against "
        "the original fp32")] = "fp32,fp16,bf16,int8,int4,sim6",
    seeds: Annotated[str, typer.Option(
        "--seeds", help="evaluation seeds: seed s runs episode i on env seed 100000 × s + i")] = "0,1,2",
    episodes: StudyEpisodes = EVALUATION.episodes,
    n_envs: NEnvs = EVALUATION.n_envs,
    max_steps: MaxSteps = None,
    int8_weights: Int8Weights = INT_OPTIONS.int8_weights,
    block_size: BlockSize = INT_OPTIONS.block_size,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    workers: Annotated[int, typer.Option("--workers", help="cells at once; more than 1 runs them on a local Ray")] = 1,
    address: Annotated[str | None, typer.Option("--address", help="run the cells on this Ray cluster")] = None,
    out: Annotated[Path, typer.Option(
        "--out", parser=validate.out_option, help="folder of study.sqlite, the table and the plot")] = outputs.STUDY,
    decide_episodes: StudyDecideEpisodes = None,
    decide_minutes: DecideMinutes = 60.0,
    insure: Insure = INSURE,
    return_range: ReturnRange = None,
    sticky_actions: AgentsStickyActions = None,
    stochastic: Stochastic = None,
    wide: Wide = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
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
    from quarl.study.report import write_study_report
    from quarl.study.store import StudyRecord

    base = IntOptions(int8_weights, block_size).config()
    seed_list = validate.seed_list(seeds)
    validate.count(max_steps, 1, "--max-steps")
    found = tuple(find_agents(agents))
    validate.out_folder(outputs.apart_from_inputs(out, found))
    columns = registry_options.columns(precisions, base)
    Evaluation(episodes, 0, n_envs, max_steps).checked().settings()  # each value checked
    validate.check_workers(workers)  # before a Ray is asked for that many CPUs
    deciding = Deciding.parse(decide_episodes, decide_minutes, insure, return_range, STUDY_DECIDE_EPISODES)
    config = StudyConfig(found, tuple(columns), tuple(seed_list), episodes, n_envs, max_steps, trust_pickle, workers,
                         address, out, deciding.episodes, stochastic, sticky_actions, deciding.seconds,
                         deciding.judging)
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
    rows = write_study_report(records, [c.label for c in columns], out, len(seed_list), deciding.judging)
    budget = deciding.budget()
    print_table(rows, f"mean return over {episodes} episodes x {len(seed_list)}+ seeds"
                + (f" ({budget})" if budget else "")
                + " (E%: reward lost against fp32)", out_console, wide)
    reused = len(records) - evaluated
    if reused > 0:  # a rerun evaluates only the cells the store lacks: say so, as ptq does
        out_console.print(f"reused {reused} finished cell{'s' * (reused != 1)} from {out}/study.sqlite (same policy "
                          "content, config and settings)")
    out_console.print(f"wrote {out}/study.sqlite ({len(records)} cells), table.csv, table.md, table.json, study.png")
