"""The README and docs/ as a newcomer reads them: every TOML block is a config the project accepts,
every Python block compiles and names what the package has, every relative link leads to a file
(and heading) that exists, every docs page is reachable from the README's table, and the generated
configuration reference is what ``scripts/config_reference.py`` writes. The pages' shell commands
are checked by tests/test_readme.py."""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.sources import validate_config
from prefect_rollouts.environments.harbor.config import TaskToml
from prefect_rollouts.evals.identity import check_portable
from tests.test_readme import FENCE, PAGES, README, REPO

pytestmark = pytest.mark.unit

SRC = REPO / "src"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def blocks(language: str) -> list[tuple[str, str]]:
    """``(id, body)`` of every fenced block in ``language`` on every page, ids ``page#n``."""
    found = []
    for page, text in PAGES.items():
        bodies = [body for lang, body in FENCE.findall(text) if lang == language]
        found += [(f"{page}#{n}", body) for n, body in enumerate(bodies, 1)]
    return found


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``more`` over ``base``, tables key by key (as ``--set`` and a suite entry merge)."""
    out = dict(base)
    for key, value in more.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


#: What a TOML fragment of the docs is completed with to make an eval config: a taskset and an agent.
BASE = {"env": {"taskset": {"id": "arithmetic"}, "agent": {"model": "my-model"}}}
#: Top-level tables of a Harbor task's task.toml (docs/harbor.md), which no eval config has.
TASK_TOML_KEYS = {"version", "metadata", "agent", "verifier", "environment", "solution"}


@pytest.mark.parametrize(("where", "body"), blocks("toml"), ids=[where for where, _ in blocks("toml")])
def test_each_toml_block_is_a_config_the_project_accepts(where, body):
    data = tomllib.loads(body)
    if data and set(data) <= TASK_TOML_KEYS and "env" not in data:
        task = TaskToml.model_validate(data)
        assert task.unknown_keys() == [], f"{where}: keys Harbor's task.toml does not have: {task.unknown_keys()}"
        return
    config = validate_config(EvalConfig, eval_config_of(data), "", REPO / "examples")
    # a literal env value counts as a secret: "***" in the trace's config, refused by the launch form and a
    # work pool; a value that is no secret is written "${NAME:-value}"
    check_portable(config, "a launch form")


def eval_config_of(data: dict[str, Any]) -> dict[str, Any]:
    """A docs TOML fragment completed into an eval config (``BASE``; a suite's tasksets replace its taskset).
    Its relative paths (a program's files) are relative to the config file: the examples' directory."""
    config = merged(BASE, data)
    if "tasksets" in config["env"]:
        del config["env"]["taskset"]
    return config


def module_file(name: str) -> Path | None:
    """The source file of ``prefect_rollouts...`` module ``name`` (a package's ``__init__.py``), found
    without importing it (flows/ would load Prefect); None when there is none."""
    path = SRC.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def defined_names(path: Path) -> set[str]:
    """Names a module defines or imports at its top level (what ``from module import name`` finds)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


PUBLIC_API = defined_names(SRC / "prefect_rollouts" / "__init__.py")


@pytest.mark.parametrize(("where", "body"), blocks("python"), ids=[where for where, _ in blocks("python")])
def test_each_python_block_compiles_and_names_what_the_package_has(where, body):
    tree = compile(body, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    missing = []
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "prefect_rollouts":
            path = module_file(node.module)
            if path is None:
                missing.append(f"module {node.module}")
                continue
            names = defined_names(path)
            missing += [f"{node.module}.{alias.name}" for alias in node.names
                        if alias.name not in names and module_file(f"{node.module}.{alias.name}") is None]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "prefect_rollouts":
                    if module_file(alias.name) is None:
                        missing.append(f"module {alias.name}")
                    if alias.name == "prefect_rollouts" and alias.asname:
                        aliases.add(alias.asname)
    for node in ast.walk(tree):   # vf.Name where `import prefect_rollouts as vf`
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr not in PUBLIC_API:
                missing.append(f"prefect_rollouts.{node.attr}")
    assert not missing, f"{where} names what the package does not have: {missing}"


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (outside code blocks), duplicates numbered."""
    found: set[str] = set()
    for line in FENCE.sub("", text).splitlines():
        if match := re.match(r"^#{1,6} +(.*?)\s*#*$", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            candidate, n = slug, 0
            while candidate in found:
                n += 1
                candidate = f"{slug}-{n}"
            found.add(candidate)
    return found


def relative_links(text: str) -> list[str]:
    """Targets of the page's Markdown links and images, outside code, that are not URLs."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return [target for target in LINK.findall(prose) if not re.match(r"^[a-z][a-z+.-]*:", target)]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in relative_links(PAGES[page]):
        path, _, anchor = target.partition("#")
        file = (REPO / page).parent / path if path else REPO / page
        if not file.resolve().is_relative_to(REPO) or not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file.read_text())):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page}: {broken}"


def test_the_readme_table_links_every_docs_page():
    table = README[README.index("## Where each topic is documented"):]
    table = table[:table.index("\n## ")]
    linked = {target.partition("#")[0] for target in relative_links(table)}
    pages = {name for name in PAGES if name.startswith("docs/")}
    assert pages <= linked, f"pages the README's table does not link: {sorted(pages - linked)}"


def test_the_readme_shows_an_eval_in_the_prefect_ui_and_stays_a_front_door():
    images = [target for target in relative_links(README) if target.endswith(".png")]
    assert images and all((REPO / image).stat().st_size < 250_000 for image in images)
    assert README.count("\n") <= 300


def test_the_configuration_reference_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (REPO / "docs" / "config-reference.md").read_text() == script.render(), (
        "docs/config-reference.md is stale: run .venv/bin/python scripts/config_reference.py")
    documented = set(re.findall(r"^\| `(\w+)` \|", script.render(), re.MULTILINE))
    assert {"rollout_granularity", "max_turn_tokens", "storage_mb", "work_pool", "model_requests"} <= documented
