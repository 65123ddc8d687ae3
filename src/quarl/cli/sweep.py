"""``quarl sweep`` (reward against simulated n-bit weights) and ``quarl analyze`` (the
weights themselves: statistics, histograms, KL and SQNR per width)."""

from __future__ import annotations

from typing import Annotated

import typer

from quarl import outputs
from quarl.cli import early
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import float_checkpoint, out_console, progress, say_reused, setup, user_errors
from quarl.cli.loading import load
from quarl.cli.ptq import warm
from quarl.cli.settings import (
    EVALUATION,
    INT_OPTIONS,
    LOADING,
    Bits,
    BlockSize,
    CheckpointArg,
    Env,
    Episodes,
    Evaluation,
    Granularity,
    GymPackages,
    LoadBest,
    LoadCheckpoint,
    Loading,
    LoadLastCheckpoint,
    MaxSteps,
    NEnvs,
    Out,
    Scheme,
    Seed,
    TrustGymPackages,
    TrustPickle,
    Verbose,
    Workers,
    checked_path,
)
from quarl.core import validate

BITS = "8,7,6,5,4,3,2"
Activations = Annotated[bool, typer.Option("--activations", help="also quantize layer outputs (calibrated ranges)")]


@command(app, "sweep")
@user_errors
def sweep(
    checkpoint: CheckpointArg,
    *,
    env: Env = None,
    bits: Bits = BITS,
    scheme: Scheme = "quarl",
    granularity: Granularity = "auto",
    activations: Activations = False,
    episodes: Episodes = EVALUATION.episodes,
    seed: Seed = EVALUATION.seed,
    n_envs: NEnvs = EVALUATION.n_envs,
    max_steps: MaxSteps = None,
    workers: Workers = None,
    block_size: BlockSize = INT_OPTIONS.block_size,
    out: Out = None,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
    load_best: LoadBest = LOADING.load_best,
    load_checkpoint: LoadCheckpoint = None,
    load_last_checkpoint: LoadLastCheckpoint = LOADING.load_last_checkpoint,
) -> None:
    """Evaluate fp32 and simulated n-bit weights for each width; write a CSV and the reward-vs-bits plot.

    Example: quarl sweep ../shared/zoo/dqn/CartPole-v1_1 --bits 8,6,4,3,2 --episodes 10
    """
    setup(verbose)
    loading = Loading(trust_pickle, load_best, load_checkpoint, load_last_checkpoint)
    checkpoint = loading.policy_path(checkpoint, env, out)
    widths = validate.bit_widths(bits)  # before torch loads: a typo answers at once
    evaluation = Evaluation(episodes, seed, n_envs, max_steps, workers).checked()
    worker_count = evaluation.worker_count()
    from quarl.evaluation.reports import print_table, ptq_rows
    from quarl.ptq.sweep import run_sweep
    from quarl.quantization.config import QuantConfig

    # every width's config but its bits, validated once (one line for a bad value) and passed down
    base = QuantConfig(precision="nbit", scheme=scheme, granularity=granularity, block_size=block_size,
                       activations=activations)
    settings = evaluation.settings(worker_count)
    float_checkpoint(checkpoint, "sweep re-quantizes the float weights")
    ckpt, spec = load(checkpoint, env, trust_pickle)
    warm(settings.workers)
    variant = outputs.sweep_variant(scheme, granularity, activations)
    out = validate.out_folder(outputs.apart_from_inputs(out, [checkpoint])) or outputs.claim(outputs.sweep_folder(
        checkpoint, spec.env_id, scheme, granularity, activations), checkpoint)
    labels = ["fp32", *(f"sim{n}" for n in widths)]
    with progress() as bar:
        tasks = {c: bar.add_task(f"{c:>5}", total=episodes) for c in labels}
        records = run_sweep(ckpt.policy, spec, widths, settings, out, base,
                            progress=lambda c, n: bar.update(tasks[c], completed=n),
                            title=f"{ckpt.algo} {spec.env_id} ({variant})", source=str(checkpoint))
    what = "weights and activations" if activations else "weights"
    print_table(ptq_rows(records, identity=False), f"{ckpt.algo} {spec.env_id}: n-bit {what} ({scheme}, {granularity})",
                out_console)
    say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, sweep.csv, sweep.md, sweep.json, sweep.png")


@command(app, "analyze")
@user_errors
def analyze(
    checkpoint: CheckpointArg,
    *,
    bits: Bits = BITS,
    scheme: Scheme = "quarl",
    granularity: Granularity = "auto",
    out: Out = None,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
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
    from quarl.ptq.sweep import run_analyze
    from quarl.quant.analysis import kl_bins, per_layer_table
    from quarl.quantization.config import QuantConfig

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
