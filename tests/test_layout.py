"""The package layout the design promises: no import cycles, and the core never imports Prefect."""

from __future__ import annotations

import ast
import importlib.metadata
import os
from pathlib import Path

import pytest

import prefect_rollouts

pytestmark = pytest.mark.unit

ROOT = Path(prefect_rollouts.__file__).parent
PREFECT_LAYER = ("prefect_rollouts.flows", "prefect_rollouts.tasks", "prefect_rollouts.blocks")


def in_prefect_layer(name: str) -> bool:
    """A module of ``flows/``, ``tasks/`` or ``blocks/``, or of the CLI (``cli/``), which may import Prefect."""
    return (any(name == package or name.startswith(package + ".") for package in PREFECT_LAYER)
            or is_cli(name))


def is_cli(name: str) -> bool:
    """A module of ``cli/``, the ``prefect-rollouts`` command."""
    return name == "prefect_rollouts.cli" or name.startswith("prefect_rollouts.cli.")


def _python_files(root: Path) -> list[Path]:
    """Every ``.py`` under ``root``, through the symlinks that put ``flows/``, ``tasks/`` and
    ``blocks/`` of the repository root into the package (``Path.rglob`` does not follow them)."""
    return [Path(folder) / name for folder, _, names in os.walk(root, followlinks=True)
            for name in names if name.endswith(".py")]


def modules() -> dict[str, Path]:
    found = {}
    for path in _python_files(ROOT):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``: imports only the type checker runs."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their ``else:`` is kept)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if _is_type_checking(node):
            todo.extend(node.orelse)   # type: ignore[attr-defined]  # an ast.If
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its body (lazy imports included, those under
    ``if TYPE_CHECKING:`` left out). ``from pkg import mod`` counts as importing ``pkg.mod`` only, as
    Python resolves it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
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


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of ``graph`` (node -> the nodes it imports) meets, each as
    ``[a, b, ..., a]``; empty when the graph is layered."""
    cycles: list[list[str]] = []
    seen: set[str] = set()

    def walk(node: str, trail: list[str]) -> None:
        if node in trail:
            cycles.append([*trail[trail.index(node):], node])
            return
        if node in seen:
            return
        for target in sorted(graph[node]):
            walk(target, [*trail, node])
        seen.add(node)
    for name in sorted(graph):
        walk(name, [])
    return cycles


def module_graph() -> dict[str, set[str]]:
    """Each module of the package -> the project modules it imports (typing-only imports aside)."""
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: its subpackage (``config``, ``runtimes``, ...) or, for a root
    module, the module itself (``agent``, ``stages``); ``__init__`` for the package's own ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph() -> dict[str, set[str]]:
    """The module graph folded onto subpackages and root modules: ``config -> {errors, ...}`` when any
    module of ``config/`` imports ``errors``. A unit's imports of itself are left out."""
    graph: dict[str, set[str]] = {}
    for name, targets in module_graph().items():
        unit = unit_of(name)
        graph.setdefault(unit, set()).update(unit_of(t) for t in targets if unit_of(t) != unit)
    return graph


def test_there_are_no_import_cycles():
    assert find_cycles(module_graph()) == []


def test_there_are_no_import_cycles_between_subpackages_and_root_modules():
    """The layers (DESIGN.md) hold only if the packages import one way: a cycle such as config ->
    scoring -> runtimes -> config means none of them can be read, tested or moved without the others.
    ``benchmarks/import_graph.py`` prints the graph and its cycles."""
    assert find_cycles(package_graph()) == []


def test_only_the_prefect_layer_imports_prefect():
    offenders = []
    for name, path in modules().items():
        if in_prefect_layer(name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] == "prefect"]
    assert offenders == []


def _imports_from(package: str) -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()
            if name == package or name.startswith(package + ".")}


def test_the_eval_package_imports_neither_the_prefect_layer_nor_the_cli():
    """``evals/`` is the eval without Prefect (its package docstring): the core, never flows/tasks/blocks/cli."""
    offenders = sorted(f"{name} -> {target}" for name, targets in _imports_from("prefect_rollouts.evals").items()
                       for target in targets if in_prefect_layer(target))
    assert offenders == []


def test_the_prefect_layer_does_not_import_the_cli():
    """``flows/``, ``tasks/`` and ``blocks/`` serve the CLI, the UI and notebooks alike: none reaches into ``cli*``."""
    layer = {}
    for package in PREFECT_LAYER:
        layer |= _imports_from(package)
    offenders = sorted(f"{name} -> {target}" for name, targets in layer.items() for target in targets
                       if is_cli(target))
    assert offenders == []


def test_the_stage_runner_does_not_import_the_flows():
    """``tasks/`` translates a stage policy into a task run (its package docstring); flows compose it, not the
    reverse."""
    offenders = sorted(f"{name} -> {target}" for name, targets in _imports_from("prefect_rollouts.tasks").items()
                       for target in targets if target.startswith("prefect_rollouts.flows"))
    assert offenders == []


def test_the_prefect_layer_sits_at_the_repository_root_and_in_the_package():
    """The design card's top level: ``flows/``, ``tasks/``, ``blocks/`` beside ``src/``; each is the
    package's ``prefect_rollouts.<name>`` (a symlink from ``src/prefect_rollouts/<name>``), one import
    name space, no top-level ``flows`` import name."""
    repository = ROOT.parents[1]
    if not (repository / "pyproject.toml").is_file():
        pytest.skip("an installed package, not a checkout")
    for name in ("flows", "tasks", "blocks"):
        assert (repository / name / "__init__.py").is_file() and not (repository / name).is_symlink(), name
        link = ROOT / name
        assert link.is_symlink() and link.resolve() == (repository / name).resolve(), name
    import prefect_rollouts.flows.eval as eval_module

    assert Path(eval_module.__file__).resolve() == (repository / "flows" / "eval.py").resolve()
    top_level = importlib.metadata.distribution("prefect-rollouts").read_text("top_level.txt") or ""
    assert top_level.split() == ["prefect_rollouts"]   # no top-level flows, tasks or blocks in users' environments


def test_the_prefect_layer_the_agent_loads_by_name_is_there():
    """``orchestrator = "prefect"`` loads the Prefect layer by module name (``agent.PREFECT_LAYER``), not by
    an import the layout checks could see: a moved or renamed module fails here, not at a user's first run."""
    import importlib

    from prefect_rollouts.agent import PREFECT_LAYER

    rollout = importlib.import_module(PREFECT_LAYER["rollout"])
    assert callable(rollout.run_rollout_flow) and callable(rollout.FlowChannel)
    blocks = importlib.import_module(PREFECT_LAYER["blocks"])
    assert {"ModelEndpoint", "TraceStore"} <= set(dir(blocks))


MAX_LINES = 400
"""STYLE.md: past about 400 lines, split the module by what each piece does."""
def test_no_module_is_over_400_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert over == {}
