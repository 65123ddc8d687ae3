"""The lists in the help (precisions and int modes, algorithms, actor precisions) built
from the registries that define them, so a registered entry shows up in ``--help``.

The registries load torch and ONNX Runtime (a second), so an option's help holds a
placeholder such as ``{precisions}``, and :func:`fill` replaces it only when ``--help`` is
asked for, and only in the command whose help is shown (``quarl --help`` lists commands,
no option needs a list). The lists of the built-in registries are kept on disk per quarl
version (``~/.cache/quarl/help-lists-VERSION.json``; ``QUARL_CACHE=off`` skips it), so a
second ``quarl ptq --help`` answers without loading torch; a ``--gym-packages`` module,
which may register entries, bypasses it."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from quarl.cli.common import environment_defaults
from quarl.core.atomic import write_atomic
from quarl.core.errors import QuarlError


def spoken(items: Sequence[object]) -> str:
    """``a, b or c``."""
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def runs(numbers: Sequence[int]) -> list[str]:
    """Consecutive descending numbers of three or more as one range: 32, 16, 8..2."""
    out: list[str] = []
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] - 1:
            j += 1
        out.extend([f"{numbers[i]}..{numbers[j]}"] if j - i >= 2 else [str(n) for n in numbers[i:j + 1]])
        i = j + 1
    return out


def precisions() -> str:
    """Every label ``--precisions`` takes, as :meth:`quarl.quant.config.QuantConfig.parse`
    reads them: the precisions, the real int modes, the simulated widths."""
    from quarl.quant.modes import MODES
    from quarl.quant.precisions import PRECISIONS
    from quarl.quant.primitives import MAX_BITS, MIN_BITS

    plain = [name for name, p in PRECISIONS.items() if not p.real_int and name != "nbit"]
    real = [name for name, p in PRECISIONS.items() if p.real_int]
    return (f"comma list of {', '.join(plain)}, {' / '.join(real)} (real kernels, a fast mode that agrees with "
            f"fp32), {', '.join(MODES)}, sim{MIN_BITS}..sim{MAX_BITS} (simulated n-bit weights)")


def precision_labels() -> str:
    """Every label ``--precisions`` takes, comma-joined: not shown in any help, kept in the
    cache so that a command refuses an unknown label before torch loads (:mod:`quarl.cli.early`)."""
    from quarl.quant.config import precision_labels as labels

    return ",".join(labels())


def precision_allowed() -> str:
    """What a refusal of an unknown precision says is allowed (cached with :func:`precision_labels`)."""
    from quarl.quant.config import allowed_precisions

    return allowed_precisions()


def train_algorithms() -> str:
    from quarl.training.hyperparams import TRAINERS

    contrib = [t.name for t in TRAINERS.values() if t.module == "sb3_contrib"]
    return spoken(list(TRAINERS)) + (f" ({', '.join(contrib)}: sb3-contrib)" if contrib else "")


def train_precisions() -> str:
    from quarl.training.mixed_precision import TRAIN_PRECISIONS

    return spoken(TRAIN_PRECISIONS)


def actor_precisions() -> str:
    from quarl.actorq.actor_precisions import actor_precisions as registered

    return spoken(registered())


def wire_bits() -> str:
    from quarl.actorq.config import WIRE_BITS

    return spoken(runs(WIRE_BITS))


LISTS: dict[str, Callable[[], str]] = {
    "precisions": precisions,
    "precision_labels": precision_labels,
    "precision_allowed": precision_allowed,
    "train_algorithms": train_algorithms,
    "train_precisions": train_precisions,
    "actor_precisions": actor_precisions,
    "wire_bits": wire_bits,
}
"""Placeholder name (``{name}`` in a help text) -> its list."""
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def commands(command: Any) -> Iterator[Any]:
    """``command`` and every command under it (typer carries its own copy of click, so a
    group is what has subcommands, whatever its class)."""
    yield command
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from commands(sub)


def render(text: str, cache: dict[str, str]) -> str:
    """``text`` with each ``{name}`` of :data:`LISTS` replaced by its list."""

    def one(match: re.Match[str]) -> str:
        name = match[1]
        if name not in LISTS:
            return match[0]
        if name not in cache:
            cache[name] = LISTS[name]()
        return cache[name]

    return PLACEHOLDER.sub(one, text)


MAX_CACHE_BYTES = 1 << 16


def cache_file() -> Path | None:
    """Where the built-in lists are kept (None: ``QUARL_CACHE=off``)."""
    from quarl import __version__

    if os.environ.get("QUARL_CACHE", "").strip().lower() == "off":
        return None
    return Path.home() / ".cache" / "quarl" / f"help-lists-{__version__}.json"


def source_key() -> str:
    """What the lists were made from: quarl's own files (their newest change and count), so
    a registry edited in a checkout is read again, without importing it."""
    root = Path(__file__).resolve().parents[1]
    stamps = [p.stat().st_mtime_ns for p in root.rglob("*.py")]
    return f"{len(stamps)}-{max(stamps, default=0)}"


def read_cache() -> dict[str, str]:
    """The stored lists (only string values of known names, made from these sources;
    anything else: none)."""
    path = cache_file()
    try:
        if path is None or not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_CACHE_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("key") != source_key() or not isinstance(data.get("lists"), dict):
        return {}
    return {k: v for k, v in data["lists"].items() if k in LISTS and isinstance(v, str)}


def write_cache(lists: dict[str, str]) -> None:
    path = cache_file()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": source_key(), "lists": lists}))
    except (OSError, QuarlError):  # a read-only home or a full disk: the lists are made again next time
        pass


def shown(group: Any, args: Sequence[str]) -> list[Any]:
    """The commands whose option help ``args`` asks for: the command named before
    ``--help`` (``quarl actorq run --help``: run), none for ``quarl --help``."""
    command, chosen = group, []
    for arg in args:
        if arg.startswith("-"):
            continue
        sub = (getattr(command, "commands", None) or {}).get(arg)
        if sub is None:
            break
        command = sub
        chosen = [sub]
    return list(commands(chosen[0])) if chosen else []


def bare_flags(command: Any) -> None:
    """A flag (``--wide``, ``--stochastic/--deterministic``, ``--help``) shows no ``<bool>`` in the
    help: it takes no value."""
    if getattr(command, "quarl_bare_flags", False):  # once per command object
        return
    command.quarl_bare_flags = True
    original = command.get_help_option

    def help_option(ctx: Any) -> Any:
        option = original(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for param in command.params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


def fill(group: Any, args: Sequence[str] | None = None, use_cache: bool = True) -> None:
    """Replace the placeholders in the help of every option and argument of the commands
    ``args`` shows the help of (all under ``group`` where ``args`` is None); flags shown bare."""
    targets = list(commands(group)) if args is None else shown(group, args)
    for command in [group, *targets]:
        bare_flags(command)
    if not targets:
        return
    stored = read_cache() if use_cache else {}
    cache: dict[str, str] = dict(stored)
    if set(LISTS) - set(cache):
        environment_defaults()  # the registries load torch: its thread settings first
    for command in targets:
        for param in command.params:
            text = getattr(param, "help", None)
            if isinstance(text, str) and "{" in text:
                setattr(param, "help", render(text, cache))
    if use_cache and cache != stored:
        write_cache(cache)
