"""The ``quarl`` command. It only parses arguments into the library's configs and calls
it; a user mistake (QuarlError) prints one line and exits with status 2."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import click
import typer
from rich.markup import escape
from typer.core import TyperGroup

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as _typer_click
    _USAGE_ERRORS: tuple = (click.UsageError, _typer_click.UsageError)
    _ABORTS: tuple = (click.Abort, _typer_click.Abort if hasattr(_typer_click, "Abort") else click.Abort, typer.Abort)
except ImportError:  # pragma: no cover - older typer uses click itself
    _USAGE_ERRORS, _ABORTS = (click.UsageError,), (click.Abort,)
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from quarl import validate
from quarl.actorq.algorithms import algorithms_help
from quarl.errors import QuarlError

if TYPE_CHECKING:  # the ActorQ config module is imported by the commands that use it
    from quarl.actorq.config import ActorQConfig

# Old option spellings, kept for one release: (command path, old) -> new. Each gives a
# one-line notice and then means exactly what the new name means; none is in --help.
RENAMED_OPTIONS: dict[tuple[str, str], str] = {
    ("train", "--episodes"): "--eval-episodes",
    ("actorq run", "--eval-every"): "--eval-seconds",
    ("actorq run", "--eval-every-steps"): "--eval-freq",
    ("actorq compare", "--eval-every"): "--eval-seconds",
    ("actorq compare", "--eval-every-steps"): "--eval-freq",
    **{(command, "--precision"): "--precisions" for command in ("ptq", "bench", "demo", "study", "actorq compare")},
    ("export", "--precisions"): "--precision",
    ("play", "--precisions"): "--precision",
}
_GROUPS = ("actorq",)


def rename_options(args: list[str], notice: Callable[[str], None]) -> list[str]:
    """``args`` with every old option spelling of their command replaced by the new one."""
    words = [a for a in args[:2] if not a.startswith("-")]
    command = " ".join(words[:2]) if words and words[0] in _GROUPS else (words[0] if words else "")
    out = []
    for arg in args:
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        new = RENAMED_OPTIONS.get((command, name))
        if new is None:
            out.append(arg)
            continue
        notice(f"note: quarl {command} {name} is now {new} (the old name goes in the next release)")
        out.append(new + eq + value)
    return out


def take_gym_packages(args: list[str]) -> list[str]:
    """``args`` without ``--gym-packages MODULE[,MODULE]`` (rl_zoo3's option, taken by every
    command, before or after its name, repeatable), each module imported first so that the
    envs it registers are known, here and in the evaluation workers."""
    from quarl.envs import import_gym_packages

    out, i = [], 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name != "--gym-packages":
            out.append(args[i])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args):
                raise QuarlError("--gym-packages needs a module name (e.g. --gym-packages my_envs)")
            value, i = args[i + 1], i + 1
        import_gym_packages([v.strip() for v in value.split(",") if v.strip()] or [value])
        i += 1
    return out


class _OneLineUsageErrors(TyperGroup):
    """Click's usage errors (a value that is not a number, an unknown option) as one line
    on stderr and exit status 2, like every other error quarl reports; ``--help`` as ever.
    Old option spellings (RENAMED_OPTIONS) are rewritten first, with a notice."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = rename_options(list(sys.argv[1:] if args is None else args),
                              lambda text: console.print(text, highlight=False, soft_wrap=True))
        try:
            args = take_gym_packages(args)
        except QuarlError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            if not standalone_mode:
                return 2
            sys.exit(2)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _USAGE_ERRORS as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `quarl` alone: the help, as before
                console.print(exc.format_message(), highlight=False)
            else:
                console.print(f"[red]error:[/red] {exc.format_message()}", highlight=False, soft_wrap=True)
            code = 2
        except _ABORTS:
            console.print("aborted")
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineUsageErrors,
    add_completion=False,
    no_args_is_help=True,
    help="quarl: quantize trained RL policies and measure what it costs in reward. Every command also takes "
         "--gym-packages MODULE (rl_zoo3's option): MODULE is imported first, so the custom envs it registers are "
         "known (evaluation workers import it too; an RL Zoo folder's args.yml gym_packages are imported likewise).",
)
console = Console(stderr=True)
# files and pipes get whole tables; no markup: what it prints holds users' paths and labels ("[/]" is text)
out_console = Console(width=None if sys.stdout.isatty() else 200, markup=False)
log = logging.getLogger("quarl")



def _version(value: bool) -> None:
    if value:
        import quarl

        out_console.print(f"quarl {quarl.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print quarl's version and exit")) -> None:
    """quarl: quantize trained RL policies and measure what it costs in reward."""


def _setup(verbose: bool = False) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MUJOCO_GL", "egl")
    import torch

    torch.set_num_threads(1)
    from quarl.logs import AgentFilter

    handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    handler.addFilter(AgentFilter())  # demo / study: each line names the agent it is about
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    logging.getLogger("quarl").setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        from quarl import quiet

        quiet.install()


def user_errors(fn: Callable) -> Callable:
    """Turn QuarlError (and a Ctrl-C) into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except QuarlError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
            # a path the user gave (--out naming a file, a folder we may not write)
            console.print(f"[red]error:[/red] {escape(str(exc.filename))}: {escape(str(exc.strerror))}",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print(f"interrupted: what finished is kept; to continue, run: {escape(_resume_command(fn))}",
                          highlight=False, soft_wrap=True)
            raise typer.Exit(128 + _stopped_by[-1] if _stopped_by else 130) from None

    return wrapper


RESUMES_WITH_FLAG = ("train_cmd", "actorq_run")
"""Commands that continue only with ``--resume`` (the others reuse what they find)."""


def _resume_command(fn: Callable) -> str:
    """The command line that continues an interrupted run: the same one, with ``--resume``
    where the command needs it."""
    import shlex

    argv = ["quarl", *sys.argv[1:]]
    if fn.__name__ in RESUMES_WITH_FLAG and "--resume" not in argv:
        argv.append("--resume")
    return " ".join(shlex.quote(a) for a in argv)


_stopped_by: list[int] = []
"""The signal that stopped the run (SIGTERM, SIGHUP), for the exit code 128 + N."""


def _stop_on_signal(signum: int, frame: Any) -> None:
    """SIGTERM / SIGHUP take Ctrl-C's path: every long command writes what it finished
    (checkpoints, stored cells) and says how to continue, workers and Ray shut down."""
    _stopped_by.append(signum)
    raise KeyboardInterrupt


MAX_REPEATS = 100
MAX_LIST_ITEMS = 256
"""Distinct items of a comma list option (--bits has 15 values, --precisions a few dozen)."""


def _split(text: str, what: str, unique: bool = True) -> list[str]:
    """The items of a comma list, in order; a set of values (``unique``: bits, precisions,
    seeds...) counts a repeated one once, a sequence (layer widths) keeps every item."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if unique:
        items = list(dict.fromkeys(items))
    if not items:
        raise QuarlError(f"{what} is empty: give a comma-separated list")
    if len(items) > MAX_LIST_ITEMS:
        raise QuarlError(f"{what} lists {len(items):,} distinct items: at most {MAX_LIST_ITEMS}")
    return items


def _parse_bits(text: str) -> list[int]:
    from quarl.quant.primitives import MAX_BITS, MIN_BITS

    bits = []
    for item in _split(text, "--bits"):
        if not validate.digits(item) or not MIN_BITS <= int(item) <= MAX_BITS:
            raise QuarlError(f"bits {item!r} is out of range: allowed integers {MIN_BITS}..{MAX_BITS}")
        bits.append(int(item))
    return bits


def _parse_precisions(text: str, recovered: bool = False, **options) -> list[str]:
    """The labels of --precisions, each checked; ``recovered``: ``rec-int4`` / ``rec-int8``
    (a recovered column, quarl study) are allowed too."""
    from quarl.quant.config import QuantConfig
    from quarl.recovery import RECOVERED_PREFIX, recovered_precision

    labels = _split(text, "--precisions")
    for label in labels:
        if label.lower().startswith(RECOVERED_PREFIX):
            if not recovered:
                raise QuarlError(f"{label!r} is a study column: here run quarl recover POLICY --precision "
                                 f"{label[len(RECOVERED_PREFIX):]}")
            recovered_precision(label)
            continue
        QuantConfig.parse(label, **options)  # raises a clear error for an unknown one
    return [label.lower() for label in labels]


def _quant_options(int8_weights: str, block_size: int) -> dict:
    """QuantConfig fields shared by every cell, validated (one line for a bad value)."""
    from quarl.quant.config import QuantConfig

    QuantConfig(int8_weights=int8_weights, block_size=block_size)
    return {"int8_weights": int8_weights, "block_size": block_size}


def _say_reused(records: list[dict], where: Path) -> None:
    reused = sum(1 for r in records if r.get("reused"))
    if reused:
        out_console.print(f"reused {reused} finished cell{'s' * (reused != 1)} from {where} (same policy content, "
                          "config and settings)")


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _load_choice(fn: Callable) -> Callable:
    """Gives a command rl_zoo3.enjoy's ``--load-best``, ``--load-checkpoint N`` and
    ``--load-last-checkpoint``: which zip of a run folder its CHECKPOINT means
    (:func:`quarl.policies.sb3.pick_zip`); the zip then finds its folder's statistics."""
    extra = [
        inspect.Parameter("load_best", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
            False, "--load-best", help="a run folder's best_model.zip (as rl_zoo3.enjoy --load-best)")),
        inspect.Parameter("load_checkpoint", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int],
                          default=typer.Option(None, "--load-checkpoint", help="a run folder's rl_model_N_steps.zip")),
        inspect.Parameter("load_last_checkpoint", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
            False, "--load-last-checkpoint", help="a run folder's latest rl_model_N_steps.zip")),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, load_best: bool = False, load_checkpoint: Optional[int] = None,
                load_last_checkpoint: bool = False, **kwargs: Any) -> Any:
        if load_best or load_checkpoint is not None or load_last_checkpoint:
            from quarl.policies.sb3 import pick_zip

            kwargs["checkpoint"] = pick_zip(kwargs["checkpoint"], load_best, load_checkpoint, load_last_checkpoint)
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    setattr(wrapper, "__signature__", signature.replace(parameters=[*signature.parameters.values(), *extra]))
    return wrapper


def _load(checkpoint: Path, env: Optional[str], trust_pickle: bool):
    """quarl.load: fails before any work when the env does not fit the policy."""
    from quarl.api import load

    ckpt = load(checkpoint, env, trust_pickle)
    return ckpt, ckpt.env_spec


def _default_out(kind: str, checkpoint: Path, env_id: str) -> Path:
    from quarl import hub

    if hub.is_hub(checkpoint):  # hf://ORG/REPO
        repo = hub.parse(str(checkpoint))[0].replace("/", "-")
        return Path("results") / kind / f"hf-{repo}-{env_id.replace('/', '_')}"
    path = checkpoint.resolve()
    name = path.name.removesuffix(".zip").removesuffix(".pkl").removesuffix(".onnx")
    if _is_export(path):  # an exported model: its own name says enough
        return Path("results") / kind / f"{name}-{env_id.replace('/', '_')}"
    # zoo folder ALGO/ENV_1, zip ALGO/ENV_1/ENV.zip, legacy pickle ALGO/ENV.pkl
    algo = path.parent.name if checkpoint.is_dir() or path.suffix == ".pkl" else path.parent.parent.name
    return Path("results") / kind / f"{algo}-{name}-{env_id.replace('/', '_')}"


def _protocol(policy, spec, stochastic: Optional[bool], sticky_actions: Optional[float]):
    """The env spec with ``--sticky-actions`` and the policy acting as ``--stochastic`` /
    ``--deterministic`` say (or the RL Zoo's default)."""
    from quarl.evaluation import protocol

    return protocol(policy, spec, stochastic, sticky_actions)


def _refuse_export(checkpoint: Path, why: str) -> None:
    """One line for an exported model given to a command that needs the float policy."""
    if _is_export(checkpoint):
        raise QuarlError(f"{checkpoint} is an exported model: {why}; give the SB3 .zip or RL Zoo folder it was "
                         "exported from (ptq, play and bench take the export as it is)")


def _is_export(checkpoint: Path) -> bool:
    from quarl.policies.onnx_artifact import is_artifact

    return is_artifact(checkpoint)


def _workers(workers: Optional[int]) -> int:
    """--workers, else $QUARL_WORKERS, else this machine's cores (checked; see :func:`_warm`)."""
    from quarl import parallel

    if workers is None:
        raw = os.environ.get("QUARL_WORKERS", "")
        if raw and not validate.digits(raw):
            raise QuarlError(f"QUARL_WORKERS={raw!r} is not a whole number")
        workers = int(raw) if raw else parallel.usable_cores()
    return parallel.check_workers(workers)


def _warm(settings) -> None:
    """Start the evaluation workers in the background once the policy has loaded (a bad
    checkpoint fails without starting them), so they are ready when calibration ends."""
    if settings.workers > 1:
        from quarl import parallel

        parallel.warm_up(settings.workers)


MAX_DECIDE_EPISODES = 100_000
"""--decide-episodes at most: beyond it a verdict near the 5 % line is a fact, not a plan."""
MAX_N_ENVS = 1024
"""Envs side by side per process: each holds an emulator or a physics model in memory."""


def _eval_settings(episodes: int, seed: int, n_envs: int, max_steps: Optional[int], workers: int = 1):
    from quarl.measure import EvalSettings

    if episodes < 1:
        raise QuarlError(f"--episodes {episodes} must be at least 1")
    if not 1 <= n_envs <= MAX_N_ENVS:
        raise QuarlError(f"--n-envs {n_envs} must be in 1..{MAX_N_ENVS}")
    validate.seed(seed)
    return EvalSettings(episodes=episodes, seed=seed, n_envs=n_envs, max_steps=max_steps, workers=workers)


CheckpointArg = typer.Argument(..., help="the policy: an SB3 .zip, an RL Zoo run folder (ppo/CartPole-v1_1), a legacy "
                                         "stable-baselines .pkl, hf://ORG/REPO (Hugging Face Hub), a quarl actorq run "
                                         "folder, or a quarl export (its folder or .onnx)")
EnvOpt = typer.Option(None, "--env", help="gymnasium env id (default: the zoo folder's env)")
EpisodesOpt = typer.Option(20, "--episodes", help="episodes per precision (episode i uses seed + i)")
DemoEpisodesOpt = typer.Option(20, "--episodes", help="episodes per precision (episode i uses env seed i)")
StudyEpisodesOpt = typer.Option(20, "--episodes", help="episodes per cell (for --seeds s, episode i uses env seed "
                                                       "100000 × s + i)")
SeedOpt = typer.Option(0, "--seed")
NEnvsOpt = typer.Option(32, "--n-envs", help="envs stepped side by side per process, the policy called on their batch "
                                               "(each env's action exactly as if alone)")
MaxStepsOpt = typer.Option(None, "--max-steps", help="cut episodes after this many steps")
WorkersOpt = typer.Option(None, "--workers", help="processes playing episodes side by side (default: this machine's "
                                                  "cores, or $QUARL_WORKERS); the same returns as --workers 1")
OutOpt = typer.Option(None, "--out", parser=validate.out_option, help="output folder (default results/<command>/<policy>)")
TrustOpt = typer.Option(False, "--trust-pickle", help="allow arbitrary unpickling of vecnormalize.pkl")
VerboseOpt = typer.Option(False, "--verbose", "-v")
WideOpt = typer.Option(False, "--wide", help="print the table as one wide table even where it is wider than the "
                       "terminal (it then prints one block per row; the CSV is always wide)")
StickyOpt = typer.Option(None, "--sticky-actions", help="Atari / MinAtar: repeat the previous action with this "
                         "probability (0.25: Machado et al., ALE v5), so a deterministic agent's seeds are different "
                         "games")
StochasticOpt = typer.Option(None, "--stochastic/--deterministic", help="sample actions as rl_zoo3.enjoy "
                             "--stochastic does (fp32 and each precision share their noise per seed and step), or act "
                             "greedily; default: the RL Zoo's (stochastic on Atari and MinAtar)")
BitsOpt = typer.Option("8,7,6,5,4,3,2", help="comma list of widths in 2..16")
SchemeOpt = typer.Option("quarl", help="quarl (paper, unclamped), affine or symmetric")
GranularityOpt = typer.Option("auto", help="auto (paper: tensor for dense, channel for conv), tensor, channel, "
                                           "block (per --block-size inputs)")
PRECISIONS_HELP = ("comma list of fp32, fp16, bf16, int8 / int4 (real kernels, a fast mode that agrees with fp32), "
                   "int8-dyn-tensor, int8-dyn-channel, int8-block, int8-weight-only, int8-static, int4-block, "
                   "int4-weight-only, sim2..sim16 (simulated n-bit weights)")
Int8WeightsOpt = typer.Option("auto", help="8-bit weights of the MatMulInteger / QDQ modes: auto (symmetric int8 "
                                           "where the CPU has VNNI, else asymmetric uint8), asymmetric, symmetric")
BlockSizeOpt = typer.Option(32, "--block-size", help="inputs per block of the MatMulNBits modes: 16, 32, 64, 128 or 256")


def _recover_hint(rows: list[dict], checkpoint: Path, recovered: bool) -> None:
    """Where an int precision loses or is undecided, the command that repairs it."""
    for row in rows:
        label, verdict = str(row.get("precision", "")), str(row.get("verdict", "")).split(" ")[0]
        if label not in ("int8", "int4") or recovered:
            continue
        if verdict == "loses":
            out_console.print(f"{label} loses: recover it with quarl recover {checkpoint} --precision {label}",
                              soft_wrap=True, highlight=False)
        elif verdict == "undecided":  # more episodes may show it keeps: say both ways out
            out_console.print(f"{label} undecided: play more episodes (--decide-episodes 200), or recover it with "
                              f"quarl recover {checkpoint} --precision {label}", soft_wrap=True, highlight=False)


@app.command()
@user_errors
@_load_choice
def ptq(
    checkpoint: Path = CheckpointArg,
    env: Optional[str] = EnvOpt,
    precisions: str = typer.Option("fp32,fp16,bf16,int8,int4", help=PRECISIONS_HELP),
    episodes: int = EpisodesOpt,
    decide_episodes: int = typer.Option(0, "--decide-episodes", help="where a verdict is undecided, play as many "
                                        "episodes again (the next seeds, fp32 too) until it decides or a cell has "
                                        "played this many (0: off; e.g. 200)"),
    sticky_actions: Optional[float] = StickyOpt,
    stochastic: Optional[bool] = StochasticOpt,
    seed: int = SeedOpt,
    n_envs: int = NEnvsOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    workers: Optional[int] = WorkersOpt,
    int8_weights: str = Int8WeightsOpt,
    block_size: int = BlockSizeOpt,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool = TrustOpt,
    wide: bool = WideOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Evaluate a policy at several precisions and print precision | mean | std | E%.

    Example: quarl ptq ../shared/zoo/ppo/LunarLander-v2_1 --precisions fp32,fp16,int8 --episodes 20
    """
    _setup(verbose)
    from quarl.ptq import run_ptq
    from quarl.reports import print_table, ptq_rows

    options = _quant_options(int8_weights, block_size)
    labels = _parse_precisions(precisions, **options)
    settings = _eval_settings(episodes, seed, n_envs, max_steps, _workers(workers))
    if decide_episodes and not episodes < decide_episodes <= MAX_DECIDE_EPISODES:
        raise QuarlError(f"--decide-episodes {decide_episodes} must be above --episodes {episodes} and at most "
                         f"{MAX_DECIDE_EPISODES:,} (or 0: off)")
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = _protocol(ckpt.policy, spec, stochastic, sticky_actions)
    _warm(settings)
    out = validate.out_folder(out) or _default_out("ptq", checkpoint, spec.env_id)
    if _is_export(checkpoint):  # an exported model: evaluated as it is, nothing re-quantized
        from quarl.ptq import run_artifact

        out_console.print(f"{checkpoint} is an exported model: evaluated as exported ({ckpt.policy.precision}), "
                          "--precisions does not apply (ptq the checkpoint it came from for the other rows)",
                          soft_wrap=True, highlight=False)

        with _progress() as bar:
            task = bar.add_task(ckpt.policy.precision, total=episodes)
            records = run_artifact(ckpt.policy, spec, settings, out, lambda c, n: bar.update(task, completed=n),
                                   source=str(checkpoint))
        print_table(ptq_rows(records, identity=False), f"{checkpoint.name} ({ckpt.algo} {spec.env_id}), {episodes} episodes",
                    out_console, wide)
        _say_reused(records, out / "results.jsonl")
        out_console.print(f"wrote {out}/results.jsonl, ptq.csv, ptq.md, ptq.json")
        return
    from quarl.recovery import load_recovered

    recovered = load_recovered(checkpoint, trust_pickle)
    fixed, title = {}, f"{ckpt.algo} {spec.env_id}, {episodes} episodes" + (", stochastic" if ckpt.policy.stochastic
                                                                              else "")
    if recovered is not None:  # fp32 is the ORIGINAL policy, the recovered precision its real kernel
        from quarl.evaluation import acting

        fixed = {"fp32": acting(recovered.original, spec, ckpt.policy.stochastic),
                 recovered.precision: acting(recovered.kernel, spec, ckpt.policy.stochastic)}
        title += f" (recovered {recovered.precision}: fp32 is the original policy)"
    elif ckpt.policy.precision.startswith("qat"):  # a QAT run: every row starts from its fake-quantized network
        title += f" (a {ckpt.policy.precision} QAT net: fp32 is that net in fp32 arithmetic, not an fp32-trained agent)"
    cells = list(dict.fromkeys(["fp32", *labels]))
    with _progress() as bar:
        tasks = {c: bar.add_task(f"{c:>5}", total=episodes) for c in cells}

        def on_episodes(cell: str, n: int) -> None:  # --decide-episodes: a bar grows with its cell's episodes
            bar.update(tasks[cell], completed=n, total=max(n, bar.tasks[tasks[cell]].total or 0))

        records = run_ptq(ckpt.policy, spec, labels, settings, out, progress=on_episodes, source=str(checkpoint),
                          fixed=fixed, decide_episodes=decide_episodes, **options)
    rows = ptq_rows(records, identity=False)
    print_table(rows, title, out_console, wide)
    _recover_hint(rows, checkpoint, recovered is not None)
    _say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, ptq.csv, ptq.md, ptq.json" + (", ptq.png" if len(records) > 1 else ""))


@app.command()
@user_errors
@_load_choice
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
    workers: Optional[int] = WorkersOpt,
    block_size: int = BlockSizeOpt,
    out: Optional[Path] = OutOpt,
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Evaluate fp32 and simulated n-bit weights for each width; write a CSV and the reward-vs-bits plot.

    Example: quarl sweep ../shared/zoo/dqn/CartPole-v1_1 --bits 8,6,4,3,2 --episodes 10
    """
    _setup(verbose)
    from quarl.ptq import run_sweep
    from quarl.quant.config import QuantConfig
    from quarl.reports import print_table, ptq_rows

    widths = _parse_bits(bits)
    QuantConfig(precision="nbit", scheme=scheme, granularity=granularity, block_size=block_size)  # validates all
    settings = _eval_settings(episodes, seed, n_envs, max_steps, _workers(workers))
    _refuse_export(checkpoint, "sweep re-quantizes the float weights")
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    _warm(settings)
    variant = f"{scheme}-{granularity}" + ("-act" if activations else "")
    out = validate.out_folder(out) or _default_out("sweep", checkpoint, spec.env_id) / variant
    labels = ["fp32", *(f"sim{n}" for n in widths)]
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
            block_size=block_size,
            source=str(checkpoint),
        )
    what = "weights and activations" if activations else "weights"
    print_table(ptq_rows(records, identity=False), f"{ckpt.algo} {spec.env_id}: n-bit {what} ({scheme}, {granularity})",
                out_console)
    _say_reused(records, out / "results.jsonl")
    out_console.print(f"wrote {out}/results.jsonl, sweep.csv, sweep.md, sweep.json, sweep.png")


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
    from quarl.quant.analysis import kl_bins, per_layer_table
    from quarl.quant.config import QuantConfig
    from quarl.reports import print_table

    widths = _parse_bits(bits)
    QuantConfig(precision="nbit", scheme=scheme, granularity=granularity)
    _refuse_export(checkpoint, "analyze reads the float weights")
    ckpt = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    out = validate.out_folder(out) or _default_out("analyze", checkpoint, "weights")
    stats, kl = run_analyze(ckpt.policy, widths, out, scheme, granularity, title=f"{ckpt.algo} {checkpoint.name}")
    print_table(
        [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in stats],
        f"{ckpt.algo} {checkpoint.name}: weights",
        out_console,
    )
    print_table(per_layer_table(kl), "per layer: SQNR of n-bit weights (dB, no binning) and KL(fp32 || n-bit) of "
                f"{kl_bins(widths)}-bin histograms",
                out_console)
    out_console.print(f"wrote {out}/weights.csv, weights.md, weights.json, kl.csv, kl.md, kl.json, histograms.png, "
                      "kl.png")


def _parse_overrides(items: list[str]) -> dict:
    """KEY=VALUE pairs, each value a literal (never evaluated): Python's (``1e-3``,
    ``dict(net_arch=[64, 64])``, names kept as text) or YAML's (``true``, ``null``)."""
    import yaml

    from quarl.policies.safe_load import parse_literal

    def literal(text: str):
        value = parse_literal(text)
        return yaml.safe_load(text) if isinstance(value, str) and value == text.strip() else value

    out = {}
    for item in items:
        eq, colon = item.find("="), item.find(":")
        sep = "=" if eq >= 0 and (colon < 0 or eq < colon) else ":"  # the RL Zoo's KEY:VALUE too
        key, found, value = item.partition(sep)
        if not found or not key.strip():
            raise QuarlError(f"--hp {item!r} is not KEY=VALUE or KEY:VALUE (e.g. --hp n_envs=4)")
        out[key.strip()] = literal(value)
    return out


def _check_count(name: str, value: Optional[int], minimum: int) -> None:
    if value is not None and value < minimum:
        raise QuarlError(f"{name} {value} must be at least {minimum}")


MAX_BENCH_BUDGET_S = 600.0
"""Seconds of timing per bench cell: a larger value (or inf) is a typo, not a wish."""
MAX_BENCH_BATCH = 65_536

AlgoArg = typer.Argument(None, help="a2c, ppo, dqn, ddpg, td3, sac, qrdqn, tqc or trpo (qrdqn, tqc, trpo: sb3-contrib)")
EnvIdArg = typer.Argument(None, help="gymnasium env id, e.g. CartPole-v1, Pendulum-v1, PongNoFrameskip-v4")
AlgoOpt = typer.Option(None, "--algo", help="the algorithm, as the RL Zoo's train.py takes it (or as the first argument)")
EnvOptZoo = typer.Option(None, "--env", help="the env id, as the RL Zoo's train.py takes it (or as the second argument)")


def _algo_and_env(algo: Optional[str], env_id: Optional[str], algo_opt: Optional[str],
                  env_opt: Optional[str]) -> tuple[str, str]:
    """ALGO ENV as arguments or as the RL Zoo's --algo / --env, not both differently."""
    pairs = (("algorithm", "--algo", algo, algo_opt), ("env id", "--env", env_id, env_opt))
    out = []
    for what, option, positional, named in pairs:
        if positional is not None and named is not None and positional != named:
            raise QuarlError(f"{what} given twice: {positional!r} and {option} {named!r}")
        value = positional if positional is not None else named
        if value is None:
            raise QuarlError(f"no {what}: give it as an argument or with {option} (e.g. quarl train ppo CartPole-v1)")
        out.append(value)
    return out[0], out[1]
TimestepsOpt = typer.Option(None, "--timesteps", "-n", "--n-timesteps",
                            help="env steps (default: the RL Zoo's budget for this env)")
HpOpt = typer.Option([], "--hp", "--hyperparams", help="override a zoo hyperparameter, KEY=VALUE or KEY:VALUE "
                                                       "as the RL Zoo writes it (repeatable)")


@app.command("train")
@user_errors
def train_cmd(
    algo: Optional[str] = AlgoArg,
    env_id: Optional[str] = EnvIdArg,
    algo_opt: Optional[str] = AlgoOpt,
    env_opt: Optional[str] = EnvOptZoo,
    timesteps: Optional[int] = TimestepsOpt,
    seed: int = SeedOpt,
    out: Path = typer.Option(Path("runs"), "--out", "-f", "--log-folder", parser=validate.out_option,
                             help="run folders go to OUT/ALGO/ENV_N"),
    precision: str = typer.Option("fp32", "--train-precision",
                                  help="gradient updates in fp32, bf16 or fp16 (autocast)"),
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
    verbose: bool = VerboseOpt,
) -> None:
    """Train with Stable-Baselines3 and the RL Zoo's hyperparameters; save an RL Zoo run
    folder (with TensorBoard logs and checkpoints) that ptq / sweep load as is.

    Example: quarl train ppo CartPole-v1 --qat-bits 4 --timesteps 50000
    """
    _setup(verbose)
    from quarl.evaluation import evaluate
    from quarl.policies.sb3 import load_checkpoint
    from quarl.quant.config import QATConfig
    from quarl.training.sb3_train import TrainConfig, resolve_timesteps, train

    algo, env_id = _algo_and_env(algo, env_id, algo_opt, env_opt)

    validate.timesteps(timesteps)
    validate.seed(seed)
    validate.out_folder(out)
    _check_count("--eval-episodes", eval_episodes, 1)
    _check_count("--eval-freq", eval_freq, 0)
    _check_count("--checkpoint-freq", checkpoint_freq, 0)
    overrides = _parse_overrides(hp)
    total = resolve_timesteps(algo.lower(), env_id, timesteps, overrides)
    qat = None
    if qat_bits is not None:
        _parse_bits(str(qat_bits))
        _check_count("--quant-delay", quant_delay, 0)
        qat = QATConfig(bits=qat_bits, quant_delay=quant_delay if quant_delay is not None else total // 2)
    elif quant_delay is not None:
        raise QuarlError("--quant-delay needs --qat-bits")
    config = TrainConfig(algo.lower(), env_id, timesteps=total, seed=seed, out=out, precision=precision, qat=qat,
                         hyperparams=overrides, eval_freq=eval_freq, eval_episodes=eval_episodes, checkpoint_freq=checkpoint_freq,
                         progress_bar=True, trust_pickle=trust_pickle,
                         on_progress=lambda line: console.print(line, highlight=False, soft_wrap=True))
    result = train(config, resume=resume)
    if result.resumed_from:
        console.print(f"resumed {result.run_dir} from step {result.resumed_from}")
    ckpt = load_checkpoint(result.run_dir)
    assert ckpt.env_spec is not None  # a run folder quarl trained names its env
    ev = evaluate(ckpt.policy, ckpt.env_spec, episodes=eval_episodes, seed=seed + 100_000,
                  n_envs=min(eval_episodes, 8))
    out_console.print(
        f"saved {result.run_dir} ({result.timesteps} steps, {ckpt.policy.precision}): "
        f"mean return {ev.mean:.2f} +/- {ev.std:.2f} over {eval_episodes} episodes",
        soft_wrap=True,
    )


@app.command()
@user_errors
def qat(
    algo: Optional[str] = AlgoArg,
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
    verbose: bool = VerboseOpt,
) -> None:
    """Quantization-aware training against post-training quantization: trains an fp32
    policy and one QAT policy per width (same budget and seed), evaluates PTQ of the fp32
    one and each QAT one, and writes the table and the paper's QAT plot.

    Example: quarl qat ppo CartPole-v1 --bits 8,4,2 --timesteps 40000 --episodes 10
    """
    _setup(verbose)
    algo, env_id = _algo_and_env(algo, env_id, algo_opt, env_opt)
    from quarl.qat_study import QATStudy, run_qat_study
    from quarl.quant.config import QuantConfig
    from quarl.reports import print_table

    widths = _parse_bits(bits)
    _check_count("--timesteps", timesteps, 1)
    _check_count("--quant-delay", quant_delay, 0)
    settings = _eval_settings(episodes, seed, n_envs, None)
    study = QATStudy(algo.lower(), env_id, tuple(widths), timesteps, quant_delay, seed, scheme,
                     tuple(_parse_overrides(hp).items()))
    QuantConfig(precision="nbit", scheme=scheme)  # validates the scheme before any training
    out = validate.out_folder(out) or Path("results") / "qat" / f"{algo.lower()}-{env_id.replace('/', '_')}"
    rows = run_qat_study(study, settings, out, on_stage=lambda text: console.print(f"[bold]{text}[/bold]"),
                         progress_bar=True)
    print_table(rows, f"{algo} {env_id}: QAT vs PTQ, mean return over {episodes} episodes", out_console)
    out_console.print(f"wrote {out}/qat.csv, qat.md, qat.json, qat.png")


def _parse_layers(text: str) -> tuple[int, ...]:
    items = _split(text, "--policy-layers", unique=False)
    if not all(validate.digits(i) and int(i) > 0 for i in items):
        raise QuarlError(f"--policy-layers {text!r} must be positive integers, e.g. 2048,2048,2048")
    return tuple(int(i) for i in items)


def _number(value: Optional[float]) -> str:
    """A progress field; '-' until there is one (no evaluation has finished yet)."""
    return "-" if value is None or value != value else f"{value:.2f}"


def _progress_line(state, line: dict) -> None:
    console.print(
        f"{line['t_s']:7.1f}s  env {line['env_steps']:>8} ({line['env_steps_per_s']:7.1f}/s)  "
        f"learner {line['learner_steps']:>7} ({line['learner_steps_per_s']:6.1f}/s)  "
        f"eval {_number(line['last_eval']):>8}  mean10 {_number(line['running_mean']):>8}"
        f" / {line['target'] if line['target'] is not None else '-'}  v{line['version']}",
        highlight=False,
        soft_wrap=True,
    )


actorq_app = typer.Typer(no_args_is_help=True, help="ActorQ: distributed actor-learner training with a "
                         "full-precision learner and quantized actors, on Ray.")
app.add_typer(actorq_app, name="actorq")


ALGORITHMS_HELP = algorithms_help()
"""--algo's help, from the registry (quarl.actorq.algorithms)."""


def _actorq_options(
    algo: str = typer.Option("dqn", help=ALGORITHMS_HELP),
    actors: int = typer.Option(2, help="actor processes"),
    actor_precision: str = typer.Option("int8", help="fp32, fp16, bf16, int8 or int4 (ONNX Runtime)"),
    wire_bits: int = typer.Option(32, help="weights sent to float actors at 32, 16 or 8..2 bits"),
    update_period: int = typer.Option(300, help="actor env steps between weight pulls"),
    push_period: int = typer.Option(100, help="learner steps between weight pushes"),
    target_update_period: int = typer.Option(100, help="learner steps between target-network updates"),
    n_step: int = typer.Option(3, help="n-step returns"),
    policy_layers: str = typer.Option("2048,2048,2048", help="hidden widths of the policy"),
    target_reward: Optional[float] = typer.Option(None, help="stop at this running-mean eval return (default: env's threshold)"),
    max_minutes: float = typer.Option(10.0, help="time budget of one run"),
    max_env_steps: Optional[int] = typer.Option(None, help="also stop after this many env steps"),
    learning_rate: float = typer.Option(1e-4, "--lr"),
    batch_size: int = typer.Option(256),
    min_replay: int = typer.Option(1000, help="transitions before learning starts"),
    samples_per_insert: float = typer.Option(32.0, help="rate limiter: items sampled per item inserted"),
    replay: str = typer.Option("uniform", help="uniform or prioritized (proportional)"),
    priority_exponent: float = typer.Option(0.6, help="prioritized replay: alpha"),
    importance_exponent: float = typer.Option(0.4, help="prioritized replay: beta"),
    checkpoint_replay: bool = typer.Option(False, "--checkpoint-replay", help="also checkpoint replay (for --resume)"),
    eval_seconds: float = typer.Option(10.0, help="seconds between evaluations (without --eval-freq)"),
    eval_freq: Optional[int] = typer.Option(
        None, help="evaluate every N env steps instead, as train's --eval-freq (fleets of different speeds compared "
                   "at the same learning progress)"),
    eval_episodes: int = typer.Option(5),
    unroll_length: int = typer.Option(20, help="impala: steps per unroll (the V-trace horizon)"),
    rho_bar: float = typer.Option(1.0, help="impala: clip of the importance ratios pi / mu"),
    c_bar: float = typer.Option(1.0, help="impala: clip of the traces, at most --rho-bar"),
    no_correction: bool = typer.Option(False, "--no-correction", help="impala: learn as if the actors' unrolls were "
                                                                     "the learner's own (the ablation of V-trace)"),
    entropy_cost: float = typer.Option(0.01, help="impala, ppo: weight of the policy's entropy bonus"),
    clip_range: float = typer.Option(0.2, help="ppo: the surrogate's clip on the ratio pi / mu (mu: the actors' "
                                               "quantized policy)"),
    gae_lambda: float = typer.Option(0.95, help="ppo: GAE's lambda"),
    ppo_epochs: int = typer.Option(4, help="ppo: passes over each batch of unrolls"),
    ppo_minibatches: int = typer.Option(4, help="ppo: minibatches (of whole unrolls) per pass"),
    seed: int = SeedOpt,
    address: Optional[str] = typer.Option(None, help="join this Ray cluster, HOST:PORT (default: start a local one)"),
    local: bool = typer.Option(False, "--local", help="everything in this process (no Ray)"),
    learner_device: str = typer.Option("cpu", help="cpu, or cuda / cuda:N for a GPU learner"),
    out: Optional[Path] = OutOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """The options ``actorq run`` and ``actorq compare`` share (typer reads this signature)."""


def _with_options(options: Callable) -> Callable:
    """Gives a command ``options``' parameters as well as its own, passed in ``**kwargs``."""

    def wrap(fn: Callable) -> Callable:
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        setattr(fn, "__signature__", inspect.signature(fn).replace(
            parameters=own + list(inspect.signature(options).parameters.values())))
        fn.__annotations__ = {**options.__annotations__, **fn.__annotations__}
        return fn

    return wrap


def _actorq_config(env_id: str, kind: str, opts: dict) -> tuple[ActorQConfig, Path]:
    from quarl.actorq.acting import env_info
    from quarl.actorq.config import ActorQConfig
    from quarl.envs import check_env_id

    _setup(opts["verbose"])
    check_env_id(env_id)
    name = f"{opts['algo']}{'-no-correction' if opts['no_correction'] else ''}-{env_id.replace('/', '_')}"
    out = validate.out_folder(opts["out"]) or Path("results") / "actorq" / (f"compare-{name}" if kind == "compare" else
                                                       f"{name}-{opts['actor_precision']}")
    config = ActorQConfig(
        env_id, algo=opts["algo"], actors=opts["actors"], actor_precision=opts["actor_precision"],
        wire_bits=opts["wire_bits"], update_period=opts["update_period"], push_period=opts["push_period"],
        target_update_period=opts["target_update_period"], n_step=opts["n_step"],
        policy_layers=_parse_layers(opts["policy_layers"]), target_reward=opts["target_reward"],
        max_minutes=opts["max_minutes"], max_env_steps=opts["max_env_steps"], learning_rate=opts["learning_rate"],
        batch_size=opts["batch_size"],
        min_replay=opts["min_replay"], samples_per_insert=opts["samples_per_insert"],
        eval_every_s=opts["eval_seconds"], eval_every_steps=opts["eval_freq"], eval_episodes=opts["eval_episodes"], seed=opts["seed"],
        address=opts["address"], local=opts["local"], out=out, replay=opts["replay"],
        priority_exponent=opts["priority_exponent"], importance_exponent=opts["importance_exponent"],
        checkpoint_replay=opts["checkpoint_replay"], learner_device=opts["learner_device"],
        unroll_length=opts["unroll_length"], rho_bar=opts["rho_bar"], c_bar=opts["c_bar"],
        correction=not opts["no_correction"], entropy_cost=opts["entropy_cost"], clip_range=opts["clip_range"],
        gae_lambda=opts["gae_lambda"], ppo_epochs=opts["ppo_epochs"], ppo_minibatches=opts["ppo_minibatches"],
    )
    info = env_info(config)  # env / algorithm mismatch: one line before anything starts
    if kind == "compare" and config.target_reward is None and info.reward_threshold is None:
        raise QuarlError(f"{env_id} has no reward threshold: pass --target-reward for the time-to-reward comparison")
    where = ("in this process" if config.local else f"on the Ray cluster at {config.address}" if config.address
             else "on a local Ray cluster")
    actors = f"{config.actors} {config.actor_precision}" if kind == "run" else str(config.actors)
    each = " for each run" if kind == "compare" else ""
    console.print(f"starting {actors} actors and a {config.learner_device} learner {where}{each}; a progress line "
                  "every 2 s", highlight=False, soft_wrap=True)
    return config, out


@actorq_app.command("run")
@user_errors
@_with_options(_actorq_options)
def actorq_run(
    env_id: str = typer.Argument(..., help="environment id, e.g. CartPole-v1 or dm_control/cartpole-balance-v0"),
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/checkpoint.pt"),
    **opts,
) -> None:
    """Train with a full-precision learner and quantized actors until the target reward.

    Example: quarl actorq run CartPole-v1 --algo dqn --actors 2 --actor-precision int8 --policy-layers 256,256
    """
    config, out = _actorq_config(env_id, "run", opts)
    from quarl.actorq.system import run_actorq

    summary = run_actorq(config, resume=resume, on_progress=_progress_line)
    ttr = summary.time_to_reward_s
    out_console.print(
        (f"reached {summary.target_reward} in {ttr:.1f} s" if ttr is not None else
         f"did not reach {summary.target_reward} in {summary.elapsed_s:.0f} s")
        + f" ({summary.env_steps} env steps, {summary.learner_steps} learner steps); wrote {out}/summary.json, "
        f"evals.csv, actor_nodes.json, checkpoint.pt, policy.pt, tb/",
        soft_wrap=True,
    )


@actorq_app.command("compare")
@user_errors
@_with_options(_actorq_options)
def actorq_compare(
    env_id: str = typer.Argument(..., help="environment id"),
    precisions: str = typer.Option("fp32,int8", help="actor precisions, one run each"),
    repeats: int = typer.Option(3, help="runs per precision (seeds seed, seed+1, ...)"),
    **opts,
) -> None:
    """The same run once per actor precision and repeat, then the paper's table (time to
    reward, speedup, actor steps/s, where actor time goes), convergence, breakdown and
    energy plots. Finished runs are reused, so an interrupted comparison resumes.

    Example: quarl actorq compare CartPole-v1 --precisions fp32,int8 --repeats 3 --policy-layers 256,256
    """
    from quarl.actorq.config import ACTOR_PRECISIONS

    labels = _split(precisions, "--precisions")
    bad = [p for p in labels if p not in ACTOR_PRECISIONS]
    if bad:
        raise QuarlError(f"unknown precision {bad[0]!r} in --precisions: allowed {', '.join(ACTOR_PRECISIONS)}")
    _check_count("--repeats", repeats, 1)
    if repeats > MAX_REPEATS:
        raise QuarlError(f"--repeats {repeats:,} is more runs than a comparison needs: at most {MAX_REPEATS}")
    config, out = _actorq_config(env_id, "compare", opts)
    from quarl.actorq.compare import run_compare
    from quarl.reports import print_table
    result = run_compare(config, labels, repeats, out,
                         on_run=lambda p, r: console.print(f"[bold]{p} actors, run {r + 1}/{repeats}[/bold]"),
                         on_progress=_progress_line)
    print_table(result.table, f"ActorQ {config.algo} {env_id}: {config.actors} actors, policy "
                f"{opts['policy_layers']}", out_console)
    print_table(result.breakdown, "share of the actors' wall time per part (and the learner's busy share)",
                out_console)
    out_console.print(f"wrote {out}/compare.csv, compare.md, compare.json, breakdown.csv, breakdown.md, "
                      "breakdown.json, convergence.png, breakdown.png, energy.png")


@actorq_app.command("model")
@user_errors
def actorq_model(
    runs: list[Path] = typer.Argument(..., help="run or compare folders whose summary.json give the component costs"),
    actors: str = typer.Option("1,2,4,8,16,32,64,128", help="actor counts to predict"),
    nodes: int = typer.Option(1, help="nodes the actors are spread over"),
    cores_per_node: Optional[int] = typer.Option(None, help="CPU cores per node (default: this machine's)"),
    learner_speedup: float = typer.Option(1.0, help="learner steps this many times faster than measured (a GPU)"),
    bandwidth_gbps: Optional[float] = typer.Option(None, help="broadcaster-to-actor network, Gbit/s (default: "
                                                              "the measured same-machine pulls)"),
    wire_bits: str = typer.Option("", help="also model float actors pulling weights at these widths, e.g. 16,8,4"),
    validate: Optional[list[Path]] = typer.Option(None, help="runs to predict from RUNS' costs (e.g. 2-actor runs)"),
    out: Path = typer.Option(Path("results/actorq/model"), "--out", help="output folder"),
    verbose: bool = VerboseOpt,
) -> None:
    """Predict ActorQ at cluster scale from measured component costs: the bound (actors,
    learner, cores or network), env steps/s and time-to-reward speedup over fp32 actors for
    each actor count, validated against every measured run.

    Example: quarl actorq model results/actorq/actor-bound-dqn --learner-speedup 20 --nodes 4 --cores-per-node 16
    """
    _setup(verbose)
    from quarl.actorq.model import Cluster, load_runs, model_report
    from quarl.reports import print_table

    from quarl.actorq.config import WIRE_BITS

    counts = [int(a) for a in _split(actors, "--actors") if _is_count(a, "--actors")]
    widths = [int(b) for b in _split(wire_bits, "--wire-bits") if _is_count(b, "--wire-bits")] if wire_bits else []
    bad = [b for b in widths if b not in WIRE_BITS]
    if bad:
        raise QuarlError(f"--wire-bits {bad[0]} is not a width actors pull: allowed {', '.join(map(str, WIRE_BITS))}")
    if bandwidth_gbps is not None and not 0 < bandwidth_gbps < float("inf"):
        raise QuarlError(f"--bandwidth-gbps {bandwidth_gbps} must be a finite number above 0")
    if cores_per_node is not None and cores_per_node < 1:
        raise QuarlError(f"--cores-per-node {cores_per_node} must be at least 1 (or unset: this machine's)")
    cluster = Cluster(actors=1, nodes=nodes, cores_per_node=cores_per_node or os.cpu_count() or 1,
                      learner_speedup=learner_speedup,
                      bandwidth_bytes_per_s=bandwidth_gbps * 1e9 / 8 if bandwidth_gbps else float("inf"))
    report = model_report(load_runs(runs), counts, cluster, out, load_runs(validate) if validate else None, widths)
    print_table(report["rows"], f"ActorQ model, {report['where']}", out_console)
    print_table(report["validation"], "measured runs against the model", out_console)
    out_console.print("wrote " + ", ".join(str(f) for f in report["files"]), soft_wrap=True)


def _is_count(text: str, option: str) -> bool:
    if not validate.digits(text) or int(text) < 1:
        raise QuarlError(f"{option}: {text!r} is not a positive integer")
    return True


@app.command()
@user_errors
@_load_choice
def export(
    checkpoint: Path = CheckpointArg,
    env: Optional[str] = EnvOpt,
    precision: str = typer.Option("int8", help="fp32, int8 / int4 (fastest mode that agrees with fp32) or one mode "
                                               "(int8-dyn-channel, int4-weight-only...)"),
    out: Optional[Path] = OutOpt,
    int8_weights: str = Int8WeightsOpt,
    block_size: int = BlockSizeOpt,
    seed: int = typer.Option(0, "--seed", hidden=True, help="ignored: calibration seeds are fixed (10,000..10,199)"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="cut calibration episodes after this many steps"),
    portable: bool = typer.Option(False, "--portable", help="int4 / int8-block: standard ONNX only (blocked "
                                  "DequantizeLinear + MatMul, opset 21) instead of ONNX Runtime's MatMulNBits, "
                                  "the same weights; the sidecar says how it computes against MatMulNBits"),
    stochastic: Optional[bool] = typer.Option(None, "--stochastic/--deterministic", help="how the deployed policy "
                                              "acts: a sampling categorical policy's int mode must keep its action "
                                              "distributions, a greedy one its argmax; default: the RL Zoo's "
                                              "(stochastic on Atari and MinAtar), as ptq"),
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Export the acting network as OUT/policy.onnx (fp32 or real int8 / int4) plus
    OUT/policy.json, a sidecar with the observation normalization, the action head and the
    int mode that was chosen. ptq, bench and play take OUT (or OUT/policy.onnx) as a policy.

    Example: quarl export ../shared/zoo/ppo/LunarLander-v2_1 --precision int8 --out lunar-int8
    """
    _setup(verbose)
    from quarl.deploy import export_policy
    from quarl.measure import calibration_inputs, calibration_returns
    from quarl.policies.onnx_artifact import ARTIFACT_NAME

    options = _quant_options(int8_weights, block_size)
    config = _parse_precisions(precision, **options)
    validate.seed(seed)
    if seed:
        console.print("note: export --seed is ignored and will be removed: calibration seeds are fixed, so export, "
                      "ptq and study choose the same int mode", highlight=False)
    validate.out_folder(out)
    if _is_export(checkpoint):
        raise QuarlError(f"{checkpoint} is already an exported model: export the checkpoint it came from (an SB3 .zip "
                         "or RL Zoo folder) at the precision you want; quarl ptq evaluates the .onnx as it is")
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = _protocol(ckpt.policy, spec, stochastic, None)
    if out is None:
        default = _default_out("export", checkpoint, spec.env_id)
        out = default.with_name(f"{default.name}-{precision}")
    if max_steps is not None and max_steps < 1:
        raise QuarlError(f"--max-steps {max_steps} must be at least 1 (or unset)")
    calibration = None if config == ["fp32"] else calibration_inputs(ckpt.policy, spec, max_steps)
    returns = calibration_returns(spec, max_steps)
    stem = out / ARTIFACT_NAME
    meta = export_policy(ckpt.policy, precision, stem, calibration, spec, returns, portable=portable, **options)
    mode = f", mode {meta['quant']['mode']}" if "quant" in meta else ""
    out_console.print(f"wrote {stem.with_suffix('.onnx')} ({meta['onnx_bytes']:,} bytes{mode}) and "
                      f"{stem.with_suffix('.json')}", soft_wrap=True)


RecoverCheckpointArg = typer.Argument(..., help="the trained policy: an SB3 .zip (with --env) or an RL Zoo run "
                                                 "folder (ppo/CartPole-v1_1)")


@app.command()
@user_errors
@_load_choice
def recover(
    checkpoint: Path = RecoverCheckpointArg,
    env: Optional[str] = EnvOpt,
    precision: str = typer.Option("int4", help="int8 / int4 (the mode ptq's automatic choice runs) or a mode: "
                                               "int8-block, int8-dyn-channel, int8-dyn-tensor, int8-weight-only, "
                                               "int4-block, int4-weight-only"),
    out: Optional[Path] = OutOpt,
    rounds: int = typer.Option(12, "--rounds", help="DAgger rounds at most (round 0 plays the teacher)"),
    updates: int = typer.Option(400, "--updates", help="student updates (Adam steps) per round"),
    episodes_per_round: int = typer.Option(4, "--episodes-per-round", help="distillation episodes per round"),
    lr: float = typer.Option(5e-4, "--lr", help="the student's learning rate"),
    target_agreement: Optional[float] = typer.Option(None, "--target-agreement", help="held-out agreement with the "
                                                     "teacher that ends the run (default: the teacher's fp16 copy's, "
                                                     "at most 0.99)"),
    finetune_steps: int = typer.Option(0, "--finetune-steps", help="then fine-tune this many env steps with the "
                                       "agent's own algorithm, fake quantization on (the RL Zoo's hyperparameters, a "
                                       "tenth of its learning rate); kept where it plays calibration episodes better"),
    episodes: int = EpisodesOpt,
    seed: int = SeedOpt,
    n_envs: int = NEnvsOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    workers: Optional[int] = WorkersOpt,
    int8_weights: str = Int8WeightsOpt,
    block_size: int = BlockSizeOpt,
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Recover what quantization loses: distil the fp32 policy into a student on the real
    int kernel's grid (DAgger on distillation seeds), write OUT as an RL Zoo run folder (its
    zip on the grid, OUT/export the real kernel, the original recorded by hash), then judge
    the recovered kernel against the ORIGINAL fp32 policy on the evaluation seeds. A rerun
    resumes after the last finished round.

    Example: quarl recover ../shared/zoo/dqn/CartPole-v1_1 --precision int4 --out results/recover/dqn-cartpole-int4
    """
    _setup(verbose)
    from quarl.recovery import RecoverConfig, run_recover
    from quarl.reports import print_table, ptq_rows

    options = _quant_options(int8_weights, block_size)
    config = RecoverConfig(precision=precision.lower(), rounds=rounds, updates_per_round=updates,
                           episodes_per_round=episodes_per_round, lr=lr, target_agreement=target_agreement,
                           finetune_steps=finetune_steps, **options)
    settings = _eval_settings(episodes, seed, n_envs, max_steps, _workers(workers))
    if _is_export(checkpoint):
        raise QuarlError(f"{checkpoint} is an exported model: recover the checkpoint it came from (an SB3 .zip or RL "
                         "Zoo folder)")
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    out = validate.out_folder(out) or _default_out("recover", checkpoint, spec.env_id).with_name(
        f"{_default_out('recover', checkpoint, spec.env_id).name}-{precision}")
    from quarl.recovery import preflight

    preflight(checkpoint, out)  # one line before any progress bar
    with _progress() as bar:
        task = bar.add_task("distil", total=rounds)
        evals: dict[str, TaskID] = {}

        def on_round(stats) -> None:
            bar.update(task, completed=stats.round + 1, description=f"distil: agreement {100 * stats.agreement:.1f}%")

        def on_episode(label: str, n: int) -> None:
            if label not in evals:
                evals[label] = bar.add_task(f"{label:>5}", total=episodes)
            bar.update(evals[label], completed=n)

        record, records = run_recover(checkpoint, spec, ckpt.policy, config, out, settings, on_round, on_episode,
                                      trust_pickle)
    rows = ptq_rows(records, identity=False)
    print_table(rows, f"{ckpt.algo} {spec.env_id}: recovered {record['kernel']['mode']} against the original fp32 "
                      f"policy, {episodes} episodes", out_console)
    kept = "the fine-tuned model's" if record.get("finetune", {}).get("chosen") == "finetuned" else "the written model's"
    stopped = "target reached" if record["stopped"] == "target" else "round budget spent"
    out_console.print(f"held-out agreement with the teacher ({kept}, on every held-out state): "
                      f"{100 * record['agreement']:.1f}% (PTQ {100 * record['ptq_agreement']:.1f}%, target "
                      f"{100 * record['target_agreement']:.1f}%); {record['labelled_states']:,} states labelled, "
                      f"{record['updates']:,} updates, {record['wall_s']:.0f} s ({stopped})", highlight=False)
    if "finetune" in record:
        tuned = record["finetune"]
        out_console.print(f"fine-tuned {tuned['steps']:,} steps in {tuned['wall_s']:.0f} s: calibration return "
                          f"{tuned['calibration']['finetuned']['mean']:.2f} against distilled "
                          f"{tuned['calibration']['distilled']['mean']:.2f}; kept the {tuned['chosen']}",
                          highlight=False)
    elif record["stopped"] == "budget" and not any(str(r.get("verdict", "")).startswith("keeps") for r in rows):
        out_console.print(f"distillation ended at its budget without reaching the target: more --rounds, or add "
                          f"--finetune-steps 20000 to fine-tune with {ckpt.algo}'s own updates", highlight=False)
    out_console.print(f"wrote {out}/ (RL Zoo run folder), {out}/export/policy.onnx, {out}/verdict/ptq.csv; "
                      f"quarl ptq {out} --precisions fp32,{record['precision']} judges it again", soft_wrap=True,
                      highlight=False)


@app.command()
@user_errors
@_load_choice
def play(
    checkpoint: Path = CheckpointArg,
    env: Optional[str] = EnvOpt,
    precision: str = typer.Option("fp32", help="one precision, as in ptq's --precisions (int8 chooses its mode on the "
                                               "calibration seeds, as ptq does)"),
    episodes: int = typer.Option(3, "--episodes", help="episodes to play (episode i uses seed + i, as in ptq)"),
    seed: int = SeedOpt,
    sticky_actions: Optional[float] = StickyOpt,
    stochastic: Optional[bool] = StochasticOpt,
    video: Optional[Path] = typer.Option(None, "--video", parser=validate.out_option,
                                         help="record each episode as VIDEO/<precision>-episode-K.mp4 (no display "
                                              "needed)"),
    max_steps: Optional[int] = MaxStepsOpt,
    int8_weights: str = Int8WeightsOpt,
    block_size: int = BlockSizeOpt,
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Play a policy at one precision, print each episode's return and length (the same
    numbers ptq gets on those seeds) and, with --video, record each episode.

    Example: quarl play ../shared/zoo/ppo/LunarLander-v2_1 --precision int8 --episodes 2 --video videos
    """
    _setup(verbose)
    from quarl.api import quantize
    from quarl.play import play as play_episodes
    from quarl.reports import print_table

    options = _quant_options(int8_weights, block_size)
    labels = _parse_precisions(precision, **options)
    if len(labels) != 1:
        raise QuarlError(f"--precision {precision!r} names {len(labels)} precisions: play takes one")
    _eval_settings(episodes, seed, 1, max_steps)
    _check_count("--max-steps", max_steps, 1)
    validate.out_folder(video, "--video")
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    spec, ckpt.policy = _protocol(ckpt.policy, spec, stochastic, sticky_actions)
    if _is_export(checkpoint):
        if labels[0] != "fp32":
            raise QuarlError(f"{checkpoint} is an exported model: it plays as exported ({ckpt.policy.precision}); "
                             "drop --precision")
        policy = ckpt.policy
    else:
        policy = ckpt.policy if labels[0] == "fp32" else quantize(ckpt.policy, labels[0], spec, **options)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", policy.precision).strip("-")  # "int8 (onnx)" -> int8-onnx
    result = play_episodes(policy, spec, episodes, seed, video, max_steps, name=name).result
    rows = [{"episode": i, "seed": seed + i, "return": round(float(r), 2), "length": int(n)}
            for i, (r, n) in enumerate(zip(result.returns, result.lengths))]
    mode = (policy.meta.get("quant") or {}).get("mode")
    print_table(rows, None, out_console)
    out_console.print(f"{ckpt.algo} {spec.env_id} at {name}" + (f" (mode {mode})" if mode else "") +
                      f": mean return {result.mean:.2f} over {episodes} episodes" +
                      (", sampled actions" if policy.stochastic else ""), soft_wrap=True)
    if video is not None:
        out_console.print(f"wrote {len(rows)} videos to {video}/ ({name}-episode-0.mp4 ...)", soft_wrap=True)


@app.command()
@user_errors
@_load_choice
def bench(
    checkpoint: Path = CheckpointArg,
    env: Optional[str] = EnvOpt,
    precisions: Optional[str] = typer.Option(None, help=PRECISIONS_HELP + " (default fp16,bf16,int8,int4; an "
                                             "exported model is timed as exported); PyTorch and ONNX Runtime fp32 "
                                                                                 "are always measured"),
    batches: str = typer.Option("1,256", help="comma list of batch sizes"),
    budget: float = typer.Option(1.0, help="seconds of timing per cell"),
    out: Optional[Path] = typer.Option(None, "--out", help="also write bench.csv, bench.md, bench.json here"),
    trust_pickle: bool = TrustOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Latency of the policy at each precision next to PyTorch fp32 (median per call, one
    thread), with the model's size in bytes (process memory is not reported: ONNX Runtime's
    arenas, not the model, set it).

    Example: quarl bench ../shared/zoo/dqn/CartPole-v1_1 --precisions fp32,int8
    """
    _setup(verbose)
    from quarl.deploy import bench_precisions
    from quarl.measure import calibration_inputs, calibration_returns
    from quarl.reports import print_table

    if precisions is not None and _is_export(checkpoint):
        raise QuarlError(f"{checkpoint} is an exported model: bench times it as exported; drop --precisions (or bench "
                         "the checkpoint it came from)")
    labels = _parse_precisions(precisions or "fp16,bf16,int8,int4")
    if not 0 < budget <= MAX_BENCH_BUDGET_S:
        raise QuarlError(f"--budget {budget} must be a positive number of seconds, at most {MAX_BENCH_BUDGET_S:g}")
    sizes = []
    for item in _split(batches, "--batches"):
        if not validate.digits(item) or not 1 <= int(item) <= MAX_BENCH_BATCH:
            raise QuarlError(f"batch size {item!r} must be an integer in 1..{MAX_BENCH_BATCH}")
        sizes.append(int(item))
    ckpt, spec = _load(checkpoint, env, trust_pickle)
    if _is_export(checkpoint):
        rows = bench_precisions(ckpt.policy, calibration_inputs(ckpt.policy, spec), [], sizes, budget, as_exported=True)
    else:
        rows = bench_precisions(ckpt.policy, calibration_inputs(ckpt.policy, spec), labels, sizes, budget,
                                calibration_returns(spec))
    against = "itself (an exported model has no float network beside it)" if _is_export(checkpoint) else \
        "PyTorch fp32"
    print_table(rows, f"{ckpt.algo} {spec.env_id} ({ckpt.policy.precision} policy): latency in us, x = speedup over "
                      f"{against}", out_console)
    if out is not None:
        from quarl.reports import write_rows

        from quarl.provenance import provenance

        write_rows(rows, out, "bench")
        (out / "provenance.json").write_text(json.dumps({"checkpoint": str(checkpoint), "policy_sha256":
                                                         ckpt.policy.fingerprint(), **provenance()}, indent=1))
        out_console.print(f"wrote {out}/bench.csv, bench.md, bench.json, provenance.json")


@app.command()
@user_errors
def demo(
    zoo: Optional[Path] = typer.Option(None, help="folder of trained agents: RL Zoo (ALGO/ENV_1/) or legacy "
                                                  "(ALGO/ENV.pkl); default ../shared/zoo, else a PPO CartPole trained here"),
    precisions: str = typer.Option("fp32,fp16,int8", help="precisions of the table"),
    episodes: int = DemoEpisodesOpt,
    decide_episodes: int = typer.Option(200, "--decide-episodes", help="where a verdict is undecided, play more "
                                        "episodes until it decides or a cell has played this many (0: off)"),
    workers: Optional[int] = WorkersOpt,
    sticky_actions: Optional[float] = typer.Option(None, "--sticky-actions", help="Atari / MinAtar agents: repeat "
                                                   "the previous action with this probability (0.25: ALE v5); "
                                                   "the other agents play as they are"),
    stochastic: Optional[bool] = StochasticOpt,
    out: Path = typer.Option(Path("results/demo"), "--out", parser=validate.out_option),
    train_steps: int = typer.Option(60_000, help="PPO CartPole steps when no zoo agents are found"),
    wide: bool = WideOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """The main job: every zoo agent at each precision, as the paper's table
    (policy | fp32 | fp16 | E_fp16 | int8 | E_int8). Without a zoo folder it first trains
    PPO on CartPole-v1 with Stable-Baselines3 (a few minutes).

    Example: quarl demo --zoo ../shared/zoo --episodes 20
    """
    _setup(verbose)
    from quarl.demo import demo_agents, run_demo
    from quarl.reports import print_table

    labels = _parse_precisions(precisions)
    settings = _eval_settings(episodes, 0, 8, None, _workers(workers))
    validate.out_folder(out)
    if decide_episodes and not decide_episodes <= MAX_DECIDE_EPISODES:
        raise QuarlError(f"--decide-episodes {decide_episodes} must be at most {MAX_DECIDE_EPISODES:,} (or 0: off)")

    def say_training(where: Path) -> None:
        console.print(f"no zoo agents under {where}: training PPO on CartPole-v1 for {train_steps} steps")

    runs = demo_agents(zoo, out, train_steps, say_training)
    _warm(settings)
    with _progress() as bar:
        def on_policy(name: str, cells: list[str]):
            tasks = {c: bar.add_task(f"{name} {c}", total=episodes) for c in cells}
            return lambda c, n: bar.update(tasks[c], completed=n)

        rows = run_demo(runs, labels, settings, out, on_policy, decide_episodes, stochastic, sticky_actions)
    print_table(rows, f"mean return over {episodes} episodes (E = (R_fp32 - R_q) / |R_fp32|, %)", out_console, wide)
    out_console.print(f"wrote {out}/table.csv, table.md, table.json, table.png")


@app.command()
@user_errors
def study(
    agents: list[Path] = typer.Argument(..., help="checkpoints, or folders of agents (RL Zoo ALGO/ENV_1, legacy ALGO/ENV.pkl)"),
    precisions: str = typer.Option("fp32,fp16,bf16,int8,int4,sim6", help=PRECISIONS_HELP + "; rec-int8, rec-int4: "
                                   "the agent recovered by quarl recover at that precision (once per agent, under "
                                   "OUT/recovered), its real kernel against the original fp32"),
    seeds: str = typer.Option("0,1,2", help="evaluation seeds: seed s runs episode i on env seed 100000 × s + i"),
    episodes: int = StudyEpisodesOpt,
    n_envs: int = NEnvsOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    int8_weights: str = Int8WeightsOpt,
    block_size: int = BlockSizeOpt,
    trust_pickle: bool = TrustOpt,
    workers: int = typer.Option(1, help="cells at once; more than 1 runs them on a local Ray"),
    address: Optional[str] = typer.Option(None, help="run the cells on this Ray cluster"),
    out: Path = typer.Option(Path("results/study"), "--out", parser=validate.out_option,
                             help="folder of study.sqlite, the table and the plot"),
    decide_episodes: int = typer.Option(200, "--decide-episodes", help="where a verdict is undecided, play more "
                                        "seeds for it (and fp32) until it decides or it has this many episodes "
                                        "(0: off)"),
    sticky_actions: Optional[float] = typer.Option(None, "--sticky-actions", help="Atari / MinAtar agents: repeat "
                                                   "the previous action with this probability (0.25: ALE v5); "
                                                   "the other agents play as they are"),
    stochastic: Optional[bool] = StochasticOpt,
    wide: bool = WideOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """A grid of (agent, precision, seed) cells stored in OUT/study.sqlite, one row per
    cell as it finishes; a rerun evaluates only the missing cells. Writes the paper's
    table (mean over seeds) and study.png (E% per precision, spread over seeds).

    Example: quarl study ../shared/zoo ../shared/paper-agents --precisions fp32,fp16,int8,int4 --seeds 0,1,2
    """
    _setup(verbose)
    from quarl.reports import print_table, write_rows
    from quarl.study.grid import StudyConfig, find_agents, run_study
    from quarl.study.grid import cells as study_cells
    from quarl.study.report import plot_study, study_table

    options = _quant_options(int8_weights, block_size)
    seed_list = []
    for text in _split(seeds, "--seeds"):
        if not validate.digits(text):
            raise QuarlError(f"--seeds: {text!r} is not a non-negative integer")
        seed_list.append(validate.seed(int(text), "--seeds"))
    _check_count("--max-steps", max_steps, 1)
    validate.out_folder(out)
    labels = _parse_precisions(precisions, recovered=True, **options)
    _eval_settings(episodes, 0, n_envs, max_steps)
    if decide_episodes and not decide_episodes <= MAX_DECIDE_EPISODES:
        raise QuarlError(f"--decide-episodes {decide_episodes} must be at most {MAX_DECIDE_EPISODES:,} (or 0: off)")
    config = StudyConfig(tuple(find_agents(agents)), tuple(labels), tuple(seed_list), episodes, n_envs, max_steps,
                         int8_weights, block_size, trust_pickle, workers, address, out, decide_episodes, stochastic,
                         sticky_actions)
    with _progress() as bar:
        task = bar.add_task("cells", total=len(study_cells(config)))

        def on_cell(record: dict, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)  # deciding verdicts adds cells
            log.info("%s %s seed %d: %.2f", record["policy"], record["precision"], record["seed"], record["mean"])

        records = run_study(config, on_cell)
        bar.update(task, completed=len(records))
    rows = study_table(records, labels)
    print_table(rows, f"mean return over {episodes} episodes x {len(seed_list)} seeds (E%: reward lost against fp32)",
                out_console, wide)
    write_rows(rows, out, "table")
    plot_study(records, labels, out / "study.png", f"{len(rows)} agents, {len(seed_list)} seeds")
    out_console.print(f"wrote {out}/study.sqlite ({len(records)} cells), table.csv, table.md, table.json, study.png")


def main() -> None:
    import signal

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)
    try:
        app()
    except BrokenPipeError:  # `quarl ... | head`
        sys.exit(0)


if __name__ == "__main__":
    main()
