"""Readers of the trace dataset: pandas DataFrames with the partition columns ``date`` and ``run_id``.

Every reader takes the dataset root as a path, an object-store URI (``s3://bucket/prefix``) or a
``DatasetRoot`` (``traces.store``), and sees the same rows whichever process or machine wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.nesting import loads
from prefect_rollouts.trace import ErrorRecord, Trace
from prefect_rollouts.traces.files import LEFT_OUT, read_partitions
from prefect_rollouts.traces.schema import MODEL_CALLS, PARTITIONING, ROLLOUTS
from prefect_rollouts.traces.store import DatasetRoot, dataset_root

Root = str | Path | DatasetRoot
"""A dataset root: a path, an object-store URI, or a resolved ``DatasetRoot``."""
ROLLOUT_KEY = ["run_id", "environment", "task_id", "rollout_index"]
"""What identifies a rollout in the dataset: a row written twice with the same key is read once (the first)."""


def read_rollouts(path: Root, *, columns: list[str] | None = None, **filters: Any) -> pd.DataFrame:
    """The ``rollouts`` table as a DataFrame, one row per rollout.

    Args:
        path: Dataset root (holding ``rollouts/`` and ``model_calls/``): a directory, a URI such as
            ``s3://bucket/prefix``, or a ``DatasetRoot``.
        columns: Only these columns (default: all); ``ROLLOUT_KEY`` (run id, environment, task
            id, rollout index) is always read.
        **filters: Column equality filters, e.g. ``run_id="nightly-2026-11-29"``,
            ``model="m"``; a list or tuple value means "any of".

    Returns:
        Columns of ``traces.schema.ROLLOUTS`` plus ``date`` and ``run_id``; empty (with
        those columns) when nothing is written yet. A rollout written twice (same run,
        environment, task and rollout index) appears once.

    Raises:
        TraceStoreError: a filter names an unknown column, or the store cannot be reached. (A file
            that cannot be read as Parquet is skipped with a warning naming it: ``traces.files``.)
        ConfigError: ``path`` is a URI pyarrow cannot open, or holds credentials.
    """
    return first_rows(scan_rollouts(path, columns=columns, **filters), ROLLOUT_KEY).to_pandas()


def first_rows(table: pa.Table, keys: list[str]) -> pa.Table:
    """The first row of each ``keys`` value, in Arrow, before the rest of a row becomes Python
    objects: a 238 KB dictionary-encoded file of a million duplicate rows became 1.96 GB in
    ``traces show`` when duplicates were dropped after ``to_pandas``. Only the key columns are
    converted to find them."""
    if table.num_rows == 0:
        return table
    repeated = table.select(keys).to_pandas().duplicated(keys, keep="first").to_numpy()
    return table.filter(pa.array(~repeated)) if repeated.any() else table


def scan_rollouts(path: Root, *, columns: list[str] | None = None, **filters: Any) -> pa.Table:
    """The matching ``rollouts`` rows as an Arrow table, in one scan of the dataset, NOT de-duplicated.

    For readers that reduce a large column in Arrow before the rest becomes a DataFrame (as
    ``traces.compare`` does with ``info``); same arguments and errors as ``read_rollouts``, which
    is this plus ``to_pandas`` and dropping duplicates (keep the first of each ``ROLLOUT_KEY``).
    """
    if columns is not None:
        columns = list(dict.fromkeys([*ROLLOUT_KEY, *columns]))
    return _read(dataset_root(path), "rollouts", ROLLOUTS, filters, columns=columns)


def read_model_calls(path: Root, *, columns: list[str] | None = None, **filters: Any) -> pd.DataFrame:
    """The ``model_calls`` table as a DataFrame, one row per model call (same ``filters`` as ``read_rollouts``).

    Only calls of the rollouts ``read_rollouts`` returns are kept: calls of a rollout whose row is
    not durable (a crash between the two files of a batch) or was dropped as a duplicate are
    left out, and a call stored twice (a compaction cut short) appears once (the first read).

    Args:
        columns: Only these columns (default: all); ``run_id``, ``rollout_id`` and ``call_index``
            are always read.
    """
    root = dataset_root(path)
    if columns is not None:
        columns = list(dict.fromkeys(["run_id", "rollout_id", "call_index", *columns]))
    calls = _read(root, "model_calls", MODEL_CALLS, filters, columns=columns)
    keep = {k: v for k, v in filters.items() if k in ("run_id", "date", "task_id", "model", "environment")}
    rollouts = _read(root, "rollouts", ROLLOUTS, keep, columns=[*ROLLOUT_KEY, "rollout_id"])
    shown = first_rows(rollouts, ROLLOUT_KEY).to_pandas()
    # Arrow's is_in: pandas' isin on 400,000 string ids took about 1 s of the 1.4 s read
    calls = calls.filter(pc.is_in(calls.column("rollout_id"), value_set=pa.array(shown["rollout_id"], pa.string())))
    return first_rows(calls, ["rollout_id", "call_index"]).to_pandas()


NETWORK_COLUMNS = ["run_id", "environment", "task_id", "rollout_index", "rollout_id", "phase", "method", "host",
                   "port", "sni", "address", "allowed", "reason", "error", "bytes_sent", "bytes_received",
                   "started_at", "duration_s"]
"""The columns of ``read_network``: a rollout's key, then ``trace.NetworkRecord``'s fields."""


def read_network(path: Root, **filters: Any) -> pd.DataFrame:
    """The network log of the matching rollouts, one row per connection the egress proxy saw
    (``NETWORK_COLUMNS``; ``started_at`` a UTC timestamp), in rollout and connection order (same
    ``filters`` as ``read_rollouts``). Rollouts under ``open`` or ``none`` have no rows; files
    written before schema version 5 have none either.

    "Which tasks tried to reach what": ``read_network(root, run_id="nightly").query("not allowed")``.
    """
    rollouts = read_rollouts(path, columns=["rollout_id", "network"], **filters)
    rows = [{"run_id": row.run_id, "environment": row.environment, "task_id": row.task_id,
             "rollout_index": row.rollout_index, "rollout_id": row.rollout_id, **record}
            for row in rollouts.itertuples() if isinstance(row.network, str)
            for record in json.loads(row.network)]
    frame = pd.DataFrame(rows, columns=NETWORK_COLUMNS)
    frame["started_at"] = pd.to_datetime(frame["started_at"], unit="s", utc=True)
    return frame


def read_traces(path: Root, **filters: Any) -> list[Trace]:
    """The full ``Trace`` objects of the matching rollouts (``trace_of_row`` of each row)."""
    return [trace_of_row(row) for row in read_rollouts(path, **filters).to_dict("records")]


NOT_READABLE = "TraceNotReadable"
"""The ``ErrorRecord.type`` ``trace_of_row`` adds to a trace built from a row's other columns."""


def trace_of_row(row: Mapping[str, Any]) -> Trace:
    """The ``Trace`` of one ``rollouts`` row (a record of ``read_rollouts``, every column read).

    Its ``trace`` column's JSON; when that cannot be read (not JSON, nested deeper than pydantic's
    JSON parser takes, not a trace's shape: a damaged or hand-made row), a ``Trace`` of what the
    row's other columns hold (rollout id, task, model, reward, rewards, metrics, stop condition,
    tokens, errors, info; a JSON column that cannot be read is left empty), with an ``ErrorRecord``
    of type ``NOT_READABLE`` and stage ``read`` saying why. Never raises for what the row holds.
    """
    try:
        return Trace.model_validate_json(row.get("trace") or "")
    except ValueError as exc:   # pydantic's ValidationError, also for JSON it cannot parse
        problem = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) and exc.errors() else str(exc)
    plain = {name: None if _missing(value) else value.item() if isinstance(value, np.generic) else value
             for name, value in row.items()}
    started = plain.get("started_at")
    fields = {"id": plain.get("rollout_id") or "", "task_id": plain.get("task_id") or "",
              "model": plain.get("model") or "", "reward": plain.get("reward"),
              "stop_condition": plain.get("stop_condition"), "is_timeout": bool(plain.get("is_timeout")),
              "started_at": started.timestamp() if isinstance(started, pd.Timestamp) else 0.0,
              "usage": {key: plain.get(key) or 0 for key in ("prompt_tokens", "completion_tokens", "total_tokens")},
              **{name: _json_column(plain.get(name), kind)
                 for name, kind in (("rewards", dict), ("metrics", dict), ("info", dict), ("errors", list))}}
    try:
        trace = Trace.model_validate(fields)
    except ValueError:   # a column of another shape than a trace's: keep what identifies the rollout
        trace = Trace.model_validate({key: fields[key] for key in ("id", "task_id", "model")})
    trace.errors.append(ErrorRecord(type=NOT_READABLE, stage="read", message=(
        f"the row's trace JSON could not be read ({problem[:200]}); shown is what the row's other columns hold")))
    return trace


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float | np.floating) and np.isnan(value)) or value is pd.NaT


def _json_column(text: Any, kind: type) -> Any:
    """A row's JSON column as ``kind`` (dict or list), empty when it is not one (or not JSON, or too deep)."""
    try:
        value = loads(text, "the column") if isinstance(text, str) else None
    except ValueError:
        return kind()
    return value if isinstance(value, kind) else kind()


def durable_keys(path: Root, run_id: str) -> set[tuple[str, str, int]]:
    """``(environment, task_id, rollout_index)`` of every rollout of ``run_id`` with a durable row,
    written by any process on any machine (what ``--resume`` skips). Reads only the run's files; one
    that cannot be read is skipped with a warning naming it: its rollouts count as not durable (a
    resume runs them again) until it is moved out of the dataset or deleted.

    Raises:
        TraceStoreError: the dataset cannot be reached.
    """
    table = _read(dataset_root(path), "rollouts", ROLLOUTS, {"run_id": run_id}, columns=ROLLOUT_KEY[1:],
                  skipped=NOT_DURABLE)
    return set(zip(*(table.column(name).to_pylist() for name in ROLLOUT_KEY[1:]), strict=True))


NOT_DURABLE = "the rollouts whose rows it holds count as not durable, so a --resume of the run runs them again"
"""What a skipped file means to ``durable_keys`` (the warning a resume shows)."""


def _read(root: DatasetRoot, name: str, schema: pa.Schema, filters: dict[str, Any],
          columns: list[str] | None = None, skipped: str = LEFT_OUT) -> pa.Table:
    """The rows of table ``name`` matching ``filters``, opening only the partitions they select
    (``traces.files``: an unreadable file is skipped with a warning, ``skipped`` saying what that means)."""
    full = pa.unify_schemas([schema, PARTITIONING])
    unknown = set(filters) - set(full.names)
    if unknown:
        raise TraceStoreError(f"read filter {sorted(unknown)}: no such column. Columns: {', '.join(full.names)}")
    expression = None
    for column, value in filters.items():
        values = list(value) if isinstance(value, (list, tuple, set)) else [value]
        term = pc.field(column).isin(values)
        expression = term if expression is None else expression & term
    return read_partitions(root, name, filters, full, expression, columns, skipped=skipped)


def read_rollouts_with_categories(path: Root, *, columns: list[str], **filters: Any) -> pd.DataFrame:
    """``read_rollouts`` of ``columns`` plus ``category``: each rollout's task category
    (``task_categories``), without reading the large ``info`` column into pandas."""
    table = scan_rollouts(path, columns=[*columns, "info"], **filters)
    table = table.append_column("category", task_categories(table)).drop_columns(["info"])
    return first_rows(table, ROLLOUT_KEY).to_pandas()


def task_categories(table: pa.Table) -> pa.Array:
    """``info["task"]["category"]`` of each row's task (environment, task id), taken from the task's
    first row; None where it has none.

    Parses only those first rows' ``info`` values, and of them only the ones that mention ``"category"``.
    """
    keys = pd.DataFrame({"environment": table.column("environment").to_pandas(),
                         "task_id": table.column("task_id").to_pandas()})
    rows = np.flatnonzero(~keys.duplicated().to_numpy())   # each task's first row, in order of appearance
    infos = table.column("info").take(pa.array(rows))
    mentions = pc.fill_null(pc.match_substring(infos, '"category"'), False).to_numpy()
    of_task = np.full(len(rows), None, dtype=object)
    of_task[mentions] = [category_of(info) for info in infos.filter(pa.array(mentions)).to_pylist()]
    task = keys.groupby(["environment", "task_id"], sort=False).ngroup().to_numpy()   # numbered as they appear
    return pa.array(of_task[task], pa.string(), from_pandas=True)


def category_of(info: str | None) -> str | None:
    """``info["task"]["category"]`` of one row's ``info`` JSON, as a string; None when it has none."""
    try:
        task = json.loads(info).get("task") if info else None
    except (ValueError, AttributeError):
        return None
    category = task.get("category") if isinstance(task, dict) else None
    return None if category is None else str(category)
