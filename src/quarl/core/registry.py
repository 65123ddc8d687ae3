"""The one registry every axis of quarl extends (precisions, checkpoint formats, policy
layouts, env families, trainers, ActorQ algorithms, ...): :class:`Registry`.

An entry is registered once, under a name; the registry declares the order it is asked in
(registration order, or newest first where a specific claim must be asked before a general
one, as checkpoint formats and env families are), and refuses a name taken twice unless the
caller says it replaces it. Lookups by a name users typed fail in one line naming what is
allowed. The entries' own types stay where they are (torchao's way: a config class tied to
its handler by registration, not by a branch elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from quarl.core.errors import QuarlError

T = TypeVar("T")


class Registry(Mapping[str, T]):
    """Entries of one kind by name, in a declared order: ``newest_first`` asks the latest
    registered first (a claim made later is more specific); else registration order (an order
    of preference, or the order help lists them in)."""

    def __init__(self, kind: str, entries: Mapping[str, T] | Iterable[tuple[str, T]] = (),
                 *, newest_first: bool = False) -> None:
        self.kind = kind
        """What an entry is, in words (``"checkpoint format"``): the one-line errors say it."""
        self.newest_first = newest_first
        self._entries: dict[str, T] = {}
        for name, entry in (entries.items() if isinstance(entries, Mapping) else entries):
            self.register(name, entry)

    # ------------------------------------------------------------------ changing it
    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` as ``name``; returns it. A name already taken is refused unless
        ``replace`` (then the entry keeps its place in the order)."""
        if name in self._entries and not replace:
            raise QuarlError(f"{self.kind} {name!r} is registered already: allowed a new name "
                             "(or replace=True to replace it)")
        if name in self._entries or not self.newest_first:
            self._entries[name] = entry
        else:  # asked before everything registered earlier
            self._entries = {name: entry, **self._entries}
        return entry

    def remove(self, name: str) -> T:
        """Take ``name`` out (a test's made-up entry); returns it."""
        if name not in self._entries:
            raise QuarlError(f"no {self.kind} named {name!r} to remove: registered {', '.join(self._entries)}")
        return self._entries.pop(name)

    @contextmanager
    def replaced(self, name: str, entry: T) -> Iterator[T]:
        """``entry`` as ``name`` for the block (registered, or replacing the entry there, in its
        place), then ``name`` as it was; entries registered meanwhile under other names stay."""
        previous = {name: self._entries[name]} if name in self._entries else {}
        try:
            yield self.register(name, entry, replace=True)
        finally:
            if previous:
                self._entries.update(previous)
            else:
                self._entries.pop(name, None)

    # ------------------------------------------------------------------ reading it
    def lookup(self, name: str) -> T:
        """The entry named ``name``, or one line naming the names allowed."""
        if name not in self._entries:
            raise QuarlError(f"unknown {self.kind} {name!r}: allowed {', '.join(self._entries)}")
        return self._entries[name]

    def first(self, claims: Callable[[T], bool]) -> T | None:
        """The first entry, in the declared order, that ``claims`` says yes to."""
        return next((entry for entry in self._entries.values() if claims(entry)), None)

    def names(self) -> tuple[str, ...]:
        """Every name, in the declared order."""
        return tuple(self._entries)

    def listing(self, describe: Callable[[T], str], sep: str = ": ") -> list[str]:
        """``name: description`` of every entry in the declared order (help texts, the docs' lists)."""
        return [f"{name}{sep}{describe(entry)}" for name, entry in self._entries.items()]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
