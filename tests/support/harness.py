"""The Prefect test harness (a real ephemeral server on SQLite), started once per test process (once
per xdist worker) and only when that process runs a test that needs it: every test of the prefect
tier, and a system test that asks for it with ``pytest.mark.usefixtures("prefect_harness")``. A unit
test never starts it, nor does a worker that draws no such test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def needs_harness(item: pytest.Item) -> bool:
    return item.get_closest_marker("prefect") is not None or "prefect_harness" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of the prefect tier uses ``prefect_harness``."""
    for item in items:
        if item.get_closest_marker("prefect") is not None and "prefect_harness" not in item.fixturenames:
            item.fixturenames.insert(0, "prefect_harness")


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """This process's Prefect settings point at the harness's server until the session ends.

    Session-scoped, it is set up before any module or function fixture of the test that first asks
    for it, so a fixture pointing Prefect at another server (``pg_api``) nests inside the harness's
    settings and its exit restores them. Its start-up (up to a minute on a busy machine) counts
    against that first test's timeout (the tiers' timeouts leave room for it)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        assert PREFECT_API_URL.value(), "the Prefect test harness did not set PREFECT_API_URL"
        yield
