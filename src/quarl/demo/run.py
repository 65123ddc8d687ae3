"""The main job (``quarl demo``): every agent of a zoo folder at each precision, as the
paper's table (policy | fp32 | fp16 | E_fp16 | int8 | E_int8), with the int kernel each
int column ran. Without agents it first trains PPO on CartPole-v1."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from quarl.checkpoints import load_checkpoint
from quarl.core.errors import QuarlError
from quarl.core.logs import about
from quarl.core.table import Row
from quarl.evaluation.cells import EvalSettings, Progress
from quarl.evaluation.episodes import protocol
from quarl.evaluation.record import CellRecord
from quarl.evaluation.reports import paper_table, plot_verdicts, write_rows
from quarl.policies.checkpoint import resolve_env_spec
from quarl.ptq.run import run_ptq
from quarl.quantization.config import QuantConfig, as_config
from quarl.verdict import Judging

DEFAULT_ZOO = Path("../shared/zoo")


def demo_agents(zoo: Path | None, out: Path, train_steps: int,
                on_train: Callable[[Path], None] | None = None) -> list[Path]:
    """The agents under ``zoo`` (default :data:`DEFAULT_ZOO`); none there: a PPO
    CartPole-v1 trained for ``train_steps`` under ``OUT/trained`` (reused once trained)."""
    from quarl.study.grid import find_agents

    if zoo is not None and not zoo.is_dir():
        raise QuarlError(f"--zoo {str(zoo)!r} is not a folder of agents")
    zoo = zoo or DEFAULT_ZOO
    runs = find_agents([zoo]) if zoo.is_dir() else []
    if runs:
        return runs
    from quarl.training.sb3_train import TrainConfig, train

    run_dir = out / "trained" / "ppo" / "CartPole-v1_1"
    if not (run_dir / "CartPole-v1.zip").exists():
        if on_train:
            on_train(zoo)
        train(TrainConfig("ppo", "CartPole-v1", timesteps=train_steps, eval_freq=0, progress_bar=True,
                          run_dir=run_dir))
    return [run_dir]


def run_demo(runs: Sequence[Path], precisions: Sequence[QuantConfig | str], settings: EvalSettings, out: Path,
             on_policy: Callable[[str, list[str]], Progress] | None = None,
             decide_episodes: int = 0, stochastic: bool | None = None,
             sticky_actions: float | None = None, decide_seconds: float | None = None,
             judging: Judging = Judging(),
             on_records: Callable[[Path, list[CellRecord]], None] | None = None) -> list[Row]:
    """Evaluate every agent at fp32 and ``precisions`` (configs, as ``quarl demo`` parses them
    once; a label, parsed once here) (each agent's cells under its own
    folder, resumable); write ``OUT/table.{csv,md,json}`` and ``table.png`` (E with its
    interval per agent and precision) and return its rows.
    ``on_policy(name, cells)`` gives the progress callback for one agent's cells;
    ``decide_episodes``, ``decide_seconds`` (per agent): see :func:`quarl.ptq.run.decide`;
    ``stochastic`` / ``sticky_actions``: see :func:`quarl.evaluation.episodes.protocol` (sticky
    actions only where the env has them);
    ``on_records(folder, records)``: each agent's cells once played or reused from ``folder``."""
    per_policy: dict[str, list[CellRecord]] = {}
    modes: dict[str, dict[str, str]] = {}
    configs = [as_config(p) for p in precisions]
    cells = list(dict.fromkeys(["fp32", *(c.label for c in configs)]))
    for run in runs:
        ckpt = load_checkpoint(run)
        spec, ckpt.policy = protocol(ckpt.policy, resolve_env_spec(ckpt, None), stochastic, sticky_actions,
                                     where_supported=True)
        name = f"{ckpt.algo} {spec.env_id}"
        progress = on_policy(name, cells) if on_policy else None
        folder = out / f"{run.parent.name}-{run.name.removesuffix('.pkl')}"
        with about(name):  # its warnings name it
            per_policy[name] = run_ptq(ckpt.policy, spec, configs, settings, folder, progress=progress,
                                       source=str(run), decide_episodes=decide_episodes,
                                       decide_seconds=decide_seconds, judging=judging)
        if on_records is not None:
            on_records(folder, per_policy[name])
        modes[name] = {r.precision: r.result.quant["mode"] for r in per_policy[name] if r.result.quant}
    rows = paper_table(per_policy, cells, judging)
    for row in rows:  # which real kernel each int column ran
        chosen = modes.get(str(row["policy"]), {})
        if chosen:
            row["int modes"] = ", ".join(m.split("-", 1)[1] for m in chosen.values())
    write_rows(rows, out, "table")
    from quarl.ptq.run import episodes_played

    played = episodes_played([r for records in per_policy.values() for r in records], settings.episodes)
    plot_verdicts(per_policy, out / "table.png", f"every agent against fp32, {played}", judging)
    return rows
