"""The viewer's data: a trace dataset as plain JSON-able views, computed by the readers, summary and
comparison the CLI uses (``traces summary``, ``traces compare``), never a second copy of their rules.

Every string here is the dataset's own text, unescaped: the page renders it with ``textContent`` only.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pandas as pd

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.trace import Trace
from prefect_rollouts.traces.by_task import run_task_lines, task_changes
from prefect_rollouts.traces.compare import compare_runs
from prefect_rollouts.traces.files import run_ids
from prefect_rollouts.traces.read import read_rollouts, trace_of_row
from prefect_rollouts.traces.report import run_rows
from prefect_rollouts.traces.run_config import with_harness
from prefect_rollouts.traces.store import dataset_root
from prefect_rollouts.traces.summary import summarize_run
from prefect_rollouts.traces.view import plots
from prefect_rollouts.traces.view.conversation import conversation

TABLE_COLUMNS = ["rollout_id", "environment", "task_id", "rollout_index", "attempt", "harness", "reward",
                 "stop_condition", "is_error", "error_type", "is_truncated", "is_timeout", "scoring_skipped",
                 "total_tokens", "cached_tokens", "cost_usd", "elapsed_s", "num_model_calls", "num_tool_calls"]
"""The columns of the rollouts table, in order (``rollouts`` gives each row as a list in this order)."""
_KEY = ("environment", "task_id", "rollout_index")
_READ = [c for c in TABLE_COLUMNS if c not in ("harness", "run_id")] + ["started_at"]


class Dataset:
    """A trace dataset as the viewer reads it, each view computed once and kept (the dataset is a
    finished run's files: the viewer shows what they hold when it reads them).

    Args:
        root: Dataset root (a directory or an object-store URI), as ``read_rollouts`` takes it.
        pass_threshold: Reward at which a rollout passes (flipped tasks), as ``traces compare`` takes it.
    """

    def __init__(self, root: str | Path, *, pass_threshold: float = 1.0) -> None:
        self.root, self.pass_threshold = str(root), pass_threshold
        self._tables: dict[str, pd.DataFrame] = {}
        self._harness: dict[str, dict[str, Any]] = {}
        self._plots: dict[str, dict[str, str]] = {}
        self._locks = {name: threading.RLock() for name in ("runs", "table", "plots")}   # a server's threads
        self._runs: list[dict[str, Any]] | None = None
        self._comparisons: dict[tuple[str, str], dict[str, Any]] = {}

    def runs(self) -> list[dict[str, Any]]:
        """One dict per run, oldest first: ``run_rows``' keys, the ``EvalSummary`` figures (``summary``:
        rollouts, errored, timed_out, truncated, tokens, cost, retried, pass@k), ``ci`` (mean ± 1.96
        stderr) and ``wall_time_s`` (first start to last end). (``plots`` draws a run's plots.)"""
        with self._locks["runs"]:
            if self._runs is None:
                self._runs = [self._run(run) for run in run_rows(self.root)]
            return self._runs

    def run_ids(self) -> list[str]:
        """The runs' ids, oldest first."""
        return [run["run_id"] for run in self.runs()]

    def _run(self, run: dict[str, Any]) -> dict[str, Any]:
        summary = summarize_run(self.root, run["run_id"], pass_threshold=self.pass_threshold, spend=False)
        envs = summary.environments
        table = self.table(run["run_id"])
        mean, stderr = run["mean"], run["stderr"]
        ci = [mean - 1.96 * stderr, mean + 1.96 * stderr] if mean is not None and stderr is not None else None
        started = pd.to_datetime(table["started_at"], utc=True)
        ends = started + pd.to_timedelta(table["elapsed_s"].fillna(0), unit="s")
        wall = (ends.max() - started.min()).total_seconds() if len(table) else None
        figures = {"rollouts": summary.rollouts, "errored": summary.errored,
                   "timed_out": sum(e.timed_out for e in envs), "truncated": sum(e.truncated for e in envs),
                   "skipped": sum(e.skipped for e in envs), "total_tokens": summary.total_tokens,
                   "cached_tokens": summary.cached_tokens, "reasoning_tokens": summary.reasoning_tokens,
                   "judge_tokens": summary.judge_tokens, "retried": summary.retried, "recovered": summary.recovered,
                   "unfinished": summary.unfinished,
                   "cost_usd": sum(e.cost_usd or 0 for e in envs) if any(e.cost_usd is not None for e in envs)
                   else None,
                   "pass_at_k": {str(k): v for k, v in (envs[0].pass_at_k if len(envs) == 1 else {}).items()},
                   "errors": [error.model_dump() for error in summary.errors]}
        return {**{k: _plain(v) for k, v in run.items()}, "ci": ci, "wall_time_s": _plain(wall), "summary": figures}

    def plots(self, run_id: str) -> dict[str, str]:
        """Run ``run_id``'s plots as SVG data URIs: ``rewards`` (the distribution of its rewards) and
        ``tokens`` (tokens against wall time, a point per rollout).

        Raises:
            ConfigError: the dataset holds no rollout of ``run_id``.
        """
        with self._locks["plots"]:
            if run_id not in self._plots:
                table = self.table(run_id)
                self._plots[run_id] = {
                    "rewards": plots.reward_histogram(table["reward"].dropna().astype(float).tolist(), run_id),
                    "tokens": plots.tokens_and_time(table["total_tokens"].fillna(0).tolist(),
                                                    table["elapsed_s"].fillna(0).tolist())}
            return self._plots[run_id]

    def table(self, run_id: str) -> pd.DataFrame:
        """The rows of run ``run_id`` (latest attempts) with ``TABLE_COLUMNS`` and ``started_at``.

        Raises:
            ConfigError: the dataset holds no rollout of ``run_id`` (the message lists its runs).
        """
        with self._locks["table"]:
            return self._table(run_id)

    def _table(self, run_id: str) -> pd.DataFrame:
        if run_id not in self._tables:
            rows = read_rollouts(self.root, columns=_READ, run_id=run_id)
            if rows.empty:
                raise ConfigError(f"RUN = {run_id!r}: no rollouts of this run in the trace dataset at {self.root}. "
                                  f"Runs in it: {', '.join(run_ids(dataset_root(self.root))) or 'none'}")
            rows = with_harness(rows, self.root).sort_values(["environment", "task_id", "rollout_index"])
            self._tables[run_id] = rows.reset_index(drop=True)
        return self._tables[run_id]

    def rollouts(self, run_id: str) -> dict[str, Any]:
        """The rollouts table of run ``run_id``: ``{"columns": TABLE_COLUMNS, "rows": [[...], ...]}``, one
        list per rollout (its latest attempt), None for a missing value."""
        frame = self.table(run_id)[TABLE_COLUMNS]   # pandas' JSON encoder: NaN and NA as null, 10x a Python loop
        return {"columns": TABLE_COLUMNS, "rows": json.loads(frame.to_json(orient="values"))}

    def rollout(self, run_id: str, rollout_id: str) -> dict[str, Any] | None:
        """One attempt of a rollout of run ``run_id`` (by its ``rollout_id``, of any attempt) as the page
        shows it (``rollout_view``), with ``key`` (run, environment, task, index, attempt, harness,
        elapsed_s) and ``attempts``: every attempt of the rollout, the latest marked. None when the run
        holds no such rollout."""
        ids = read_rollouts(self.root, columns=["rollout_id"], attempts="all", run_id=run_id)
        match = ids[ids["rollout_id"] == rollout_id]
        if match.empty:
            return None
        key = match.iloc[0]
        rows = read_rollouts(self.root, attempts="all", run_id=run_id, environment=key["environment"],
                             task_id=key["task_id"], rollout_index=int(key["rollout_index"]))
        return self._view(run_id, rows.to_dict("records"), rollout_id)

    def rollout_views(self, run_id: str, rollout_ids: list[str]) -> dict[str, dict[str, Any]]:
        """``rollout`` of each of ``rollout_ids`` (latest attempts of run ``run_id``), reading the run once."""
        wanted = set(rollout_ids)
        frame = read_rollouts(self.root, attempts="all", run_id=run_id)
        keys = frame.loc[frame["rollout_id"].isin(wanted), list(_KEY)].drop_duplicates()
        rows = frame.merge(keys, on=list(_KEY)).to_dict("records")   # the wanted rollouts' attempts only
        attempts: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in rows:
            attempts.setdefault(tuple(row[k] for k in _KEY), []).append(row)
        return {row["rollout_id"]: self._view(run_id, attempts[tuple(row[k] for k in _KEY)], row["rollout_id"])
                for row in rows if row["rollout_id"] in wanted}

    def _view(self, run_id: str, rows: list[dict[str, Any]], rollout_id: str) -> dict[str, Any]:
        """``rollout_view`` of the row ``rollout_id`` of ``rows`` (every attempt of one rollout, as records)."""
        rows = sorted(rows, key=lambda r: int(r["attempt"]))
        latest = int(rows[-1]["attempt"])
        row = next(r for r in rows if r["rollout_id"] == rollout_id)
        view = rollout_view(trace_of_row(row))
        view["key"] = {"run_id": run_id, "environment": row["environment"], "task_id": row["task_id"],
                       "rollout_index": int(row["rollout_index"]), "attempt": int(row["attempt"]),
                       "harness": self._harnesses(run_id).get(row["environment"]),
                       "elapsed_s": _plain(row["elapsed_s"])}
        view["attempts"] = [{"attempt": int(r["attempt"]), "rollout_id": r["rollout_id"], "reward": _plain(r["reward"]),
                             "stop_condition": r["stop_condition"], "error_type": _plain(r["error_type"]),
                             "latest": int(r["attempt"]) == latest} for r in rows]
        return view

    def _harnesses(self, run_id: str) -> dict[str, Any]:
        """Each environment's harness in run ``run_id`` (from its stored config; None when unknown)."""
        if run_id not in self._harness:
            table = self.table(run_id).drop_duplicates("environment")
            self._harness[run_id] = {env: _plain(harness)
                                     for env, harness in zip(table["environment"], table["harness"], strict=True)}
        return self._harness[run_id]

    def compare(self, run_a: str, run_b: str) -> dict[str, Any]:
        """Run B against run A, as ``traces compare --by-task --json`` gives it (``comparison``: the
        ``RunComparison``; ``tasks``: per task, reward in A and B and the difference) with ``plot``: reward
        per task in A and B.

        Raises:
            ConfigError: a run has no rollouts in the dataset.
        """
        if (run_a, run_b) not in self._comparisons:
            result = compare_runs(self.root, run_a, run_b, pass_threshold=self.pass_threshold)
            changes = task_changes(run_task_lines(self.root, run_a, self.pass_threshold),
                                   run_task_lines(self.root, run_b, self.pass_threshold))
            tasks = json.loads(changes.to_json(orient="records"))
            self._comparisons[run_a, run_b] = {
                "comparison": json.loads(result.model_dump_json()), "tasks": tasks,
                "plot": plots.reward_per_task([t["task_id"] for t in tasks], [t["reward_a"] for t in tasks],
                                              [t["reward_b"] for t in tasks], run_a, run_b)}
        return self._comparisons[run_a, run_b]


def rollout_view(trace: Trace) -> dict[str, Any]:
    """One trace as the page shows it: ``conversation`` (``conversation.conversation``), ``model_calls``,
    ``rewrites`` (what the endpoint rewrote), ``programs`` (launches: exit code, output tails, transcript),
    ``network``, ``rewards`` (name, value, weight), ``metrics``, ``judges``, ``errors``, ``timings``,
    ``sends``, ``usage`` and ``judge_usage``, ``expected`` (the task's answer where its info holds one) and
    ``info`` (the rest of ``trace.info`` as indented JSON text)."""
    info = dict(trace.info)
    programs, rewrites = info.pop("program", []), info.pop("program_rewrites", [])
    task = info.get("task")
    task_info: dict[str, Any] = task if isinstance(task, dict) else {}
    expected = next((task_info[k] for k in ("answer", "expected", "expected_answer") if k in task_info), None)
    return {
        "rollout_id": trace.id, "task_id": trace.task_id, "task_type": trace.task_type, "model": trace.model,
        "reward": trace.reward, "stop_condition": trace.stop_condition, "is_truncated": trace.is_truncated,
        "is_timeout": trace.is_timeout, "scoring_skipped": trace.info.get("scoring_skipped"),
        "usage": trace.usage.model_dump(), "judge_usage": trace.judge_usage.model_dump(),
        "conversation": conversation(trace),
        "model_calls": [dict(call.model_dump(), index=i) for i, call in enumerate(trace.model_calls)],
        "rewrites": _json_text(rewrites) if rewrites else None,
        "programs": programs if isinstance(programs, list) else [programs],
        "network": [record.model_dump() for record in trace.network],
        "rewards": [{"name": name, "value": value, "weight": trace.reward_weights.get(name)}
                    for name, value in trace.rewards.items()],
        "metrics": [{"name": name, "value": value} for name, value in trace.metrics.items()],
        "judges": [call.model_dump() for call in trace.judge_calls],
        "errors": [error.model_dump() for error in trace.errors],
        "timings": trace.timings, "sends": [send.model_dump() for send in trace.sends],
        "expected": None if expected is None else (expected if isinstance(expected, str) else _json_text(expected)),
        "info": _json_text(info) if info else None,
        "agent": _json_text(trace.agent) if trace.agent else None,
    }


def _json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=repr)


def _plain(value: Any) -> Any:
    """``value`` as JSON has it: None for NaN, NaT or pandas' NA; Python numbers for NumPy's; ISO text for a time."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if hasattr(value, "item"):   # a NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
