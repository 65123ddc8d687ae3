"""``quarl train`` (Stable-Baselines3 with the RL Zoo's hyperparameters, optionally QAT or
mixed precision) and ``quarl qat`` (QAT against PTQ at several widths)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from quarl import outputs
from quarl.cli import registry_options
from quarl.cli.common import console, out_console, setup, user_errors
from quarl.cli.groups import common_options, with_options
from quarl.cli.options import EpisodesOpt, NEnvsOpt, OutOpt, SchemeOpt, SeedOpt
from quarl.core import validate

AlgoArg = typer.Argument(None, help="{train_algorithms}")
EnvIdArg = typer.Argument(None, help="gymnasium env id, e.g. CartPole-v1, Pendulum-v1, PongNoFrameskip-v4")
AlgoOpt = typer.Option(None, "--algo", help="the algorithm, as the RL Zoo's train.py takes it (or as the first argument)")
EnvOptZoo = typer.Option(None, "--env", help="the env id, as the RL Zoo's train.py takes it (or as the second argument)")
TimestepsOpt = typer.Option(None, "--timesteps", "-n", "--n-timesteps",
                            help="env steps (default: the RL Zoo's budget for this env)")
HpOpt = typer.Option([], "--hp", "--hyperparams", help="override a zoo hyperparameter, KEY=VALUE or KEY:VALUE "
                                                       "as the RL Zoo writes it (repeatable)")


@user_errors
@with_options(common_options)
def train_cmd(
    algo: Optional[str] = AlgoArg,
    *,
    env_id: Optional[str] = EnvIdArg,
    algo_opt: Optional[str] = AlgoOpt,
    env_opt: Optional[str] = EnvOptZoo,
    timesteps: Optional[int] = TimestepsOpt,
    seed: int = SeedOpt,
    out: Path = typer.Option(outputs.TRAIN_RUNS, "--out", "-f", "--log-folder", parser=validate.out_option,
                             help="run folders go to OUT/ALGO/ENV_N"),
    precision: str = typer.Option("fp32", "--train-precision",
                                  help="gradient updates in {train_precisions} (autocast)"),
    qat_bits: Optional[int] = typer.Option(None, "--qat-bits", help="quantization-aware training at this width (2..16)"),
    quant_delay: Optional[int] = typer.Option(None, "--quant-delay", help="QAT: fp32 steps first (default: half)"),
    hp: list[str] = HpOpt,
    eval_freq: int = typer.Option(10_000, help="evaluate every N env steps (0: never)"),
    checkpoint_freq: int = typer.Option(0, "--checkpoint-freq", "--save-freq",
                                        help="checkpoint every N env steps (0: a tenth of the run)"),
    resume: bool = typer.Option(False, "--resume", help="continue the newest run that has a checkpoint"),
    eval_episodes: int = typer.Option(5, "--eval-episodes", help="episodes of each evaluation (every --eval-freq "
                                                                 "steps, and the final one)"),
    trust_pickle: bool = typer.Option(False, "--trust-pickle", help="--resume: allow the replay / normalization "
                                                                    "pickles of an older quarl's checkpoint"),
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Train with Stable-Baselines3 and the RL Zoo's hyperparameters; save an RL Zoo run
    folder (with TensorBoard logs and checkpoints) that ptq / sweep load as is.

    Example: quarl train ppo CartPole-v1 --qat-bits 4 --timesteps 50000
    """
    setup(verbose)
    from quarl.workflows import evaluate_trained, train_config

    algo, env_id = validate.algo_and_env(algo, env_id, algo_opt, env_opt)
    config = train_config(algo, env_id, timesteps, seed, out, precision, qat_bits, quant_delay, hp, eval_freq,
                          eval_episodes, checkpoint_freq, trust_pickle,
                          on_progress=lambda line: console.print(line, highlight=False, soft_wrap=True))
    from quarl.training.sb3_train import train  # Stable-Baselines3 and torch, once every option is checked
    result = train(config, resume=resume)
    if result.resumed_from:
        console.print(f"resumed {result.run_dir} from step {result.resumed_from}")
    score = evaluate_trained(result.run_dir, eval_episodes, seed)
    out_console.print(
        f"saved {result.run_dir} ({result.timesteps} steps, {score.precision}): "
        f"mean return {score.mean:.2f} +/- {score.std:.2f} over {eval_episodes} episodes",
        soft_wrap=True,
    )


@user_errors
@with_options(common_options)
def qat(
    algo: Optional[str] = AlgoArg,
    *,
    env_id: Optional[str] = EnvIdArg,
    algo_opt: Optional[str] = AlgoOpt,
    env_opt: Optional[str] = EnvOptZoo,
    bits: str = typer.Option("8,6,4,3,2", help="comma list of widths in 2..16"),
    quant_delay: Optional[int] = typer.Option(None, "--quant-delay", help="fp32 steps before quantizing (default: half)"),
    timesteps: Optional[int] = TimestepsOpt,
    seed: int = SeedOpt,
    scheme: str = SchemeOpt,
    hp: list[str] = HpOpt,
    episodes: int = EpisodesOpt,
    n_envs: int = NEnvsOpt,
    out: Optional[Path] = OutOpt,
    gym_packages: Optional[str],
    verbose: bool,
) -> None:
    """Quantization-aware training against post-training quantization: trains an fp32
    policy and one QAT policy per width (same budget and seed), evaluates PTQ of the fp32
    one and each QAT one, and writes the table and the paper's QAT plot.

    Example: quarl qat ppo CartPole-v1 --bits 8,4,2 --timesteps 40000 --episodes 10
    """
    setup(verbose)
    algo, env_id = validate.algo_and_env(algo, env_id, algo_opt, env_opt)
    widths = validate.bit_widths(bits)  # before torch loads: a typo answers at once
    validate.count(timesteps, 1, "--timesteps")
    validate.count(quant_delay, 0, "--quant-delay")
    registry_options.check_eval_values(episodes, seed, n_envs, None)
    from quarl.evaluation.reports import print_table
    from quarl.qat_study import QATStudy, run_qat_study
    from quarl.quant.config import QuantConfig

    settings = registry_options.eval_settings(episodes, seed, n_envs, None)
    study = QATStudy(algo.lower(), env_id, tuple(widths), timesteps, quant_delay, seed, scheme,
                     tuple(validate.hyperparams(hp).items()))
    QuantConfig(precision="nbit", scheme=scheme)  # validates the scheme before any training
    out = validate.out_folder(out) or outputs.qat_folder(algo, env_id)
    rows = run_qat_study(study, settings, out, on_stage=lambda text: console.print(f"[bold]{text}[/bold]"),
                         progress_bar=True)
    print_table(rows, f"{algo} {env_id}: QAT vs PTQ, mean return over {episodes} episodes", out_console)
    out_console.print(f"wrote {out}/qat.csv, qat.md, qat.json, qat.png")
