"""The eval summary: mean reward with standard error, pass@k, outcome counts, the most frequent
errors, tokens, wall time; and ``run_failure``, the one rule that says whether a run failed."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from prefect_rollouts.traces.store import DatasetRoot

#: The ``rollouts`` columns ``summarize`` needs (readers can skip the large JSON columns).
SUMMARY_COLUMNS = ["run_id", "task_id", "rollout_index", "environment", "reward", "is_truncated", "is_timeout",
                   "scoring_skipped", "is_error", "error_type", "error_message", "total_tokens", "cached_tokens",
                   "reasoning_tokens", "judge_prompt_tokens", "judge_completion_tokens"]

#: Error types an ``EvalSummary`` lists (the most frequent first).
TOP_ERRORS = 5

#: Characters of an error message kept in a state message or an ``ErrorCount`` example.
ERROR_CHARS = 300


class ErrorCount(BaseModel):
    """One error type of a run: how many rollouts ended with it, and one of their messages."""

    type: str
    """The exception's class name (the ``error_type`` column), e.g. ``ProviderError``."""
    count: int
    example: str
    """The message of the first such rollout (by task id, then rollout index), cut to ``ERROR_CHARS``."""


class EnvironmentSummary(BaseModel):
    """Figures of one environment (taskset) of a run."""

    environment: str
    rollouts: int
    """Rows written, errored ones included."""
    scored: int
    """Rollouts with a reward (errored and unscored ones are excluded from the mean)."""
    mean_reward: float | None
    stderr: float | None
    """Standard error of the mean: sample std (ddof=1) / sqrt(scored); None below 2 scored."""
    pass_at_k: dict[int, float]
    """Unbiased pass@k (Chen et al. 2021) for k = 1..rollouts_per_task, a pass being reward >= threshold."""
    truncated: int
    timed_out: int
    skipped: int
    errored: int
    total_tokens: int
    """Tokens of the agent's model calls."""
    cached_tokens: int | None = None
    """Prompt tokens the server served from its cache, summed over the rollouts that report
    them; None when none does (unknown, not 0)."""
    reasoning_tokens: int | None = None
    """Completion tokens spent reasoning, summed like ``cached_tokens``."""
    judge_tokens: int = 0
    """Tokens of the judges' calls (prompt + completion)."""


class EvalSummary(BaseModel):
    """What ``eval_flow`` returns and ``prefect-rollouts traces summary`` prints."""

    run_id: str
    environments: list[EnvironmentSummary]
    rollouts: int
    errored: int
    total_tokens: int
    cached_tokens: int | None = None
    """As ``EnvironmentSummary.cached_tokens``, over the whole run."""
    reasoning_tokens: int | None = None
    judge_tokens: int = 0
    wall_time_s: float | None = None
    errors: list[ErrorCount] = []
    """The ``TOP_ERRORS`` most frequent error types of the errored rollouts, most frequent first."""
    flow_run_id: str | None = None
    """The eval flow run that produced this summary (``eval_flow`` sets it)."""

    def table(self) -> list[dict[str, Any]]:
        """One flat dict per environment (for a Prefect table artifact or a terminal table).

        ``cached_tokens`` and ``reasoning_tokens`` are columns only when some environment reports them.
        """
        details = [key for key in ("cached_tokens", "reasoning_tokens")
                   if any(getattr(env, key) is not None for env in self.environments)]
        rows = []
        for env in self.environments:
            row: dict[str, Any] = {
                "environment": env.environment, "rollouts": env.rollouts, "scored": env.scored,
                "mean_reward": _round(env.mean_reward), "stderr": _round(env.stderr)}
            row.update({f"pass@{k}": _round(v) for k, v in env.pass_at_k.items()})
            row.update(truncated=env.truncated, timed_out=env.timed_out, skipped=env.skipped,
                       errored=env.errored, total_tokens=env.total_tokens)
            row.update({key: getattr(env, key) for key in details})
            row["judge_tokens"] = env.judge_tokens
            rows.append(row)
        return rows


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: ``1 - C(n - c, k) / C(n, k)`` (n samples, c passing).

    Raises:
        ValueError: ``k > n`` (the estimator needs at least k samples).
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(rows: pd.DataFrame, *, run_id: str, rollouts_per_task: int | None = None,
              pass_threshold: float = 1.0, wall_time_s: float | None = None) -> EvalSummary:
    """Summarise ``read_rollouts`` rows of one run.

    Errored rollouts (infrastructure or task-code failures, reward None) are counted apart and
    excluded from means and pass@k, never counted as reward 0. Skipped rollouts (skip rules)
    have reward 0 and count. pass@k uses, per task, the scored rollouts; tasks with fewer than
    k scored rollouts are left out of that k.

    Args:
        rows: Rows of the ``rollouts`` table.
        run_id: The run the rows belong to.
        rollouts_per_task: Largest k to report; default: the most rollouts any task has.
        pass_threshold: A rollout passes when ``reward >= pass_threshold``.
        wall_time_s: Wall time of the run, recorded as is.
    """
    environments = []
    for name, group in rows.groupby("environment", sort=True):
        scored = group[group["reward"].notna()]
        rewards = scored["reward"].astype(float)
        per_task = scored.groupby("task_id")["reward"].agg(n="count", c=lambda r: int((r >= pass_threshold).sum()))
        top = rollouts_per_task or (int(per_task["n"].max()) if len(per_task) else 0)
        passes = {}
        for k in range(1, top + 1):
            eligible = per_task[per_task["n"] >= k]
            if len(eligible):
                pairs = zip(eligible["n"], eligible["c"], strict=True)
                passes[k] = float(sum(pass_at_k(int(n), int(c), k) for n, c in pairs) / len(eligible))
        environments.append(EnvironmentSummary(
            environment=str(name), rollouts=len(group), scored=len(scored),
            mean_reward=float(rewards.mean()) if len(rewards) else None,
            stderr=float(rewards.std(ddof=1) / math.sqrt(len(rewards))) if len(rewards) > 1 else None,
            pass_at_k=passes, truncated=int(group["is_truncated"].sum()), timed_out=int(group["is_timeout"].sum()),
            skipped=int(group["scoring_skipped"].notna().sum()), errored=int(group["is_error"].sum()),
            total_tokens=int(group["total_tokens"].sum()), cached_tokens=_reported(group, "cached_tokens"),
            reasoning_tokens=_reported(group, "reasoning_tokens"), judge_tokens=_judge_tokens(group)))
    return EvalSummary(run_id=run_id, environments=environments, rollouts=len(rows),
                       errored=int(rows["is_error"].sum()) if len(rows) else 0,
                       total_tokens=int(rows["total_tokens"].sum()) if len(rows) else 0,
                       cached_tokens=_reported(rows, "cached_tokens"),
                       reasoning_tokens=_reported(rows, "reasoning_tokens"),
                       judge_tokens=_judge_tokens(rows), wall_time_s=wall_time_s, errors=_top_errors(rows))


def _top_errors(rows: pd.DataFrame) -> list[ErrorCount]:
    """The most frequent ``error_type`` values of the errored ``rows``, each with its first message."""
    if not len(rows) or "error_type" not in rows:
        return []
    errored = rows[rows["is_error"].astype(bool)].sort_values(["task_id", "rollout_index"])
    pairs = zip(errored["error_type"].fillna("unknown error"), errored["error_message"].fillna(""), strict=True)
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for kind, message in pairs:
        counts[kind] += 1
        examples.setdefault(kind, message)
    return [ErrorCount(type=kind, count=count, example=_cut(examples[kind]))   # ties: first seen first
            for kind, count in counts.most_common(TOP_ERRORS)]


def _cut(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."


def error_text(error_type: str, message: str) -> str:
    """``<error type>: <message>``, the message cut to ``ERROR_CHARS`` (a Prefect state message)."""
    return f"{error_type}: {_cut(message)}"


def run_failure(summary: EvalSummary, planned: int, max_error_fraction: float = 0.0) -> str | None:
    """Why a run failed, or None when it succeeded: every one of the ``planned`` rollouts has a
    row, and at most ``max_error_fraction`` (0 to 1) of them errored.

    The eval flow run's state message and the CLI's exit status both come from here, e.g.
    ``"6 of 6 rollouts errored (ProviderError: ...)"``, ``"4 of 10 rollouts have no row"``.
    """
    missing = planned - summary.rollouts
    if missing > 0:
        return f"{missing} of {planned} rollouts have no row"
    if not summary.errored or summary.errored / max(planned, 1) <= max_error_fraction:
        return None
    allowed = f", more than max_error_fraction = {max_error_fraction:g} allows" if max_error_fraction else ""
    text = f"{summary.errored} of {planned} rollouts errored{allowed}"
    if summary.errors:
        top, others = summary.errors[0], len(summary.errors) - 1
        more = f"; {others} other error type{'s' if others > 1 else ''}" if others else ""
        text += f" ({error_text(top.type, top.example)}{more})"
    return text


def _reported(rows: pd.DataFrame, column: str) -> int | None:
    """Sum of ``column`` over the rows that report it; None when none does (or, in rows written
    before schema version 2, the column is missing)."""
    if column not in rows or not rows[column].notna().any():
        return None
    return int(rows[column].sum())


def _judge_tokens(rows: pd.DataFrame) -> int:
    """Judge tokens of ``rows``; rows written before judges existed hold none."""
    return int(sum(rows[c].fillna(0).sum() for c in ("judge_prompt_tokens", "judge_completion_tokens") if c in rows))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summarize_run(root: str | Path | DatasetRoot, run_id: str, *, rollouts_per_task: int | None = None,
                  pass_threshold: float = 1.0, wall_time_s: float | None = None) -> EvalSummary:
    """``summarize`` the durable rows of run ``run_id`` in the dataset at ``root`` (a path, an
    object-store URI or a ``DatasetRoot``), whoever wrote them, reading only
    the columns the summary needs (``SUMMARY_COLUMNS``).

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    from prefect_rollouts.traces.read import read_rollouts

    rows = read_rollouts(root, run_id=run_id, columns=SUMMARY_COLUMNS)
    return summarize(rows, run_id=run_id, rollouts_per_task=rollouts_per_task, pass_threshold=pass_threshold,
                     wall_time_s=wall_time_s)
