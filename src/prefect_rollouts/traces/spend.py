"""What a run spent: tokens and, where prices are given, USD, per run, per task and per rollout.

Every attempt counts (a rollout stopped by the budget and run again spent twice), judges included, as
the eval's budget counts (``evals/budget.py``). The cost is the rows' ``cost_usd`` (schema version 7:
``pricing.call_cost_usd`` with each client's ``price``); None where no row of the group has one.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pydantic import BaseModel

#: The ``rollouts`` columns the spend is read from (every attempt).
SPEND_COLUMNS = ("run_id environment task_id rollout_index attempt total_tokens judge_prompt_tokens "
                 "judge_completion_tokens cost_usd").split()

#: Tasks and rollouts a ``RunSpend`` lists (the most expensive first).
TOP_SPENDERS = 10


class SpendLine(BaseModel):
    """The spend of one task (``rollout_index`` None) or one rollout, over all its attempts."""

    environment: str
    task_id: str
    rollout_index: int | None = None
    attempts: int
    """Rows (attempts) counted."""
    tokens: int
    """Agent and judge tokens (prompt + completion)."""
    cost_usd: float | None = None


class RunSpend(BaseModel):
    """The spend of a run over every attempt (``spend_of``)."""

    tokens: int
    """Agent and judge tokens (prompt + completion) of every attempt."""
    judge_tokens: int = 0
    cost_usd: float | None = None
    """USD of the priced calls; None when no row has a cost (no client had a price)."""
    attempts: int = 0
    """Rows counted (every attempt of every rollout)."""
    rollouts: int = 0
    """Distinct rollouts (environment, task, rollout index)."""
    tokens_per_rollout: float | None = None
    """Mean tokens of a rollout (its attempts together)."""
    cost_per_rollout_usd: float | None = None
    tasks: list[SpendLine] = []
    """The ``TOP_SPENDERS`` tasks that spent most (by cost where priced, else tokens), most first."""
    top_rollouts: list[SpendLine] = []
    """The ``TOP_SPENDERS`` rollouts that spent most, most first."""

    def text(self) -> str:
        """Lines for a terminal or a log: the run's spend, then its costliest tasks and rollouts."""
        cost = f", ${self.cost_usd:.4f}" if self.cost_usd is not None else ""
        per = "" if self.tokens_per_rollout is None else f"; per rollout {self.tokens_per_rollout:,.0f} tokens" + (
            f", ${self.cost_per_rollout_usd:.4f}" if self.cost_per_rollout_usd is not None else "")
        lines = [f"spend: {self.tokens:,} tokens (judges {self.judge_tokens:,}){cost} over {self.attempts} "
                 f"attempts of {self.rollouts} rollouts (every attempt){per}"]
        for title, items in (("tasks", self.tasks), ("rollouts", self.top_rollouts)):
            if items:
                lines.append(f"costliest {title}:")
                lines += [f"  {line.environment}/{line.task_id}"
                          + (f" #{line.rollout_index}" if line.rollout_index is not None else "")
                          + f": {line.tokens:,} tokens"
                          + (f", ${line.cost_usd:.4f}" if line.cost_usd is not None else "")
                          + (f" ({line.attempts} attempts)" if line.attempts > 1 else "") for line in items]
        return "\n".join(lines)

    def table(self) -> list[dict[str, Any]]:
        """The costliest tasks then rollouts as flat rows (a Prefect table artifact)."""
        return [{"environment": line.environment, "task_id": line.task_id, "rollout_index": line.rollout_index,
                 "attempts": line.attempts, "tokens": line.tokens,
                 "cost_usd": None if line.cost_usd is None else round(line.cost_usd, 6)}
                for line in [*self.tasks, *self.top_rollouts]]


def spend_table(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Spend grouped ``by`` columns of ``rows`` (``read_rollouts(..., attempts="all")``): ``attempts``,
    ``tokens`` (agent + judge), ``judge_tokens``, ``cost_usd`` (NaN where no row of the group has one),
    most expensive first. The notebook's per-task and per-rollout tables."""
    frame = rows.assign(
        judge_tokens=_column(rows, "judge_prompt_tokens") + _column(rows, "judge_completion_tokens"),
        cost_usd=rows["cost_usd"] if "cost_usd" in rows else float("nan"))
    frame = frame.assign(tokens=_column(frame, "total_tokens") + frame["judge_tokens"])
    grouped = frame.groupby(by, sort=False).agg(attempts=("tokens", "size"), tokens=("tokens", "sum"),
                                                judge_tokens=("judge_tokens", "sum"),
                                                cost_usd=("cost_usd", lambda c: c.sum(min_count=1)))
    order = ["cost_usd", "tokens"] if grouped["cost_usd"].notna().any() else ["tokens"]
    return grouped.sort_values(order, ascending=False).reset_index()


def spend_of(rows: pd.DataFrame) -> RunSpend:
    """The ``RunSpend`` of ``rows``: every attempt of one run (``read_rollouts(..., attempts="all")``)."""
    if not len(rows):
        return RunSpend(tokens=0)
    tasks = spend_table(rows, ["environment", "task_id"])
    per_rollout = spend_table(rows, ["environment", "task_id", "rollout_index"])
    priced = rows["cost_usd"].notna().any() if "cost_usd" in rows else False
    judge = int((_column(rows, "judge_prompt_tokens") + _column(rows, "judge_completion_tokens")).sum())
    tokens = int(_column(rows, "total_tokens").sum()) + judge
    cost = float(rows["cost_usd"].sum()) if priced else None
    return RunSpend(tokens=tokens, judge_tokens=judge, cost_usd=cost, attempts=len(rows), rollouts=len(per_rollout),
                    tokens_per_rollout=tokens / len(per_rollout),
                    cost_per_rollout_usd=None if cost is None else cost / len(per_rollout),
                    tasks=_lines(tasks), top_rollouts=_lines(per_rollout))


def read_spend(root: Any, run_id: str) -> RunSpend:
    """``spend_of`` the rows of run ``run_id`` in the dataset at ``root``, every attempt.

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    from prefect_rollouts.traces.read import read_rollouts

    return spend_of(read_rollouts(root, columns=SPEND_COLUMNS, attempts="all", run_id=run_id))


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    return rows[name].fillna(0).astype("int64") if name in rows else pd.Series(0, index=rows.index, dtype="int64")


def _lines(table: pd.DataFrame) -> list[SpendLine]:
    return [SpendLine(environment=str(row["environment"]), task_id=str(row["task_id"]),
                      rollout_index=int(row["rollout_index"]) if "rollout_index" in row else None,
                      attempts=int(row["attempts"]), tokens=int(row["tokens"]),
                      cost_usd=None if pd.isna(row["cost_usd"]) else float(row["cost_usd"]))
            for _, row in table.head(TOP_SPENDERS).iterrows()]
