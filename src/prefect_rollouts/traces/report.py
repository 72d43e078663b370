"""Console views of a trace dataset: one compact row per run, a run's rollouts, one rollout in full.

What ``prefect-rollouts traces summary`` and ``traces show`` print; the CLI only wires them.
Everything returned is plain text (no markup), already scrubbed of secrets, as the dataset is.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.trace import Trace, content_text
from prefect_rollouts.traces.files import run_ids
from prefect_rollouts.traces.read import Attempts, read_rollouts, trace_of_row
from prefect_rollouts.traces.run_config import with_harness
from prefect_rollouts.traces.schema import cost_usd
from prefect_rollouts.traces.store import dataset_root

#: The columns of ``run_rows``, in order.
RUN_COLUMNS = ["date", "run_id", "harness", "model", "environment", "rollouts", "mean", "stderr", "errors"]
#: ``rollouts`` columns the run table reads (never the large JSON ones).
_RUN_READ = ["started_at", "model", "environment", "reward", "is_error"]
_ROLLOUT_READ = ["reward", "stop_condition", "error_type", "error_message", "started_at"]
#: Characters of a message shown by ``format_rollout`` unless told otherwise.
MAX_CHARS = 2000


def run_rows(root: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """One dict per run of the dataset at ``root``, oldest first (by its first rollout's start); only
    run ``run_id`` (whose files alone are read) when given.

    Keys are ``RUN_COLUMNS``: ``date`` (``YYYY-MM-DD HH:MM``, UTC, when the run's first rollout
    started), ``run_id``, ``harness`` (from the run's stored config, ``—`` when it has none),
    ``model`` and ``environment`` (each comma-joined when a run holds several),
    ``rollouts`` (rows), ``mean`` (mean reward of the scored rollouts; None when none is scored),
    ``stderr`` (its standard error, sample std / sqrt(n); None below 2 scored) and ``errors``
    (errored rollouts, which have no reward and are left out of the mean). Empty when the
    dataset holds no rollouts (or does not exist).

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    filters: dict[str, Any] = {} if run_id is None else {"run_id": run_id}
    rows = with_harness(read_rollouts(root, columns=_RUN_READ, **filters), root)
    runs = []
    for run_id, group in rows.groupby("run_id", sort=False):
        rewards = group["reward"].dropna().astype(float)
        runs.append({
            "date": _minute(group["started_at"].min()), "run_id": str(run_id),
            "harness": ",".join(sorted(group["harness"].dropna().unique())) or "—",
            "model": ",".join(sorted(group["model"].dropna().unique())),
            "environment": ",".join(sorted(group["environment"].dropna().unique())),
            "rollouts": len(group), "mean": float(rewards.mean()) if len(rewards) else None,
            "stderr": float(rewards.std(ddof=1) / math.sqrt(len(rewards))) if len(rewards) > 1 else None,
            "errors": int(group["is_error"].sum())})
    return sorted(runs, key=lambda run: (run["date"], run["run_id"]))


def comparable_runs(root: str | Path, run_a: str | None = None,
                    run_b: str | None = None) -> tuple[str | None, str | None]:
    """The runs to compare: the latest pair of runs of the dataset at ``root`` that share a rollout.

    Two runs are comparable when they hold a rollout of the same (environment, task id, rollout
    index), the pairs ``compare_runs`` aligns; the two latest runs of a dataset need not be (two
    series on different tasksets). B is the latest run that has a comparable earlier run, A the
    latest such earlier run; a run given as ``run_a`` or ``run_b`` stays fixed and the other is
    chosen around it (for a fixed ``run_a``, B is the latest other run comparable with it).

    Returns:
        ``(run_a, run_b)``, ids in ``run_rows`` order (A older than B unless both were given);
        ``(run_a, run_b)`` as given when both are; ``None`` for a run that cannot be chosen (no
        comparable pair).

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    if run_a and run_b:
        return run_a, run_b
    order = [run["run_id"] for run in run_rows(root)]      # oldest first
    rows = read_rollouts(root, columns=["environment", "task_id", "rollout_index"])
    keys = {str(run): set(zip(group["environment"], group["task_id"], group["rollout_index"], strict=True))
            for run, group in rows.groupby("run_id", sort=False)}
    for b in [run_b] if run_b else reversed(order):
        earlier = order[:order.index(b)] if b in order else order
        for a in [run_a] if run_a else reversed(earlier):
            if a != b and keys.get(a, set()) & keys.get(b, set()):
                return a, b
    return run_a, run_b


def format_runs(runs: list[dict[str, Any]]) -> str:
    """``run_rows`` as an aligned text table, one line per run under a header line."""
    return _table([{**run, "mean": _fixed(run["mean"]), "stderr": _fixed(run["stderr"])} for run in runs],
                  RUN_COLUMNS, right={"rollouts", "mean", "stderr", "errors"})


def format_rollout_list(root: str | Path, run_id: str) -> str:
    """The rollouts of run ``run_id``: task id, rollout index, reward, stop condition and first
    error, one line each in task order (first the environment, when the run has several: a suite),
    then how to show one.

    Raises:
        TraceStoreError: the dataset cannot be read, or holds no rollout of ``run_id`` (the
            message lists the runs it holds).
    """
    rows = _rollouts_of(root, run_id, columns=_ROLLOUT_READ)
    rows = rows.sort_values(["environment", "task_id", "rollout_index"], key=_natural_order)
    listed = [{"environment": row.environment, "task_id": row.task_id, "index": row.rollout_index,
               "reward": _fixed(row.reward),
               "stop_condition": row.stop_condition or "",
               "error": f"{row.error_type}: {str(row.error_message)[:80]}" if isinstance(row.error_type, str) else ""}
              for row in rows.itertuples()]
    columns = ["task_id", "index", "reward", "stop_condition", "error"]
    if rows["environment"].nunique() > 1:
        columns.insert(0, "environment")
    table = _table(listed, columns, right={"index", "reward"})
    return (f"run {run_id}: {len(rows)} rollouts\n{table}\n\n"
            f"show one with: prefect-rollouts traces show {root} {run_id} TASK_ID")


def read_rollout_traces(root: str | Path, run_id: str, task_id: str, index: int | None = None,
                        environment: str | None = None, attempt: int | None = None) -> list[tuple[str, int, Trace]]:
    """``(environment, rollout index, trace)`` of each rollout of task ``task_id`` in run ``run_id``
    (only rollout ``index``, and only ``environment``, when given), by environment and index: its
    latest attempt, or attempt ``attempt`` when given (``attempt_lines`` lists them). In a suite two
    environments may hold the same task id. A row whose ``trace`` JSON cannot be read gives the trace of
    its other columns, with an error saying so (``read.trace_of_row``).

    Raises:
        TraceStoreError: the dataset cannot be read, holds no rollout of ``run_id``, or none of
            ``task_id`` (and ``index``, and ``attempt``) in that run; the message lists what it does hold.
    """
    rows = _rollouts_of(root, run_id, columns=["trace"], attempts="latest" if attempt is None else "all")
    if environment is not None:
        if not (rows["environment"] == environment).any():
            raise TraceStoreError(f"run {run_id!r} has no environment {environment!r}. Its environments: "
                                  + ", ".join(sorted(rows["environment"].unique())))
        rows = rows[rows["environment"] == environment]
    of_task = rows[rows["task_id"] == task_id]
    if of_task.empty:
        tasks = sorted(rows["task_id"].unique(), key=natural_key)
        listed = ", ".join(tasks[:10]) + (f", ... ({len(tasks)} in all)" if len(tasks) > 10 else "")
        raise TraceStoreError(f"run {run_id!r} has no task {task_id!r}. Its tasks: {listed}")
    chosen = of_task if index is None else of_task[of_task["rollout_index"] == index]
    if chosen.empty:
        indices = ", ".join(str(i) for i in sorted(of_task["rollout_index"].unique()))
        raise TraceStoreError(f"task {task_id!r} of run {run_id!r} has no rollout index {index}; it has {indices}")
    if attempt is not None:
        if not (chosen["attempt"] == attempt).any():
            held = ", ".join(str(a) for a in sorted(chosen["attempt"].unique()))
            raise TraceStoreError(f"task {task_id!r} of run {run_id!r}" + (f" (rollout index {index})" if index
                                  is not None else "") + f" has no attempt {attempt}; its attempts: {held}")
        chosen = chosen[chosen["attempt"] == attempt]
    chosen = chosen.sort_values(["environment", "rollout_index"])
    traces = []
    for env, i, text in zip(chosen["environment"], chosen["rollout_index"], chosen["trace"], strict=True):
        try:
            trace = Trace.model_validate_json(text)
        except ValueError:   # a damaged or hand-made row: what its other columns hold (read again, whole)
            picked: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
            row = read_rollouts(root, run_id=run_id, environment=env, task_id=task_id, rollout_index=int(i),
                                attempts="all" if attempt is not None else "latest", **picked)
            trace = trace_of_row(row.iloc[0].to_dict())
        traces.append((str(env), int(i), trace))
    return traces


def attempt_lines(root: str | Path, run_id: str, task_id: str) -> dict[tuple[str, int], dict[int, str]]:
    """Per ``(environment, rollout index)`` of task ``task_id`` in run ``run_id``, one line per attempt by
    attempt number, first to latest: ``attempt 1 · stop provider_error · reward — · error ProviderError:
    <message, cut at a word past ERROR_CHARS>`` (``traces show`` prints them when a rollout has several).
    Reads small columns of every attempt.

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    rows = read_rollouts(root, columns=_ROLLOUT_READ, attempts="all", run_id=run_id, task_id=task_id)
    lines: dict[tuple[str, int], dict[int, str]] = {}
    for row in rows.sort_values(["environment", "rollout_index", "attempt"]).itertuples():
        error = (f" · error {row.error_type}: {_brief(str(row.error_message))}" if isinstance(row.error_type, str)
                 else "")
        lines.setdefault((str(row.environment), int(row.rollout_index)), {})[int(row.attempt)] = (
            f"attempt {row.attempt} · stop {row.stop_condition or '—'} · reward {_fixed(row.reward)}{error}")
    return lines


ERROR_CHARS = 160
"""Characters of an error message an attempt's line keeps (then up to the next space, at most 40 more)."""


def _brief(message: str) -> str:
    """``message`` on one line, cut after ``ERROR_CHARS`` at the next space (within 40 characters) with ``…``."""
    flat = " ".join(message.split())
    if len(flat) <= ERROR_CHARS:
        return flat
    space = flat.find(" ", ERROR_CHARS, ERROR_CHARS + 40)
    return flat[:space if space != -1 else ERROR_CHARS] + " …"


def format_rollout(trace: Trace, *, index: int | None = None, environment: str | None = None,
                   max_chars: int = MAX_CHARS, attempts: dict[int, str] | None = None,
                   attempt: int | None = None) -> str:
    """One rollout for a terminal: a header (ids, model, timing, stop condition, tokens, the cost of its agent
    and judge calls where their clients have a price), its
    rewards and metrics, the transcript (each message under a ``── role ──`` rule, tool calls as
    ``→ name(arguments)``, judge verdicts), its errors and its ``info`` (``info["task"]``, the
    task's own data, left out).

    Args:
        trace: A trace as read from the dataset (scrubbed of secrets when it was written).
        index: Its rollout index, shown in the header when given.
        environment: Its environment, shown in the header when given.
        max_chars: Characters kept of each message, tool argument list and judge reply (the end
            is replaced by a note of how many were cut); 0 keeps everything.
        attempts: The rollout's ``attempt_lines``, listed under the header when there are several.
        attempt: The attempt ``trace`` is, shown in the header (``attempt 1 of 2``) when given and the rollout
            has several attempts (default: its latest).
    """
    cut = _cutter(max_chars)
    started = datetime.fromtimestamp(trace.started_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    elapsed = f" · {sum(trace.timings.values()):.1f} s" if trace.timings else ""
    flags = [name for name, on in (("truncated", trace.is_truncated), ("timeout", trace.is_timeout)) if on]
    skipped = trace.info.get("scoring_skipped")
    lines = [
        f"rollout {trace.id} · " + (f"environment {environment} · " if environment else "") + f"task {trace.task_id}"
        + (f" · index {index}" if index is not None else "")
        + (f" · attempt {attempt or max(attempts)} of {len(attempts)}" if attempts and len(attempts) > 1 else "")
        + f" · model {trace.model}",
        f"started {started}{elapsed} · stop {trace.stop_condition or '—'}"
        + "".join(f" · {flag}" for flag in flags) + (f" · scoring skipped ({skipped})" if skipped else ""),
        f"tokens: prompt {trace.usage.prompt_tokens}, completion {trace.usage.completion_tokens}"
        + (f"; judges {trace.judge_usage.total_tokens}" if trace.judge_usage.total_tokens else "")
        + (f" · cost ${cost:.6f}" if (cost := cost_usd(trace)) is not None else ""),
        f"reward: {_number(trace.reward)}"
        + "".join(f"\n  {name} = {_number(value)} (weight {trace.reward_weights.get(name, 1.0):g})"
                  for name, value in trace.rewards.items()),
    ]
    if attempts and len(attempts) > 1:
        lines += [f"attempts: {len(attempts)} (traces show --attempt N shows another)",
                  *(f"  {a}" for a in attempts.values())]
    if trace.metrics:
        lines.append("metrics: " + ", ".join(f"{name} = {_number(value)}" for name, value in trace.metrics.items()))
    for message in trace.messages:
        lines.extend(_message_lines(message, cut))
    for call in trace.judge_calls:
        verdict = json.dumps(call.verdict) if call.verdict is not None else "—"
        lines += [f"── judge {call.judge} ({call.model}) ──", f"verdict: {verdict}"]
        if call.reply:
            lines.append(cut(call.reply))
        if call.error:
            lines.append(f"error: {call.error}")
    lines.append("errors:" if trace.errors else "errors: none")
    for error in trace.errors:
        status = f" (status {error.status_code})" if error.status_code is not None else ""
        lines.append(f"  {error.type} in {error.stage}{status}: {error.message}")
    info = {key: value for key, value in trace.info.items() if key != "task"}
    if info:
        lines.append("info:")
        lines += _value_lines(info, "  ")
    return "\n".join(lines)


def _value_lines(value: dict[str, Any], indent: str) -> list[str]:
    """``value`` as indented ``key: value`` lines: nested dicts one level deeper, text with line
    breaks as an indented block under its key, anything else as JSON."""
    lines = []
    for key, item in value.items():
        if isinstance(item, dict) and item:
            lines += [f"{indent}{key}:", *_value_lines(item, indent + "  ")]
        elif isinstance(item, str) and "\n" in item:
            lines += [f"{indent}{key}:", *(f"{indent}  {line}" for line in item.splitlines())]
        else:
            lines.append(f"{indent}{key}: {json.dumps(item, default=str)}")
    return lines


def _table(rows: list[dict[str, Any]], columns: list[str], *, right: set[str]) -> str:
    """``rows`` as an aligned text table under a header: columns in ``right`` right-aligned, the
    others left-aligned, two spaces apart."""
    cells = [columns, *([str(row[column]) for column in columns] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.rjust(width) if column in right else cell.ljust(width)
                               for cell, width, column in zip(line, widths, columns, strict=True)).rstrip()
                     for line in cells)


def _message_lines(message: dict[str, Any], cut: Any) -> list[str]:
    role = message.get("role", "?")
    label = f"{role} ({message['name']})" if message.get("name") else role
    if role == "tool" and message.get("tool_call_id"):
        label = f"tool result {message['tool_call_id']}"
    lines = [f"── {label} ──"]
    text = content_text(message.get("content"))
    if text:
        lines.append(cut(text))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        lines.append(f"→ {function.get('name', '?')}({cut(str(function.get('arguments', '')))})"
                     + (f"  [{call['id']}]" if call.get("id") else ""))
    return lines


def _cutter(max_chars: int) -> Any:
    def cut(text: str) -> str:
        if max_chars <= 0 or len(text) <= max_chars:
            return text
        return f"{text[:max_chars]}… ({len(text) - max_chars} more characters)"
    return cut


def _rollouts_of(root: str | Path, run_id: str, columns: list[str], attempts: Attempts = "latest") -> pd.DataFrame:
    rows = read_rollouts(root, run_id=run_id, columns=columns, attempts=attempts)
    if rows.empty:
        runs = run_ids(dataset_root(root))
        known = f"Runs in it: {', '.join(runs)}" if runs else "It holds no rollouts"
        raise TraceStoreError(f"no rollouts of run {run_id!r} in the trace dataset at {root}. {known}")
    return rows


def _minute(timestamp: Any) -> str:
    return "—" if pd.isna(timestamp) else pd.Timestamp(timestamp).tz_convert("UTC").strftime("%Y-%m-%d %H:%M")


def natural_key(text: str) -> tuple[str | int, ...]:
    """A sort key that orders the digit runs of ``text`` as numbers: ``simple_python_2`` before
    ``simple_python_10`` (text parts and numbers alternate, so keys always compare)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", str(text))))


def _natural_order(column: pd.Series) -> pd.Series:
    """``sort_values``' key: text columns in ``natural_key`` order, others as they are."""
    return column.map(natural_key) if column.dtype == object or pd.api.types.is_string_dtype(column) else column


def _fixed(value: float | None) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.3f}"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"
