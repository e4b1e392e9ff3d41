"""No import circle in the kernel, counting imports inside functions and under TYPE_CHECKING.

An import inside a function or under ``TYPE_CHECKING`` hides a circle from the interpreter and
from import-linter's layers, not from a reader: two modules that each need the other are one
module in two files. This walks every module under kernel/ with ``ast``, collects every import
wherever it stands, and asserts the graph has no strongly connected component.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support import ROOT

KERNEL = ROOT / "kernel"

# No circle is allowed: the list names the exceptions, and there are none left.
KNOWN_CYCLES: list[set[str]] = []


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kernel_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(KERNEL.rglob("*.py"))}


def imported_names(tree: ast.Module, name: str, *, is_package: bool) -> Iterator[str]:
    """Every dotted name the module imports, wherever the import stands."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # `from kernel.state import memory` names the module, `from kernel.state import X`
            # the package: the caller keeps the longest prefix that is a kernel module.
            for alias in node.names:
                yield f"{source}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """Each kernel module and the kernel modules it imports (the most specific one a name names)."""
    modules = kernel_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for imported in imported_names(tree, name, is_package=path.name == "__init__.py"):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module, iteratively (the graph is deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return components


def test_the_walk_sees_hidden_imports() -> None:
    source = """
from typing import TYPE_CHECKING
from . import sibling
if TYPE_CHECKING:
    from kernel.state.memory import Receipt
def later():
    import kernel.mesh._bridge
    from ..journal import store
"""
    names = set(imported_names(ast.parse(source), "kernel.cli._x", is_package=False))
    assert {
        "kernel.cli.sibling",
        "kernel.state.memory.Receipt",
        "kernel.mesh._bridge",
        "kernel.journal.store",
    } <= names


def test_the_graph_covers_the_kernel() -> None:
    graph = import_graph()
    assert "kernel.cli._main" in graph
    assert "kernel.cli._serve" in graph["kernel.cli._main"]


def test_tarjan_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [{"a", "b", "c"}]


def test_no_import_circle_in_the_kernel() -> None:
    circles = [
        c
        for c in strongly_connected(import_graph())
        if not any(c <= known for known in KNOWN_CYCLES)
    ]
    assert sorted(sorted(c) for c in circles) == []
