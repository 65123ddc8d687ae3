"""The click classes every ``quarl`` command runs in (typer's own, extended where click lets
one): usage errors and refusals as one line on stderr with exit status 2, the lists in the
help filled from the registries when the help is shown, flags shown bare, both sides of an
on/off flag refused, and old option spellings read as the new ones (click's
``token_normalize_func``) with a notice."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click
import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from quarl.cli import help_lists
from quarl.cli.common import console, print_error
from quarl.core.errors import QuarlError

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as _typer_click
    USAGE_ERRORS: tuple[type[BaseException], ...] = (click.UsageError, _typer_click.UsageError)
    ABORTS: tuple[type[BaseException], ...] = (click.Abort, getattr(_typer_click, "Abort", click.Abort), typer.Abort)
except ImportError:  # pragma: no cover - older typer uses click itself
    USAGE_ERRORS, ABORTS = (click.UsageError,), (click.Abort,)


def renamed(command: str, names: dict[str, str]) -> dict[str, Any]:
    """A command's ``context_settings`` that read each old option spelling of ``names``
    (``--old`` -> ``--new``, kept for one release) as the new one, with a one-line notice; none is
    in ``--help``. Click passes every option token, without its dashes, through the function."""
    bare = {old.lstrip("-"): new.lstrip("-") for old, new in names.items()}

    def normalize(token: str) -> str:
        new = bare.get(token)
        if new is None:
            return token
        console.print(f"note: quarl {command} --{token} is now --{new} (the old name goes in the next release)",
                      highlight=False, soft_wrap=True)
        return new

    return {"token_normalize_func": normalize}


def contradiction(params: Iterable[Any], args: Sequence[str]) -> str | None:
    """The line refusing both sides of an on/off flag given to one command
    (``--stochastic --deterministic``: click takes the last silently), or None."""
    words = list(args[:args.index("--")] if "--" in args else args)
    for param in params:
        on = [w for w in words if w in getattr(param, "opts", ())]
        off = [w for w in words if w in getattr(param, "secondary_opts", ())]
        if on and off:
            first, second = sorted((on[0], off[0]), key=words.index)  # in the order typed
            return f"{first} and {second} contradict each other: give one of them"
    return None


def named_command(group: Any, args: Sequence[str]) -> Any | None:
    """The command ``args`` name under ``group`` (``ptq``, ``actorq run``), or None."""
    command, current = None, group
    for arg in args:
        if arg.startswith("-"):
            continue
        sub = (getattr(current, "commands", None) or {}).get(arg)
        if sub is None:
            break
        command = current = sub
    return command


def show_bare_and_filled(command: Any, ctx: Any) -> None:
    """Before a command's help is shown: its flags (``--wide``, ``--help``) without a ``<bool>``
    (they take no value), and each ``{list}`` in an option's help replaced by the registry's list
    (:mod:`quarl.cli.help_lists`)."""
    params = list(command.get_params(ctx))
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        text = getattr(param, "help", None)
        if isinstance(text, str) and "{" in text:
            setattr(param, "help", help_lists.render(text))


class QuarlCommand(TyperCommand):
    """A command: the lists in its help from the registries, flags bare."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        show_bare_and_filled(self, ctx)
        super().format_help(ctx, formatter)


class QuarlGroup(TyperGroup):
    """``quarl`` and ``quarl actorq``: click's usage errors (a value that is not a number, an
    unknown option) and refusals made while parsing (a ``--gym-packages`` module that cannot be
    imported) as one line on stderr and exit status 2, like every other error quarl reports;
    both sides of an on/off flag given to the command the arguments name refused before
    anything is parsed (typer's value checks load pydantic); ``--help`` as ever."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        show_bare_and_filled(self, ctx)
        super().format_help(ctx, formatter)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        named = None if "--help" in args or ctx.parent is not None else named_command(self, args)
        said = None if named is None else contradiction(named.params, args)
        if said is not None:
            raise click.UsageError(said, ctx)
        return super().parse_args(ctx, args)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        code = self.run(list(sys.argv[1:] if args is None else args), prog_name, complete_var, windows_expand_args,
                        **extra)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def run(self, args: list[str], prog_name: str | None, complete_var: str | None, windows_expand_args: bool,
            **extra: Any) -> Any:
        try:
            return super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except USAGE_ERRORS as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `quarl` alone: the help, as before
                console.print(exc.format_message(), highlight=False)  # type: ignore[attr-defined]
            else:
                console.print(f"[red]error:[/red] {exc.format_message()}",  # type: ignore[attr-defined]
                              highlight=False, soft_wrap=True)
            return 2
        except QuarlError as exc:  # an option's callback refused its value (--gym-packages)
            print_error(str(exc))
            return 2
        except ABORTS:
            console.print("aborted")
            return 1


def parameters_of(settings: Callable[..., Any]) -> list[Any]:
    """The click parameters typer makes of ``settings``' signature (a settings dataclass: one
    per field, each ``Annotated`` with its ``typer.Option``, its default the field's), as it makes
    a command's: typer's public way (a command of an app of its own, made into click's by
    ``typer.main.get_command``), for a command class that adds them to a command's own."""
    own = typer.Typer(add_completion=False)
    own.command()(settings)
    return list(typer.main.get_command(own).params)


def command(app: typer.Typer, name: str, renames: dict[str, str] | None = None, path: str | None = None,
            cls: type[QuarlCommand] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as the command ``name`` of ``app`` in ``cls`` (default
    :class:`QuarlCommand`); ``renames``: old option spellings it still reads (:func:`renamed`),
    ``path``: how their notice names the command (default ``name``)."""
    settings = renamed(path or name, renames) if renames else None
    return app.command(name, cls=cls or QuarlCommand, context_settings=settings)
