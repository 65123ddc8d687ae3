"""``quarl actorq run`` / ``compare``'s options of one algorithm, made from each registry
entry's options dataclass (:mod:`quarl.actorq.options`): one option per field, its help the
field's docstring (CleanRL's style)."""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path
from typing import Optional, get_type_hints

import typer

ALGORITHM_PANEL = "Options of one algorithm (--algo)"
SWITCH_PANEL = "Switches of one algorithm (--algo)"
"""The on / off options (``--x/--no-x``): in a panel of their own, since their ``--no-x``
column would squeeze the names beside it (``--samples-per-insert-tolerance`` cut to 21
characters at 80 columns)."""
SCALARS: tuple[type, ...] = (bool, int, float, str)
"""Field types an option takes as they are; any other (a tuple of widths) is a comma list."""


def algorithm_parameters() -> list[inspect.Parameter]:
    """One option per field of every registered algorithm's options dataclass
    (:mod:`quarl.actorq.algorithms`), ``--field-name``, its help the field's docstring after
    the algorithms that take it. Each defaults to None (not given: the field's default, shown
    in the help), so an option of another algorithm is refused rather than ignored."""
    from dataclasses import fields

    from quarl.actorq.algorithms import ALGORITHMS, option_owners

    owners = option_owners()
    docs: dict[str, dict[str, list[str]]] = {}
    defaults: dict[str, dict[str, list[str]]] = {}
    kinds: dict[str, type | None] = {}
    """The field's type where it is one of :data:`SCALARS`; None: a comma list."""
    for algorithm in ALGORITHMS.values():
        hints, helps = get_type_hints(algorithm.options), field_docs(algorithm.options)
        for f in fields(algorithm.options):
            docs.setdefault(f.name, {}).setdefault(helps.get(f.name, ""), []).append(algorithm.name)
            shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default)
            defaults.setdefault(f.name, {}).setdefault(shown, []).append(algorithm.name)
            hint = hints[f.name]
            kinds[f.name] = hint if hint in SCALARS else None
    parameters = []
    for name in owners:
        flag = "--" + name.replace("_", "-")
        kind = kinds[name]
        names = [f"{flag}/--no-{name.replace('_', '-')}"] if kind is bool else [flag]
        helped = "; ".join(f"{', '.join(algos)}: {_plain(doc)}" for doc, algos in docs[name].items())
        shown = next(iter(defaults[name])) if len(defaults[name]) == 1 else \
            "; ".join(f"{', '.join(algos)}: {value}" for value, algos in defaults[name].items())
        annotation: object = Optional[kind or str]  # what typer reads: the value given, or None
        option = typer.Option(None, *names, help=f"{helped} \\[default: {shown}]", show_default=False,
                              rich_help_panel=SWITCH_PANEL if kind is bool else ALGORITHM_PANEL,
                              metavar="W,W,..." if kind is None else None)
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                            annotation=annotation))
    return parameters


def _plain(doc: str) -> str:
    """A field's docstring as the other options' help reads: no capital (but in an acronym)
    and no full stop at the end."""
    if len(doc) > 1 and doc[1].islower():
        doc = doc[0].lower() + doc[1:]
    return doc.removesuffix(".")


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


@functools.cache
def _module_classes(module: str) -> dict[str, ast.ClassDef]:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return {}
    tree = ast.parse(Path(spec.origin).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _class_node(module: str, name: str) -> ast.ClassDef | None:
    return _module_classes(module).get(name)
