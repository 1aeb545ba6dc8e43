"""No import circles: the modules of each package, read with `ast`, import each other in one direction.

Every import counts, wherever it is written (at the top, inside a function, under TYPE_CHECKING):
a circle that only works because an import is deferred is still two modules that each need the
other. `from a.b import c` counts as importing `a.b`, and `a.b.c` too when that is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    """Module name -> file, for every .py file of the package (a package is its __init__)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules that module `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return (out & known) - {name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle_through_a_deferred_import(tmp_path: Path) -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert circles(graph) == [["p.a", "p.b", "p.c"]]
    (tmp_path / "m.py").write_text("def f():\n    from p.a import x\n")
    assert imports("p.m", tmp_path / "m.py", {"p.a", "p.a.x"}) == {"p.a", "p.a.x"}
    (tmp_path / "r.py").write_text("from . import a\nfrom .a import x\n")
    assert imports("p.r", tmp_path / "r.py", {"p", "p.a"}) == {"p", "p.a"}


@pytest.mark.parametrize("package", ["backend", "engine"])
def test_no_import_circles(package: str) -> None:
    found = modules(package)
    graph = {name: imports(name, path, set(found)) for name, path in found.items()}
    assert circles(graph) == []
