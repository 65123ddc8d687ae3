"""The lists in the help (precisions and int modes, algorithms, actor precisions) built
from the registries that define them, so a registered entry shows up in ``--help``.

The registries load torch and ONNX Runtime (a second), so an option's help holds a
placeholder such as ``{precisions}``, replaced only when a command's help is shown
(:class:`quarl.cli.command.QuarlCommand`). Where a list's registry is already loaded (an entry
registered in this process) or a ``--gym-packages`` module may have registered entries, the
list is made from the registry; otherwise from :mod:`quarl.cli.builtin_lists`, the lists of the
built-in registries written by ``python -m quarl.cli.help_lists`` (a test holds it equal to the
registries), so ``quarl ptq --help`` and the refusals of :mod:`quarl.cli.early` answer without
loading torch."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

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
    """Every label ``--precisions`` takes, as :meth:`quarl.quantization.config.QuantConfig.parse`
    reads them: the precisions, the real int modes, the simulated widths."""
    from quarl.quant.modes import MODES
    from quarl.quant.primitives import MAX_BITS, MIN_BITS
    from quarl.quantization.precisions import PRECISIONS

    plain = [name for name, p in PRECISIONS.items() if not p.real_int and name != "nbit"]
    real = [name for name, p in PRECISIONS.items() if p.real_int]
    return (f"comma list of {', '.join(plain)}, {' / '.join(real)} (real kernels, a fast mode that agrees with "
            f"fp32), {', '.join(MODES)}, sim{MIN_BITS}..sim{MAX_BITS} (simulated n-bit weights)")


def precision_labels() -> str:
    """Every label ``--precisions`` takes, comma-joined: not shown in any help, kept in the
    cache so that a command refuses an unknown label before torch loads (:mod:`quarl.cli.early`)."""
    from quarl.quantization.config import precision_labels as labels

    return ",".join(labels())


def precision_allowed() -> str:
    """What a refusal of an unknown precision says is allowed (cached with :func:`precision_labels`)."""
    from quarl.quantization.config import allowed_precisions

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
REGISTRIES: dict[str, tuple[str, ...]] = {
    "precisions": ("quarl.quantization.precisions", "quarl.quant.modes"),
    "precision_labels": ("quarl.quantization.precisions", "quarl.quant.modes"),
    "precision_allowed": ("quarl.quantization.precisions", "quarl.quant.modes"),
    "train_algorithms": ("quarl.training.hyperparams",),
    "train_precisions": ("quarl.training.mixed_precision",),
    "actor_precisions": ("quarl.quantization.precisions", "quarl.quant.modes"),
    "wire_bits": (),
}
"""The modules that hold each list's entries: where they are loaded, the list is made from them."""
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def live(name: str) -> bool:
    """Whether the list ``name`` is made from its registry here (rather than the built-in lists)."""
    envs = sys.modules.get("quarl.envs")
    if envs is not None and envs.gym_packages():  # a module may have registered entries
        return True
    return all(module in sys.modules for module in REGISTRIES[name])


def get(name: str) -> str:
    """The list ``name``: from its registry where :func:`live`, else the built-in one."""
    if not live(name):
        from quarl.cli.builtin_lists import BUILTIN_LISTS

        if name in BUILTIN_LISTS:
            return BUILTIN_LISTS[name]
    environment_defaults()  # the registries load torch: its thread settings first
    return LISTS[name]()


def render(text: str) -> str:
    """``text`` with each ``{name}`` of :data:`LISTS` replaced by its list."""
    return PLACEHOLDER.sub(lambda match: get(match[1]) if match[1] in LISTS else match[0], text)


def write_builtin_lists(path: Path | None = None) -> Path:
    """Write :mod:`quarl.cli.builtin_lists` from the registries (run after adding a built-in
    precision, int mode, trainer or train precision: ``python -m quarl.cli.help_lists``)."""
    path = path or Path(__file__).with_name("builtin_lists.py")
    environment_defaults()
    entries = []
    for name, make in LISTS.items():
        pieces = textwrap.wrap(make(), 100, drop_whitespace=False, break_on_hyphens=False)
        entries.append(f"    {name!r}: (\n" + "".join(f"        {piece!r}\n" for piece in pieces) + "    ),")
    path.write_text(
        '"""The help lists of the built-in registries, written by ``python -m quarl.cli.help_lists``\n'
        "(:mod:`quarl.cli.help_lists`); ``tests/test_cli_help.py`` holds them equal to the registries.\"\"\"\n\n"
        "BUILTIN_LISTS: dict[str, str] = {\n" + "\n".join(entries) + "\n}\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    write_builtin_lists()
