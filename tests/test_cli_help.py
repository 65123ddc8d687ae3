"""The lists in the help: ``quarl.cli.builtin_lists`` (what ``--help`` and the early refusals
read without loading torch) is what the registries hold, and a list is made from its registry
where the registry is loaded."""

from __future__ import annotations

import sys

from quarl.cli import help_lists
from quarl.cli.builtin_lists import BUILTIN_LISTS


def test_the_builtin_lists_are_the_registries() -> None:
    made = {name: make() for name, make in help_lists.LISTS.items()}
    assert BUILTIN_LISTS == made, "a registry changed: run .venv/bin/python -m quarl.cli.help_lists"


def test_a_loaded_registry_gives_its_own_list() -> None:
    import quarl.quant.modes  # noqa: F401
    import quarl.quantization.precisions  # noqa: F401

    assert help_lists.live("precisions") and "quarl.quantization.precisions" in sys.modules
    assert help_lists.live("wire_bits")  # made from a light module, always from its registry
    assert help_lists.render("a {precisions} b {unknown}") == f"a {help_lists.precisions()} b {{unknown}}"
