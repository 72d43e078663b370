"""``TraceWriter``: append finished rollouts to the Parquet dataset, atomically, in batches.

Each flush writes one file per table under ``<table>/date=<UTC day>/run_id=<run>/``. A file is
written under a hidden temporary name (``.part-*.tmp``, which readers skip), fsynced, then
renamed into place, so a crash or ``kill -9`` never leaves a half-written file: a row is either
durable or absent. ``flush`` returns only once the rows are durable.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.trace import Trace
from prefect_rollouts.traces.schema import MODEL_CALLS, ROLLOUTS, model_call_rows, rollout_row


class TraceWriter:
    """Buffers rollout rows and writes them as Parquet files of one run.

    Args:
        root: Dataset root (a local directory; created if missing).
        run_id: The eval run these rollouts belong to (a partition value).
        batch_size: Flush automatically once this many rollouts are buffered.
        durable: Keys already durable (when resuming), so ``durable`` covers the whole run.

    Raises:
        TraceStoreError: the root cannot be created or a file cannot be written.
    """

    def __init__(self, root: str | Path, run_id: str, *, batch_size: int = 64,
                 durable: set[tuple[str, int]] | None = None) -> None:
        self.root = Path(root)
        self.run_id = run_id
        self.batch_size = batch_size
        self._rollouts: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []
        self.written = 0
        self._lock = asyncio.Lock()
        self.durable: set[tuple[str, int]] = set(durable or ())
        """``(task_id, rollout_index)`` of every durable rollout of the run (resume keys included)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceStoreError(f"[traces] path = {str(self.root)!r}: cannot create it ({exc}). "
                                  "Choose a writable directory") from exc

    @property
    def pending(self) -> int:
        """Rollouts buffered and not yet durable."""
        return len(self._rollouts)

    def add(self, trace: Trace, *, rollout_index: int, environment: str, config_hash: str,
            elapsed_s: float) -> bool:
        """Buffer one finished rollout.

        Returns:
            True when the batch is full: call ``flush`` (or ``aflush``) to make it durable.
        """
        self._rollouts.append(rollout_row(trace, rollout_index=rollout_index, environment=environment,
                                          config_hash=config_hash, elapsed_s=elapsed_s))
        self._calls.extend(model_call_rows(trace, rollout_index=rollout_index, environment=environment))
        return len(self._rollouts) >= self.batch_size

    def flush(self) -> int:
        """Write the buffered rows (one file per table) and return how many rollouts became durable."""
        return self._write(*self._take())

    async def aflush(self) -> int:
        """``flush`` with the file writes and fsyncs in a worker thread, so the event loop keeps
        running rollouts; concurrent calls write one after another."""
        async with self._lock:
            rollouts, calls = self._take()
            return await asyncio.to_thread(self._write, rollouts, calls)

    def _take(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        taken = self._rollouts, self._calls
        self._rollouts, self._calls = [], []
        return taken

    def _write(self, rollouts: list[dict[str, Any]], calls: list[dict[str, Any]]) -> int:
        if not rollouts:
            return 0
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        name = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
        if calls:
            _write_atomic(pa.Table.from_pylist(calls, schema=MODEL_CALLS), self._dir("model_calls", day) / name)
        _write_atomic(pa.Table.from_pylist(rollouts, schema=ROLLOUTS), self._dir("rollouts", day) / name)
        self.durable.update((row["task_id"], row["rollout_index"]) for row in rollouts)
        self.written += len(rollouts)
        return len(rollouts)

    def _dir(self, table: str, day: str) -> Path:
        path = self.root / table / f"date={day}" / f"run_id={self.run_id}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def _write_atomic(table: pa.Table, target: Path) -> None:
    """Write ``table`` to ``target`` through a hidden temporary file, fsync, rename, fsync the directory.

    The model_calls file of a batch is written before its rollouts file, so a rollout that is
    durable always has its model calls (a crash between the two leaves orphan calls at worst,
    which readers drop by joining on rollouts).
    """
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with open(tmp, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TraceStoreError(f"trace dataset: cannot write {target} ({exc}). "
                              "Check free space and permissions") from exc
