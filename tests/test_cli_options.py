"""The CLI's option groups (:mod:`quarl.cli.settings`): each option declared once as a typer
``Annotated`` type beside its group's dataclass, so every command that takes a group shows the
same flags, help and defaults; and CONTRIBUTING's recipe "Add a CLI command" (one module and
one registration line), followed end to end."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from quarl.cli import actorq, bench, export, judge, play, ptq, recover, settings, study, sweep, train
from quarl.cli.app import app

COMMANDS: dict[str, Callable[..., Any]] = {
    "ptq": ptq.ptq, "sweep": sweep.sweep, "analyze": sweep.analyze, "train": train.train_cmd, "qat": train.qat,
    "actorq run": actorq.actorq_run, "actorq compare": actorq.actorq_compare, "export": export.export,
    "bench": bench.bench, "play": play.play, "demo": study.demo, "study": study.study, "judge": judge.judge,
    "recover": recover.recover,
}
GROUPS: dict[str, tuple[type | None, dict[str, Any], set[str]]] = {
    # group: (its dataclass, option -> its one declaration, the commands that take the whole group)
    "evaluation": (settings.Evaluation, {"episodes": settings.Episodes, "seed": settings.Seed,
                                         "n_envs": settings.NEnvs, "max_steps": settings.MaxSteps,
                                         "workers": settings.Workers}, {"ptq", "sweep", "recover"}),
    "int options": (settings.IntOptions, {"int8_weights": settings.Int8Weights, "block_size": settings.BlockSize},
                    {"ptq", "play", "export", "study", "recover"}),
    "acting": (settings.Acting, {"sticky_actions": settings.StickyActions, "stochastic": settings.Stochastic},
               {"ptq", "play"}),
    "loading": (settings.Loading, {"trust_pickle": settings.TrustPickle, "load_best": settings.LoadBest,
                                   "load_checkpoint": settings.LoadCheckpoint,
                                   "load_last_checkpoint": settings.LoadLastCheckpoint},
                {"ptq", "sweep", "export", "bench", "play", "recover"}),
    "deciding": (None, {"decide_minutes": settings.DecideMinutes, "insure": settings.Insure,
                        "return_range": settings.ReturnRange}, {"ptq", "recover", "demo", "study"}),
    "common": (None, {"gym_packages": settings.GymPackages, "verbose": settings.Verbose},
               set(COMMANDS) - {"judge"}),
}


def hints(command: Callable[..., Any]) -> dict[str, Any]:
    return typing.get_type_hints(command, include_extras=True)


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_command_that_takes_a_group_takes_its_one_declaration(group: str) -> None:
    """Each option of the group is the group's own ``Annotated`` type (the same typer option
    object), with the dataclass field's default."""
    cls, options, users = GROUPS[group]
    defaults = {f.name: f.default for f in dataclasses.fields(cls)} if cls is not None else {}
    for name in users:
        declared, signature = hints(COMMANDS[name]), inspect.signature(COMMANDS[name]).parameters
        for option, annotation in options.items():
            assert declared[option] == annotation, (group, name, option)
            if option in defaults:
                assert signature[option].default == defaults[option], (group, name, option)


def test_a_group_s_dataclass_checks_its_values_before_anything_heavy() -> None:
    from quarl.core.errors import QuarlError

    with pytest.raises(QuarlError, match="--episodes 0 must be at least 1"):
        settings.Evaluation(episodes=0).checked()
    with pytest.raises(QuarlError, match="--n-envs 2000 must be in 1..1024"):
        settings.Evaluation(n_envs=2000).checked()
    assert settings.Evaluation(7, 3, 4, 100).checked().settings(2).workers == 2
    assert settings.IntOptions("symmetric", 64).checked() == {"int8_weights": "symmetric", "block_size": 64}
    deciding = settings.Deciding.parse(100, 2.0, 1.0, "0:500", default=20)
    assert (deciding.episodes, deciding.seconds) == (100, 120.0)
    assert deciding.note(20) == "deciding up to 100 episodes / 2 min" and deciding.note(100) == ""


def test_no_command_rewrites_a_signature_or_takes_kwargs() -> None:
    """typer reads each command's own signature: no ``__signature__`` set, no ``**kwargs``."""
    for name, command in COMMANDS.items():
        function = inspect.unwrap(command)
        assert "__signature__" not in vars(function), name
        assert not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(function).parameters.values()), name


HELLO = '''"""``quarl hello``: a made-up command (CONTRIBUTING's recipe "Add a CLI command")."""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.app import app
from quarl.cli.command import command
from quarl.cli.common import say, setup, user_errors
from quarl.cli.settings import EVALUATION, Episodes, Evaluation, Seed, Verbose


@command(app, "hello")
@user_errors
def hello(
    name: Annotated[str, typer.Argument(help="who to greet")],
    *,
    episodes: Episodes = EVALUATION.episodes,
    seed: Seed = EVALUATION.seed,
    verbose: Verbose = False,
) -> None:
    """Greet NAME with the evaluation it would play."""
    setup(verbose)
    evaluation = Evaluation(episodes, seed).checked()
    say(f"hello {name}: {evaluation.episodes} episodes from seed {evaluation.seed}")
'''


def test_a_cli_command_is_one_module_and_one_registration_line(tmp_path: Path) -> None:
    """The recipe: the module above, and its import (``from quarl.cli import hello`` in
    quarl/cli/__init__.py; here the test imports it). It runs, shares the evaluation options'
    flags, help and checks, shows in ``quarl --help``, and is gone once removed."""
    (tmp_path / "quarl_hello.py").write_text(HELLO)
    sys.path.insert(0, str(tmp_path))
    before = list(app.registered_commands)
    try:
        import quarl_hello  # noqa: F401  (the one registration line)

        r = run_cli("hello", "you", "--episodes", "3", "--seed", "7")
        assert r.returncode == 0 and r.stdout.strip() == "hello you: 3 episodes from seed 7", r.stderr
        r = run_cli("hello", "you", "--episodes", "0")
        assert r.returncode == 2 and r.stderr.strip() == "error: --episodes 0 must be at least 1"
        shown = run_cli("hello", "--help").stdout
        assert "episodes per precision (episode i uses seed + i)" in shown and "[default: 20]" in shown
        assert "Greet NAME" in run_cli("--help").stdout
    finally:
        app.registered_commands[:] = before
        sys.path.remove(str(tmp_path))
        sys.modules.pop("quarl_hello", None)
    assert run_cli("hello", "you").returncode == 2
