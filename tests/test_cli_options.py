"""Shared CLI option groups: each declared once in quarl.cli.options and attached with one
decorator (``with_options``), so every command that takes a group shows the same flags,
help and defaults."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest
import typer

from quarl.cli import actorq, export, play, ptq, recover, study, sweep, train
from quarl.cli.groups import (
    acting_options,
    agents_acting_options,
    common_options,
    evaluation_options,
    group_parameters,
    int_mode_options,
    loading_options,
    with_options,
)

COMMANDS: dict[str, Callable[..., Any]] = {
    "ptq": ptq.ptq, "sweep": sweep.sweep, "analyze": sweep.analyze, "train": train.train_cmd, "qat": train.qat,
    "actorq run": actorq.actorq_run, "actorq compare": actorq.actorq_compare, "export": export.export,
    "bench": export.bench, "recover": recover.recover, "play": play.play, "demo": study.demo, "study": study.study,
}
GROUPS = {
    "common": (common_options, set(COMMANDS)),
    "evaluation": (evaluation_options, {"ptq", "sweep", "recover"}),
    "deciding": (ptq.DECIDING, {"ptq", "recover"}),
    "int modes": (int_mode_options, {"ptq", "recover", "play", "export", "study"}),
    "acting": (acting_options, {"ptq", "play"}),
    "agents acting": (agents_acting_options, {"demo", "study"}),
    "loading": (loading_options, {"ptq", "sweep", "analyze", "export", "bench", "recover", "play", "study"}),
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_command_that_takes_a_group_takes_its_one_declaration(group: str) -> None:
    declared, users = GROUPS[group]
    for name, command in COMMANDS.items():
        params = inspect.signature(command).parameters
        mine = [params.get(p.name) for p in group_parameters(declared)]
        if name in users:
            assert all(m is not None and m.default is p.default
                       for m, p in zip(mine, group_parameters(declared))), (group, name)
        else:  # a command that takes only some of these declares its own (play's 3 episodes, export's --seed)
            assert not all(m is not None and m.default is p.default
                           for m, p in zip(mine, group_parameters(declared))), (group, name)


def _options(seed: int = typer.Option(0, "--seed"), verbose: bool = typer.Option(False, "--verbose")) -> None:
    """A made-up group."""


def test_with_options_puts_a_group_s_options_where_the_command_names_them() -> None:
    @with_options(_options)
    def command(path: Path = typer.Argument(...), *, seed: int, out: Optional[Path] = None, **rest: Any) -> None:
        """A command naming --seed (it reads it) and leaving --verbose to **rest."""

    names = list(inspect.signature(command).parameters)
    assert names == ["path", "seed", "out", "verbose"]  # --seed in place, --verbose after its own
    assert inspect.signature(command).parameters["seed"].default is inspect.signature(_options).parameters["seed"].default
    assert command.__annotations__["seed"] is int and command.__annotations__["verbose"] is bool


def test_with_options_refuses_a_second_declaration_or_an_option_nowhere() -> None:
    with pytest.raises(TypeError, match="--seed is declared by an option group and by the command"):
        @with_options(_options)
        def twice(*, seed: int = typer.Option(1, "--seed"), verbose: bool) -> None:
            """--seed declared here too."""
    with pytest.raises(TypeError, match=r"nowhere takes no \*\*kwargs for verbose"):
        @with_options(_options)
        def nowhere(*, seed: int) -> None:
            """--verbose has nowhere to go."""
    with pytest.raises(TypeError, match="episodes has no default and no option group declares it"):
        @with_options(_options)
        def undeclared(*, seed: int, verbose: bool, episodes: int) -> None:
            """--episodes is declared nowhere."""
    with pytest.raises(TypeError, match="two option groups declare one option"):
        with_options(_options, common_options)(lambda **kw: None)
