"""The package's layers: a module imports only from lower layers, or from its own layer
without a cycle.

Layers: 0 helpers (``_checks``, ``_io``, the package root), 1 toolkit (the other flat
modules and the ``metrics`` and ``calibrators`` packages), 2 ``data`` and ``models``,
3 ``training``, 4 ``runs``, 5 ``book``. Every import counts: at the top of a module, inside
functions, and ``importlib.import_module("calnotes...")`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "calnotes"

#: Layer of each subpackage or module below the root that is not a toolkit module.
LAYERS = {"_checks": 0, "_io": 0, "metrics": 1, "calibrators": 1, "data": 2, "models": 2,
          "conformal": 1, "training": 3, "runs": 4, "book": 5,
          "__main__": 5}  # the command line sits above every layer
TOOLKIT = 1


def layer_of(module: str) -> int:
    """The layer of a dotted module name under ``calnotes``."""
    parts = module.split(".")
    if parts[0] != "calnotes":
        raise ValueError(f"{module} is not part of calnotes")
    if len(parts) == 1:
        return 0
    if parts[1] in LAYERS:
        return LAYERS[parts[1]]
    if len(parts) == 2:
        return TOOLKIT  # a flat module at the package root
    raise ValueError(f"{module} is in a subpackage without a layer: add it to LAYERS")


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


def _known(name: str, modules: Collection[str]) -> str:
    """``name`` if it is a module, else its longest prefix that is one (an attribute)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def import_graph(
    sources: Mapping[str, str], packages: Collection[str] = ()
) -> dict[str, set[str]]:
    """Module -> the calnotes modules it imports, from each module's source text.

    ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``
    (whose ``__init__`` runs). ``packages`` names the modules that are packages (needed for
    relative imports); by default, those with another module below them.
    """
    modules = set(sources)
    packages = set(packages) or {m for m in modules if any(o.startswith(m + ".") for o in modules)}
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, module in packages, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    names.add(sub if sub in modules else base)
            elif (isinstance(node, ast.Call) and _is_import_module(node.func) and node.args
                  and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                names.add(node.args[0].value)
        graph[module] = {
            _known(n, modules) for n in names if n == "calnotes" or n.startswith("calnotes.")
        }
    return graph


def _cycles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_problems(graph: Mapping[str, Collection[str]]) -> list[str]:
    """Every upward import and every import cycle, as readable lines."""
    problems = []
    for module in sorted(graph):
        for target in sorted(graph[module]):
            if layer_of(target) > layer_of(module):
                problems.append(f"{module} (layer {layer_of(module)}) imports {target} "
                                f"(layer {layer_of(target)})")
    problems += [f"import cycle: {' <-> '.join(c)}" for c in _cycles(graph)]
    return problems


def _package_sources() -> tuple[dict[str, str], set[str]]:
    sources, packages = {}, set()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
            packages.add(".".join(parts))
        sources[".".join(parts)] = path.read_text(encoding="utf-8")
    return sources, packages


# --------------------------------------------------------------------------- the package


def test_every_module_has_a_layer() -> None:
    sources, _ = _package_sources()
    assert {"calnotes.metrics", "calnotes.data.splits", "calnotes.runs.store"} <= set(sources)
    layers = {m: layer_of(m) for m in sources}
    assert layers["calnotes.ood"] == 1 and layers["calnotes.data.ood_sets"] == 2
    assert layers["calnotes.metrics.binned"] == 1
    assert layers["calnotes.training.meta"] == 3 and layers["calnotes.runs.ood"] == 4
    assert layers["calnotes.book.notebook"] == 5


def test_no_upward_imports_and_no_cycles() -> None:
    sources, packages = _package_sources()
    graph = import_graph(sources, packages)
    # the parser sees the package's real imports, so an empty graph cannot pass silently
    assert "calnotes.training.trainer" in graph["calnotes.runs.experiment"]
    assert "calnotes.runs.experiment" in graph["calnotes.runs.store"]
    assert "calnotes.runs.store" in graph["calnotes.book.notebook"]
    assert layer_problems(graph) == []


# --------------------------------------------------------------------------- the checker


def test_checker_catches_planted_upward_imports() -> None:
    graph = import_graph({
        "calnotes": "",
        "calnotes.metrics": "from calnotes.runs.store import RunStore\n",
        "calnotes.ood": "def f():\n    import importlib\n"
                        "    return importlib.import_module('calnotes.training.trainer')\n",
        "calnotes.data": "",
        "calnotes.data.splits": "def g():\n    from ..training import Trainer\n",
        "calnotes.training": "",
        "calnotes.training.trainer": "",
        "calnotes.runs": "",
        "calnotes.runs.store": "import calnotes.book\n",
        "calnotes.book": "",
    })
    assert layer_problems(graph) == [
        "calnotes.data.splits (layer 2) imports calnotes.training (layer 3)",
        "calnotes.metrics (layer 1) imports calnotes.runs.store (layer 4)",
        "calnotes.ood (layer 1) imports calnotes.training.trainer (layer 3)",
        "calnotes.runs.store (layer 4) imports calnotes.book (layer 5)",
    ]


def test_checker_catches_cycles_also_inside_functions_and_through_a_package() -> None:
    graph = import_graph({
        "calnotes.metrics": "from calnotes import plots\n",
        "calnotes.plots": "def f():\n    from calnotes.metrics import ece\n",
        "calnotes.data": "from calnotes.data.splits import load_dataset\n",
        "calnotes.data.splits": "from calnotes.data import ImageData\n",
    })
    assert layer_problems(graph) == [
        "import cycle: calnotes.data <-> calnotes.data.splits",
        "import cycle: calnotes.metrics <-> calnotes.plots",
    ]


def test_checker_accepts_sibling_submodules_and_downward_imports() -> None:
    graph = import_graph({
        "calnotes": "",
        "calnotes._checks": "",
        "calnotes.metrics": "from ._checks import as_tensor\n",
        "calnotes.runs": "from calnotes.runs.store import RunStore\n",
        "calnotes.runs.store": "import calnotes\nfrom calnotes.runs import experiment\n",
        "calnotes.runs.experiment": "from calnotes import metrics\n",
    })
    assert graph["calnotes.runs.store"] == {"calnotes", "calnotes.runs.experiment"}
    assert graph["calnotes.metrics"] == {"calnotes._checks"}
    assert layer_problems(graph) == []


def test_a_subpackage_without_a_layer_is_an_error() -> None:
    with pytest.raises(ValueError, match="add it to LAYERS"):
        layer_of("calnotes.newpkg.module")
