"""Arrow schemas of the trace dataset and the mapping from ``Trace`` to rows.

The dataset root holds two hive-partitioned tables, ``rollouts/`` (one row per rollout) and
``model_calls/`` (one row per model call), each under ``date=YYYY-MM-DD/run_id=<id>/``.
Nested values (rewards, metrics, info, errors, a call's failed attempts, the full trace) are
JSON strings, which pandas and DuckDB (``json_extract``) both read without a schema per taskset.

Versions: 1 first layout; 2 adds ``cached_tokens`` and ``reasoning_tokens`` (null when the server
does not report them) to both tables and ``attempts`` to ``model_calls``; 4: the ``trace`` column's
JSON leaves out ``last_reply``, which repeated the last assistant message of ``messages`` (a 5 MB
reply was stored twice); ``Trace`` derives it again when the row is read, from files of any version;
5 adds ``network`` (the trace's network log, a JSON list) and ``network_denied`` to ``rollouts``
(``read_network`` gives one row per connection); 6 adds ``attempt`` to both tables: a rollout (run,
environment, task, rollout index) may be run again as a new attempt (``--retry-errors``,
``max_rollout_attempts``, a resume after a budget stop), each attempt a row of its own; an older
file's rows read as attempt 1. (Not a model call's HTTP ``attempts``, which count tries of one call.)
7 adds ``cost_usd`` to ``rollouts`` (USD of the rollout's agent and judge calls, from the prices the user
gives per client: ``pricing.call_cost_usd``; null when no call had a price). 8 adds ``cache_write_tokens``
to both tables (prompt tokens written to a prompt cache: Anthropic's ``cache_creation_input_tokens``; null
when the server does not report them).
Readers read files of every version with the current schema: a column a file lacks reads as null.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa

from prefect_rollouts.errors import scrub
from prefect_rollouts.nesting import MAX_JSON_DEPTH, cut_deep, nests_deeper
from prefect_rollouts.trace import ErrorRecord, Trace

#: Bumped when a column is added or changes meaning or type; readers can filter on it.
SCHEMA_VERSION = 8

DERIVED_FROM_MESSAGES = {"last_reply"}
"""``Trace`` fields the ``trace`` column leaves out: each repeats text of ``messages`` (``Trace`` derives it)."""

KEY_COLUMNS = {"rollouts": ("environment", "task_id", "rollout_index"), "model_calls": ("rollout_id", "call_index")}
"""The columns that identify a rollout (or a model call) within its run: a file without them is not a file of
the table, and a row with a null one identifies nothing."""

ROW_KEYS = {"rollouts": (*KEY_COLUMNS["rollouts"], "attempt"), "model_calls": KEY_COLUMNS["model_calls"]}
"""The columns that identify a row within its run: a row written twice (a crash between a write and its
record) is read once, the first (readers and compaction). ``attempt`` is null in files before schema
version 6 and counts as 1 (``FIRST_ATTEMPT``)."""

FIRST_ATTEMPT = 1
"""A rollout's first attempt; what a row without ``attempt`` (schema version 5 or older) is."""

PARTITIONING = pa.schema([("date", pa.string()), ("run_id", pa.string())])

ROLLOUTS = pa.schema([
    ("schema_version", pa.int16()),
    ("rollout_id", pa.string()),
    ("task_id", pa.string()),
    ("rollout_index", pa.int32()),
    ("attempt", pa.int32()),
    ("task_type", pa.string()),
    ("environment", pa.string()),
    ("model", pa.string()),
    ("config_hash", pa.string()),
    ("flow_run_id", pa.string()),
    ("shard_flow_run_id", pa.string()),
    ("worker_host", pa.string()),
    ("worker_pid", pa.int32()),
    ("reward", pa.float64()),
    ("rewards", pa.string()),
    ("metrics", pa.string()),
    ("stop_condition", pa.string()),
    ("is_truncated", pa.bool_()),
    ("is_timeout", pa.bool_()),
    ("scoring_skipped", pa.string()),
    ("is_error", pa.bool_()),
    ("error_type", pa.string()),
    ("error_message", pa.string()),
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("total_tokens", pa.int64()),
    ("cached_tokens", pa.int64()),
    ("reasoning_tokens", pa.int64()),
    ("cache_write_tokens", pa.int64()),
    ("judge_prompt_tokens", pa.int64()),
    ("judge_completion_tokens", pa.int64()),
    ("cost_usd", pa.float64()),
    ("num_model_calls", pa.int32()),
    ("num_tool_calls", pa.int32()),
    ("num_judge_calls", pa.int32()),
    ("num_segments", pa.int32()),
    ("started_at", pa.timestamp("ms", tz="UTC")),
    ("elapsed_s", pa.float64()),
    ("setup_s", pa.float64()),
    ("agent_s", pa.float64()),
    ("finalize_s", pa.float64()),
    ("scoring_s", pa.float64()),
    ("teardown_s", pa.float64()),
    ("info", pa.string()),
    ("errors", pa.string()),
    ("network", pa.string()),
    ("network_denied", pa.int32()),
    ("trace", pa.string()),
])

MODEL_CALLS = pa.schema([
    ("schema_version", pa.int16()),
    ("rollout_id", pa.string()),
    ("task_id", pa.string()),
    ("rollout_index", pa.int32()),
    ("attempt", pa.int32()),
    ("environment", pa.string()),
    ("model", pa.string()),
    ("call_index", pa.int32()),
    ("segment", pa.int32()),
    ("started_at", pa.timestamp("ms", tz="UTC")),
    ("latency_ms", pa.float64()),
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("cached_tokens", pa.int64()),
    ("reasoning_tokens", pa.int64()),
    ("cache_write_tokens", pa.int64()),
    ("finish_reason", pa.string()),
    ("retries", pa.int32()),
    ("attempts", pa.string()),
    ("status_code", pa.int32()),
    ("error", pa.string()),
])


def rollout_row(trace: Trace, *, rollout_index: int, environment: str, config_hash: str,
                elapsed_s: float, attempt: int = FIRST_ATTEMPT) -> dict[str, Any]:
    """One ``rollouts`` row for a finished trace (``elapsed_s``: wall seconds of the whole rollout;
    ``attempt``: which attempt of the rollout this trace is, 1 for the first).

    Every trace gets a row: one whose JSON cannot be written as it is (nested deeper than
    pydantic's 255 levels, a cycle, a key JSON has no form for, a lone UTF-16 surrogate in a string:
    U+FFFD in the copy) or could not be read back (nested deeper than ``MAX_JSON_DEPTH``: pydantic's
    JSON parser stops near 200 levels) is written from ``writable``'s copy, which says on the trace
    what was cut.
    """
    texts = None
    why = _too_deep(trace)
    if why is None:
        try:
            texts = _json_columns(trace)
        except (ValueError, TypeError, RecursionError) as exc:   # PydanticSerializationError is a ValueError
            why = f"{type(exc).__name__}: {str(exc)[:200]}".encode(errors="replace").decode()   # no surrogate
    if texts is None:
        trace = writable(trace, why or "")
        texts = _json_columns(trace)
    timings = trace.timings
    worker = trace.info.get("worker") or {}   # where it ran: host, pid, shard flow run (flows/execute.py)
    first_error = trace.errors[0] if trace.errors else None
    return {
        "schema_version": SCHEMA_VERSION,
        "rollout_id": trace.id,
        "task_id": trace.task_id,
        "rollout_index": rollout_index,
        "attempt": attempt,
        "task_type": trace.task_type,
        "environment": environment,
        "model": trace.model,
        "config_hash": config_hash,
        "flow_run_id": trace.info.get("flow_run_id"),
        "shard_flow_run_id": worker.get("shard_flow_run_id"),
        "worker_host": worker.get("host"),
        "worker_pid": worker.get("pid"),
        "reward": trace.reward,
        "rewards": texts["rewards"],
        "metrics": texts["metrics"],
        "stop_condition": trace.stop_condition,
        "is_truncated": trace.is_truncated,
        "is_timeout": trace.is_timeout,
        "scoring_skipped": trace.info.get("scoring_skipped"),
        "is_error": bool(trace.errors),
        "error_type": first_error.type if first_error else None,
        "error_message": first_error.message if first_error else None,
        "prompt_tokens": trace.usage.prompt_tokens,
        "completion_tokens": trace.usage.completion_tokens,
        "total_tokens": trace.usage.total_tokens,
        "cached_tokens": trace.usage.cached_tokens,
        "reasoning_tokens": trace.usage.reasoning_tokens,
        "cache_write_tokens": trace.usage.cache_write_tokens,
        "judge_prompt_tokens": trace.judge_usage.prompt_tokens,
        "judge_completion_tokens": trace.judge_usage.completion_tokens,
        "cost_usd": cost_usd(trace),
        "num_model_calls": len(trace.model_calls),
        "num_tool_calls": len(trace.tool_calls),
        "num_judge_calls": len(trace.judge_calls),
        "num_segments": len(trace.segments),
        "started_at": _utc(trace.started_at),
        "elapsed_s": elapsed_s,
        "setup_s": timings.get("setup"),
        "agent_s": timings.get("agent"),
        "finalize_s": timings.get("finalize"),
        "scoring_s": timings.get("scoring"),
        "teardown_s": timings.get("teardown"),
        "info": texts["info"],
        "errors": json.dumps([e.model_dump() for e in trace.errors]),
        "network": json.dumps([record.model_dump() for record in trace.network]),
        "network_denied": sum(not record.allowed for record in trace.network),
        "trace": texts["trace"],
    }


def cost_usd(trace: Trace) -> float | None:
    """USD of the rollout's agent and judge calls (``Usage.cost_usd``); None when neither had a price."""
    costs = [cost for cost in (trace.usage.cost_usd, trace.judge_usage.cost_usd) if cost is not None]
    return sum(costs) if costs else None


def _json_columns(trace: Trace) -> dict[str, str]:
    """The row's JSON columns that hold values of any shape (``info``: task code may put any object in it)."""
    return {"rewards": json.dumps(trace.rewards), "metrics": json.dumps(trace.metrics),
            "info": json.dumps(trace.info, default=repr),
            "trace": trace.model_dump_json(fallback=repr, exclude=DERIVED_FROM_MESSAGES)}


def _too_deep(trace: Trace) -> str | None:
    """Why ``trace`` could not be read back, or None: the fields of any shape (messages, info, judge
    verdicts) nest deeper than ``MAX_JSON_DEPTH`` (a walk, about 17 µs per 50 messages)."""
    parts = [trace.messages, trace.info, trace.agent, [call.verdict for call in trace.judge_calls]]
    if nests_deeper(parts, MAX_JSON_DEPTH, shared=True):
        return f"it nests deeper than {MAX_JSON_DEPTH} levels, more than readers take back"
    return None


def writable(trace: Trace, why: str) -> Trace:
    """A copy of ``trace`` that can be written and read back (``nesting.cut_deep``: what lies
    deeper than ``MAX_JSON_DEPTH`` levels replaced by ``nesting.MARKER``, a cycle by ``nesting.CYCLE``),
    with an ``ErrorRecord`` of stage ``record`` saying ``why`` it could not be written as it was
    and how many places were cut. The stop condition and reward stay: the rollout ran as it says;
    its row is an error, never a lost rollout."""
    data, cuts = cut_deep({name: getattr(trace, name) for name in type(trace).model_fields})
    try:
        copy = Trace.model_validate(data)
    except ValueError:   # a typed field held something else: keep what identifies the rollout
        copy = Trace.model_validate({key: data[key] for key in _IDENTITY if key in data})
        copy.info["record_dropped"] = "every field but the rollout's identity: see errors"
    cut = f"; {cuts} value(s) cut (nested deeper than {MAX_JSON_DEPTH} levels or in a cycle)" if cuts else ""
    copy.errors.append(ErrorRecord(type="TraceNotWritable", stage="record",
                                   message=scrub(f"the trace could not be written as it was ({why}){cut}")))
    return copy


_IDENTITY = ("version", "id", "task_id", "task_type", "model", "stop_condition", "is_timeout", "started_at",
             "timings", "reward", "errors")


def model_call_rows(trace: Trace, *, rollout_index: int, environment: str,
                    attempt: int = FIRST_ATTEMPT) -> list[dict[str, Any]]:
    """The ``model_calls`` rows of a finished trace, in call order (``attempt``: the rollout's attempt, as
    on its ``rollouts`` row; ``attempts``: the call's HTTP tries, a JSON list of ``{"status_code", "error"}``,
    ``[]`` when the first try succeeded)."""
    return [{
        "schema_version": SCHEMA_VERSION,
        "rollout_id": trace.id,
        "task_id": trace.task_id,
        "rollout_index": rollout_index,
        "attempt": attempt,
        "environment": environment,
        "model": trace.model,
        "call_index": index,
        "segment": call.segment,
        "started_at": _utc(call.started_at),
        "latency_ms": call.latency_ms,
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
        "cached_tokens": call.cached_tokens,
        "reasoning_tokens": call.reasoning_tokens,
        "cache_write_tokens": call.cache_write_tokens,
        "finish_reason": call.finish_reason,
        "retries": call.retries,
        "attempts": json.dumps([tried.model_dump() for tried in call.attempts]),
        "status_code": call.status_code,
        "error": call.error,
    } for index, call in enumerate(trace.model_calls)]


def _utc(timestamp: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)
