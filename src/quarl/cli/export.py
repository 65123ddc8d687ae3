"""``quarl export`` (the acting network as ONNX with its sidecar) and ``quarl bench``
(latency and model size per precision)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.common import console, out_console, setup, user_errors
from quarl.cli.groups import common_options, int_mode_options, loading_options, with_options
from quarl.cli.options import PRECISIONS_HELP, CheckpointArg, EnvOpt, OutOpt, is_export, load, load_choice, protocol
from quarl.core import validate
from quarl.core.errors import QuarlError

if TYPE_CHECKING:  # the CLI imports deploy (torch) only when a command runs
    from quarl.deploy import PortableCheck


@user_errors
@load_choice
@with_options(int_mode_options, loading_options, common_options)
def export(
    checkpoint: Path = CheckpointArg,
    *,
    env: Optional[str] = EnvOpt,
    precision: str = typer.Option("int8", help="fp32, int8 / int4 (fastest mode that agrees with fp32) or one mode "
                                               "(int8-dyn-channel, int4-weight-only...)"),
    out: Optional[Path] = OutOpt,
    int8_weights: str,
    block_size: int,
    seed: int = typer.Option(0, "--seed", hidden=True, help="ignored: calibration seeds are fixed (10,000..10,199)"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="cut calibration episodes after this many steps"),
    portable: bool = typer.Option(False, "--portable", help="int4 / int8-block: standard ONNX only (blocked "
                                  "DequantizeLinear + MatMul, opset 21) instead of ONNX Runtime's MatMulNBits, "
                                  "the same weights; the sidecar says how it computes against MatMulNBits"),
    stochastic: Optional[bool] = typer.Option(None, "--stochastic/--deterministic", help="how the deployed policy "
                                              "acts: a sampling categorical policy's int mode must keep its action "
                                              "distributions, a greedy one its argmax; default: the RL Zoo's "
                                              "(stochastic on Atari and MinAtar), as ptq"),
    trust_pickle: bool,
    trust_gym_packages: bool,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Export the acting network as OUT/policy.onnx (fp32 or real int8 / int4) plus
    OUT/policy.json, a sidecar with the observation normalization, the action head and the
    int mode that was chosen. ptq, bench and play take OUT (or OUT/policy.onnx) as a policy.

    Example: quarl export ../shared/zoo/ppo/LunarLander-v2_1 --precision int8 --out lunar-int8
    """
    setup(verbose)
    from quarl.workflows import export_checkpoint

    early.precisions(precision)
    options = registry_options.quant_options(int8_weights, block_size)
    registry_options.precisions(precision, **options)
    validate.seed(seed)
    if seed:
        console.print("note: export --seed is ignored and will be removed: calibration seeds are fixed, so export, "
                      "ptq and study choose the same int mode", highlight=False)
    validate.out_folder(outputs.apart_from_inputs(out, [checkpoint]))
    if is_export(checkpoint):
        raise QuarlError(f"{checkpoint} is already an exported model: export the checkpoint it came from (an SB3 .zip "
                         "or RL Zoo folder) at the precision you want; quarl ptq evaluates the .onnx as it is")
    ckpt, spec = load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = protocol(ckpt.policy, spec, stochastic, None)
    default = out is None
    out = out or outputs.precision_folder("export", checkpoint, spec.env_id, precision)
    exported = export_checkpoint(ckpt.policy, spec, precision, out, max_steps, portable, **options)
    if default:
        outputs.claim(out, checkpoint)
    mode = f", mode {exported.meta['quant']['mode']}" if "quant" in exported.meta else ""
    out_console.print(f"wrote {exported.onnx} ({exported.meta['onnx_bytes']:,} bytes{mode}) and {exported.sidecar}",
                      soft_wrap=True)
    inexact = portable_note(exported.meta.get("portable", {}))
    if inexact:
        out_console.print(inexact, soft_wrap=True, highlight=False)


def portable_note(check: Mapping[str, PortableCheck]) -> str:
    """The line that says where a --portable file does not compute what the contrib kernel
    computes under ONNX Runtime ('' where it does, or nothing was checked)."""
    runtime = check.get("onnxruntime_default")
    if runtime is None or runtime["max_abs_diff"] == 0:
        return ""
    diff, agree = runtime["max_abs_diff"], runtime["action_agreement"]
    return (f"note: under ONNX Runtime the portable file is not the contrib kernel's arithmetic here (largest output "
            f"difference {diff:.3g}, identical actions on {100 * agree:.1f}% of 512 calibration states; sidecar "
            "'portable'): ptq of the export folder judges the file as it runs")


@user_errors
@load_choice
@with_options(loading_options, common_options)
def bench(
    checkpoint: Path = CheckpointArg,
    *,
    env: Optional[str] = EnvOpt,
    precisions: Optional[str] = typer.Option(None, help=PRECISIONS_HELP + " (default fp16,bf16,int8,int4; an "
                                             "exported model is timed as exported); PyTorch and ONNX Runtime fp32 "
                                                                                 "are always measured"),
    batches: str = typer.Option("1,256", help="comma list of batch sizes"),
    budget: float = typer.Option(1.0, help="seconds of timing per cell"),
    out: Optional[Path] = typer.Option(None, "--out", help="also write bench.csv, bench.md, bench.json here"),
    trust_pickle: bool,
    trust_gym_packages: bool,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Latency of the policy at each precision next to PyTorch fp32 (median per call, one
    thread), with the model's size in bytes (process memory is not reported: ONNX Runtime's
    arenas, not the model, set it).

    Example: quarl bench ../shared/zoo/dqn/CartPole-v1_1 --precisions fp32,int8
    """
    setup(verbose)
    early.precisions(precisions)
    validate.bench_budget(budget)
    validate.batch_sizes(batches)
    from quarl.evaluation.reports import print_table
    from quarl.workflows import bench_checkpoint, write_bench

    exported = is_export(checkpoint)
    if precisions is not None and exported:
        raise QuarlError(f"{checkpoint} is an exported model: bench times it as exported; drop --precisions (or bench "
                         "the checkpoint it came from)")
    labels = registry_options.precisions(precisions or "fp16,bf16,int8,int4")
    validate.bench_budget(budget)
    sizes = validate.batch_sizes(batches)
    outputs.apart_from_inputs(out, [checkpoint])
    ckpt, spec = load(checkpoint, env, trust_pickle)
    rows = bench_checkpoint(ckpt.policy, spec, labels, sizes, budget, as_exported=exported)
    against = "itself (an exported model has no float network beside it)" if exported else "PyTorch fp32"
    print_table(rows, f"{ckpt.algo} {spec.env_id} ({ckpt.policy.precision} policy): latency in us, x = speedup over "
                      f"{against}", out_console)
    if out is not None:
        write_bench(rows, out, checkpoint, ckpt.policy)
        out_console.print(f"wrote {out}/bench.csv, bench.md, bench.json, provenance.json")
