"""Test tiers. Every test is exactly one of (markers registered in pyproject.toml):

- ``unit``: no service. No Prefect server, PostgreSQL, Docker, browser or real model; the in-process
  fakes on loopback (the scripted OpenAI server, moto's S3) and local subprocesses are allowed.
- ``prefect``: the Prefect test harness (an ephemeral server on SQLite, ``tests/support/harness.py``)
  or another SQLite-backed Prefect server; nothing of the system tier.
- ``system``: PostgreSQL-backed Prefect servers, real ``prefect worker`` processes, the browser,
  Docker, the real SmolLM2 model, installs from PyPI.

A module says its tier with ``pytestmark``; a module whose tests differ marks each test (or each
parameter). A collected test with no tier or two stops the run before any test runs. Each test runs
under its tier's timeout unless it sets its own with ``@pytest.mark.timeout`` (or the run gives
``--timeout``); a test's timeout covers its fixtures' setup and teardown, and a module-scoped fixture
is torn down in the module's last test, so a mixed module gives its servers function scope.
scripts/test runs the tiers in this order, each as its own pytest run.

Within a tier, tests run at once in pytest-xdist workers (scripts/test). Two rules keep that sound:

- the tests of a module that share a module-scoped fixture (a server, a browser, a built image) run
  in one worker, in order (an ``xdist_group`` named after the module, for ``--dist loadgroup``), so
  the fixture is set up once, as without xdist;
- a test marked ``smollm2`` runs the real model, whose llama.cpp server takes every core while it reads a
  prompt: those tests run in ``MODEL_LANES`` lanes (groups ``smollm2-0``, ...; alternating in collection
  order; they win over the module's group);
- a test marked ``serial`` acts on what every test shares (the whole Docker engine's containers, the
  machine's load or disk): scripts/test runs those after the others, one at a time.

The tests are ordered for the scheduler (scripts/test passes ``--no-loadscope-reorder``, so xdist hands out
groups in this order, the next to whichever worker is free): the real-model lane first (the longest
chain of the suite: 600-700 s of a 770 s system tier under load), then the module groups, most tests
first (xdist's own order), then the tests of no group, in collection order. The longest work starts
first and the short tests fill the gaps at the end.
"""

from __future__ import annotations

import os

import pytest

MODEL_LANES = 1
"""How many tests that run the real model (``smollm2``) may run at once. One lane is the system tier's
critical path (680 of its 718 s on a clean clone), but the tier is CPU-bound: with two lanes the model
tests ran 2-3x longer side by side and the whole ``.ci/run`` took 18 min 12 s against 18 min 23 s."""

TIMEOUT_S = {"unit": 10, "prefect": 300, "system": 600}
"""Seconds per test, setup included: a unit test takes under 5 s here; the harness starts within the
first prefect test (~60 s on a busy machine); a system test may build images or start servers."""


def group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return None if mark is None else str(mark.args[0] if mark.args else mark.kwargs.get("name"))


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` in the order the module docstring gives: the ``smollm2`` lanes, then the other groups by
    number of tests (most first; ties in collection order), then the rest; each group's tests in collection order."""
    groups: dict[str | None, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    rest = groups.pop(None, [])
    ordered = sorted(groups.items(), key=lambda group: (not group[0].startswith("smollm2-"), -len(group[1])))
    return [item for _, members in ordered for item in members] + rest


def tiers_of(item: pytest.Item) -> list[str]:
    return sorted({mark.name for mark in item.iter_markers() if mark.name in TIMEOUT_S})


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture set up once per module, class or package (not per session)."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class", "package")
               for defs in definitions.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)   # before ``-m`` deselects: every collected test is checked, whichever tier runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = [f"{item.nodeid}: {', '.join(tiers) or 'no tier'}" for item in items if len(tiers := tiers_of(item)) != 1]
    if wrong:
        raise pytest.UsageError("each test needs exactly one tier marker, unit, prefect or system "
                                "(tests/support/tiers.py):\n  " + "\n  ".join(wrong))
    model_tests = 0
    for item in items:
        if item.get_closest_marker("smollm2") is not None:
            item.add_marker(pytest.mark.xdist_group(f"smollm2-{model_tests % MODEL_LANES}"))
            model_tests += 1
        elif shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items[:] = longest_first(items)
    if config.getvalue("timeout") is not None or os.environ.get("PYTEST_TIMEOUT"):
        return   # the run's own timeout wins over the tiers'
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[tiers_of(item)[0]]))
