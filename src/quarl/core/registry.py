"""The one helper quarl's ordered registries share (env families, policy layouts)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def put_first(table: dict[str, T], name: str, entry: T) -> T:
    """Put ``entry`` first in ``table``, so it is asked before the entries registered
    earlier (a specific claim before a general one), replacing any entry named ``name``."""
    rest = {k: v for k, v in table.items() if k != name}
    table.clear()
    table.update({name: entry, **rest})
    return entry
