"""An eval run's token and cost budget: what the run has spent, and the one rule that stops it.

``Budget`` is shared by every rollout of the run in one process (``EvalRun.budget``, and each rollout's
``RolloutState.budget``). Each rollout asks it before every model call (``Budget.check``: the run's
spend has reached ``token_budget`` or ``cost_budget_usd`` -> the rollout stops as ``budget`` at that
boundary, as ``max_turns`` stops it) and charges it after every call (``Budget.charge``). The engine asks
it before starting a rollout: once reached, no new rollout starts.

Where the spend is kept is a ``Ledger``:

- ``MemoryLedger``: one process runs the whole run (the inline engine without Prefect). It starts from the
  spend of the run's durable rows (``rows_spend``: every attempt, judges included), so a resume counts
  what earlier attempts spent. The eval flow without a work pool mirrors it to Prefect-side counters
  (``flows/services/budget.py``: ``MirroredLedger``), so a killed eval's spend survives.
- Across shards and workers (``[dispatch] work_pool``) the Prefect layer gives a ledger every process
  shares (``flows/services/budget.py``: a Prefect global concurrency limit used as a counter).

Overshoot: a rollout checks before each call and charges after it, so once the budget is reached no
further call starts anywhere that sees the ledger; what lands past it is at most the calls that were in
flight then (one per rollout in flight, one per judge of a rollout being scored: judge calls check and
charge like agent calls, ``scoring.judge_base.JUDGE_BUDGET``). ``tests/core/test_budget.py`` measures it.
Must not import Prefect.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from prefect_rollouts.traces.store import DatasetRoot

log = logging.getLogger("prefect_rollouts.budget")

SPEND_COLUMNS = ["total_tokens", "judge_prompt_tokens", "judge_completion_tokens", "cost_usd"]
"""The ``rollouts`` columns a run's spend is summed from."""


@dataclass(frozen=True, slots=True)
class Spend:
    """Tokens (prompt + completion, judges included) and USD (of priced calls) spent."""

    tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.tokens + other.tokens, self.cost_usd + other.cost_usd)

    def text(self) -> str:
        """``12,345 tokens, $0.0123``."""
        return f"{self.tokens:,} tokens, ${self.cost_usd:.4f}"


class Ledger(Protocol):
    """Where a run's spend is kept; every process of the run that shares one sees one total."""

    async def add(self, spend: Spend) -> None:
        """Count ``spend`` (one model call's, or a rollout's judge calls')."""
        ...

    async def total(self) -> Spend:
        """The run's spend so far, as every process that shares the ledger has counted it."""
        ...


class MemoryLedger:
    """A ledger in this process: the run's rows' spend when it started (``start``), plus what was added."""

    def __init__(self, start: Spend = Spend()) -> None:
        self._total = start

    async def add(self, spend: Spend) -> None:
        """See ``Ledger.add``."""
        self._total = self._total + spend

    async def total(self) -> Spend:
        """See ``Ledger.total``."""
        return self._total


class Budget:
    """The budget of one eval run (``EvalConfig.token_budget``, ``cost_budget_usd``) over a ``Ledger``.

    Args:
        token_budget: Tokens the run may spend; None for no token budget.
        cost_budget_usd: USD the run may spend; None for no cost budget.
        ledger: Where the spend is kept.

    Once reached it stays reached in this process (``is_reached``), also if a ledger read fails later.
    """

    def __init__(self, token_budget: int | None, cost_budget_usd: float | None, ledger: Ledger) -> None:
        self.token_budget = token_budget
        self.cost_budget_usd = cost_budget_usd
        self.ledger = ledger
        self.spent = Spend()
        """The last total this process read or made (``check``, ``charge``)."""
        self.is_reached = False
        self.warned_unknown = False

    def over(self, spend: Spend) -> bool:
        """Whether ``spend`` reaches a budget (``>=``: a budget of 1,000 tokens is reached at 1,000)."""
        return ((self.token_budget is not None and spend.tokens >= self.token_budget)
                or (self.cost_budget_usd is not None and spend.cost_usd >= self.cost_budget_usd))

    async def check(self) -> bool:
        """True when the run's spend (read from the ledger) has reached the budget: call before each
        model call and before starting a rollout."""
        if not self.is_reached:
            self.spent = await self.ledger.total()
            self.is_reached = self.over(self.spent)
        return self.is_reached

    async def charge(self, tokens: int, cost_usd: float | None, usage_note: str | None = None) -> None:
        """Count one call's ``tokens`` and ``cost_usd`` (None: no price: 0); ``usage_note``: the call's usage
        was missing or invalid (``warn_unknown``, once)."""
        if usage_note:
            self.warn_unknown(usage_note)
        if tokens or cost_usd:
            await self.ledger.add(Spend(tokens, cost_usd or 0.0))

    def warn_unknown(self, note: str) -> None:
        """Log once per budget (per process) that a call's usage was missing or invalid: such a call counts
        0 tokens (``model.completion.USAGE_MAX``), so the budget may never be reached."""
        if not self.warned_unknown:
            self.warned_unknown = True
            log.warning("budget: a model call's usage is unknown (%s); it counts 0 tokens against %s, and "
                        "so may every such call (the trace's info usage_unknown lists them)", note,
                        self.limits_text())

    def limits_text(self) -> str:
        """``token_budget = 10,000`` and/or ``cost_budget_usd = 0.5``, as the keys are written."""
        parts = ([f"token_budget = {self.token_budget:,}"] if self.token_budget is not None else []) + (
            [f"cost_budget_usd = {self.cost_budget_usd:g}"] if self.cost_budget_usd is not None else [])
        return " and ".join(parts)

    def raised_overrides(self, not_done: int, per_rollout: Spend | None) -> list[str]:
        """``--set`` items with each budget raised to an estimate of what finishing the run takes (the
        resume command a stop prints): the spend so far plus ``not_done`` rollouts at ``per_rollout`` each
        (``resume_estimate``); None (nothing to go by): twice each budget. Only an estimate."""
        if per_rollout is None:
            need = Spend(2 * (self.token_budget or 0), 2 * (self.cost_budget_usd or 0.0))
        else:
            need = self.spent + Spend(not_done * per_rollout.tokens, not_done * per_rollout.cost_usd)
        items = []
        if self.token_budget is not None:
            items.append(f"token_budget={max(need.tokens, self.spent.tokens + 1)}")
        if self.cost_budget_usd is not None:
            items.append(f"cost_budget_usd={max(need.cost_usd, self.spent.cost_usd * 1.01, 1e-4):.4g}")
        return items


def resume_estimate(root: str | DatasetRoot, run_id: str, caps: Collection[int | None]) -> tuple[Spend | None, str]:
    """What one rollout not done will spend, for the resume command, and how that was estimated (text).

    The mean spend (tokens with judges, cost) of the run's finished rollouts (latest attempt without an
    error, not stopped as ``budget``: a rollout the budget cut short spent less than a whole one); without
    any, ``max_rollout_tokens`` when every environment sets it (``caps``; tokens only); else None (nothing
    to go by: ``Budget.raised_overrides`` doubles the budget).

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    from prefect_rollouts.trace import UNFINISHED_STOPS
    from prefect_rollouts.traces.read import read_rollouts

    rows = read_rollouts(root, columns=[*SPEND_COLUMNS, "stop_condition", "is_error"], run_id=run_id)
    finished = rows[~rows["is_error"].astype(bool) & ~rows["stop_condition"].isin(list(UNFINISHED_STOPS))]
    if len(finished):
        tokens = sum(finished[column].fillna(0) for column in SPEND_COLUMNS[:3])
        per = Spend(math.ceil(float(tokens.mean())), float(finished["cost_usd"].fillna(0.0).mean()))
        return per, f"each rollout not done at {per.text()}, the mean of the {len(finished)} finished ones"
    if caps and None not in caps:
        cap = max(cap for cap in caps if cap is not None)
        return Spend(cap, 0.0), f"no rollout finished: each rollout not done at max_rollout_tokens = {cap:,}"
    return None, "no rollout finished and no max_rollout_tokens: twice the budget"


def rows_spend(root: str | DatasetRoot, run_id: str) -> Spend:
    """What run ``run_id``'s durable rows spent: every attempt's agent and judge tokens, and cost
    (rows without ``cost_usd``, written before schema version 7 or without prices, count 0 USD).

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    from prefect_rollouts.traces.read import read_rollouts  # pyarrow and pandas load only when needed

    rows = read_rollouts(root, columns=SPEND_COLUMNS, attempts="all", run_id=run_id)
    if not len(rows):
        return Spend()
    tokens = sum(int(rows[column].fillna(0).sum()) for column in SPEND_COLUMNS[:3])
    return Spend(tokens, float(rows["cost_usd"].fillna(0.0).sum()))


def budget_of(config_token_budget: int | None, config_cost_budget_usd: float | None,
              ledger: Ledger) -> Budget | None:
    """A ``Budget`` over ``ledger`` when either budget is set, else None (no budget: nothing is asked)."""
    if config_token_budget is None and config_cost_budget_usd is None:
        return None
    return Budget(config_token_budget, config_cost_budget_usd, ledger)
