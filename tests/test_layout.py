"""The package layout the design promises: no import cycles, and the core never imports Prefect."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import prefect_rollouts

pytestmark = pytest.mark.unit

ROOT = Path(prefect_rollouts.__file__).parent
PREFECT_LAYER = ("prefect_rollouts.flows", "prefect_rollouts.tasks", "prefect_rollouts.blocks", "prefect_rollouts.cli")


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its body (lazy imports included).
    ``from pkg import mod`` counts as importing ``pkg.mod`` only, as Python resolves it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [s for s in subs if s in known] + ([base] if any(s not in known for s in subs) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_there_are_no_import_cycles():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    cycles, seen = [], set()

    def walk(node: str, trail: list[str]) -> None:
        if node in trail:
            cycles.append(trail[trail.index(node):] + [node])
            return
        if node in seen:
            return
        for target in sorted(graph[node]):
            walk(target, trail + [node])
        seen.add(node)
    for name in sorted(graph):
        walk(name, [])
    assert cycles == []


def test_only_the_prefect_layer_imports_prefect():
    offenders = []
    for name, path in modules().items():
        if name.startswith(PREFECT_LAYER):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] == "prefect"]
    assert offenders == []
