"""The package's import graph, read from the source with ``ast``: no cycles, no import
against the layer order below, no private name taken from another package, and a
function-level import only where it saves start-up time (and says so with ``# lazy:``).

Imports under ``if TYPE_CHECKING:`` never run: they are held to the privacy rule only.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "batchbench"
ROOT = "batchbench"

# The layers, lowest first: a module may import its own layer and those below it. A module
# takes the layer of the longest prefix naming it (the root package only by its own name).
_LAYER_TABLE = """
foundations            | batchbench batchbench.errors batchbench.secrets batchbench.rng
                       | batchbench.lifeline batchbench._impl batchbench._native
shard arithmetic       | batchbench.scale.partition
plans                  | batchbench.plan
text                   | batchbench.text
ingest of logs, traces | batchbench.ingest
records of a run       | batchbench.results.failures batchbench.results.lifecycle
                       | batchbench.results.metrics batchbench.results.samples
                       | batchbench.results.events batchbench.results.recording
                       | batchbench.results.slo batchbench.results.confidence
                       | batchbench.results.promsummary batchbench.results.progress
                       | batchbench.results.formatting batchbench.results.documents
html report            | batchbench.report
client and simulator   | batchbench.drive batchbench.sim batchbench.record
                       | batchbench.results.scrape
option declarations    | batchbench.options
configuration          | batchbench.config
results                | batchbench.results
shards                 | batchbench.scale
stages of a run        | batchbench.stages
runs over processes    | batchbench.scale.merge batchbench.scale.combine
                       | batchbench.scale.salvage batchbench.scale.supervisor
                       | batchbench.scale.workers
public face            | batchbench.api
capacity search        | batchbench.capacity
documents read back    | batchbench.documents
commands               | batchbench.cli batchbench.agent batchbench.__main__
                       | batchbench.export_plans
"""


def _layers(table: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The table as (layer name, module prefixes); a line with no name continues a layer."""
    layers: list[tuple[str, tuple[str, ...]]] = []
    for line in table.strip().splitlines():
        name, _, prefixes = (part.strip() for part in line.partition("|"))
        if name:
            layers.append((name, tuple(prefixes.split())))
        else:
            layers[-1] = (layers[-1][0], layers[-1][1] + tuple(prefixes.split()))
    return tuple(layers)


LAYERS = _layers(_LAYER_TABLE)

# Edges known to be wrong and kept for a reason: (importer, imported) -> why (none today).
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}

# The registry of the compiled hot paths names each one's pure-Python twin (for --version,
# the tests and the benchmarks): the only module that reaches into other packages' privates.
TWIN_REGISTRY = "batchbench._impl"
LAZY_MARK = "# lazy:"


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str  # a module of the package
    names: tuple[str, ...]  # the dotted path as written, and each imported name
    line: int
    level: str  # "module", "function" or "typing"
    marked_lazy: bool


def module_names() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = module_names()


def owning_module(dotted: str) -> str:
    """The module a dotted name lives in (itself when it is a module)."""
    while dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted


def _where(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import with its level: module, inside a function, or under TYPE_CHECKING."""

    def visit(node: ast.AST, level: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, level
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, "function" if level == "module" else level)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from visit(child, "typing")
            else:
                yield from visit(child, level)

    return visit(tree, "module")


def _marked_above(lines: list[str], index: int) -> bool:
    """Whether the comment above a run of import lines (ending at ``index``) says why."""
    index -= 1
    while index >= 0 and lines[index].strip().startswith(("from ", "import ")):
        index -= 1
    return index >= 0 and lines[index].strip().startswith(LAZY_MARK)


def imports() -> list[Import]:
    found = []
    for name, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, level in _where(ast.parse(source)):
            lazy = LAZY_MARK in lines[node.lineno - 1] or _marked_above(lines, node.lineno - 1)
            targets: list[tuple[str, tuple[str, ...]]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, (alias.name,)) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append((full if full in MODULES else base, (base, alias.name)))
            for target, names in targets:
                if target.split(".")[0] != ROOT:
                    continue
                imported = owning_module(target)
                if imported != name:
                    found.append(Import(name, imported, names, node.lineno, level, lazy))
    return found


IMPORTS = imports()
RUNTIME = [i for i in IMPORTS if i.level != "typing"]


def layer_of(module: str) -> int:
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = module == prefix
            inside = prefix != ROOT and module.startswith(prefix + ".")
            if (exact or inside) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def twin_import(item: Import) -> bool:
    """The registry's import of a compiled module's twin (``_native/_x.pyi`` ↔ ``_x_py``)."""
    last = item.imported.rpartition(".")[2]
    stub = PACKAGE / "_native" / (last.removesuffix("_py") + ".pyi")
    return item.importer == TWIN_REGISTRY and last.endswith("_py") and stub.is_file()


def checked(items: list[Import]) -> list[Import]:
    return [i for i in items if (i.importer, i.imported) not in KNOWN_EXCEPTIONS]


def cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_every_module_has_a_layer():
    assert [m for m in sorted(MODULES) if layer_of(m) < 0] == []


def test_no_import_cycle():
    assert cycles([(i.importer, i.imported) for i in checked(RUNTIME)]) == []


def test_no_import_against_the_layer_order():
    upward = [
        f"{i.importer}:{i.line} imports {i.imported} "
        f"({LAYERS[layer_of(i.importer)][0]} < {LAYERS[layer_of(i.imported)][0]})"
        for i in checked(RUNTIME)
        if layer_of(i.imported) > layer_of(i.importer) and not twin_import(i)
    ]
    assert upward == []


def _private_scope(path: str) -> str | None:
    """The package a dotted path's first private part is private to (None: public)."""
    parts = path.split(".")
    for position, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            owner = ".".join(parts[:position])
            is_package = owner in MODULES and MODULES[owner].name == "__init__.py"
            return owner if is_package else owner.rpartition(".")[0]
    return None


def test_no_private_name_crosses_packages():
    crossing = []
    for item in IMPORTS:
        scope = _private_scope(".".join(item.names))
        inside = scope is not None and (item.importer + ".").startswith(scope + ".")
        if scope is not None and not inside and not twin_import(item):
            crossing.append(f"{item.importer}:{item.line} imports {'.'.join(item.names)}")
    assert crossing == []


def test_function_level_imports_say_why():
    unmarked = [
        f"{i.importer}:{i.line} imports {i.imported} inside a function without '{LAZY_MARK}'"
        for i in checked(RUNTIME)
        if i.level == "function" and not i.marked_lazy
    ]
    assert unmarked == []


def test_the_rules_see_what_they_check():
    """The graph is read as written: a function-level import is seen, and a cycle, an
    upward import and a private import are reported."""
    assert any(i.level == "function" for i in IMPORTS)
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert layer_of("batchbench.cli.main") > layer_of("batchbench.api") > layer_of(ROOT)
    assert layer_of("batchbench.scale.workers") > layer_of("batchbench.stages.sequence")
    assert _private_scope("batchbench.text._synth_py") == "batchbench.text"
    assert _private_scope("batchbench.drive.wire._LOADS") == "batchbench.drive"
    assert _private_scope("batchbench._native._sse") == ROOT
    assert _private_scope("batchbench.stages.console.Silent") is None


def test_config_does_not_import_the_command_line():
    assert not any(
        i.importer == "batchbench.config" and i.imported.startswith("batchbench.cli")
        for i in RUNTIME
    )


def test_every_package_is_installed():
    """A package missing from pyproject's list imports from a checkout but not from a wheel."""
    listed = set(
        tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    found = {
        ".".join(init.parent.relative_to(PACKAGE.parent).parts)
        for init in PACKAGE.rglob("__init__.py")
    }
    assert found == listed
