"""The lists in the help (precisions and int modes, algorithms, actor precisions) built
from the registries that define them, so a registered entry shows up in ``--help``.

The registries load torch and ONNX Runtime (a second), so an option's help holds a
placeholder such as ``{precisions}``, and :func:`fill` replaces it only when ``--help`` is
asked for: ``quarl --version`` and a usage error stay as quick as before."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Sequence

from quarl.cli.common import environment_defaults


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


def train_algorithms() -> str:
    from quarl.training.hyperparams import TRAINERS

    contrib = [t.name for t in TRAINERS.values() if t.module == "sb3_contrib"]
    return spoken(list(TRAINERS)) + (f" ({', '.join(contrib)}: sb3-contrib)" if contrib else "")


def train_precisions() -> str:
    from quarl.training.mixed_precision import TRAIN_PRECISIONS

    return spoken(TRAIN_PRECISIONS)


def actor_precisions() -> str:
    from quarl.actorq.config import ACTOR_PRECISIONS

    return spoken(ACTOR_PRECISIONS)


def wire_bits() -> str:
    from quarl.actorq.config import WIRE_BITS

    return spoken(runs(WIRE_BITS))


LISTS: dict[str, Callable[[], str]] = {
    "precisions": precisions,
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


def fill(group: Any) -> None:
    """Replace the placeholders in the help of every option and argument under ``group``."""
    environment_defaults()  # the registries load torch: its thread settings first
    cache: dict[str, str] = {}
    for command in commands(group):
        for param in command.params:
            text = getattr(param, "help", None)
            if isinstance(text, str) and "{" in text:
                setattr(param, "help", render(text, cache))
