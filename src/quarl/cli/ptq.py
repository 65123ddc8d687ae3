"""``quarl ptq``: a policy at several precisions, with E% and a verdict per precision."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import typer

from quarl import outputs, registry_options

from quarl.core import validate
from quarl.cli.common import out_console, progress, say, say_reused, setup, user_errors
from quarl.cli.groups import (acting_options, common_options, deciding_options, evaluation_options, int_mode_options,
                              loading_options, with_options)
from quarl.cli.options import (CheckpointArg, EnvOpt, is_export, load, load_choice, OutOpt, PRECISIONS_HELP, protocol,
                               WideOpt)


DECIDE_EPISODES = 640
DECIDING = deciding_options(DECIDE_EPISODES, 5.0)
"""--decide-episodes / --decide-minutes of ptq and recover."""


def budget_note(decide_episodes: int, decide_seconds: float | None) -> str:
    """``deciding up to 640 episodes / 5 min`` for a title ('' where deciding is off)."""
    if not decide_episodes:
        return ""
    return f"deciding up to {decide_episodes} episodes" + (
        f" / {decide_seconds / 60:g} min" if decide_seconds else "")


def warm(workers: int) -> None:
    """Start the evaluation workers in the background once the policy has loaded (a bad
    checkpoint fails without starting them), so they are ready when calibration ends."""
    if workers > 1:
        from quarl.evaluation import parallel

        parallel.warm_up(workers)


def recover_hint(rows: Sequence[dict[str, Any]], checkpoint: Path, recovered: bool) -> None:
    """Where an int precision loses or is undecided, the command that repairs it."""
    for row in rows:
        label, verdict = str(row.get("precision", "")), str(row.get("verdict", "")).split(" ")[0]
        if label not in ("int8", "int4") or recovered:
            continue
        if verdict == "loses":
            say(f"{label} loses: recover it with quarl recover {checkpoint} --precision {label}")
        elif verdict == "undecided":  # more episodes may show it keeps: say both ways out
            say(f"{label} undecided: play more episodes (a larger --decide-episodes / --decide-minutes), or recover it with "
                f"quarl recover {checkpoint} --precision {label}")


DEFAULT_PRECISIONS = "fp32,fp16,bf16,int8,int4"


@user_errors
@load_choice
@with_options(evaluation_options, DECIDING, acting_options, int_mode_options, loading_options, common_options)
def ptq(
    checkpoint: Path = CheckpointArg,
    *,
    env: Optional[str] = EnvOpt,
    precisions: str = typer.Option(DEFAULT_PRECISIONS, help=PRECISIONS_HELP),
    episodes: int,
    decide_episodes: Optional[int],
    decide_minutes: float,
    sticky_actions: Optional[float],
    stochastic: Optional[bool],
    seed: int,
    n_envs: int,
    max_steps: Optional[int],
    workers: Optional[int],
    int8_weights: str,
    block_size: int,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool,
    wide: bool = WideOpt,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Evaluate a policy at several precisions and print precision | mean | std | E%.

    Example: quarl ptq ../shared/zoo/ppo/LunarLander-v2_1 --precisions fp32,fp16,int8 --episodes 20
    """
    setup(verbose)
    registry_options.eval_settings(episodes, seed, n_envs, max_steps, 1)  # the plain values first: a typo answers at once
    settings = registry_options.eval_settings(episodes, seed, n_envs, max_steps, validate.workers(workers))
    options = registry_options.quant_options(int8_weights, block_size)
    labels = registry_options.precisions(precisions, **options)
    decide_episodes = validate.decide_episodes(decide_episodes, default=DECIDE_EPISODES)
    decide_seconds = validate.decide_minutes(decide_minutes)
    from quarl.ptq import run_ptq
    from quarl.evaluation.reports import print_table, ptq_rows

    ckpt, spec = load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = protocol(ckpt.policy, spec, stochastic, sticky_actions)
    warm(settings.workers)
    out = validate.out_folder(outputs.apart_from_inputs(out, [checkpoint])) or outputs.claim(outputs.policy_folder(
        "ptq", checkpoint, spec.env_id), checkpoint)
    if is_export(checkpoint):  # an exported model: evaluated as it is, nothing re-quantized
        from quarl.ptq import run_artifact

        if precisions != DEFAULT_PRECISIONS:  # asked for rows an export cannot give
            say(f"{checkpoint} is an exported model: evaluated as exported ({ckpt.policy.precision}), --precisions "
                "does not apply (ptq the checkpoint it came from for the other rows)")
        with progress() as bar:
            task = bar.add_task(ckpt.policy.precision, total=episodes)
            records = run_artifact(ckpt.policy, spec, settings, out, lambda c, n: bar.update(task, completed=n),
                                   source=str(checkpoint))
        print_table(ptq_rows(records, identity=False), f"{checkpoint.name} ({ckpt.algo} {spec.env_id}), {episodes} "
                    "episodes", out_console, wide)
        say_reused(records, out / "results.jsonl")
        out_console.print(f"wrote {out}/results.jsonl, ptq.csv, ptq.md, ptq.json")
        return
    from quarl.workflows import recovered_cells

    fixed, recovered = recovered_cells(checkpoint, spec, ckpt.policy.stochastic, trust_pickle)
    budget = budget_note(decide_episodes, decide_seconds) if decide_episodes > episodes else ""
    title = f"{ckpt.algo} {spec.env_id}, {{played}}" + (f" ({budget})" if budget else "") + (
        ", stochastic" if ckpt.policy.stochastic else "")
    if recovered is not None:  # fp32 is the ORIGINAL policy, the recovered precision its real kernel
        title += f" (recovered {recovered}: fp32 is the original policy)"
    elif ckpt.policy.precision.startswith("qat"):  # a QAT run: every row starts from its fake-quantized network
        title += f" (a {ckpt.policy.precision} QAT net: fp32 is that net in fp32 arithmetic, not an fp32-trained agent)"
    cells = list(dict.fromkeys(["fp32", *labels]))
    with progress() as bar:
        limit = f" (≤{decide_episodes})" if decide_episodes > episodes else ""
        tasks = {c: bar.add_task(f"{c:>5}{limit}", total=episodes) for c in cells}

        def on_episodes(cell: str, n: int) -> None:  # --decide-episodes: a bar grows with its cell's episodes
            bar.update(tasks[cell], completed=n, total=max(n, bar.tasks[tasks[cell]].total or 0))

        records = run_ptq(ckpt.policy, spec, labels, settings, out, progress=on_episodes, source=str(checkpoint),
                          fixed=fixed, decide_episodes=decide_episodes, decide_seconds=decide_seconds, **options)
    from quarl.ptq import episodes_played

    rows = ptq_rows(records, identity=False)
    print_table(rows, title.replace("{played}", episodes_played(records, episodes)), out_console, wide)
    if len({r["episodes"] for r in rows}) > 1:  # deciding stopped some cells early: say what E pairs
        say("E of each row pairs its episodes with fp32's first ones of the same seeds (its episodes column); "
            "fp32's mean is over all of its own")
    recover_hint(rows, checkpoint, recovered is not None)
    say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, ptq.csv, ptq.md, ptq.json" + (", ptq.png" if len(records) > 1 else ""))
