"""The Prefect test harness (a real ephemeral server on SQLite), started once per session and only
when the session has a test that needs it: every test of the prefect tier, and a system test that
asks for it with ``pytest.mark.usefixtures("prefect_harness")``. A unit test never starts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def needs_harness(item: pytest.Item) -> bool:
    return item.get_closest_marker("prefect") is not None or "prefect_harness" in getattr(item, "fixturenames", ())


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    """Run the session's tests inside ``prefect_test_harness`` when one of them needs it. Started here,
    before the first test: its start-up (up to a minute on a busy machine) counts against no test's
    timeout, and a fixture that points Prefect's settings at another server (``pg_api``) nests inside
    the harness's settings, so its exit cannot drop them."""
    if session.config.option.collectonly or not any(needs_harness(item) for item in session.items):
        return (yield)
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        return (yield)


@pytest.fixture(scope="session")
def prefect_harness() -> None:
    """A test that asks for this runs with the harness up (``pytest_runtestloop`` above starts it)."""
    from prefect.settings import PREFECT_API_URL

    assert PREFECT_API_URL.value(), "the Prefect test harness is not running"
