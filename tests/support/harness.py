"""The Prefect test harness (a real ephemeral server on SQLite), started once per session and only
when the session has a test that needs it: every test of the prefect tier, and a system test that
asks for it with ``pytest.mark.usefixtures("prefect_harness")``. A unit test never starts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def needs_harness(item: pytest.Item) -> bool:
    return item.get_closest_marker("prefect") is not None or "prefect_harness" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """This process's Prefect client pointed at ``prefect_test_harness`` for the rest of the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session", autouse=True)
def _prefect_harness_first(request: pytest.FixtureRequest) -> None:
    """Start the harness as the session starts when a selected test needs it (``needs_harness``), before
    any module fixture: one that points Prefect's settings at another server (``pg_api``) must nest
    inside the harness's settings, as when the harness was always on, or its exit would drop them too."""
    if any(needs_harness(item) for item in request.session.items):
        request.getfixturevalue("prefect_harness")

