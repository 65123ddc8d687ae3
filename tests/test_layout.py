"""The package's shape, read from every module's imports (top-level and inside functions; not
those only for type checkers): no import cycle between modules or between packages, every
package in its layer (a layer imports only the layers below it), few loose modules, no file
over 500 lines, every module type-checked, few untyped dicts, and Ray imported only by the two Ray runners and
the cluster helper."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import quarl

ROOT = Path(quarl.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("quarl", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        out[name] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
            found |= subs or {base}  # "from quarl import hub" imports the module hub
    return {m for m in found if m in modules and m != name and m != "quarl"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 40 and graph["quarl.api"]  # the walk sees the package
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_ray_only_in_the_ray_runners() -> None:
    users = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                users.add(name)
    assert users == {"quarl.actorq.ray_fleet", "quarl.study.ray_runner", "quarl.core.ray_cluster"}


LAYOUT_DOC = ROOT.parents[1] / "docs" / "how-it-works.md"
"""Where quarl's layers are written: its Layout's tree, one ``# layer N: units`` comment above
each layer's modules (``# layer 6: checkpoints (...); 7: study, qat_study`` names two)."""


def layers_of(text: str) -> tuple[tuple[str, ...], ...]:
    """The layers the doc's ``# layer`` comments name, bottom first: each ``N: unit, unit`` in
    order, numbered from 0 without a gap (a unit is a package or a loose module under quarl)."""
    found = [(int(number), tuple(units.split(", "))) for line in text.splitlines()
             if line.strip().startswith("# layer")
             for number, units in re.findall(r"(\d+): ([a-z_]+(?:, [a-z_]+)*)", line)]
    assert [number for number, _ in found] == list(range(len(found))), f"layers numbered {[n for n, _ in found]}"
    return tuple(units for _, units in found)


LAYERS = layers_of(LAYOUT_DOC.read_text())
"""quarl's layers, bottom first, as docs/how-it-works.md writes them: a package or loose module
imports only units of lower layers (where a lower layer needs a plug-in from above, a registry
is filled from above)."""


def test_the_layers_are_read_from_the_doc() -> None:
    assert LAYERS[:3] == (("core", "verdict"), ("quant", "envs"), ("policies",)) and LAYERS[-1] == ("cli",)
    assert layers_of("  # layer 0: core (x)\n  a.py\n  # layer 1: quant, envs; 2: cli\n") == (
        ("core",), ("quant", "envs"), ("cli",))


def _unit(module: str) -> str:
    """The package (or loose module) right under quarl that ``module`` belongs to."""
    return module.split(".")[1] if "." in module else module


def _unit_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> unit it imports -> the module-level imports that make the arrow."""
    modules = _modules()
    out: dict[str, dict[str, list[str]]] = {}
    for name, path in modules.items():
        if name == "quarl":
            continue
        arrows = out.setdefault(_unit(name), {})
        for target in _imports(name, path, modules):
            if _unit(target) != _unit(name):
                arrows.setdefault(_unit(target), []).append(f"{name} -> {target}")
    return out


def test_no_package_cycles() -> None:
    graph = _unit_graph()
    assert {"core", "quant", "policies", "evaluation", "cli"} <= set(graph)
    assert _cycles({u: set(arrows) for u, arrows in graph.items()}) == []


def _upward(graph: dict[str, dict[str, list[str]]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """The imports that reach the importer's own layer or one above it."""
    layer = {unit: i for i, units in enumerate(layers) for unit in units}
    return [arrow for unit, arrows in graph.items() for target, made in arrows.items()
            if layer[target] >= layer[unit] for arrow in made]


def test_every_unit_imports_only_layers_below_it() -> None:
    graph = _unit_graph()
    assert set(graph) == {u for units in LAYERS for u in units}, "a new package or loose module: give it a layer"
    assert _upward(graph, LAYERS) == []


def test_layer_check_finds_upward_and_sideways_imports() -> None:
    graph = {"core": {}, "quant": {"core": ["quarl.quant.a -> quarl.core.b"]},
             "envs": {"quant": ["quarl.envs -> quarl.quant.c"]},
             "policies": {"quant": ["ok"], "evaluation": ["quarl.policies.x -> quarl.evaluation.y"]},
             "evaluation": {"policies": ["ok"]}}
    layers = (("core",), ("quant", "envs"), ("policies",), ("evaluation",))
    assert _upward(graph, layers) == ["quarl.envs -> quarl.quant.c", "quarl.policies.x -> quarl.evaluation.y"]


def test_every_package_has_its_init() -> None:
    """A folder of modules without ``__init__.py`` imports (a namespace package) but is missed
    by setuptools' package finder and by the API docs."""
    folders = {p.parent for p in ROOT.rglob("*.py")}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []


def test_few_loose_modules_at_the_top() -> None:
    loose = sorted(p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert loose == ["api", "checkpoints", "outputs"], loose  # every feature is a package


def test_no_file_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_every_module_is_type_checked() -> None:
    """mypy's skip list (``ignore_errors``) is empty: every module is checked by ``make test``."""
    config = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text())
    skipped = [o["module"] for o in config["tool"]["mypy"].get("overrides", []) if o.get("ignore_errors")]
    assert skipped == []


UNTYPED_DICTS = 45
"""The most ``dict[str, Any]`` src/quarl may hold (39 now, each where a file or SB3's keyword
arguments are first parsed or last written): a new one takes a typed record instead."""


def test_few_untyped_dicts() -> None:
    counts = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := p.read_text().count("dict[str, Any]"))}
    assert sum(counts.values()) <= UNTYPED_DICTS, sorted(counts.items(), key=lambda kv: -kv[1])
