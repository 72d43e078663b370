"""The eval summary: mean reward with standard error, each reward component's mean, pass@k,
outcome counts, the most frequent errors, tokens and cost (``traces/spend.py``), wall time, as a table or plain text;
``run_failure``, the one rule that says whether a run failed; ``outcome_line``, one rollout in a line."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from prefect_rollouts.trace import Trace
from prefect_rollouts.traces.attempt_counts import retry_counts
from prefect_rollouts.traces.paired_stats import pass_at_k
from prefect_rollouts.traces.spend import RunSpend, read_spend
from prefect_rollouts.traces.store import DatasetRoot

#: The ``rollouts`` columns ``summarize`` needs (readers can skip the large JSON columns).
SUMMARY_COLUMNS = ("run_id task_id rollout_index environment model reward rewards stop_condition is_truncated "
                   "is_timeout scoring_skipped is_error error_type error_message total_tokens cached_tokens "
                   "reasoning_tokens judge_prompt_tokens judge_completion_tokens cost_usd").split()

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
    """Figures of one environment (taskset) of a run, of one task category of it, or of the whole run."""

    environment: str
    """The environment; ``"all"`` on the overall line of a suite."""
    category: str | None = None
    """The task category (``info["task"]["category"]``, e.g. BFCL's) on a category's line."""
    harness: str | None = None
    """The harness of its rollouts (from the run's stored config; comma-joined when several); None if unknown."""
    model: str | None = None
    """The model of its rollouts (comma-joined, sorted, when they used several); None in rows without one."""
    rollouts: int
    """Rows written, errored ones included."""
    scored: int
    """Rollouts with a reward (errored and unscored ones are excluded from the mean)."""
    mean_reward: float | None
    stderr: float | None
    """Standard error of the mean: sample std (ddof=1) / sqrt(scored); None below 2 scored."""
    reward_components: dict[str, float | None] = {}
    """Mean of each reward component (``trace.rewards``: a task's ``@reward`` functions and judges,
    by name) over the scored rollouts, unweighted: ``{"correct": 0.0, "judge": 1.0}`` shows a
    judge that passes every answer an exact match fails. A rollout skipped by a skip rule counts
    0 for each (as for its reward); a component a rollout did not record is left out of that
    component's mean; None when no scored rollout recorded it."""
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
    cost_usd: float | None = None
    """USD of the agent's and judges' calls (``cost_usd`` column); None when no row has a price."""


class EvalSummary(BaseModel):
    """What ``eval_flow`` returns and ``prefect-rollouts traces summary`` prints."""

    run_id: str
    environments: list[EnvironmentSummary]
    rollouts: int
    errored: int
    unscored: dict[str, int] = {}
    """Rollouts without an error that were not scored for an infrastructure reason, by cause: a
    deadline expired before scoring finished (reward None; the stop condition, e.g.
    ``scoring_timeout`` or ``setup_timeout``), or ``skip_on_timeout`` (a deadline expired and the
    skip rule gave reward 0, which the means keep, as the rule says). ``run_failure`` counts them
    with the errored ones: a run none of whose rollouts was scored is not a success."""
    total_tokens: int
    cached_tokens: int | None = None
    """As ``EnvironmentSummary.cached_tokens``, over the whole run."""
    reasoning_tokens: int | None = None
    judge_tokens: int = 0
    wall_time_s: float | None = None
    retried: int = 0
    """Rollouts run again after an errored attempt (``traces.attempt_counts``); ``recovered``: those of them
    whose latest attempt has no error."""
    recovered: int = 0
    errors: list[ErrorCount] = []
    """The ``TOP_ERRORS`` most frequent error types of the errored rollouts, most frequent first."""
    categories: list[EnvironmentSummary] = []
    """One per task category of each environment whose tasks have two or more categories."""
    overall: EnvironmentSummary | None = None
    """All environments together (a suite; its reward components are left out: each environment
    has its own); None with one environment."""
    flow_run_id: str | None = None
    """The eval flow run that produced this summary (``eval_flow`` sets it)."""
    baseline: str | None = None
    """The run this one was compared with (``EvalConfig.baseline``), if any."""
    against_baseline: list[str] = []
    """One line per environment: ``<environment>: regressed, difference -0.250 [-0.400, -0.100]``."""
    regressed: list[str] = []
    """Environments whose interval against the baseline lies below 0."""
    baseline_note: str | None = None
    """Why there is no comparison, whether the run became the series' baseline and, if not, why."""
    baseline_moved: bool = False
    """The run became its series' baseline (``baseline = "last"``): it completed, did not regress
    and scored every rollout the old baseline scored."""
    spend: RunSpend | None = None
    """Tokens and cost of every attempt, per run, costliest tasks and rollouts (``traces.spend``)."""
    budget_stop: str | None = None
    """Why the run's budget stopped it (spend, budget, rollouts not done), when it did (``eval_flow``)."""
    unfinished: int = 0
    """Rollouts whose latest attempt is not done (``trace.UNFINISHED_STOPS``: stopped as ``budget``): the run is
    unfinished, a resume runs them again (``summarize_run``; rollouts never started have no row to count)."""
    budget_not_done: int | None = None
    """How many rollouts the budget left not done (no row, stopped as ``budget``, an error due a retry),
    when it stopped the run (``eval_flow``)."""

    def lines(self) -> list[EnvironmentSummary]:
        """Each environment followed by its categories, then the overall line (a suite)."""
        ordered: list[EnvironmentSummary] = []
        for env in self.environments:
            ordered += [env, *(c for c in self.categories if c.environment == env.environment)]
        return [*ordered, *([self.overall] if self.overall else [])]

    def table(self) -> list[dict[str, Any]]:
        """One flat dict per line of ``lines()`` (for a Prefect table artifact or a terminal table):
        each environment, its categories (``environment`` is ``"<environment> / <category>"``)
        and, for a suite, ``"all"``.

        Keys, in order: ``environment``, ``harness``, ``model``, ``rollouts``, ``scored``,
        ``mean_reward``, ``stderr``, ``reward.<name>`` per reward component of any environment (its
        mean; None where an environment has no such component), ``pass@<k>`` for every k of any environment
        (None where it has none), the outcome counts and the token counts: the same keys in
        every row. ``cached_tokens`` and ``reasoning_tokens`` are columns only when some
        environment reports them. Floats are rounded to 4 decimals.
        """
        details = [key for key in ("cached_tokens", "reasoning_tokens")
                   if any(getattr(env, key) is not None for env in self.environments)]
        components = list(dict.fromkeys(name for env in self.environments for name in env.reward_components))
        ks = sorted({k for env in self.environments for k in env.pass_at_k})
        rows = []
        for env in self.lines():
            label = f"{env.environment} / {env.category}" if env.category else env.environment
            row: dict[str, Any] = {
                "environment": label, "harness": env.harness, "model": env.model, "rollouts": env.rollouts,
                "scored": env.scored, "mean_reward": _round(env.mean_reward), "stderr": _round(env.stderr)}
            row.update({f"reward.{name}": _round(env.reward_components.get(name)) for name in components})
            row.update({f"pass@{k}": _round(env.pass_at_k.get(k)) for k in ks})
            row.update(truncated=env.truncated, timed_out=env.timed_out, skipped=env.skipped,
                       errored=env.errored, total_tokens=env.total_tokens)
            row.update({key: getattr(env, key) for key in details})
            row["judge_tokens"] = env.judge_tokens
            if any(line.cost_usd is not None for line in self.environments):
                row["cost_usd"] = None if env.cost_usd is None else round(env.cost_usd, 6)
            rows.append(row)
        return rows

    def unfinished_text(self) -> str:
        """``unfinished: 3 rollouts not done (stopped as budget; ...)``, for a run its budget stopped."""
        return (f"unfinished: {self.unfinished} rollouts not done (stopped as budget; rollouts never started are "
                f"not counted here): prefect-rollouts eval CONFIG --resume {self.run_id} with a larger budget")

    def text(self) -> str:
        """The summary as plain text (the eval flow run's log): a title line, ``table()`` as
        aligned columns (None as ``—``), the wall time and tokens, then the top errors, one line
        each (``<type> x<count>, e.g.: <example>``)."""
        rows = self.table()
        lines = [f"run {self.run_id}: {self.rollouts} rollouts, {self.errored} errored"
                 + (f", {sum(self.unscored.values())} not scored ({_counts(self.unscored)})" if self.unscored else "")]
        if rows:
            cells = [list(rows[0]), *([_cell(row[column]) for column in rows[0]] for row in rows)]
            widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
            lines += ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                                for i, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip()
                      for line in cells]
        if self.wall_time_s is not None:
            judged = f", judge tokens: {self.judge_tokens}" if self.judge_tokens else ""
            lines.append(f"wall time: {self.wall_time_s:.1f} s, tokens of the latest attempts: "
                         f"{self.total_tokens}{judged}")
        if self.spend is not None:
            lines.append(self.spend.text())
        if self.budget_stop:
            lines.append(f"budget: {self.budget_stop}")
        elif self.unfinished:
            lines.append(self.unfinished_text())
        if self.retried:
            lines.append(f"retried: {self.retried} rollout{'' if self.retried == 1 else 's'} after an errored "
                         f"attempt, {self.recovered} recovered")
        if self.errors:
            lines.append("top errors:")
            lines += [f"  {error.type} x{error.count}, e.g.: {error.example}" for error in self.errors]
        if self.baseline:
            lines.append(f"against baseline {self.baseline}:")
            lines += [f"  {line}" for line in self.against_baseline]
        if self.baseline_note:
            lines.append(f"baseline: {self.baseline_note}")
        return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    """``scoring_timeout x6, setup_timeout x1``."""
    return ", ".join(f"{cause} x{count}" for cause, count in counts.items())


def _cell(value: Any) -> str:
    return "—" if value is None else str(value)


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
        details.append(f"not scored: {_counts(summary.unscored)}")
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


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


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
