"""``quarl export``: the acting network as ONNX with its sidecar."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

import typer

from quarl import outputs
from quarl.cli import early, registry_options
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import console, out_console, setup, user_errors
from quarl.cli.loading import protocol, read, with_env
from quarl.cli.settings import (
    INT_OPTIONS,
    LOADING,
    Acting,
    BlockSize,
    CheckpointArg,
    Env,
    GymPackages,
    Int8Weights,
    IntOptions,
    LoadBest,
    LoadCheckpoint,
    Loading,
    LoadLastCheckpoint,
    Out,
    TrustGymPackages,
    TrustPickle,
    Verbose,
)
from quarl.core import validate
from quarl.core.errors import QuarlError

if TYPE_CHECKING:  # the CLI imports deploy (torch) only when a command runs
    from quarl.export.artifact import PortableCheck
    from quarl.quantization.config import QuantConfig

Precision = Annotated[str, typer.Option(
    "--precision", help="fp32, int8 / int4 (fastest mode that agrees with fp32) or one mode (int8-dyn-channel, "
                        "int4-weight-only...)")]
IgnoredSeed = Annotated[int, typer.Option(
    "--seed", hidden=True, help="ignored: calibration seeds are fixed (10,000..10,199)")]
CalibrationSteps = Annotated[int | None, typer.Option(
    "--max-steps", help="cut calibration episodes after this many steps")]
Portable = Annotated[bool, typer.Option(
    "--portable", help="int4 / int8-block: standard ONNX only (blocked DequantizeLinear + MatMul, opset 21) instead "
                       "of ONNX Runtime's MatMulNBits, the same weights; the sidecar says how it computes against "
                       "MatMulNBits")]
DeployedStochastic = Annotated[bool | None, typer.Option(
    "--stochastic/--deterministic", help="how the deployed policy acts: a sampling categorical policy's int mode "
    "must keep its action distributions, a greedy one its argmax; default: the RL Zoo's (stochastic on Atari and "
    "MinAtar), as ptq")]


@command(app, "export", renames={"--precisions": "--precision"})
@user_errors
def export(
    checkpoint: CheckpointArg,
    *,
    env: Env = None,
    precision: Precision = "int8",
    out: Out = None,
    int8_weights: Int8Weights = INT_OPTIONS.int8_weights,
    block_size: BlockSize = INT_OPTIONS.block_size,
    seed: IgnoredSeed = 0,
    max_steps: CalibrationSteps = None,
    portable: Portable = False,
    stochastic: DeployedStochastic = None,
    trust_pickle: TrustPickle = False,
    trust_gym_packages: TrustGymPackages = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
    load_best: LoadBest = LOADING.load_best,
    load_checkpoint: LoadCheckpoint = None,
    load_last_checkpoint: LoadLastCheckpoint = LOADING.load_last_checkpoint,
) -> None:
    """Export the acting network as OUT/policy.onnx (fp32 or real int8 / int4) plus
    OUT/policy.json, a sidecar with the observation normalization, the action head and the
    int mode that was chosen. ptq, bench and play take OUT (or OUT/policy.onnx) as a policy.

    Example: quarl export ../shared/zoo/ppo/LunarLander-v2_1 --precision int8 --out lunar-int8
    """
    setup(verbose)
    loading = Loading(trust_pickle, load_best, load_checkpoint, load_last_checkpoint)
    checkpoint = loading.policy_path(checkpoint, env, out)
    early.precisions(precision)
    config = one_precision(precision, IntOptions(int8_weights, block_size).config())
    validate.seed(seed)
    if seed:
        console.print("note: export --seed is ignored and will be removed: calibration seeds are fixed, so export, "
                      "ptq and study choose the same int mode", highlight=False)
    validate.out_folder(outputs.apart_from_inputs(out, [checkpoint]))
    from quarl.policies.onnx_artifact import ExportedModel

    ckpt = read(checkpoint, env, trust_pickle)
    if ckpt.payload_of(ExportedModel) is not None:  # what loaded, said before its env is made
        raise QuarlError(f"{checkpoint} is already an exported model: export the checkpoint it came from (an SB3 .zip "
                         "or RL Zoo folder) at the precision you want; quarl ptq evaluates the .onnx as it is")
    ckpt, spec = with_env(ckpt, env)
    spec, ckpt.policy = protocol(ckpt.policy, spec, Acting(stochastic))
    from quarl.export.artifact import export_checkpoint  # torch and ONNX, once every option is checked

    default = out is None
    out = out or outputs.precision_folder("export", checkpoint, spec.env_id, precision)
    exported = export_checkpoint(ckpt.policy, spec, config, out, max_steps, portable)
    if default:
        outputs.claim(out, checkpoint)
    mode = f", mode {exported.meta['quant']['mode']}" if "quant" in exported.meta else ""
    out_console.print(f"wrote {exported.onnx} ({exported.meta['onnx_bytes']:,} bytes{mode}) and {exported.sidecar}",
                      soft_wrap=True)
    inexact = portable_note(exported.meta.get("portable", {}))
    if inexact:
        out_console.print(inexact, soft_wrap=True, highlight=False)


def one_precision(text: str, base: QuantConfig) -> QuantConfig:
    """--precision parsed once onto the int options: one label (a list is refused as the one
    label it is not)."""
    configs = registry_options.configs(text, base)
    if "," in text:  # an export is one model
        from quarl.quantization.config import allowed_precisions

        raise validate.unknown_precision(text, allowed_precisions())
    return configs[0]


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
