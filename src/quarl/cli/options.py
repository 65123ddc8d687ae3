"""Options and arguments several commands take, and the decorators that add option sets
(rl_zoo3.enjoy's ``--load-*``, ActorQ's shared options) to a command."""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import typer

from quarl.core import validate
from quarl.core.errors import QuarlError

if TYPE_CHECKING:
    from quarl.envs import EnvSpec
    from quarl.policies.base import Policy
    from quarl.policies.checkpoint import Checkpoint

CheckpointArg = typer.Argument(..., help="the policy: an SB3 .zip, an RL Zoo run folder (ppo/CartPole-v1_1), a legacy "
                                         "stable-baselines .pkl, hf://ORG/REPO (Hugging Face Hub), a quarl actorq run "
                                         "folder, or a quarl export (its folder or .onnx)")
EnvOpt = typer.Option(None, "--env", help="gymnasium env id (default: the zoo folder's env)")
EpisodesOpt = typer.Option(20, "--episodes", help="episodes per precision (episode i uses seed + i)")
SeedOpt = typer.Option(0, "--seed")
NEnvsOpt = typer.Option(32, "--n-envs", help="envs stepped side by side per process, the policy called on their batch "
                                               "(each env's action exactly as if alone)")
MaxStepsOpt = typer.Option(None, "--max-steps", help="cut episodes after this many steps")
WorkersOpt = typer.Option(None, "--workers", help="processes playing episodes side by side (default: this machine's "
                                                  "cores, or $QUARL_WORKERS); the same returns as --workers 1")
OutOpt = typer.Option(None, "--out", parser=validate.out_option, help="output folder (default results/<command>/<policy>)")
TrustOpt = typer.Option(False, "--trust-pickle", help="allow arbitrary unpickling of vecnormalize.pkl")
VerboseOpt = typer.Option(False, "--verbose", "-v")
GymPackagesOpt = typer.Option(None, "--gym-packages", metavar="MODULE",
                              help="modules to import first, so the envs they register are known here and in every "
                                   "worker (rl_zoo3's option; repeatable or comma-separated; installed modules or "
                                   "modules in the current folder). A run folder's args.yml gym_packages are imported "
                                   "only when named here, or with --trust-gym-packages (a file naming code to run)")
"""Shown in each command's help; the group takes the option before any command parses
(:func:`quarl.cli.group.take_gym_packages`), so the parameter is always None."""
WideOpt = typer.Option(False, "--wide", help="print the table as one wide table even where it is wider than the "
                       "terminal (it then prints one block per row; the CSV is always wide)")
StickyOpt = typer.Option(None, "--sticky-actions", help="Atari / MinAtar: repeat the previous action with this "
                         "probability (0.25: Machado et al., ALE v5), so a deterministic agent's seeds are different "
                         "games")
AgentsStickyOpt = typer.Option(None, "--sticky-actions", help="Atari / MinAtar agents: repeat the previous action "
                               "with this probability (0.25: ALE v5); the other agents play as they are")
StochasticOpt = typer.Option(None, "--stochastic/--deterministic", help="sample actions as rl_zoo3.enjoy "
                             "--stochastic does (fp32 and each precision share their noise per seed and step), or act "
                             "greedily; default: the RL Zoo's (stochastic on Atari and MinAtar)")
BitsOpt = typer.Option("8,7,6,5,4,3,2", help="comma list of widths in 2..16")
SchemeOpt = typer.Option("quarl", help="quarl (paper, unclamped), affine or symmetric")
GranularityOpt = typer.Option("auto", help="auto (paper: tensor for dense, channel for conv), tensor, channel, "
                                           "block (per --block-size inputs)")
PRECISIONS_HELP = "{precisions}"
"""Every label --precisions takes, from the registries (see :mod:`quarl.cli.help_lists`)."""
Int8WeightsOpt = typer.Option("auto", help="8-bit weights of the MatMulInteger / QDQ modes: auto (symmetric int8 "
                                           "where the CPU has VNNI, else asymmetric uint8), asymmetric, symmetric")
BlockSizeOpt = typer.Option(32, "--block-size", help="inputs per block of the MatMulNBits modes: 16, 32, 64, 128 or 256")


def common_options(gym_packages: Optional[str] = GymPackagesOpt, verbose: bool = VerboseOpt) -> None:
    """What every command that makes an env takes (attach with :func:`with_options`)."""


def evaluation_options(episodes: int = EpisodesOpt, seed: int = SeedOpt, n_envs: int = NEnvsOpt,
                       max_steps: Optional[int] = MaxStepsOpt, workers: Optional[int] = WorkersOpt) -> None:
    """How a policy's episodes are played for its score (ptq, sweep, recover)."""


def int_mode_options(int8_weights: str = Int8WeightsOpt, block_size: int = BlockSizeOpt) -> None:
    """The settings every real int mode of a command shares (ptq, recover, play, export, study)."""


def acting_options(sticky_actions: Optional[float] = StickyOpt, stochastic: Optional[bool] = StochasticOpt) -> None:
    """How one policy acts in its episodes (ptq, play)."""


def agents_acting_options(sticky_actions: Optional[float] = AgentsStickyOpt,
                          stochastic: Optional[bool] = StochasticOpt) -> None:
    """How each of several agents acts (demo, study): sticky actions for the Atari / MinAtar ones."""


def loading_options(trust_pickle: bool = TrustOpt) -> None:
    """How a policy's files are read (every command that loads a checkpoint)."""


def deciding_options(episodes: int, minutes: float) -> list[inspect.Parameter]:
    """--decide-episodes and --decide-minutes with a command's defaults (ptq and recover,
    demo, study); ``QUARL_DECIDE_EPISODES`` replaces the episodes default (the test suite
    sets 0)."""
    return [
        inspect.Parameter("decide_episodes", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int], default=typer.Option(
            None, "--decide-episodes", show_default=False, help="where a verdict is undecided, play more episodes (the "
            "next seeds, fp32 too; doubling) until it decides or a cell has played this many (0: off) [default: "
            f"{episodes}, or $QUARL_DECIDE_EPISODES]")),
        inspect.Parameter("decide_minutes", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
            minutes, "--decide-minutes", help="start no new round of deciding episodes after this many minutes (0: no "
            "limit)")),
    ]


def load_choice(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Gives a command rl_zoo3.enjoy's ``--load-best``, ``--load-checkpoint N`` and
    ``--load-last-checkpoint``: which zip of a run folder its CHECKPOINT means
    (:func:`quarl.policies.zoo_folder.pick_zip`); the zip then finds its folder's statistics."""
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
        checkpoint = kwargs.get("checkpoint")
        if isinstance(checkpoint, Path) and not str(checkpoint).startswith("hf:") and not checkpoint.exists():
            # before any option that needs the registries (torch): a typo answers at once
            raise QuarlError(f"checkpoint {str(checkpoint)!r} does not exist")
        if load_best or load_checkpoint is not None or load_last_checkpoint:
            from quarl.policies.zoo_folder import pick_zip

            kwargs["checkpoint"] = pick_zip(kwargs["checkpoint"], load_best, load_checkpoint, load_last_checkpoint)
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    setattr(wrapper, "__signature__", signature.replace(parameters=[*signature.parameters.values(), *extra]))
    return wrapper


OptionGroup = Union[Callable[..., None], Sequence[inspect.Parameter]]
"""A group of options declared once: a function whose signature lists them (typer reads it),
or the parameters themselves (options made from a registry)."""


def group_parameters(group: OptionGroup) -> list[inspect.Parameter]:
    if not callable(group):
        return list(group)
    hints = typing.get_type_hints(group)
    return [p.replace(kind=p.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(group).parameters.values()]


def with_options(*groups: OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Gives a command each group's options, declared once (flag, help, default) and
    attached here. The command names a group's option it reads as a keyword-only parameter
    without a default, where it should show in ``--help`` (``episodes: int``), and gets its
    value there; the options it does not name come after its own, in ``**kwargs``. A bare
    parameter no group declares, an option declared twice, or one the command can take
    nowhere is refused when the module loads."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        declared = {p.name: p for group in groups for p in group_parameters(group)}
        if len(declared) < sum(len(group_parameters(group)) for group in groups):
            raise TypeError(f"{fn.__name__}: two option groups declare one option")
        hints = typing.get_type_hints(fn)
        own, rest = [], dict(declared)
        signature = inspect.signature(fn)
        for p in signature.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                continue
            if p.name in declared:
                if p.default is not p.empty:
                    raise TypeError(f"{fn.__name__}: --{p.name.replace('_', '-')} is declared by an option group "
                                    "and by the command")
                own.append(rest.pop(p.name))
            elif p.default is p.empty and p.kind is p.KEYWORD_ONLY:
                raise TypeError(f"{fn.__name__}: {p.name} has no default and no option group declares it")
            else:
                own.append(p.replace(annotation=hints.get(p.name, p.annotation)))
        if rest and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            raise TypeError(f"{fn.__name__} takes no **kwargs for {', '.join(rest)}")
        setattr(fn, "__signature__", signature.replace(parameters=own + list(rest.values())))
        fn.__annotations__ = {**{p.name: p.annotation for p in (*own, *rest.values())}, "return": hints.get("return")}
        return fn

    return wrap


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and its bases (CleanRL's style: the
    field's help), whitespace collapsed and reST's double backquotes dropped."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        node = _class_node(klass.__module__, klass.__qualname__)
        if node is None:
            continue
        for field, after in zip(node.body, node.body[1:]):
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) \
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                docs[field.target.id] = " ".join(after.value.value.replace("``", "").split())
    return docs


@functools.lru_cache(maxsize=None)
def _module_classes(module: str) -> dict[str, ast.ClassDef]:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return {}
    tree = ast.parse(Path(spec.origin).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _class_node(module: str, name: str) -> ast.ClassDef | None:
    return _module_classes(module).get(name)


def load(checkpoint: Path, env: Optional[str], trust_pickle: bool) -> tuple[Checkpoint, EnvSpec]:
    """quarl.load: fails before any work when the env does not fit the policy."""
    from quarl.api import load_checkpoint_and_env as load_policy

    ckpt = load_policy(checkpoint, env, trust_pickle)
    if ckpt.env_spec is None:  # quarl.load gives the env or raises; this says so to the type checker
        raise QuarlError(f"{checkpoint} names no env: pass --env ENV_ID")
    if checkpoint.suffix == ".zip" and ckpt.policy.obs_normalizer is None and not ckpt.policy.scale_images \
            and not is_export(checkpoint) and not (checkpoint.parent / checkpoint.stem / "config.yml").exists():
        from quarl.training.hyperparams import missing_statistics

        note = missing_statistics(ckpt.algo, ckpt.env_spec.env_id, checkpoint.name)
        if note:
            logging.getLogger("quarl").warning("%s", note)
    return ckpt, ckpt.env_spec


def protocol(policy: Policy, spec: EnvSpec, stochastic: Optional[bool],
             sticky_actions: Optional[float]) -> tuple[EnvSpec, Policy]:
    """The env spec with ``--sticky-actions`` and the policy acting as ``--stochastic`` /
    ``--deterministic`` say (or the RL Zoo's default)."""
    from quarl.evaluation.episodes import protocol as acting_protocol

    return acting_protocol(policy, spec, stochastic, sticky_actions)


def is_export(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` is an exported model (a quarl export folder or .onnx)."""
    from quarl.policies.onnx_artifact import is_artifact

    return is_artifact(checkpoint)
