"""``quarl sweep`` (reward against simulated n-bit weights) and ``quarl analyze`` (the
weights themselves: statistics, histograms, KL and SQNR per width)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.common import float_checkpoint, out_console, progress, say_reused, setup, user_errors
from quarl.cli.groups import common_options, evaluation_options, loading_options, with_options
from quarl.cli.options import (
    BitsOpt,
    BlockSizeOpt,
    CheckpointArg,
    EnvOpt,
    GranularityOpt,
    OutOpt,
    SchemeOpt,
    checked_path,
    load,
    load_choice,
)
from quarl.cli.ptq import warm
from quarl.core import validate


@user_errors
@load_choice
@with_options(evaluation_options, loading_options, common_options)
def sweep(
    checkpoint: Path = CheckpointArg,
    *,
    env: Optional[str] = EnvOpt,
    bits: str = BitsOpt,
    scheme: str = SchemeOpt,
    granularity: str = GranularityOpt,
    activations: bool = typer.Option(False, "--activations", help="also quantize layer outputs (calibrated ranges)"),
    episodes: int,
    seed: int,
    n_envs: int,
    max_steps: Optional[int],
    workers: Optional[int],
    block_size: int = BlockSizeOpt,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool,
    trust_gym_packages: bool,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Evaluate fp32 and simulated n-bit weights for each width; write a CSV and the reward-vs-bits plot.

    Example: quarl sweep ../shared/zoo/dqn/CartPole-v1_1 --bits 8,6,4,3,2 --episodes 10
    """
    setup(verbose)
    widths = validate.bit_widths(bits)  # before torch loads: a typo answers at once
    registry_options.check_eval_values(episodes, seed, n_envs, max_steps)
    worker_count = validate.workers(workers)
    from quarl.evaluation.reports import print_table, ptq_rows
    from quarl.ptq import run_sweep
    from quarl.quant.config import QuantConfig

    QuantConfig(precision="nbit", scheme=scheme, granularity=granularity, block_size=block_size)  # validates all
    settings = registry_options.eval_settings(episodes, seed, n_envs, max_steps, worker_count)
    float_checkpoint(checkpoint, "sweep re-quantizes the float weights")
    ckpt, spec = load(checkpoint, env, trust_pickle)
    warm(settings.workers)
    variant = outputs.sweep_variant(scheme, granularity, activations)
    out = validate.out_folder(outputs.apart_from_inputs(out, [checkpoint])) or outputs.claim(outputs.sweep_folder(
        checkpoint, spec.env_id, scheme, granularity, activations), checkpoint)
    labels = ["fp32", *(f"sim{n}" for n in widths)]
    with progress() as bar:
        tasks = {c: bar.add_task(f"{c:>5}", total=episodes) for c in labels}
        records = run_sweep(ckpt.policy, spec, widths, settings, out, scheme, granularity,
                            progress=lambda c, n: bar.update(tasks[c], completed=n),
                            title=f"{ckpt.algo} {spec.env_id} ({variant})", activations=activations,
                            block_size=block_size, source=str(checkpoint))
    what = "weights and activations" if activations else "weights"
    print_table(ptq_rows(records, identity=False), f"{ckpt.algo} {spec.env_id}: n-bit {what} ({scheme}, {granularity})",
                out_console)
    say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, sweep.csv, sweep.md, sweep.json, sweep.png")


@user_errors
@with_options(loading_options, common_options)
def analyze(
    checkpoint: Path = CheckpointArg,
    *,
    bits: str = BitsOpt,
    scheme: str = SchemeOpt,
    granularity: str = GranularityOpt,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool,
    trust_gym_packages: bool,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Per-layer weight statistics, histograms, and the KL divergence of n-bit weights.

    Example: quarl analyze ../shared/zoo/dqn/CartPole-v1_1 --out results/analyze/dqn
    """
    setup(verbose)
    widths = validate.bit_widths(bits)  # before torch loads: a typo answers at once
    checked_path(checkpoint)
    early.out_folder(out, [checkpoint])
    from quarl.checkpoints import load_checkpoint
    from quarl.evaluation.reports import print_table
    from quarl.ptq import run_analyze
    from quarl.quant.analysis import kl_bins, per_layer_table
    from quarl.quant.config import QuantConfig

    QuantConfig(precision="nbit", scheme=scheme, granularity=granularity)
    float_checkpoint(checkpoint, "analyze reads the float weights")
    ckpt = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    out = validate.out_folder(outputs.apart_from_inputs(out, [checkpoint])) or outputs.claim(
        outputs.analyze_folder(checkpoint), checkpoint)
    stats, kl = run_analyze(ckpt.policy, widths, out, scheme, granularity, title=f"{ckpt.algo} {checkpoint.name}")
    print_table(
        [r.row(4) for r in stats],
        f"{ckpt.algo} {checkpoint.name}: weights",
        out_console,
    )
    print_table(per_layer_table(kl), "per layer: SQNR of n-bit weights (dB, no binning) and KL(fp32 || n-bit) of "
                f"{kl_bins(widths)}-bin histograms",
                out_console)
    out_console.print(f"wrote {out}/weights.csv, weights.md, weights.json, kl.csv, kl.md, kl.json, histograms.png, "
                      "kl.png")
