"""quarl.core.registry.Registry: the one registry every axis extends (declared order, the
duplicate rule, one-line lookups)."""

from __future__ import annotations

import pytest

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry


def test_registration_order_and_newest_first() -> None:
    kept = Registry("thing", {"a": 1, "b": 2})
    kept.register("c", 3)
    assert kept.names() == ("a", "b", "c") and list(kept.values()) == [1, 2, 3]
    newest = Registry("claim", newest_first=True)
    for name, entry in (("general", 1), ("specific", 2)):
        newest.register(name, entry)
    assert newest.names() == ("specific", "general") and newest.first(lambda e: e > 0) == 2


def test_a_name_taken_twice_is_refused_unless_replaced() -> None:
    reg = Registry("checkpoint format", {"zoo": 1, "hub": 2}, newest_first=True)
    with pytest.raises(QuarlError, match="checkpoint format 'zoo' is registered already: allowed a new name"):
        reg.register("zoo", 3)
    reg.register("zoo", 3, replace=True)
    assert reg["zoo"] == 3 and reg.names() == ("hub", "zoo")  # a replacement keeps its place


def test_lookup_and_remove_say_what_is_allowed_in_one_line() -> None:
    reg = Registry("precision", {"fp32": 0, "int8": 8})
    assert reg.lookup("int8") == 8 and "int8" in reg and reg.get("int4") is None
    with pytest.raises(QuarlError, match="^unknown precision 'int3': allowed fp32, int8$"):
        reg.lookup("int3")
    assert reg.remove("int8") == 8 and reg.names() == ("fp32",)
    with pytest.raises(QuarlError, match="no precision named 'int8' to remove"):
        reg.remove("int8")


def test_replaced_restores_the_registry_after_the_block() -> None:
    reg = Registry("trainer", {"ppo": 1})
    with reg.replaced("ars", 2):
        assert reg.names() == ("ppo", "ars")
        with reg.replaced("ppo", 5):
            assert reg["ppo"] == 5
        assert reg["ppo"] == 1
    assert reg.names() == ("ppo",)
    assert reg.listing(str) == ["ppo: 1"]


def test_every_registry_of_quarl_is_a_core_registry() -> None:
    """Each axis quarl extends by registration is one :class:`Registry` (declared order, the
    duplicate rule, one-line lookups), and every ``register*`` function adds through one."""
    import ast
    from pathlib import Path

    import quarl
    from quarl.actorq import algorithms
    from quarl.envs import wrappers
    from quarl.envs.families import ENV_FAMILIES
    from quarl.policies import base, formats, sb3
    from quarl.quant import modes
    from quarl.quantization import precisions
    from quarl.training import hyperparams

    for registry in (precisions.PRECISIONS, modes.MODES, formats.FORMATS, sb3.LAYOUTS, ENV_FAMILIES, wrappers.KINDS,
                     base.HEADS, hyperparams.TRAINERS, algorithms.ALGORITHMS):
        assert isinstance(registry, Registry), registry
    src = Path(quarl.__file__).parent
    own_way = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("register"):
                calls = {n.func.attr for n in ast.walk(node)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
                if "register" not in calls:
                    own_way.append(f"{path.relative_to(src.parent)}:{node.name}")
    assert own_way == []


def test_replaced_keeps_what_the_block_registered_under_other_names() -> None:
    reg = Registry("checkpoint format", {"zoo": 1}, newest_first=True)
    with reg.replaced("tiny", 2):
        reg.register("qat", 3)  # a module imported inside the block registers its own
    assert reg.names() == ("qat", "zoo")
