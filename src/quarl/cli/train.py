"""``quarl train`` (Stable-Baselines3 with the RL Zoo's hyperparameters, optionally QAT or
mixed precision) and ``quarl qat`` (QAT against PTQ at several widths)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl import outputs
from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import console, out_console, setup, user_errors
from quarl.cli.settings import EVALUATION, Episodes, Evaluation, GymPackages, NEnvs, Out, Scheme, Seed, Verbose
from quarl.core import validate

AlgoArg = Annotated[str | None, typer.Argument(help="{train_algorithms}")]
EnvIdArg = Annotated[str | None, typer.Argument(
    help="gymnasium env id, e.g. CartPole-v1, Pendulum-v1, PongNoFrameskip-v4")]
AlgoOpt = Annotated[str | None, typer.Option(
    "--algo", help="the algorithm, as the RL Zoo's train.py takes it (or as the first argument)")]
EnvOptZoo = Annotated[str | None, typer.Option(
    "--env", help="the env id, as the RL Zoo's train.py takes it (or as the second argument)")]
Timesteps = Annotated[int | None, typer.Option(
    "--timesteps", "-n", "--n-timesteps", help="env steps (default: the RL Zoo's budget for this env)")]
Hp = Annotated[list[str], typer.Option(
    "--hp", "--hyperparams", help="override a zoo hyperparameter, KEY=VALUE or KEY:VALUE as the RL Zoo writes it "
                                  "(repeatable)")]
TrainOut = Annotated[Path, typer.Option(
    "--out", "-f", "--log-folder", parser=validate.out_option, help="run folders go to OUT/ALGO/ENV_N")]
TrainPrecision = Annotated[str, typer.Option(
    "--train-precision", help="gradient updates in {train_precisions} (autocast)")]
QatBits = Annotated[int | None, typer.Option(
    "--qat-bits", help="quantization-aware training at this width (2..16)")]
EvalFreq = Annotated[int, typer.Option("--eval-freq", help="evaluate every N env steps (0: never)")]
CheckpointFreq = Annotated[int, typer.Option(
    "--checkpoint-freq", "--save-freq", help="checkpoint every N env steps (0: a tenth of the run)")]
Resume = Annotated[bool, typer.Option("--resume", help="continue the newest run that has a checkpoint")]
EvalEpisodes = Annotated[int, typer.Option(
    "--eval-episodes", help="episodes of each evaluation (every --eval-freq steps, and the final one)")]
ResumeTrustPickle = Annotated[bool, typer.Option(
    "--trust-pickle", help="--resume: allow the replay / normalization pickles of an older quarl's checkpoint")]


@command(app, "train", renames={"--episodes": "--eval-episodes"})
@user_errors
def train_cmd(
    algo: AlgoArg = None,
    env_id: EnvIdArg = None,
    *,
    algo_opt: AlgoOpt = None,
    env_opt: EnvOptZoo = None,
    timesteps: Timesteps = None,
    seed: Seed = EVALUATION.seed,
    out: TrainOut = outputs.TRAIN_RUNS,
    precision: TrainPrecision = "fp32",
    qat_bits: QatBits = None,
    quant_delay: Annotated[int | None, typer.Option(
        "--quant-delay", help="QAT: fp32 steps first (default: half)")] = None,
    hp: Hp = [],  # noqa: B006  (typer copies a list default; it is never mutated)
    eval_freq: EvalFreq = 10_000,
    checkpoint_freq: CheckpointFreq = 0,
    resume: Resume = False,
    eval_episodes: EvalEpisodes = 5,
    trust_pickle: ResumeTrustPickle = False,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
) -> None:
    """Train with Stable-Baselines3 and the RL Zoo's hyperparameters; save an RL Zoo run
    folder (with TensorBoard logs and checkpoints) that ptq / sweep load as is.

    Example: quarl train ppo CartPole-v1 --qat-bits 4 --timesteps 50000
    """
    setup(verbose)
    from quarl.training.plan import evaluate_trained, train_config

    algo, env_id = validate.algo_and_env(algo, env_id, algo_opt, env_opt)
    config = train_config(algo, env_id, timesteps, seed, out, precision, qat_bits, quant_delay, hp, eval_freq,
                          eval_episodes, checkpoint_freq, trust_pickle,
                          on_progress=lambda line: console.print(line, highlight=False, soft_wrap=True))
    from quarl.checkpoints import load_checkpoint  # Stable-Baselines3 and torch, once every option is checked
    from quarl.training.sb3_train import train
    result = train(config, resume=resume)
    if result.resumed_from:
        console.print(f"resumed {result.run_dir} from step {result.resumed_from}")
    score = evaluate_trained(load_checkpoint(result.run_dir), eval_episodes, seed)
    out_console.print(
        f"saved {result.run_dir} ({result.timesteps} steps, {score.precision}): "
        f"mean return {score.mean:.2f} +/- {score.std:.2f} over {eval_episodes} episodes",
        soft_wrap=True,
    )


@command(app, "qat")
@user_errors
def qat(
    algo: AlgoArg = None,
    env_id: EnvIdArg = None,
    *,
    algo_opt: AlgoOpt = None,
    env_opt: EnvOptZoo = None,
    bits: Annotated[str, typer.Option("--bits", help="comma list of widths in 2..16")] = "8,6,4,3,2",
    quant_delay: Annotated[int | None, typer.Option(
        "--quant-delay", help="fp32 steps before quantizing (default: half)")] = None,
    timesteps: Timesteps = None,
    seed: Seed = EVALUATION.seed,
    scheme: Scheme = "quarl",
    hp: Hp = [],  # noqa: B006  (typer copies a list default; it is never mutated)
    episodes: Episodes = EVALUATION.episodes,
    n_envs: NEnvs = EVALUATION.n_envs,
    out: Out = None,
    gym_packages: GymPackages = None,
    verbose: Verbose = False,
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
    evaluation = Evaluation(episodes, seed, n_envs).checked()
    from quarl.evaluation.reports import print_table
    from quarl.quantization.config import QuantConfig
    from quarl.study.qat import QATStudy, run_qat_study

    settings = evaluation.settings()
    study = QATStudy(algo.lower(), env_id, tuple(widths), timesteps, quant_delay, seed, scheme,
                     tuple(validate.hyperparams(hp).items()))
    QuantConfig(precision="nbit", scheme=scheme)  # validates the scheme before any training
    out = validate.out_folder(out) or outputs.qat_folder(algo, env_id)
    rows = run_qat_study(study, settings, out, on_stage=lambda text: console.print(f"[bold]{text}[/bold]"),
                         progress_bar=True)
    print_table(rows, f"{algo} {env_id}: QAT vs PTQ, mean return over {episodes} episodes", out_console)
    out_console.print(f"wrote {out}/qat.csv, qat.md, qat.json, qat.png")
