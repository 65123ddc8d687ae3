"""Typed records at the file boundary: whatever quarl reads from a file (JSON, YAML, a
checkpoint's plain containers) becomes a pydantic model before anything uses it, and a
record that does not fit is refused in one line naming the file and the field::

    FILE: field layers.q_net.0.out_max: Input should be a finite number (got inf)

:class:`Record` is the base of every such model: strict types (``"5"`` is not a number,
``True`` is not a count), finite numbers only, no fields the writer never writes.
:func:`parse_record` is the one function that turns a parsed object into a record;
:func:`parse_json` parses JSON text first (NaN and deep nesting included) for readers that
start from bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import reprlib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from quarl.core.errors import QuarlError

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 40, 40, 4, 4, 2


class Record(BaseModel):
    """A record read from a file: strict, finite, closed (unknown fields are refused)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", frozen=True)


def record_of(name: str, shape: type, *, base: type[R], flatten: Mapping[str, type] | None = None,
              types: Mapping[str, Any] | None = None, names: Mapping[str, Any] | None = None,
              required: tuple[str, ...] = ()) -> type[R]:
    """The file's image of the dataclass ``shape``: a ``base`` subclass whose fields are
    ``shape``'s, in order, with their annotations (``Annotated`` checks included) and defaults,
    so a record is defined once (the dataclass) and read back checked by the model made from it.
    A field named in ``flatten`` stands for that dataclass's own fields, laid flat in its place
    (a row that holds a nested record's columns); ``types`` gives a field the type its file
    holds instead (a JSON object read back as plain containers); ``names`` resolves annotation
    names the dataclasses' modules import only for the type checker (as the file holds them);
    ``required`` fields must be in the file whatever their default in memory."""
    fields: dict[str, Any] = {}  # create_model takes any keyword
    for source, shape_field in _flat_fields(shape, flatten or {}):
        hint = (types or {}).get(shape_field.name) or _hints(source, names or {})[shape_field.name]
        fields[shape_field.name] = (hint, ... if shape_field.name in required else _default(shape_field))
    return typing.cast(type[R], create_model(name, __base__=base, __module__=shape.__module__, **fields))


def _default(f: dataclasses.Field[Any]) -> Any:
    """What a dataclass field defaults to, as a pydantic field (``...``: required)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return Field(default_factory=f.default_factory)
    return ...


def _flat_fields(shape: type, flatten: Mapping[str, type]) -> list[tuple[type, dataclasses.Field[Any]]]:
    out: list[tuple[type, dataclasses.Field[Any]]] = []
    for f in dataclasses.fields(shape):
        out.extend(_flat_fields(flatten[f.name], {}) if f.name in flatten else [(shape, f)])
    return out


def _hints(shape: type, names: Mapping[str, object]) -> dict[str, object]:
    return typing.get_type_hints(shape, localns=dict(names), include_extras=True)


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(the whole record)"


def parse_record(record_type: type[R], data: Any, source: str | Path) -> R:
    """``data`` (a parsed JSON / YAML object, or a checkpoint's plain containers) as a
    ``record_type``, or :class:`QuarlError` ``"SOURCE: field F: problem (got VALUE)"``
    naming the first field that does not fit."""
    return _checked(record_type.model_validate, record_type.__name__, data, source)


def parse_typed(shape: type[T], data: Any, source: str | Path) -> T:
    """``data`` checked as the TypedDict ``shape`` says (its ``Annotated`` checks, and the
    pydantic config it declares with ``with_config``): the validated copy, or the one line
    :func:`parse_record` raises."""
    adapter: TypeAdapter[T] = _adapter(typing.cast(Any, shape))
    return _checked(adapter.validate_python, shape.__name__, data, source)


@functools.cache
def _adapter(shape: Any) -> TypeAdapter[Any]:
    """One adapter per TypedDict (building one compiles its validator)."""
    return TypeAdapter(shape)


def _checked(validate: Callable[[Any], T], name: str, data: Any, source: str | Path) -> T:
    try:
        return validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        problem = str(first["msg"]).removeprefix("Value error, ")
        # one line whatever the value's repr spans (a tensor's takes several)
        got = "" if first["type"] in ("missing", "value_error") else \
            f" (got {' '.join(_SHORT.repr(first.get('input')).split())})"
        raise QuarlError(f"{source}: field {_field(tuple(first['loc']))}: {problem}{got}") from None
    except RecursionError:  # a container nested deeper than Python's stack
        raise QuarlError(f"{source}: nested too deeply to be a {name}: refused") from None


MAX_JSON_DEPTH = 64
"""How deeply the containers of a file quarl reads may nest (quarl's own files and an SB3
zip's ``data`` nest 4 or 5 deep): deeper is refused before anything walks it recursively."""


def check_depth(data: Any, source: str | Path, limit: int = MAX_JSON_DEPTH) -> None:
    """One line when parsed ``data`` nests lists / dicts more than ``limit`` deep (walked
    without recursion, so 100,000 brackets cost no stack)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > limit:
                raise QuarlError(f"{source}: JSON nested more than {limit} deep: refused (at most {limit})")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))


def parse_json(text: str | bytes, source: str | Path) -> Any:
    """The object JSON ``text`` holds (``NaN`` / ``Infinity`` parse as floats, for the
    record to refuse by field), or one line naming ``source`` when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise QuarlError(f"{source}: not JSON ({str(exc).splitlines()[0][:80]}): refused") from None
    except RecursionError:
        raise QuarlError(f"{source}: JSON nested too deeply: refused") from None


def field_error(source: str | Path, field: str, problem: str) -> QuarlError:
    """The one line :func:`parse_record` raises, for a check a record's types cannot make
    alone (a length that must match another field's, a hash that must match a file)."""
    return QuarlError(f"{source}: field {field}: {problem}")
