"""Readers of the trace dataset: pandas DataFrames with the partition columns ``date`` and ``run_id``.

Every reader takes the dataset root as a path, an object-store URI (``s3://bucket/prefix``) or a
``DatasetRoot`` (``traces.store``), and sees the same rows whichever process or machine wrote them.

A rollout may have several attempts (schema version 6: ``attempt`` 1, 2, ...; a retried error, a
resume after a budget stop). Every reader gives the **latest attempt of each rollout** by default, so
a run reads as one complete run; ``attempts="all"`` gives every attempt (earlier ones are never
changed or removed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.nesting import loads
from prefect_rollouts.trace import UNFINISHED_STOPS, ErrorRecord, Trace
from prefect_rollouts.traces.files import LEFT_OUT, read_partitions
from prefect_rollouts.traces.schema import FIRST_ATTEMPT, MODEL_CALLS, PARTITIONING, ROLLOUTS
from prefect_rollouts.traces.store import DatasetRoot, dataset_root

Root = str | Path | DatasetRoot
"""A dataset root: a path, an object-store URI, or a resolved ``DatasetRoot``."""
ROLLOUT_KEY = ["run_id", "environment", "task_id", "rollout_index"]
"""What identifies a rollout in the dataset (its attempts share it)."""
ATTEMPT_KEY = [*ROLLOUT_KEY, "attempt"]
"""What identifies a row: one attempt of a rollout. A row written twice with the same key is read once (the first)."""
Attempts = Literal["latest", "all"]
"""Which attempts of each rollout a reader gives: ``"latest"`` (the default: one row per rollout, its
highest ``attempt``) or ``"all"`` (one row per attempt)."""


def read_rollouts(path: Root, *, columns: list[str] | None = None, attempts: Attempts = "latest",
                  **filters: Any) -> pd.DataFrame:
    """The ``rollouts`` table as a DataFrame, one row per rollout (its latest attempt).

    Args:
        path: Dataset root (holding ``rollouts/`` and ``model_calls/``): a directory, a URI such as
            ``s3://bucket/prefix``, or a ``DatasetRoot``.
        columns: Only these columns (default: all); ``ATTEMPT_KEY`` (run id, environment, task
            id, rollout index, attempt) is always read.
        attempts: ``"latest"``: each rollout's latest attempt only; ``"all"``: every attempt.
        **filters: Column equality filters, e.g. ``run_id="nightly-2026-11-29"``,
            ``model="m"``; a list or tuple value means "any of". A filter on a column that can differ
            between attempts (``is_error=True``, ``attempt=1``, ``reward=0``) applies to the rows
            given: with ``"latest"``, to each rollout's latest attempt.

    Returns:
        Columns of ``traces.schema.ROLLOUTS`` plus ``date`` and ``run_id``; empty (with
        those columns) when nothing is written yet. A row written twice (same run, environment,
        task, rollout index and attempt) appears once; ``attempt`` is 1 for rows written before
        schema version 6.

    Raises:
        TraceStoreError: a filter names an unknown column, or the store cannot be reached. (A file
            that cannot be read as Parquet is skipped with a warning naming it: ``traces.files``.)
        ConfigError: ``path`` is a URI pyarrow cannot open, or holds credentials.
    """
    return _rollouts(path, columns, attempts, filters).to_pandas()


def _rollouts(path: Root, columns: list[str] | None, attempts: Attempts, filters: dict[str, Any],
              extra: tuple[str, ...] = (), derive: Any = None) -> pa.Table:
    """``read_rollouts`` in Arrow: the filters that select whole rollouts (``_SAME_FOR_ATTEMPTS``) while
    reading, then ``pick_attempts``, then the other filters. ``extra`` columns are read too, handed
    to ``derive(table) -> table`` (before attempts are picked) and dropped."""
    _check_filters(ROLLOUTS, filters)
    keyed = {name: value for name, value in filters.items() if name in _SAME_FOR_ATTEMPTS}
    rest = {name: value for name, value in filters.items() if name not in _SAME_FOR_ATTEMPTS}
    wanted = None if columns is None else [*columns, *rest, *extra]
    table = scan_rollouts(path, columns=wanted, **keyed)
    if derive is not None:
        table = derive(table).drop_columns(list(extra))
    table = pick_attempts(table, attempts)
    if rest:
        table = table.filter(_expression(rest))
        if columns is not None:   # the filters' own columns, read only to filter
            table = table.drop_columns([name for name in rest if name not in columns and name not in ATTEMPT_KEY])
    return table


_SAME_FOR_ATTEMPTS = {"date", *ROLLOUT_KEY}
"""Filters that select whole rollouts (every attempt of a rollout has the same value), applied while
reading; the others apply to the attempt a reader gives. (``date`` is the day a row was written: a
retry on another day is read with its day's filter as the latest attempt of what that day holds.)"""


def pick_attempts(table: pa.Table, attempts: Attempts = "latest") -> pa.Table:
    """``table`` (rows of ``rollouts``, with the ``ATTEMPT_KEY`` columns) with ``attempt`` filled (1 where
    null), each row once (the first of each ``ATTEMPT_KEY``), and with ``attempts="latest"`` only each
    rollout's highest attempt. In Arrow, on the key columns only (see ``first_rows``).

    Raises:
        ValueError: ``attempts`` is neither ``"latest"`` nor ``"all"``.
    """
    if attempts not in ("latest", "all"):
        raise ValueError(f'attempts = {attempts!r}: use "latest" (the latest attempt of each rollout) or "all"')
    if "attempt" in table.column_names:
        index = table.column_names.index("attempt")
        table = table.set_column(index, "attempt", pc.fill_null(table.column("attempt"), FIRST_ATTEMPT))
    table = first_rows(table, ATTEMPT_KEY)
    if attempts == "all" or table.num_rows == 0 or pc.max(table.column("attempt")).as_py() == FIRST_ATTEMPT:
        return table   # a run without retries (most): each row is its rollout's only attempt after first_rows
    keys = table.select(ATTEMPT_KEY).to_pandas()
    latest = keys["attempt"].to_numpy() == keys.groupby(ROLLOUT_KEY, sort=False)["attempt"].transform("max").to_numpy()
    return table if latest.all() else table.filter(pa.array(latest))


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
    is this plus ``pick_attempts`` and ``to_pandas``.
    """
    if columns is not None:
        columns = list(dict.fromkeys([*ATTEMPT_KEY, *columns]))
    return _read(dataset_root(path), "rollouts", ROLLOUTS, filters, columns=columns)


def read_model_calls(path: Root, *, columns: list[str] | None = None, attempts: Attempts = "latest",
                     **filters: Any) -> pd.DataFrame:
    """The ``model_calls`` table as a DataFrame, one row per model call (same ``filters`` and
    ``attempts`` as ``read_rollouts``).

    Only calls of the rollouts ``read_rollouts`` returns are kept: calls of a rollout whose row is
    not durable (a crash between the two files of a batch), was dropped as a duplicate, or is an
    earlier attempt (unless ``attempts="all"``) are left out, and a call stored twice (a compaction cut
    short) appears once (the first read). ``attempt`` is the rollout's attempt (1 before schema version 6).

    Args:
        columns: Only these columns (default: all); ``run_id``, ``rollout_id`` and ``call_index``
            are always read.
    """
    root = dataset_root(path)
    if columns is not None:
        columns = list(dict.fromkeys(["run_id", "rollout_id", "call_index", *columns]))
    calls = _read(root, "model_calls", MODEL_CALLS, filters, columns=columns)
    keep = {k: v for k, v in filters.items() if k in ("run_id", "date", "task_id", "model", "environment")}
    rollouts = _read(root, "rollouts", ROLLOUTS, keep, columns=[*ATTEMPT_KEY, "rollout_id"])
    shown = pick_attempts(rollouts, attempts).to_pandas()
    # Arrow's is_in: pandas' isin on 400,000 string ids took about 1 s of the 1.4 s read
    calls = calls.filter(pc.is_in(calls.column("rollout_id"), value_set=pa.array(shown["rollout_id"], pa.string())))
    if "attempt" in calls.column_names:
        index = calls.column_names.index("attempt")
        calls = calls.set_column(index, "attempt", pc.fill_null(calls.column("attempt"), FIRST_ATTEMPT))
    return first_rows(calls, ["rollout_id", "call_index"]).to_pandas()


NETWORK_COLUMNS = ["run_id", "environment", "task_id", "rollout_index", "rollout_id", "phase", "method", "host",
                   "port", "sni", "address", "allowed", "reason", "error", "bytes_sent", "bytes_received",
                   "started_at", "duration_s"]
"""The columns of ``read_network``: a rollout's key, then ``trace.NetworkRecord``'s fields."""


def read_network(path: Root, *, attempts: Attempts = "latest", **filters: Any) -> pd.DataFrame:
    """The network log of the matching rollouts, one row per connection the egress proxy saw
    (``NETWORK_COLUMNS``; ``started_at`` a UTC timestamp), in rollout and connection order (same
    ``filters`` and ``attempts`` as ``read_rollouts``). Rollouts under ``open`` or ``none`` have no rows; files
    written before schema version 5 have none either.

    "Which tasks tried to reach what": ``read_network(root, run_id="nightly").query("not allowed")``.
    """
    rollouts = read_rollouts(path, columns=["rollout_id", "network"], attempts=attempts, **filters)
    rows = [{"run_id": row.run_id, "environment": row.environment, "task_id": row.task_id,
             "rollout_index": row.rollout_index, "rollout_id": row.rollout_id, **record}
            for row in rollouts.itertuples() if isinstance(row.network, str)
            for record in json.loads(row.network)]
    frame = pd.DataFrame(rows, columns=NETWORK_COLUMNS)
    frame["started_at"] = pd.to_datetime(frame["started_at"], unit="s", utc=True)
    return frame


def read_traces(path: Root, *, attempts: Attempts = "latest", **filters: Any) -> list[Trace]:
    """The full ``Trace`` objects of the matching rollouts (``trace_of_row`` of each row; same ``filters``
    and ``attempts`` as ``read_rollouts``)."""
    return [trace_of_row(row) for row in read_rollouts(path, attempts=attempts, **filters).to_dict("records")]


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


@dataclass(frozen=True, slots=True)
class LatestAttempt:
    """The latest durable attempt of one rollout (``latest_attempts``)."""

    attempt: int
    """1 for the first attempt (and for rows written before schema version 6)."""
    stop_condition: str | None
    error_type: str | None
    """The type of its first error (``ErrorRecord.type``, e.g. ``ProviderError``); None when it has none."""

    @property
    def done(self) -> bool:
        """False when it was stopped from outside before it could finish (``trace.UNFINISHED_STOPS``,
        e.g. a budget stop): a resume runs the rollout again."""
        return self.stop_condition not in UNFINISHED_STOPS


def latest_attempts(path: Root, run_id: str) -> dict[tuple[str, str, int], LatestAttempt]:
    """The latest durable attempt of every rollout of ``run_id`` that has a row, by ``(environment,
    task_id, rollout_index)``, written by any process on any machine. Reads only the run's files and
    four small columns; a file that cannot be read is skipped with a warning naming it: its rollouts
    count as not durable (a resume runs them again) until it is moved out of the dataset or deleted.

    Raises:
        TraceStoreError: the dataset cannot be reached.
    """
    table = _read(dataset_root(path), "rollouts", ROLLOUTS, {"run_id": run_id},
                  columns=[*ATTEMPT_KEY, "stop_condition", "error_type"], skipped=NOT_DURABLE)
    latest = pick_attempts(table, "latest")
    columns = [latest.column(name).to_pylist() for name in ("environment", "task_id", "rollout_index", "attempt",
                                                            "stop_condition", "error_type")]
    return {(environment, task_id, index): LatestAttempt(attempt, stop, error)
            for environment, task_id, index, attempt, stop, error in zip(*columns, strict=True)}


def durable_keys(path: Root, run_id: str) -> set[tuple[str, str, int]]:
    """``(environment, task_id, rollout_index)`` of every rollout of ``run_id`` that is done: its latest
    attempt has a durable row and was not stopped from outside (``LatestAttempt.done``). What a plain
    ``--resume`` skips; the others run again, as a new attempt when they have a row. Same reading and
    errors as ``latest_attempts``.
    """
    return {key for key, latest in latest_attempts(path, run_id).items() if latest.done}


NOT_DURABLE = "the rollouts whose rows it holds count as not durable, so a --resume of the run runs them again"
"""What a skipped file means to ``latest_attempts`` and ``durable_keys`` (the warning a resume shows)."""


def _read(root: DatasetRoot, name: str, schema: pa.Schema, filters: dict[str, Any],
          columns: list[str] | None = None, skipped: str = LEFT_OUT) -> pa.Table:
    """The rows of table ``name`` matching ``filters``, opening only the partitions they select
    (``traces.files``: an unreadable file is skipped with a warning, ``skipped`` saying what that means)."""
    full = _check_filters(schema, filters)
    return read_partitions(root, name, filters, full, _expression(filters), columns, skipped=skipped)


def _check_filters(schema: pa.Schema, filters: dict[str, Any]) -> pa.Schema:
    """``schema`` with the partition columns; raises ``TraceStoreError`` naming a filter that is no column of it."""
    full = pa.unify_schemas([schema, PARTITIONING])
    unknown = set(filters) - set(full.names)
    if unknown:
        raise TraceStoreError(f"read filter {sorted(unknown)}: no such column. Columns: {', '.join(full.names)}")
    return full


def _expression(filters: dict[str, Any]) -> pc.Expression | None:
    """``filters`` (column -> value, or a list/tuple/set of values meaning "any of") as one Arrow expression."""
    expression = None
    for column, value in filters.items():
        values = list(value) if isinstance(value, (list, tuple, set)) else [value]
        term = pc.field(column).isin(values)
        expression = term if expression is None else expression & term
    return expression


def read_rollouts_with_categories(path: Root, *, columns: list[str], attempts: Attempts = "latest",
                                  **filters: Any) -> pd.DataFrame:
    """``read_rollouts`` of ``columns`` plus ``category``: each rollout's task category
    (``task_categories``), without reading the large ``info`` column into pandas."""
    def categorised(table: pa.Table) -> pa.Table:
        return table.append_column("category", task_categories(table))
    return _rollouts(path, columns, attempts, filters, extra=("info",), derive=categorised).to_pandas()


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
