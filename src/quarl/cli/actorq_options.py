"""``quarl actorq run`` / ``compare``'s options of one algorithm, made from each registry
entry's options dataclass (:mod:`quarl.actorq.options`): one option per field, ``--field-name``
(``--x/--no-x`` for a bool, a comma list for a tuple of widths), its help the field's docstring
(CleanRL's style), read by pydantic (``use_attribute_docstrings``) when the help is shown.

The options are click parameters the command's class adds (:class:`ActorQCommand`):
which exist depends on the registry, so no function signature can list them; typer makes them
from a dataclass generated from the entries' fields (:func:`given_options`), as it makes a
settings dataclass's (:func:`quarl.cli.command.parameters_of`). Each defaults to
None (not given: the field's default, shown in the help), so an option of another algorithm
is refused rather than ignored (:func:`quarl.actorq.launch.algorithm_options`); the values
given go to ``ctx.meta`` (:func:`given`), already typed."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from quarl.cli.actorq_settings import NAMES as SETTINGS
from quarl.cli.actorq_settings import RunSettings
from quarl.cli.command import QuarlCommand, parameters_of
from quarl.core import validate

ALGORITHM_PANEL = "Options of one algorithm (--algo)"
SWITCH_PANEL = "Switches of one algorithm (--algo)"
"""The on / off options (``--x/--no-x``): in a panel of their own, since their ``--no-x``
column would squeeze the names beside it (``--samples-per-insert-tolerance`` cut to 21
characters at 80 columns)."""
SCALARS: tuple[type, ...] = (bool, int, float, str)
"""Field types an option takes as they are; a tuple of ints is a comma list."""
META_KEY = "quarl.algorithm_options"
"""Where the algorithm options given are kept in the click context's ``meta``."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def field_kinds() -> dict[str, type | None]:
    """Every option field of every registered algorithm -> its type where it is one of
    :data:`SCALARS`; None: a tuple of widths (a comma list)."""
    from quarl.actorq.algorithms import ALGORITHMS, option_owners

    option_owners()  # loads the algorithms registered in modules of their own
    kinds: dict[str, type | None] = {}
    for algorithm in ALGORITHMS.values():
        hints = typing.get_type_hints(algorithm.options)
        for f in dataclasses.fields(algorithm.options):
            hint = hints[f.name]
            kinds[f.name] = hint if hint in SCALARS else None
    return kinds


def keep(name: str, kind: type | None) -> Callable[[typer.Context, Any], None]:
    """The callback of option ``name``: its value, typed (a comma list as a tuple of widths),
    in ``ctx.meta`` where given."""

    def store(ctx: typer.Context, value: Any) -> None:
        if value is None:
            return
        typed = validate.layer_widths(value, flag(name)) if kind is None else value
        ctx.meta.setdefault(META_KEY, {})[name] = typed

    return store


def algorithm_parameters() -> list[Any]:
    """One option per field of every registered algorithm's options dataclass, in
    registration order, made by typer from its type as a settings dataclass's
    (:func:`quarl.cli.command.parameters_of` of :func:`given_options`; help filled when shown:
    :func:`describe`)."""
    return parameters_of(given_options())


def given_options() -> type:
    """A dataclass of the algorithm options as the command line gives them: each field of
    every registered algorithm's options (:func:`field_kinds`), ``Annotated`` with its
    ``typer.Option`` (``--x/--no-x`` for a bool, a comma list for widths, a panel of the
    algorithm's), default None (not given; the value given goes to ``ctx.meta``: :func:`keep`)."""
    fields = []
    for name, kind in field_kinds().items():
        names = [f"{flag(name)}/--no-{flag(name)[2:]}"] if kind is bool else [flag(name)]
        option = typer.Option(*names, show_default=False, expose_value=False, callback=keep(name, kind),
                              rich_help_panel=SWITCH_PANEL if kind is bool else ALGORITHM_PANEL,
                              metavar="W,W,..." if kind is None else None)
        fields.append((name, Annotated[(kind or str) | None, option], dataclasses.field(default=None)))
    return dataclasses.make_dataclass("GivenAlgorithmOptions", fields, frozen=True)


def describe(parameters: list[Any]) -> None:
    """Each algorithm option's help: the field's docstring after the algorithms that take it,
    and its default (per algorithm where they differ)."""
    from quarl.actorq.algorithms import ALGORITHMS

    docs: dict[str, dict[str, list[str]]] = {}
    defaults: dict[str, dict[str, list[str]]] = {}
    for algorithm in ALGORITHMS.values():
        helps = field_docs(algorithm.options)
        for f in dataclasses.fields(algorithm.options):
            docs.setdefault(f.name, {}).setdefault(helps.get(f.name, ""), []).append(algorithm.name)
            shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default)
            defaults.setdefault(f.name, {}).setdefault(shown, []).append(algorithm.name)
    for param in parameters:
        name = param.name
        helped = "; ".join(f"{', '.join(algos)}: {_plain(doc)}" for doc, algos in docs[name].items())
        shown = next(iter(defaults[name])) if len(defaults[name]) == 1 else \
            "; ".join(f"{', '.join(algos)}: {value}" for value, algos in defaults[name].items())
        param.help = f"{helped} \\[default: {shown}]"


def given(ctx: typer.Context) -> dict[str, Any]:
    """The algorithm options given on the command line (typed), by field name."""
    return dict(ctx.meta.get(META_KEY, {}))


def _plain(doc: str) -> str:
    """A field's docstring as the other options' help reads: no capital (but in an acronym)
    and no full stop at the end."""
    if len(doc) > 1 and doc[1].islower():
        doc = doc[0].lower() + doc[1:]
    return doc.removesuffix(".")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and its bases (CleanRL's style: the
    field's help), as pydantic reads them (``use_attribute_docstrings``, set on
    :class:`quarl.actorq.options.AlgorithmOptions`), whitespace collapsed and reST's double
    backquotes dropped. pydantic reads a class's own fields' docstrings, so each base is asked."""
    from pydantic import TypeAdapter

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or not dataclasses.fields(klass):
            continue
        for name, schema in TypeAdapter(klass).json_schema()["properties"].items():
            if schema.get("description"):
                docs[name] = " ".join(schema["description"].replace("``", "").split())
    return docs


class ActorQCommand(QuarlCommand):
    """``actorq run`` / ``compare``: the command's own parameters (its function's), the options
    of the run both start (:class:`~quarl.cli.actorq_settings.RunSettings`, parsed into
    ``ctx.params`` like the others and read with ``RunSettings.parsed(ctx)``) before the
    function's last, ``--verbose``, as every command ends; then every registered algorithm's
    (their help made when it is shown)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.algorithm_params = algorithm_parameters()
        verbose = next(i for i, param in enumerate(self.params) if param.name == "verbose")
        self.params[verbose:verbose] = parameters_of(RunSettings)
        self.params.extend(self.algorithm_params)

    def invoke(self, ctx: Any) -> Any:
        """The command's function, given its own parameters (the shared settings stay in
        ``ctx.params``)."""
        if self.callback is None:
            return None
        return ctx.invoke(self.callback, **{k: v for k, v in ctx.params.items() if k not in SETTINGS})

    def format_help(self, ctx: Any, formatter: Any) -> None:
        describe(self.algorithm_params)
        super().format_help(ctx, formatter)
