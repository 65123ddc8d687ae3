"""The option groups several commands share. Each group is a frozen dataclass of the values
a command reads, and each of its options is declared once, beside it, as a typer
``Annotated`` type (flag and help; the default is the dataclass field's). A command lists the
options it takes as ordinary parameters of those types, so typer reads its signature as
written, and builds the group from them (``Evaluation(episodes, seed, ...)``).

Checks that need nothing heavy run first (a typo answers before torch loads); the settings
the library takes are made from a checked group (:meth:`Evaluation.settings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from quarl.cli import early
from quarl.cli.registry_options import QuantOptions, check_eval_values, eval_settings, quant_options
from quarl.core import validate
from quarl.core.errors import QuarlError
from quarl.verdict import DEFAULT_INSURE

if TYPE_CHECKING:
    from quarl.evaluation.cells import EvalSettings
    from quarl.quantization.config import QuantConfig
    from quarl.verdict import Judging

# ------------------------------------------------------------------ every command that makes an env


def gym_packages_callback(modules: list[str] | str | None) -> None:
    """``--gym-packages``: each module imported when the option is parsed (it is eager), so the
    envs it registers are known before anything else is read, here and in the workers."""
    if modules:
        from quarl.envs import import_gym_packages

        given = [modules] if isinstance(modules, str) else modules
        import_gym_packages([m.strip() for value in given for m in value.split(",") if m.strip()] or given)


def trust_gym_packages_callback(trust: bool) -> None:
    """``--trust-gym-packages``: a run folder's ``args.yml`` may name modules to import."""
    if trust:
        from quarl.envs import trust_gym_packages

        trust_gym_packages()


GYM_PACKAGES_HELP = ("modules to import first, so the envs they register are known here and in every worker (rl_zoo3's "
                     "option; repeatable or comma-separated; installed modules or modules in the current folder). A "
                     "run folder's args.yml gym_packages are imported only when named here, or with "
                     "--trust-gym-packages (a file naming code to run)")
GymPackages = Annotated[list[str] | None, typer.Option(
    "--gym-packages", metavar="MODULE", is_eager=True, callback=gym_packages_callback, help=GYM_PACKAGES_HELP)]
TrustGymPackages = Annotated[bool, typer.Option(
    "--trust-gym-packages", is_eager=True, callback=trust_gym_packages_callback,
    help="import the gym_packages a run folder's args.yml names (code a file asks to run) without naming them with "
         "--gym-packages; taken, like --gym-packages, before the command parses")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v")]

# ------------------------------------------------------------------ the policy and its env

CheckpointArg = Annotated[Path, typer.Argument(
    help="the policy: an SB3 .zip, an RL Zoo run folder (ppo/CartPole-v1_1), a legacy stable-baselines .pkl, "
         "hf://ORG/REPO (Hugging Face Hub), a quarl actorq run folder, or a quarl export (its folder or .onnx)")]
Env = Annotated[str | None, typer.Option("--env", help="gymnasium env id (default: the zoo folder's env)")]

# ------------------------------------------------------------------ evaluation

Episodes = Annotated[int, typer.Option("--episodes", help="episodes per precision (episode i uses seed + i)")]
Seed = Annotated[int, typer.Option("--seed")]
NEnvs = Annotated[int, typer.Option(
    "--n-envs", help="envs stepped side by side per process, the policy called on their batch (each env's action "
                     "exactly as if alone)")]
MaxSteps = Annotated[int | None, typer.Option("--max-steps", help="cut episodes after this many steps")]
Workers = Annotated[int | None, typer.Option(
    "--workers", help="processes playing episodes side by side (default: this machine's cores, or $QUARL_WORKERS); "
                      "the same returns as --workers 1")]


@dataclass(frozen=True)
class Evaluation:
    """How a policy's episodes are played for its score (ptq, sweep, recover, qat, play)."""

    episodes: int = 20
    seed: int = 0
    n_envs: int = 32
    max_steps: int | None = None
    workers: int | None = None
    """None: $QUARL_WORKERS, else this machine's cores."""

    def checked(self) -> Evaluation:
        """This group, its plain values checked without importing anything heavy."""
        check_eval_values(self.episodes, self.seed, self.n_envs, self.max_steps)
        return self

    def worker_count(self) -> int:
        return validate.workers(self.workers)

    def settings(self, workers: int = 1) -> EvalSettings:
        """The library's :class:`~quarl.evaluation.cells.EvalSettings` (``workers``: resolved)."""
        return eval_settings(self.episodes, self.seed, self.n_envs, self.max_steps, workers)


EVALUATION = Evaluation()
"""The defaults of the evaluation options."""

# ------------------------------------------------------------------ deciding verdicts


def decide_episodes_option(default: int) -> Any:
    """``--decide-episodes`` with a command's default, shown (``QUARL_DECIDE_EPISODES``
    replaces it; the test suite sets 0)."""
    return typer.Option(
        "--decide-episodes", show_default=f"{default}, or $QUARL_DECIDE_EPISODES",
        help="where a verdict is undecided, play more episodes (the next seeds, fp32 too; 10 at a time) until it "
             "decides or a cell has played this many (0: off)")


DecideMinutes = Annotated[float, typer.Option(
    "--decide-minutes", help="start no new chunk of deciding episodes after this many minutes (0: no limit)")]
Insure = Annotated[float, typer.Option(
    "--insure", metavar="K", help="where the env defines no range of returns, the verdict insures against an unseen "
    "failure costing up to K mean returns beyond the worst paired loss seen (docs/ptq.md: what each K insures and "
    "costs)")]
INSURE = DEFAULT_INSURE
"""--insure's default, the verdict's own (:data:`quarl.verdict.DEFAULT_INSURE`)."""
ReturnRange = Annotated[str | None, typer.Option(
    "--return-range", metavar="LO:HI", help="every return lies in LO:HI (e.g. a reward clipped by a wrapper): the "
    "verdict assumes exactly that range; a return outside it refuses the verdict")]


def budget_note(decide_episodes: int, decide_seconds: float | None) -> str:
    """``deciding up to 640 episodes / 5 min`` for a title ('' where deciding is off)."""
    if not decide_episodes:
        return ""
    return f"deciding up to {decide_episodes} episodes" + (
        f" / {decide_seconds / 60:g} min" if decide_seconds else "")


def judging_of(insure: float, return_range: str | None) -> Judging:
    """--insure and --return-range checked into a :class:`quarl.verdict.Judging`."""
    from quarl.verdict import Judging
    from quarl.verdict.bounds import parse_range

    try:  # Judging checks --insure itself
        return Judging(insure, None if return_range is None else parse_range(return_range))
    except ValueError as exc:
        raise QuarlError(str(exc)) from None


@dataclass(frozen=True)
class Deciding:
    """--decide-episodes / --decide-minutes / --insure / --return-range, checked."""

    episodes: int
    """The episodes a cell may play while its verdict is undecided (0: off)."""
    seconds: float | None
    """The wall-clock budget for deciding (None: no limit)."""
    judging: Judging
    """The range the verdicts assume (:class:`quarl.verdict.Judging`)."""

    @classmethod
    def parse(cls, episodes: int | None, minutes: float, insure: float, return_range: str | None,
              default: int) -> Deciding:
        return cls(validate.decide_episodes(episodes, default=default), validate.decide_minutes(minutes),
                   judging_of(insure, return_range))

    def note(self, episodes: int) -> str:
        """:func:`budget_note` for a title where deciding may play past ``episodes``, else ''."""
        return budget_note(self.episodes, self.seconds) if self.episodes > episodes else ""

    def budget(self) -> str:
        """:func:`budget_note` of this budget."""
        return budget_note(self.episodes, self.seconds)


# ------------------------------------------------------------------ real int modes

Int8Weights = Annotated[str, typer.Option(
    "--int8-weights", help="8-bit weights of the MatMulInteger / QDQ modes: auto (symmetric int8 where the CPU has "
                           "VNNI, else asymmetric uint8), asymmetric, symmetric")]
BlockSize = Annotated[int, typer.Option(
    "--block-size", help="inputs per block of the MatMulNBits modes: 16, 32, 64, 128 or 256")]


@dataclass(frozen=True)
class IntOptions:
    """The settings every real int mode of a command shares (ptq, recover, play, export, study)."""

    int8_weights: str = "auto"
    block_size: int = 32

    def checked(self) -> QuantOptions:
        """The :class:`~quarl.quantization.config.QuantConfig` fields they set, validated."""
        return quant_options(self.int8_weights, self.block_size)

    def config(self) -> QuantConfig:
        """The config every precision label of the command is parsed onto, once
        (:func:`quarl.cli.registry_options.configs`): these options, every other field's
        default; validated (one line for a bad value)."""
        from quarl.quantization.config import QuantConfig

        return QuantConfig(int8_weights=self.int8_weights, block_size=self.block_size)


INT_OPTIONS = IntOptions()

# ------------------------------------------------------------------ how one policy acts

StickyActions = Annotated[float | None, typer.Option(
    "--sticky-actions", help="Atari / MinAtar: repeat the previous action with this probability (0.25: Machado et "
                             "al., ALE v5), so a deterministic agent's seeds are different games")]
AgentsStickyActions = Annotated[float | None, typer.Option(
    "--sticky-actions", help="Atari / MinAtar agents: repeat the previous action with this probability (0.25: ALE "
                             "v5); the other agents play as they are")]
STOCHASTIC_FLAGS = "--stochastic/--deterministic"
Stochastic = Annotated[bool | None, typer.Option(
    STOCHASTIC_FLAGS, help="sample actions as rl_zoo3.enjoy --stochastic does (fp32 and each precision share their "
                           "noise per seed and step), or act greedily; default: the RL Zoo's (stochastic on Atari "
                           "and MinAtar)")]


@dataclass(frozen=True)
class Acting:
    """How a policy acts in its episodes: sampled or greedy (None: the RL Zoo's default),
    with sticky actions (Atari / MinAtar)."""

    stochastic: bool | None = None
    sticky_actions: float | None = None


# ------------------------------------------------------------------ loading a policy

TrustPickle = Annotated[bool, typer.Option("--trust-pickle", help="allow arbitrary unpickling of vecnormalize.pkl")]
LoadBest = Annotated[bool, typer.Option(
    "--load-best", help="a run folder's best_model.zip (as rl_zoo3.enjoy --load-best)")]
LoadCheckpoint = Annotated[int | None, typer.Option("--load-checkpoint", help="a run folder's rl_model_N_steps.zip")]
LoadLastCheckpoint = Annotated[bool, typer.Option(
    "--load-last-checkpoint", help="a run folder's latest rl_model_N_steps.zip")]


@dataclass(frozen=True)
class Loading:
    """How a policy's files are read: ``--trust-pickle``, and rl_zoo3.enjoy's ``--load-best``,
    ``--load-checkpoint N``, ``--load-last-checkpoint`` (which zip of a run folder CHECKPOINT
    means, :func:`quarl.policies.zoo_folder.pick_zip`)."""

    trust_pickle: bool = False
    load_best: bool = False
    load_checkpoint: int | None = None
    load_last_checkpoint: bool = False

    def policy_path(self, checkpoint: Path, env: str | None = None, out: Path | None = None) -> Path:
        """The checkpoint these options choose, with what can be checked before torch loads
        checked first (:mod:`quarl.cli.early`): the path, ``--env``, ``--out``."""
        if isinstance(checkpoint, Path):
            checked_path(checkpoint)
        if self.load_best or self.load_checkpoint is not None or self.load_last_checkpoint:
            from quarl.policies.zoo_folder import pick_zip

            checkpoint = pick_zip(checkpoint, self.load_best, self.load_checkpoint, self.load_last_checkpoint)
        early.env_id(env)
        if isinstance(out, Path):
            early.out_folder(out, [checkpoint])
        return checkpoint


LOADING = Loading()


def checked_path(checkpoint: Path) -> None:
    """A checkpoint path that exists and, if a file, is one a format reads
    (:func:`quarl.policies.file_kind.not_a_policy`), checked before anything heavy loads. Where a
    format may have been registered beside the built-in ones (in this process, or by a
    ``--gym-packages`` module), the formats themselves decide, when the policy loads."""
    import sys

    if str(checkpoint).startswith("hf:"):  # fetched when it loads
        return
    if not checkpoint.exists():
        raise QuarlError(f"checkpoint {str(checkpoint)!r} does not exist")
    envs = sys.modules.get("quarl.envs")
    if "quarl.policies.formats" in sys.modules or (envs is not None and envs.gym_packages()):
        return
    from quarl.policies.file_kind import not_a_policy

    reason = not_a_policy(checkpoint)
    if reason is not None:
        raise QuarlError(reason)


# ------------------------------------------------------------------ output

Out = Annotated[Path | None, typer.Option(
    "--out", parser=validate.out_option, help="output folder (default results/<command>/<policy>)")]
Wide = Annotated[bool, typer.Option(
    "--wide", help="print the table as one wide table even where it is wider than the terminal (it then prints one "
                   "block per row; the CSV is always wide)")]

# ------------------------------------------------------------------ n-bit simulation

Bits = Annotated[str, typer.Option("--bits", help="comma list of widths in 2..16")]
Scheme = Annotated[str, typer.Option("--scheme", help="quarl (paper, unclamped), affine or symmetric")]
Granularity = Annotated[str, typer.Option(
    "--granularity", help="auto (paper: tensor for dense, channel for conv), tensor, channel, block (per --block-size "
                          "inputs)")]
PRECISIONS_HELP = "{precisions}"
"""Every label --precisions takes, from the registries (see :mod:`quarl.cli.help_lists`)."""
