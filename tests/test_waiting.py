"""The bounded waits of tests/support/waiting.py: a wait that gives up says what it waited for."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tests.support.waiting import WaitTimeout, next_line, poll_until, stays_false, wait_for, wait_until, within

pytestmark = pytest.mark.unit


def test_wait_until_returns_the_first_truthy_value():
    values = iter([0, [], "ready", "later"])
    assert wait_until(lambda: next(values), timeout_s=1, interval_s=0.001) == "ready"


def test_a_wait_that_gives_up_names_what_it_waited_for_and_the_last_value():
    with pytest.raises(WaitTimeout, match=r"^waited 0.05 s for two durable rows; the last check returned \[\]$"):
        wait_until(lambda: [], timeout_s=0.05, interval_s=0.01, what="two durable rows")
    with pytest.raises(AssertionError, match=r"waited 0.05 s for `.*lambda: 1 > 2, timeout_s=0.05"):
        wait_until(lambda: 1 > 2, timeout_s=0.05, interval_s=0.01)   # by default: the lambda as written

    def rows_written() -> int:
        return 0
    with pytest.raises(WaitTimeout, match=r"for `test_.*\.<locals>\.rows_written`; the last check returned 0$"):
        wait_until(rows_written, timeout_s=0.05, interval_s=0.01)


async def test_wait_for_awaits_an_async_predicate_and_names_it_when_it_gives_up():
    calls = []

    async def recorded() -> bool:
        calls.append(1)
        return len(calls) >= 3
    assert await wait_for(recorded, timeout_s=1, interval_s=0.001) is True
    with pytest.raises(WaitTimeout, match=r"^waited 0.05 s for the run to end; the last check returned None$"):
        await wait_for(lambda: None, timeout_s=0.05, interval_s=0.01, what="the run to end")


async def test_within_bounds_an_awaitable_and_names_it():
    assert await within(asyncio.sleep(0, result="done"), 1, "a sleep") == "done"
    with pytest.raises(WaitTimeout, match=r"^waited 0.05 s for the tool to start$"):
        await within(asyncio.Event().wait(), 0.05, "the tool to start")


def test_next_line_reads_a_line_or_gives_up_naming_the_process():
    code = "import sys, time; print('started', flush=True); time.sleep(float(sys.argv[1]))"
    with subprocess.Popen([sys.executable, "-c", code, "0"], stdout=subprocess.PIPE, text=True) as quick:
        assert next_line(quick, 5, "the start line") == "started\n"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], stdout=subprocess.PIPE) as mute:
        try:
            with pytest.raises(WaitTimeout, match=r"^waited 0.2 s for its start line: \[.*\] wrote no line$"):
                next_line(mute, 0.2, "its start line")
        finally:
            mute.kill()


def test_poll_until_and_stays_false_return_the_last_value_without_an_error():
    assert poll_until(lambda: 0, timeout_s=0.02, interval_s=0.01) == 0
    assert stays_false(lambda: False, for_s=0.02, interval_s=0.01) is True
    assert stays_false(lambda: True, for_s=5) is False


def test_a_callable_what_is_called_when_the_wait_gives_up():
    seen: list[str] = []

    def warned() -> bool:
        seen.append("no worker yet")
        return False
    with pytest.raises(WaitTimeout, match=r"^waited 0.05 s for the warning \(saw \['no worker yet'"):
        wait_until(warned, timeout_s=0.05, interval_s=0.01, what=lambda: f"the warning (saw {seen})")
