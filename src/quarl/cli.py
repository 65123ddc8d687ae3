"""The ``quarl`` command. It only parses arguments into the library's configs and calls
it; a user mistake (QuarlError) prints one line and exits with status 2."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quarl.errors import QuarlError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="quarl: quantize trained RL policies and measure what it costs in reward.",
)
console = Console(stderr=True)
out_console = Console()
log = logging.getLogger("quarl")

DEFAULT_ZOO = Path("../shared/zoo")


def _setup(verbose: bool = False) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MUJOCO_GL", "egl")
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
        force=True,
    )
    logging.getLogger("quarl").setLevel(logging.INFO if verbose else logging.WARNING)


def user_errors(fn: Callable) -> Callable:
    """Turn QuarlError (and a Ctrl-C) into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except QuarlError as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print("interrupted: finished cells are kept in the output folder; run again to resume")
            raise typer.Exit(130) from None

    return wrapper


def _split(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise QuarlError(f"{what} is empty: give a comma-separated list")
    return items


def _parse_bits(text: str) -> list[int]:
    from quarl.quant.primitives import MAX_BITS, MIN_BITS

    bits = []
    for item in _split(text, "--bits"):
        if not item.isdigit() or not MIN_BITS <= int(item) <= MAX_BITS:
            raise QuarlError(f"bits {item!r} is out of range: allowed integers {MIN_BITS}..{MAX_BITS}")
        bits.append(int(item))
    return bits


def _parse_precisions(text: str) -> list[str]:
    from quarl.quant.config import QuantConfig

    labels = _split(text, "--precisions")
    for label in labels:
        QuantConfig.parse(label)  # raises a clear error for an unknown one
    return [label.lower() for label in labels]


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _load(checkpoint: Path, env: Optional[str], trust_pickle: bool):
    from quarl.envs import check_env_id, make_env
    from quarl.policies.sb3 import load_checkpoint, resolve_env_spec

    if env is not None:
        check_env_id(env)
    ckpt = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    spec = resolve_env_spec(ckpt, env)
    probe = make_env(spec)  # fail before any work when the env does not fit the policy
    try:
        ckpt.policy.check_env(probe)
    finally:
        probe.close()
    return ckpt, spec


def _default_out(kind: str, checkpoint: Path, env_id: str) -> Path:
    name = checkpoint.resolve().name.removesuffix(".zip")
    algo = checkpoint.resolve().parent.name if checkpoint.is_dir() else checkpoint.resolve().parent.parent.name
    return Path("results") / kind / f"{algo}-{name}-{env_id.replace('/', '_')}"


def _eval_settings(episodes: int, seed: int, n_envs: int, max_steps: Optional[int]):
    from quarl.ptq import EvalSettings

    if episodes < 1:
        raise QuarlError(f"--episodes {episodes} must be at least 1")
    if n_envs < 1:
        raise QuarlError(f"--n-envs {n_envs} must be at least 1")
    return EvalSettings(episodes=episodes, seed=seed, n_envs=n_envs, max_steps=max_steps)


CheckpointArg = typer.Argument(..., help="SB3 .zip or RL Zoo run folder (e.g. ppo/CartPole-v1_1)")
EnvOpt = typer.Option(None, "--env", help="gymnasium env id (default: the zoo folder's env)")
EpisodesOpt = typer.Option(20, "--episodes", help="episodes per precision (episode i uses seed + i)")
SeedOpt = typer.Option(0, "--seed")
NEnvsOpt = typer.Option(8, "--n-envs", help="envs stepped side by side")
MaxStepsOpt = typer.Option(None, "--max-steps", help="cut episodes after this many steps")
OutOpt = typer.Option(None, "--out", help="output folder (default results/<command>/<policy>)")
TrustOpt = typer.Option(False, "--trust-pickle", help="allow arbitrary unpickling of vecnormalize.pkl")
VerboseOpt = typer.Option(False, "--verbose", "-v")
BitsOpt = typer.Option("8,7,6,5,4,3,2", help="comma list of widths in 2..16")
SchemeOpt = typer.Option("quarl", help="quarl (paper, unclamped), affine or symmetric")
GranularityOpt = typer.Option("auto", help="auto (paper: tensor for dense, channel for conv), tensor, channel")


@app.command()
@user_errors
def ptq(
    checkpoint: Path = CheckpointArg,
    env: Optional[str] = EnvOpt,
    precisions: str = typer.Option("fp32,fp16,bf16,int8", help="comma list of fp32, fp16, bf16, int8, int2..int16"),
    episodes: int = EpisodesOpt,
    seed: int = SeedOpt,
    n_envs: int = NEnvsOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    int8_weights: str = typer.Option("asymmetric", help="int8 weight format: asymmetric (uint8) or symmetric (int8)"),
    out: Optional[Path] = OutOpt,
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Evaluate a policy at several precisions and print precision | mean | std | E%.

    Example: quarl ptq ../shared/zoo/ppo/LunarLander-v2_1 --precisions fp32,fp16,int8 --episodes 20
    """
    _setup(verbose)
    from quarl.ptq import run_ptq
    from quarl.quant.config import INT8_WEIGHTS
    from quarl.reports import print_table, ptq_rows

    if int8_weights not in INT8_WEIGHTS:
        raise QuarlError(f"unknown --int8-weights {int8_weights!r}: allowed {', '.join(INT8_WEIGHTS)}")
    labels = _parse_precisions(precisions)
    settings = _eval_settings(episodes, seed, n_envs, max_steps)
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    out = out or _default_out("ptq", checkpoint, spec.env_id)
    cells = list(dict.fromkeys(["fp32", *labels]))
    with _progress() as bar:
        tasks = {c: bar.add_task(f"{c:>5}", total=episodes) for c in cells}
        records = run_ptq(
            ckpt.policy, spec, labels, settings, out, int8_weights, progress=lambda c, n: bar.update(tasks[c], completed=n)
        )
    print_table(ptq_rows(records), f"{ckpt.algo} {spec.env_id}, {episodes} episodes", out_console)
    out_console.print(f"wrote {out}/ptq.csv, ptq.md, ptq.json")


@app.command()
@user_errors
def sweep(
    checkpoint: Path = CheckpointArg,
    env: Optional[str] = EnvOpt,
    bits: str = BitsOpt,
    scheme: str = SchemeOpt,
    granularity: str = GranularityOpt,
    activations: bool = typer.Option(False, "--activations", help="also quantize layer outputs (calibrated ranges)"),
    episodes: int = EpisodesOpt,
    seed: int = SeedOpt,
    n_envs: int = NEnvsOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Evaluate fp32 and n-bit weights for each width; write a CSV and the reward-vs-bits plot.

    Example: quarl sweep ../shared/zoo/dqn/CartPole-v1_1 --bits 8,6,4,3,2 --episodes 10
    """
    _setup(verbose)
    from quarl.ptq import run_sweep
    from quarl.quant.config import QuantConfig
    from quarl.reports import print_table, ptq_rows

    widths = _parse_bits(bits)
    QuantConfig(precision="nbit", scheme=scheme, granularity=granularity)  # validates both
    settings = _eval_settings(episodes, seed, n_envs, max_steps)
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    variant = f"{scheme}-{granularity}" + ("-act" if activations else "")
    out = out or _default_out("sweep", checkpoint, spec.env_id) / variant
    labels = ["fp32", *(f"q{n}" for n in widths)]
    with _progress() as bar:
        tasks = {c: bar.add_task(f"{c:>5}", total=episodes) for c in labels}
        records = run_sweep(
            ckpt.policy,
            spec,
            widths,
            settings,
            out,
            scheme,
            granularity,
            progress=lambda c, n: bar.update(tasks[c], completed=n),
            title=f"{ckpt.algo} {spec.env_id} ({variant})",
            activations=activations,
        )
    what = "weights and activations" if activations else "weights"
    print_table(ptq_rows(records), f"{ckpt.algo} {spec.env_id}: n-bit {what} ({scheme}, {granularity})", out_console)
    out_console.print(f"wrote {out}/sweep.csv, sweep.png")


@app.command()
@user_errors
def analyze(
    checkpoint: Path = CheckpointArg,
    bits: str = BitsOpt,
    scheme: str = SchemeOpt,
    granularity: str = GranularityOpt,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Per-layer weight statistics, histograms, and the KL divergence of n-bit weights.

    Example: quarl analyze ../shared/zoo/dqn/CartPole-v1_1 --out results/analyze/dqn
    """
    _setup(verbose)
    from quarl.policies.sb3 import load_checkpoint
    from quarl.ptq import run_analyze
    from quarl.quant.config import QuantConfig
    from quarl.reports import print_table

    widths = _parse_bits(bits)
    QuantConfig(precision="nbit", scheme=scheme, granularity=granularity)
    ckpt = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    out = out or _default_out("analyze", checkpoint, "weights")
    stats, kl = run_analyze(ckpt.policy, widths, out, scheme, granularity, title=f"{ckpt.algo} {checkpoint.name}")
    print_table(
        [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in stats],
        f"{ckpt.algo} {checkpoint.name}: weights",
        out_console,
    )
    summary = [
        {"layer": layer, **{f"kl@{r['bits']}": round(r["kl"], 4) for r in kl if r["layer"] == layer}}
        for layer in dict.fromkeys(r["layer"] for r in kl)
    ]
    print_table(summary, "KL(fp32 || n-bit) per layer", out_console)
    out_console.print(f"wrote {out}/weights.csv, kl.csv, histograms.png, kl.png")


@app.command()
@user_errors
def demo(
    zoo: Path = typer.Option(DEFAULT_ZOO, help="RL Zoo folder with trained agents (algo/ENV_1/...)"),
    precisions: str = typer.Option("fp32,fp16,int8", help="precisions of the table"),
    episodes: int = EpisodesOpt,
    out: Path = typer.Option(Path("results/demo"), "--out"),
    train_steps: int = typer.Option(60_000, help="PPO CartPole steps when no zoo agents are found"),
    verbose: bool = VerboseOpt,
) -> None:
    """The main job: every zoo agent at each precision, as the paper's table
    (policy | fp32 | fp16 | E_fp16 | int8 | E_int8). Without a zoo folder it first trains
    PPO on CartPole-v1 with Stable-Baselines3 (a few minutes).

    Example: quarl demo --zoo ../shared/zoo --episodes 20
    """
    _setup(verbose)
    from quarl.policies.sb3 import load_checkpoint, resolve_env_spec
    from quarl.ptq import run_ptq
    from quarl.reports import paper_table, print_table, write_rows

    labels = _parse_precisions(precisions)
    settings = _eval_settings(episodes, 0, 8, None)
    runs = sorted(p for p in zoo.glob("*/*_*") if p.is_dir()) if zoo.is_dir() else []
    if not runs:
        from quarl.training.sb3_train import CARTPOLE_PPO, train_zoo_run

        console.print(f"no zoo agents under {zoo}: training PPO on CartPole-v1 for {train_steps} steps")
        runs = [train_zoo_run("ppo", "CartPole-v1", train_steps, out / "trained", 0, CARTPOLE_PPO, progress_bar=True)]
    per_policy = {}
    cells = list(dict.fromkeys(["fp32", *labels]))
    with _progress() as bar:
        for run in runs:
            ckpt = load_checkpoint(run)
            spec = resolve_env_spec(ckpt, None)
            name = f"{ckpt.algo} {spec.env_id}"
            tasks = {c: bar.add_task(f"{name} {c}", total=episodes) for c in cells}
            per_policy[name] = run_ptq(
                ckpt.policy,
                spec,
                labels,
                settings,
                out / f"{run.parent.name}-{run.name}",
                progress=lambda c, n, tasks=tasks: bar.update(tasks[c], completed=n),
            )
    rows = paper_table(per_policy, cells)
    print_table(rows, f"mean return over {episodes} episodes (E = (R_fp32 - R_q) / |R_fp32|, %)", out_console)
    write_rows(rows, out, "table")
    out_console.print(f"wrote {out}/table.csv, table.md, table.json")


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `quarl ... | head`
        sys.exit(0)


if __name__ == "__main__":
    main()
