"""``TraceWriter``: add finished rollouts to the Parquet dataset, atomically, in batches.

Each flush writes one new file per table under ``<table>/date=<UTC day>/run_id=<run>/``, named
``part-<time ns>-<random 128-bit hex>.parquet``: no file is ever appended to or shared, so any number
of writers (processes, machines) can write one run at once. A file is written atomically on every
kind of store (``traces.store``: temporary name, fsync and rename on a directory; one PUT on an
object store), so a crash or ``kill -9`` never leaves a half-written file: a row is either durable
or absent. ``flush`` returns only once the rows are durable, and rows leave the buffer only once
their files are written (a cancelled ``aflush`` neither loses nor repeats a row).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.trace import UNFINISHED_STOPS, Trace
from prefect_rollouts.traces.schema import FIRST_ATTEMPT, MODEL_CALLS, ROLLOUTS, model_call_rows, rollout_row
from prefect_rollouts.traces.store import DatasetRoot, dataset_root


class TraceWriter:
    """Buffers rollout rows and writes them as Parquet files of one run.

    Args:
        root: Dataset root: a local or shared directory (created as needed), an object-store URI
            such as ``s3://bucket/prefix``, or a ``DatasetRoot`` (e.g. from a ``TraceStore`` block).
        run_id: The eval run these rollouts belong to (a partition value).
        batch_size: Flush automatically once this many rollouts are buffered.
        durable: Keys already durable (when resuming), so ``durable`` covers the whole run.

    Raises:
        ConfigError: ``root`` is a URI pyarrow cannot open, or holds credentials.
        TraceStoreError: (from ``flush``) a file cannot be written.
    """

    def __init__(self, root: str | Path | DatasetRoot, run_id: str, *, batch_size: int = 64,
                 durable: set[tuple[str, str, int]] | None = None) -> None:
        self.root = dataset_root(root)
        self.run_id = run_id
        self.batch_size = batch_size
        self._rollouts: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []
        self.written = 0
        self._lock = asyncio.Lock()
        self.durable: set[tuple[str, str, int]] = set(durable or ())
        """``(environment, task_id, rollout_index)`` of every durable rollout of the run (resume keys included)."""
        self.unfinished: set[tuple[str, str, int]] = set()
        """Durable rollouts whose latest row written here is not done (``trace.UNFINISHED_STOPS``: a budget
        stop): a resume runs them again, so the progress bar does not count them (``done``)."""

    @property
    def done(self) -> int:
        """Durable rollouts that are done (``durable`` less ``unfinished``): the progress bar's count."""
        return len(self.durable) - len(self.unfinished)

    @property
    def pending(self) -> int:
        """Rollouts buffered and not yet durable."""
        return len(self._rollouts)

    def add(self, trace: Trace, *, rollout_index: int, environment: str, config_hash: str,
            elapsed_s: float, attempt: int = FIRST_ATTEMPT) -> bool:
        """Buffer one finished rollout (``attempt``: which attempt of it ``trace`` is, 1 for the first).

        Returns:
            True when the batch is full: call ``flush`` (or ``aflush``) to make it durable.
        """
        self._rollouts.append(rollout_row(trace, rollout_index=rollout_index, environment=environment,
                                          config_hash=config_hash, elapsed_s=elapsed_s, attempt=attempt))
        self._calls.extend(model_call_rows(trace, rollout_index=rollout_index, environment=environment,
                                           attempt=attempt))
        return len(self._rollouts) >= self.batch_size

    def flush(self) -> int:
        """Write the buffered rows (one file per table) and return how many rollouts became durable.

        Rows leave the buffer only once their files are written. Not to be called while an
        ``aflush`` is writing (it would write that flush's rows again).

        Raises:
            TraceStoreError: a file cannot be written (a full disk); the rows stay buffered, so a
                later flush writes them and no rollout has to run again for its row.
            RuntimeError: an ``aflush`` is writing.
        """
        if self._lock.locked():
            raise RuntimeError("TraceWriter.flush called while an aflush is writing; await aflush instead")
        rollouts, calls = self._rollouts[:], self._calls[:]
        try:
            written = self._write(rollouts, calls)
        except BaseException as exc:
            self._settle(rollouts, calls, exc)
            raise
        self._settle(rollouts, calls, None)
        return written

    async def aflush(self) -> int:
        """``flush`` with the file writes and fsyncs in a worker thread, so the event loop keeps
        running rollouts; concurrent calls write one after another. Same errors as ``flush``.

        Cancelling it (the eval's periodic flusher is cancelled when the rollouts end) returns at
        once, but the write it started runs on in its thread: the lock is held until that write
        ends, and its rows leave the buffer (and join ``durable``) only once their files are
        written. The next flush therefore waits for it, then writes exactly the rows that are
        still not durable: none is lost, none is written twice.
        """
        await self._lock.acquire()
        try:
            rollouts, calls = self._rollouts[:], self._calls[:]
            if not rollouts:
                self._lock.release()
                return 0
            write = asyncio.ensure_future(asyncio.to_thread(self._write, rollouts, calls))
        except BaseException:
            self._lock.release()
            raise
        # Registered before ``shield`` registers its own: the buffer and ``durable`` are settled
        # (and the lock released) before this coroutine resumes, and also when it was cancelled.
        write.add_done_callback(functools.partial(self._settle_write, rollouts, calls))
        return await asyncio.shield(write)

    def _settle_write(self, rollouts: list[dict[str, Any]], calls: list[dict[str, Any]],
                      write: asyncio.Future[int]) -> None:
        try:
            self._settle(rollouts, calls, write.exception() if not write.cancelled() else asyncio.CancelledError())
        finally:
            self._lock.release()

    def _settle(self, rollouts: list[dict[str, Any]], calls: list[dict[str, Any]],
                error: BaseException | None) -> None:
        """After a write of the buffer's first ``len(rollouts)`` rows (``add`` only appends): drop them
        unless it failed in a way a later flush can mend (a storage error; an interrupt, after which
        the files may or may not exist: readers read a row written twice once). Rows a write rejects
        for another reason (they cannot become a table) are dropped, so they do not block every later
        row; the error reaches the caller."""
        if isinstance(error, TraceStoreError) or (error is not None and not isinstance(error, Exception)):
            return
        del self._rollouts[:len(rollouts)]
        del self._calls[:len(calls)]
        if error is None:
            for row in rollouts:
                key = (row["environment"], row["task_id"], row["rollout_index"])
                self.durable.add(key)
                (self.unfinished.add if row["stop_condition"] in UNFINISHED_STOPS else self.unfinished.discard)(key)
            self.written += len(rollouts)

    def _write(self, rollouts: list[dict[str, Any]], calls: list[dict[str, Any]]) -> int:
        if not rollouts:
            return 0
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        name = new_part_name()
        partition = f"date={day}/run_id={self.run_id}/{name}"
        if calls:
            write_table(self.root, f"model_calls/{partition}", pa.Table.from_pylist(calls, schema=MODEL_CALLS))
        try:
            write_table(self.root, f"rollouts/{partition}", pa.Table.from_pylist(rollouts, schema=ROLLOUTS))
        except TraceStoreError:
            if calls:   # the calls are written again with their rollouts; readers would drop this copy anyway
                with contextlib.suppress(TraceStoreError):
                    self.root.delete_file(f"model_calls/{partition}")
            raise
        return len(rollouts)


def new_part_name() -> str:
    """A file name no other writer will use: ``part-<time ns>-<random 128-bit hex>.parquet``."""
    return f"part-{time.time_ns()}-{uuid.uuid4().hex}.parquet"


def write_table(root: str | Path | DatasetRoot, relative: str, table: pa.Table) -> None:
    """Write ``table`` as the Parquet file ``relative`` under ``root`` (zstd), atomically.

    A batch's model_calls file is written before its rollouts file, so a rollout that is durable
    always has its model calls (a crash between the two leaves orphan calls at worst, which
    readers drop by joining on rollouts).

    Raises:
        TraceStoreError: the file cannot be written.
    """
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    dataset_root(root).write_file(relative, sink.getvalue().to_pybytes())
