"""The eval summary: mean reward with standard error, each reward component's mean, pass@k,
outcome counts, the most frequent errors, tokens and cost (``traces/spend.py``), wall time (the
``EvalSummary`` they fill, with its table and text, is ``traces/eval_summary.py``);
``run_failure``, the one rule that says whether a run failed; ``outcome_line``, one rollout in a line."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from prefect_rollouts.trace import Trace
from prefect_rollouts.traces.attempt_counts import retry_counts
from prefect_rollouts.traces.eval_summary import EnvironmentSummary, ErrorCount, EvalSummary, counts_text
from prefect_rollouts.traces.paired_stats import pass_at_k
from prefect_rollouts.traces.spend import read_spend
from prefect_rollouts.traces.store import DatasetRoot

#: The ``rollouts`` columns ``summarize`` needs (readers can skip the large JSON columns).
SUMMARY_COLUMNS = ("run_id task_id rollout_index environment model reward rewards stop_condition is_truncated "
                   "is_timeout scoring_skipped is_error error_type error_message total_tokens cached_tokens "
                   "reasoning_tokens judge_prompt_tokens judge_completion_tokens cost_usd").split()

#: Error types an ``EvalSummary`` lists (the most frequent first).
TOP_ERRORS = 5

#: Characters of an error message kept in a state message or an ``ErrorCount`` example.
ERROR_CHARS = 300


def summarize(rows: pd.DataFrame, *, run_id: str, rollouts_per_task: int | None = None,
              pass_threshold: float = 1.0, wall_time_s: float | None = None) -> EvalSummary:
    """Summarise ``read_rollouts`` rows of one run.

    Errored rollouts (infrastructure or task-code failures, reward None) are counted apart and
    excluded from means and pass@k, never counted as reward 0; so are rollouts a deadline left
    unscored (``EvalSummary.unscored``). Skipped rollouts (skip rules) have reward 0 and count.
    pass@k uses, per task, the scored rollouts; tasks with fewer than k scored rollouts are left
    out of that k.

    Args:
        rows: Rows of the ``rollouts`` table.
        run_id: The run the rows belong to.
        rollouts_per_task: Largest k to report; default: the most rollouts any task has.
        pass_threshold: A rollout passes when ``reward >= pass_threshold``.
        wall_time_s: Wall time of the run, recorded as is.
    """
    def of(group: pd.DataFrame, environment: str, category: str | None = None) -> EnvironmentSummary:
        return _summary(group, environment, category, rollouts_per_task, pass_threshold)

    environments, categories = [], []
    for name, group in rows.groupby("environment", sort=True):
        environments.append(of(group, str(name)))
        named = group["category"].dropna() if "category" in group else pd.Series(dtype=object)
        if named.nunique() > 1:    # one category is the environment itself
            categories += [of(part, str(name), str(category))
                           for category, part in group.groupby("category", sort=True)]
    overall = of(rows, "all").model_copy(update={"reward_components": {}}) if len(environments) > 1 else None
    return EvalSummary(run_id=run_id, environments=environments, categories=categories, overall=overall,
                       rollouts=len(rows),
                       errored=int(rows["is_error"].sum()) if len(rows) else 0, unscored=_unscored(rows),
                       total_tokens=int(rows["total_tokens"].sum()) if len(rows) else 0,
                       cached_tokens=_reported(rows, "cached_tokens"),
                       reasoning_tokens=_reported(rows, "reasoning_tokens"),
                       judge_tokens=_judge_tokens(rows), wall_time_s=wall_time_s, errors=_top_errors(rows))


def _summary(group: pd.DataFrame, environment: str, category: str | None, rollouts_per_task: int | None,
             pass_threshold: float) -> EnvironmentSummary:
    """The figures of ``group``: one environment, one category of it, or the whole run (``"all"``)."""
    scored = group[group["reward"].notna()]
    rewards = scored["reward"].astype(float)
    per_task = (scored.assign(passed=rewards >= pass_threshold).groupby(["environment", "task_id"])  # no call per task
                .agg(n=("reward", "count"), c=("passed", "sum")))
    top = rollouts_per_task or (int(per_task["n"].max()) if len(per_task) else 0)
    passes = {}
    for k in range(1, top + 1):
        eligible = per_task[per_task["n"] >= k]
        if len(eligible):
            pairs = zip(eligible["n"], eligible["c"], strict=True)
            passes[k] = float(sum(pass_at_k(int(n), int(c), k) for n, c in pairs) / len(eligible))
    return EnvironmentSummary(
        environment=environment, category=category, harness=distinct_values(group, "harness"),
        model=distinct_values(group, "model"), rollouts=len(group), scored=len(scored),
        mean_reward=float(rewards.mean()) if len(rewards) else None,
        stderr=float(rewards.std(ddof=1) / math.sqrt(len(rewards))) if len(rewards) > 1 else None,
        reward_components=_component_means(scored), pass_at_k=passes,
        truncated=int(group["is_truncated"].sum()), timed_out=int(group["is_timeout"].sum()),
        skipped=int(group["scoring_skipped"].notna().sum()), errored=int(group["is_error"].sum()),
        total_tokens=int(group["total_tokens"].sum()), cached_tokens=_reported(group, "cached_tokens"),
        reasoning_tokens=_reported(group, "reasoning_tokens"), judge_tokens=_judge_tokens(group),
        cost_usd=float(group["cost_usd"].sum()) if "cost_usd" in group and group["cost_usd"].notna().any() else None)


def distinct_values(rows: pd.DataFrame, column: str) -> str | None:
    """The distinct values of ``column`` in ``rows``, sorted and comma-joined; None when there are none."""
    return (",".join(sorted(str(v) for v in rows[column].dropna().unique())) or None) if column in rows else None


def _component_means(scored: pd.DataFrame) -> dict[str, float | None]:
    """Mean of each reward component over the ``scored`` rows (see ``EnvironmentSummary.reward_components``)."""
    if "rewards" not in scored:
        return {}
    values: dict[str, list[float]] = {}
    skipped = 0
    for text, skip in zip(scored["rewards"], scored.get("scoring_skipped", [None] * len(scored)), strict=True):
        if isinstance(skip, str):
            skipped += 1
            continue
        for name, value in (json.loads(text) if isinstance(text, str) and text else {}).items():
            values.setdefault(name, [])
            if value is not None:
                values[name].append(float(value))
    return {name: (sum(got) / (len(got) + skipped) if got else None) for name, got in values.items()}


def _unscored(rows: pd.DataFrame) -> dict[str, int]:
    """``EvalSummary.unscored`` of ``rows``: causes sorted by name."""
    if not len(rows):
        return {}
    fine = rows["is_error"].fillna(False).astype(bool)
    skipped = rows["scoring_skipped"]
    unscored = rows[~fine & rows["reward"].isna() & skipped.isna()]
    causes = Counter(str(stop) if isinstance(stop, str) else "no reward"
                     for stop in unscored.get("stop_condition", pd.Series([None] * len(unscored))))
    causes["skip_on_timeout"] = int((~fine & (skipped == "timeout")).sum())
    return {cause: count for cause, count in sorted(causes.items()) if count}


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
    """Its start, and the last line of a text of several lines (a program's output: what failed)."""
    first, _, rest = text.partition("\n") if len(text) > ERROR_CHARS else (text, "", "")
    last = rest.rstrip().rpartition("\n")[2].strip()
    if last and len(last) <= ERROR_CHARS // 2:
        return f"{first[:ERROR_CHARS - len(last)]} ... {last}"
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."


def error_text(error_type: str, message: str) -> str:
    """``<error type>: <message>``, the message cut to ``ERROR_CHARS`` (a Prefect state message)."""
    return f"{error_type}: {_cut(message)}"


def outcome_line(trace: Trace) -> str:
    """How a finished rollout ended, in one line (the last log line of its rollout flow run).

    ``reward <total> (<component> <value>, ...) · stop <stop condition>``, then ``· scoring
    skipped (<reason>)`` when a skip rule applied, and ``· error <type>: <message>`` of its first
    error (cut to ``ERROR_CHARS``; the trace's errors are scrubbed of secrets when recorded).
    Numbers print as ``%g``; a missing reward or component as ``—``. E.g. ``reward 0.5 (correct
    0, judge 1) · stop agent_completed`` or ``reward — · stop provider_error · error
    ProviderError: ...``.
    """
    components = ", ".join(f"{name} {_short(value)}" for name, value in trace.rewards.items())
    line = f"reward {_short(trace.reward)}" + (f" ({components})" if components else "")
    line += f" · stop {trace.stop_condition or '—'}"
    if skipped := trace.info.get("scoring_skipped"):
        line += f" · scoring skipped ({skipped})"
    if trace.errors:
        line += f" · error {error_text(trace.errors[0].type, trace.errors[0].message)}"
    return line


def _short(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def run_failure(summary: EvalSummary, planned: int, max_error_fraction: float = 0.0) -> str | None:
    """Why a run failed, or None when it succeeded: every one of the ``planned`` rollouts has a
    row, and at most ``max_error_fraction`` (0 to 1) of them errored or were not scored for an
    infrastructure reason (``EvalSummary.unscored``: a deadline expired before scoring finished,
    ``skip_on_timeout`` included).

    The eval flow run's state message and the CLI's exit status both come from here, e.g.
    ``"6 of 6 rollouts errored (ProviderError: ...)"``, ``"4 of 10 rollouts have no row"``,
    ``"6 of 6 rollouts errored or were not scored (not scored: scoring_timeout x6)"``.
    """
    missing = planned - summary.rollouts
    if missing > 0:
        return f"{missing} of {planned} rollouts have no row"
    failed = summary.errored + sum(summary.unscored.values())
    if not failed or failed / max(planned, 1) <= max_error_fraction:
        return None
    allowed = f", more than max_error_fraction = {max_error_fraction:g} allows" if max_error_fraction else ""
    text = f"{failed} of {planned} rollouts errored{' or were not scored' if summary.unscored else ''}{allowed}"
    details = []
    if summary.errors:
        top, others = summary.errors[0], len(summary.errors) - 1
        more = f"; {others} other error type{'s' if others > 1 else ''}" if others else ""
        details.append(f"{error_text(top.type, top.example)}{more}")
    if summary.unscored:
        details.append(f"not scored: {counts_text(summary.unscored)}")
    return text + (f" ({'; '.join(details)})" if details else "")


def _reported(rows: pd.DataFrame, column: str) -> int | None:
    """Sum of ``column`` over the rows that report it; None when none does (or, in rows written
    before schema version 2, the column is missing)."""
    if column not in rows or not rows[column].notna().any():
        return None
    return int(rows[column].sum())


def _judge_tokens(rows: pd.DataFrame) -> int:
    """Judge tokens of ``rows``; rows written before judges existed hold none."""
    return int(sum(rows[c].fillna(0).sum() for c in ("judge_prompt_tokens", "judge_completion_tokens") if c in rows))


def summarize_run(root: str | Path | DatasetRoot, run_id: str, *, rollouts_per_task: int | None = None,
                  pass_threshold: float = 1.0, wall_time_s: float | None = None, spend: bool = True) -> EvalSummary:
    """``summarize`` the durable rows of run ``run_id`` in the dataset at ``root`` (a path, an object-store
    URI or a ``DatasetRoot``), whoever wrote them, reading only ``SUMMARY_COLUMNS``, with each
    environment's harness from the run's stored config (``run_config.with_harness``). ``spend=False``
    leaves ``spend`` None (it reads every attempt's model calls: seconds on a large run).

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    from prefect_rollouts.trace import UNFINISHED_STOPS
    from prefect_rollouts.traces.read import read_rollouts_with_categories
    from prefect_rollouts.traces.run_config import with_harness

    rows = with_harness(read_rollouts_with_categories(root, columns=SUMMARY_COLUMNS, run_id=run_id), root)
    summary = summarize(rows, run_id=run_id, rollouts_per_task=rollouts_per_task, pass_threshold=pass_threshold,
                        wall_time_s=wall_time_s)
    summary.spend = read_spend(root, run_id) if spend else None
    summary.retried, summary.recovered = retry_counts(root, run_id)
    summary.unfinished = int(rows["stop_condition"].isin(list(UNFINISHED_STOPS)).sum()) if len(rows) else 0
    return summary
