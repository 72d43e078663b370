"""A flush cancelled at any of its await points: every row ends durable exactly once (issue 32, item 1).

The write thread of ``TraceWriter.aflush`` keeps running after the task awaiting it is cancelled, as
the eval's periodic flusher is cancelled when the last rollout ends. The writes here pause at a
chosen point (``pausing_writes``) so the cancellation lands there, then go on and either succeed or
fail as a full disk does.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pyarrow.parquet as pq
import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.evals import engine
from prefect_rollouts.evals.engine import EvalRun, run_all
from prefect_rollouts.trace import ModelCall
from prefect_rollouts.traces import TraceWriter
from prefect_rollouts.traces import writer as writer_module

pytestmark = pytest.mark.unit

real_write_table = writer_module.write_table


class Pause:
    """The first write of a file of ``table`` stops ``where`` ("before" or "after" it) until ``go``;
    then it goes on, or raises a storage error when ``fail``."""

    def __init__(self, table: str, where: str, fail: bool) -> None:
        self.table, self.where, self.fail = table, where, fail
        self.reached, self.go, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.used = False

    def write_table(self, root, relative, table):
        paused = not self.used and relative.startswith(self.table)
        self.used = self.used or paused
        if paused and self.where == "before":
            self.reached.set()
            assert self.go.wait(5)
        if not (paused and self.fail):
            real_write_table(root, relative, table)
        if paused:
            if self.where == "after":
                self.reached.set()
                assert self.go.wait(5)
            self.ended.set()
            if self.fail:
                raise TraceStoreError(f"cannot write {relative} (No space left on device)")

    async def until_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 5)


@pytest.fixture
def pause(monkeypatch):
    def install(table: str, where: str, fail: bool = False) -> Pause:
        chosen = Pause(table, where, fail)
        monkeypatch.setattr(writer_module, "write_table", chosen.write_table)
        return chosen
    return install


def add(writer: TraceWriter, task_id: str) -> None:
    trace = vf.Trace(task_id=task_id, model="m", reward=1.0, stop_condition="agent_completed")
    trace.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0, latency_ms=1.0))
    writer.add(trace, rollout_index=0, environment="arith", config_hash="h", elapsed_s=0.1)


def rows_on_disk(root, table: str) -> Counter[str]:
    """How many times each task id is in the files of ``table`` (not de-duplicated as the readers do)."""
    return Counter(task_id for path in sorted(root.rglob(f"{table}/**/*.parquet"))
                   for task_id in pq.read_table(path).column("task_id").to_pylist())


def assert_each_row_durable_once(tmp_path, writer: TraceWriter, names: str) -> None:
    every = Counter(names)
    assert writer.durable == {("arith", name, 0) for name in names} and writer.pending == 0
    assert rows_on_disk(tmp_path, "rollouts") == every and rows_on_disk(tmp_path, "model_calls") == every
    assert writer.written == len(names)


POINTS = [("model_calls", "before"), ("rollouts", "before"), ("rollouts", "after")]
"""Where the write thread is when its flush is cancelled: before the batch's model_calls file, between
its two files, after both (the thread has not returned yet)."""


@pytest.mark.parametrize("fail", [False, True], ids=["write-succeeds", "write-fails"])
@pytest.mark.parametrize(("table", "where"), POINTS, ids=["-".join(point) for point in POINTS])
async def test_a_flush_cancelled_while_writing_keeps_its_rows_until_written_and_the_next_writes_each_once(
        tmp_path, pause, table, where, fail):
    writer = TraceWriter(tmp_path, "r1")
    paused = pause(table, where, fail)
    add(writer, "a"), add(writer, "b")
    flushing = asyncio.create_task(writer.aflush())
    await paused.until_reached()
    add(writer, "c")   # a rollout ending while the write runs
    flushing.cancel()
    await asyncio.gather(flushing, return_exceptions=True)
    assert flushing.cancelled()
    assert writer.pending == 3 and writer.durable == set()   # nothing left the buffer before its file is written
    final = asyncio.create_task(writer.aflush())
    paused.go.set()
    await final
    assert_each_row_durable_once(tmp_path, writer, "abc")
    assert paused.ended.is_set()


async def test_a_flush_cancelled_while_waiting_for_another_takes_nothing(tmp_path, pause):
    writer = TraceWriter(tmp_path, "r1")
    paused = pause("rollouts", "before")
    add(writer, "a")
    first = asyncio.create_task(writer.aflush())
    await paused.until_reached()
    add(writer, "b")
    waiting = asyncio.create_task(writer.aflush())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    paused.go.set()
    assert await first == 1
    assert writer.pending == 1 and writer.durable == {("arith", "a", 0)}
    assert await writer.aflush() == 1
    assert_each_row_durable_once(tmp_path, writer, "ab")


@pytest.mark.parametrize("fail", [False, True], ids=["write-succeeds", "write-fails"])
async def test_run_all_makes_every_row_durable_once_when_its_flusher_is_cancelled_mid_write(
        tmp_path, pause, monkeypatch, fail):
    monkeypatch.setattr(engine, "FLUSH_INTERVAL_S", 0.01)
    paused = pause("rollouts", "before", fail)
    writer = TraceWriter(tmp_path, "r1")
    run = EvalRun(agents={}, writer=writer, run_id="r1", total=5, gate=asyncio.Semaphore(5))

    async def runner(run: EvalRun, todo: list) -> None:
        for name in "abcd":
            add(run.writer, name)
        await paused.until_reached()   # the periodic flusher is writing a-d
        add(run.writer, "e")           # the last rollout ends; run_all cancels the flusher

        async def go_once_the_flusher_is_cancelled() -> None:
            flusher = next(task for task in asyncio.all_tasks()
                           if task.get_coro().__qualname__ == "_flush_periodically")
            await asyncio.gather(flusher, return_exceptions=True)
            paused.go.set()
        asyncio.get_running_loop().create_task(go_once_the_flusher_is_cancelled())

    assert await run_all(run, [], runner) is True
    assert run.store_error is None
    assert_each_row_durable_once(tmp_path, writer, "abcde")
