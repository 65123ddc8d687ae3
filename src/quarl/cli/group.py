"""The command group every ``quarl`` command runs in: old option spellings rewritten with a
notice, ``--gym-packages`` and ``--trust-gym-packages`` taken before the command, usage errors as one line, and the help
lists filled from the registries when ``--help`` is asked for."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
import typer
from typer.core import TyperGroup

from quarl.cli import early, help_lists
from quarl.cli.common import console, print_error
from quarl.core.errors import QuarlError

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as _typer_click
    USAGE_ERRORS: tuple[type[BaseException], ...] = (click.UsageError, _typer_click.UsageError)
    ABORTS: tuple[type[BaseException], ...] = (click.Abort, getattr(_typer_click, "Abort", click.Abort), typer.Abort)
except ImportError:  # pragma: no cover - older typer uses click itself
    USAGE_ERRORS, ABORTS = (click.UsageError,), (click.Abort,)

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
GROUPS = ("actorq",)
"""Command groups: their command path is two words."""


def rename_options(args: list[str], notice: Callable[[str], None]) -> list[str]:
    """``args`` with every old option spelling of their command replaced by the new one."""
    words = [a for a in args[:2] if not a.startswith("-")]
    command = " ".join(words[:2]) if words and words[0] in GROUPS else (words[0] if words else "")
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
    envs it registers are known, here and in the evaluation workers; and without
    ``--trust-gym-packages``, which lets a run folder's ``args.yml`` name modules to import.
    Without either, nothing is imported (``--help`` and a refusal stay light)."""
    if not any(a == "--trust-gym-packages" or a.partition("=")[0] == "--gym-packages" for a in args):
        return args
    from quarl.envs import TRUST_OPTION, import_gym_packages, trust_gym_packages

    if TRUST_OPTION in args:
        trust_gym_packages()
        args = [a for a in args if a != TRUST_OPTION]
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


def contradicting_flags(group: Any, args: Sequence[str]) -> str | None:
    """The line refusing both sides of an on/off flag given to one command
    (``--stochastic --deterministic``: click takes the last silently), or None."""
    words = list(args[:args.index("--")] if "--" in args else args)
    named = help_lists.shown(group, words)  # the command the words name, then the ones under it
    for param in getattr(named[0] if named else group, "params", []):
        on = [w for w in words if w in getattr(param, "opts", ())]
        off = [w for w in words if w in getattr(param, "secondary_opts", ())]
        if on and off:
            first, second = sorted((on[0], off[0]), key=words.index)  # in the order typed
            return f"{first} and {second} contradict each other: give one of them"
    return None


class QuarlGroup(TyperGroup):
    """Click's usage errors (a value that is not a number, an unknown option) as one line
    on stderr and exit status 2, like every other error quarl reports; ``--help`` as ever.
    Old option spellings (RENAMED_OPTIONS) are rewritten first, with a notice."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        args = rename_options(list(sys.argv[1:] if args is None else args),
                              lambda text: console.print(text, highlight=False, soft_wrap=True))
        try:
            args = take_gym_packages(args)
        except QuarlError as exc:
            print_error(str(exc))
            if not standalone_mode:
                return 2
            sys.exit(2)
        if "--help" in args:  # the lists of algorithms, precisions and modes, from the registries
            envs = sys.modules.get("quarl.envs")
            help_lists.fill(self, args, use_cache=not (envs and envs.gym_packages()))  # a package may register entries
        contradiction = None if "--help" in args else contradicting_flags(self, args)
        if contradiction is not None:
            print_error(contradiction)
            if not standalone_mode:
                return 2
            sys.exit(2)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        except USAGE_ERRORS as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `quarl` alone: the help, as before
                console.print(exc.format_message(), highlight=False)  # type: ignore[attr-defined]
            else:
                console.print(f"[red]error:[/red] {exc.format_message()}",  # type: ignore[attr-defined]
                              highlight=False, soft_wrap=True)
            code = 2
        except ABORTS:
            console.print("aborted")
            code = 1
        finally:
            try:  # the precision labels a later refusal reads before torch loads (quarl.cli.early)
                early.remember_precisions()
            except Exception:  # a cache never fails a command
                pass
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)
