"""Option groups several commands share, each declared once (flag, help, default), and the
decorator that attaches them to a command (:func:`with_options`): ``--help`` text and
defaults come from one place."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import typer

from quarl.cli.options import (
    AgentsStickyOpt,
    BlockSizeOpt,
    EpisodesOpt,
    GymPackagesOpt,
    Int8WeightsOpt,
    MaxStepsOpt,
    NEnvsOpt,
    SeedOpt,
    StickyOpt,
    StochasticOpt,
    TrustGymPackagesOpt,
    TrustOpt,
    VerboseOpt,
    WorkersOpt,
)


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


def loading_options(trust_pickle: bool = TrustOpt, trust_gym_packages: bool = TrustGymPackagesOpt) -> None:
    """How a policy's files are read (every command that loads a checkpoint)."""


def deciding_options(episodes: int, minutes: float) -> list[inspect.Parameter]:
    """--decide-episodes and --decide-minutes with a command's defaults (ptq and recover,
    demo, study), and how the verdicts are judged (--insure, --return-range);
    ``QUARL_DECIDE_EPISODES`` replaces the episodes default (the test suite sets 0)."""
    return [
        inspect.Parameter("decide_episodes", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int], default=typer.Option(
            None, "--decide-episodes", show_default=f"{episodes}, or $QUARL_DECIDE_EPISODES", help="where a verdict is "
            "undecided, play more episodes (the next seeds, fp32 too; 10 at a time) until it decides or a cell has "
            "played this many (0: off)")),
        inspect.Parameter("decide_minutes", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
            minutes, "--decide-minutes", help="start no new chunk of deciding episodes after this many minutes (0: no "
            "limit)")),
        inspect.Parameter("insure", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
            1.0, "--insure", metavar="K", help="where the env defines no range of returns, the verdict insures against "
            "an unseen failure costing up to K mean returns beyond the worst paired loss seen (docs/ptq.md: what each "
            "K insures and costs)")),
        inspect.Parameter("return_range", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str], default=typer.Option(
            None, "--return-range", metavar="LO:HI", help="every return lies in LO:HI (e.g. a reward clipped by a "
            "wrapper): the verdict assumes exactly that range; a return outside it refuses the verdict")),
    ]


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
