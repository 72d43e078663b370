"""The package-level import graph: each subpackage and root module of ``prefect_rollouts`` -> what it imports.

Reads the source (``ast``, nothing imported), as ``tests/test_layout.py`` does: every import counts, lazy
ones inside functions too, except those under ``if TYPE_CHECKING:``; a module's imports are folded onto
its unit (``config/eval.py`` -> ``config``, ``agent.py`` -> ``agent``). Prints the graph (one line a unit,
units sorted by how many others they import), the strongly connected groups (each is a set of units that
reach each other: a cycle), and the modules over 400 lines.

Usage: ``.venv/bin/python benchmarks/import_graph.py`` from the checkout (any version of the tree that
has ``tests/test_layout.py``'s ``package_graph``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.test_layout: the parser the test uses

LIMIT = 400   # lines a module may have (STYLE.md: "past about 400 lines, split the module")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's groups of ``graph`` with more than one node, each sorted; the graph is layered when empty."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def main() -> None:
    from tests.test_layout import modules, package_graph

    graph = package_graph()
    print(f"units: {len(graph)}, edges: {sum(len(t) for t in graph.values())}")
    for unit, targets in sorted(graph.items(), key=lambda item: (len(item[1]), item[0])):
        print(f"  {unit} -> {', '.join(sorted(targets)) or '(nothing)'}")
    groups = strongly_connected(graph)
    print(f"cycles (groups of units that import each other): {len(groups)}")
    for group in groups:
        inner = {u: sorted(t for t in graph[u] if t in group) for u in group}
        print(f"  {len(group)} units: " + "; ".join(f"{u} -> {', '.join(t)}" for u, t in inner.items()))
    sizes = sorted(((len(path.read_text().splitlines()), name) for name, path in modules().items()), reverse=True)
    over = [(n, name) for n, name in sizes if n > LIMIT]
    print(f"modules over {LIMIT} lines: {len(over)}")
    for n, name in over:
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
