"""``quarl bench``: latency and model size per precision."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import out_console, setup, user_errors
from quarl.cli.loading import read, with_env
from quarl.cli.settings import (
    LOADING,
    PRECISIONS_HELP,
    CheckpointArg,
    Env,
    GymPackages,
    LoadBest,
    LoadCheckpoint,
    Loading,
    LoadLastCheckpoint,
    TrustGymPackages,
    TrustPickle,
    Verbose,
)
from quarl.core import validate
from quarl.core.errors import QuarlError

Precisions = Annotated[str | None, typer.Option(
    "--precisions", help=PRECISIONS_HELP + " (default fp16,bf16,int8,int4; an exported model is timed as exported); "
                                           "PyTorch and ONNX Runtime fp32 are always measured")]
Batches = Annotated[str, typer.Option("--batches", help="comma list of batch sizes")]
Budget = Annotated[float, typer.Option("--budget", help="seconds of timing per cell")]
BenchOut = Annotated[Path | None, typer.Option("--out", help="also write bench.csv, bench.md, bench.json here")]


@command(app, "bench", renames={"--precision": "--precisions"})
@user_errors
def bench(
    checkpoint: CheckpointArg,
    *,
    env: Env = None,
    precisions: Precisions = None,
    batches: Batches = "1,256",
    budget: Budget = 1.0,
    out: BenchOut = None,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
    load_best: LoadBest = LOADING.load_best,
    load_checkpoint: LoadCheckpoint = None,
    load_last_checkpoint: LoadLastCheckpoint = LOADING.load_last_checkpoint,
) -> None:
    """Latency of the policy at each precision next to PyTorch fp32 (median per call, one
    thread), with the model's size in bytes (process memory is not reported: ONNX Runtime's
    arenas, not the model, set it).

    Example: quarl bench ../shared/zoo/dqn/CartPole-v1_1 --precisions fp32,int8
    """
    setup(verbose)
    loading = Loading(trust_pickle, load_best, load_checkpoint, load_last_checkpoint)
    checkpoint = loading.policy_path(checkpoint, env, out)
    early.precisions(precisions)
    validate.bench_budget(budget)
    validate.batch_sizes(batches)
    from quarl.evaluation.reports import print_table
    from quarl.export.bench import bench_checkpoint, write_bench
    from quarl.policies.onnx_artifact import ExportedModel

    configs = registry_options.configs(precisions or "fp16,bf16,int8,int4")
    sizes = validate.batch_sizes(batches)
    outputs.apart_from_inputs(out, [checkpoint])
    ckpt = read(checkpoint, env, trust_pickle)
    exported = ckpt.payload_of(ExportedModel) is not None  # what loaded, said before its env is made
    if precisions is not None and exported:
        raise QuarlError(f"{checkpoint} is an exported model: bench times it as exported; drop --precisions (or bench "
                         "the checkpoint it came from)")
    ckpt, spec = with_env(ckpt, env)
    rows = bench_checkpoint(ckpt.policy, spec, configs, sizes, budget, as_exported=exported)
    against = "itself (an exported model has no float network beside it)" if exported else "PyTorch fp32"
    print_table(rows, f"{ckpt.algo} {spec.env_id} ({ckpt.policy.precision} policy): latency in us, x = speedup over "
                      f"{against}", out_console)
    if out is not None:
        write_bench(rows, out, checkpoint, ckpt.policy)
        out_console.print(f"wrote {out}/bench.csv, bench.md, bench.json, provenance.json")
