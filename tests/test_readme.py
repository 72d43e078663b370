"""The shell commands of the README and of every page under docs/ run as written from a fresh clone
(once the README's Install step made `.venv`), and nothing in the repository points at one machine's
paths. tests/test_docs.py checks the pages' TOML and Python blocks and their links."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
#: The README and every docs page, by path relative to the checkout: each one's blocks are checked alike.
PAGES = {name: (REPO / name).read_text()
         for name in ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: Programs a fresh Debian or Ubuntu machine has; anything else must come from the checkout or .venv.
SYSTEM = {"python3", "export"}
VENV_BIN = Path(sys.executable).parent   # the .venv the tests run in
#: An absolute path under a directory that differs from machine to machine (not /tmp, /proc, /usr).
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|opt|srv|mnt)/\S*")


ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def readme_commands(text: str | None = None) -> list[list[str]]:
    """Each simple command of the ``bash`` blocks of ``text`` (default: the README and every docs page)
    as its words, environment assignments in front of it included; a line of assignments only is no
    command."""
    commands = []
    for language, body in FENCE.findall("\n".join(PAGES.values()) if text is None else text):
        if language != "bash":
            continue
        for line in body.splitlines():
            words: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word != "&&":
                    words.append(word)
                    continue
                if not all(ASSIGNMENT.fullmatch(w) for w in words):
                    commands.append(words)
                words = []
    return commands


def without_assignments(words: list[str]) -> list[str]:
    return list(itertools.dropwhile(ASSIGNMENT.fullmatch, words))


COMMANDS = [without_assignments(words) for words in readme_commands()]


def test_the_readme_has_the_commands_this_test_checks():
    in_readme = {without_assignments(words)[0] for words in readme_commands(README)}
    assert {"scripts/run-main", "scripts/test", ".venv/bin/prefect-rollouts", ".venv/bin/pip"} <= in_readme
    programs = {words[0] for words in COMMANDS}   # the docs pages' too
    assert {"scripts/run-main", ".venv/bin/prefect-rollouts", ".venv/bin/prefect", ".venv/bin/pip"} <= programs


@pytest.mark.parametrize("line", readme_commands(), ids=lambda words: " ".join(without_assignments(words))[:60])
def test_each_readme_command_names_a_program_a_fresh_clone_has(line):
    words = without_assignments(line)
    program = words[0]
    if program.startswith(".venv/bin/"):
        assert (VENV_BIN / program.removeprefix(".venv/bin/")).exists(), f"{program}: the install does not make it"
    elif program.startswith("scripts/"):
        assert os.access(REPO / program, os.X_OK), f"{program}: no such executable in the checkout"
    else:
        assert program in SYSTEM, (f"{program!r} is found only with the virtual environment activated: "
                                   f"write .venv/bin/{program}")
    placeholders = [word for word in line if re.search(r"<[^>]*>|^\[.*\]$", word)]
    assert not placeholders, f"placeholders the shell cannot run: {placeholders}"


def test_every_extra_the_readme_installs_exists():
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {extra for words in COMMANDS if words[0] == ".venv/bin/pip" for word in words
             for group in re.findall(r"^\.\[([\w,]+)\]$", word) for extra in group.split(",")}
    assert {"local", "bfcl", "humaneval", "notebook"} <= named <= extras
    install = README[README.index("## Install"):README.index("\n## ", README.index("## Install"))]
    assert ".venv/bin/pip install -e '.[humaneval]'" in install


def split(words: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``(leading options, subcommand words, options used after them)`` of a CLI command."""
    rest = words[1:]
    leading = []
    while rest and rest[0].startswith("--"):
        leading.append(rest.pop(0))
    sub = []
    while rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        sub.append(rest.pop(0))
    return leading, sub, [word.split("=", 1)[0] for word in rest if word.startswith("--")]


@pytest.mark.parametrize("words", list({" ".join(w): w for w in COMMANDS if w[0] == ".venv/bin/prefect-rollouts"}
                                      .values()), ids=lambda words: " ".join(words[1:3]))
def test_each_prefect_rollouts_command_has_its_subcommand_and_options(words):
    leading, sub, options = split(words)
    assert not leading
    bracketed = [word for word in words if word.startswith("[")]   # `[--opt N]` is an argument when pasted
    assert not bracketed, f"{' '.join(words)}: write optional parts as a comment, not {bracketed}"
    result = CliRunner().invoke(app, [*sub, "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and not re.search(r"Usage: .* COMMAND", result.output), result.output
    for option in options:
        assert option in result.output, f"{' '.join(sub)} has no option {option}"


PREFECT_COMMANDS = [w for w in COMMANDS if w[0] == ".venv/bin/prefect"]

HELP = """\
import contextlib, io, json, sys
from prefect.cli._app import _run_cli

helps = {}
for words in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            _run_cli([*words, "--help"] if words else [])   # the root's help, as `prefect --help` gives it
        except SystemExit as exit:
            if exit.code:
                raise
    helps[" ".join(words)] = out.getvalue()
print(json.dumps(helps))
"""
"""Every ``prefect ... --help`` the README's commands need, in one process of Prefect's CLI (its own
``_run_cli``, what the ``prefect`` script runs): one import of Prefect instead of two per command (a
subprocess each took 2 s here, past the unit tier's 10 s under load)."""


@pytest.fixture(scope="module")
def prefect_helps() -> dict[str, str]:
    wanted = sorted({" ".join(part) for words in PREFECT_COMMANDS for part in ([], split(words)[1])})
    result = subprocess.run([str(VENV_BIN / "python"), "-c", HELP, json.dumps([w.split() for w in wanted])],
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.mark.timeout(60)   # the first one sets up prefect_helps: 5-6 s quiet, past 10 s beside the other unit workers
@pytest.mark.parametrize("words", PREFECT_COMMANDS, ids=lambda words: " ".join(words[1:4]))
def test_each_prefect_command_has_its_subcommand_and_options(words, prefect_helps):
    leading, sub, options = split(words)
    for args, wanted in (([], leading), (sub, options)):
        shown = prefect_helps[" ".join(args)]
        assert "Usage:" in shown, shown
        for option in wanted:
            assert option in shown, f"prefect {' '.join(args)} has no option {option}"


@pytest.mark.parametrize("page", PAGES)
def test_no_inline_command_calls_a_bare_prefect(page):
    prose = FENCE.sub("", PAGES[page])
    bare = [span for span in re.findall(r"`([^`\n]+)`", prose) if re.match(r"(prefect|prefect-rollouts) \S", span)]
    assert not bare, f"write these as .venv/bin/...: {bare}"


def test_nothing_in_the_repository_names_one_machines_paths():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True,
                             timeout=8).stdout.split()
    found = []
    for name in tracked:
        try:
            text = (REPO / name).read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        found += [f"{name}: {m.group(0)}" for m in MACHINE_PATH.finditer(text)]
    assert not found


@pytest.mark.parametrize("script", ["scripts/test", "scripts/run-main"])
def test_the_scripts_take_prebuilt_wheels_only_from_beside_the_checkout_or_the_variable(script):
    text = (REPO / script).read_text()
    assert 'wheels="${PREFECT_ROLLOUTS_WHEELS:-../shared/wheels}"' in text
    assert 'links=(--find-links "$wheels")' in text and text.count("--find-links") == 1
    assert text.startswith("#!/usr/bin/env bash") and 'cd "$(dirname "$0")/.."' in text   # relative to the checkout
