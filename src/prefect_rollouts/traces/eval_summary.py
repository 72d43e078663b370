"""An eval's summary as data: ``EvalSummary`` (the run), ``EnvironmentSummary`` (one environment, one task
category of it, or the whole run) and ``ErrorCount``, with the summary as a table (``table``) or plain text
(``text``). ``traces/summary.py`` computes them from the dataset's rows."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from prefect_rollouts.traces.spend import RunSpend


class ErrorCount(BaseModel):
    """One error type of a run: how many rollouts ended with it, and one of their messages."""

    type: str
    """The exception's class name (the ``error_type`` column), e.g. ``ProviderError``."""
    count: int
    example: str
    """The message of the first such rollout (by task id, then rollout index), cut to ``summary.ERROR_CHARS``."""


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
    """The ``summary.TOP_ERRORS`` most frequent error types of the errored rollouts, most frequent first."""
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
        unscored = f", {sum(self.unscored.values())} not scored ({counts_text(self.unscored)})" if self.unscored else ""
        lines = [f"run {self.run_id}: {self.rollouts} rollouts, {self.errored} errored{unscored}"]
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


def counts_text(counts: dict[str, int]) -> str:
    """``scoring_timeout x6, setup_timeout x1``."""
    return ", ".join(f"{cause} x{count}" for cause, count in counts.items())


def _cell(value: Any) -> str:
    return "—" if value is None else str(value)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
