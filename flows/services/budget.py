"""An eval's budget across shards and workers: a Prefect global concurrency limit used as a counter.

A run's spend must be one number that every process running its rollouts (the eval's, and each shard
flow run's on any worker) reads before each model call and adds to after it. Prefect's global
concurrency limits are such a number: the server increments ``active_slots`` atomically
(``POST /v2/concurrency_limits/increment``, one SQL ``UPDATE``), every worker already reaches the
server, and the UI shows it (Concurrency -> Global). So the run keeps one limit per budget kind,
``budget-tokens-<run id>`` (tokens) and ``budget-usd-<run id>`` (micro-dollars), whose ``active_slots``
is the spend: never released, no slot decay, its ``limit`` the largest the server stores (``SLOT_MAX``)
so an increment is never refused. A count past ``UNITS_MAX`` is scaled (``GclLedger.unit``).

The eval flow seeds the counters before the first shard (``seed_shared_budget``: ``active_slots`` = the
spend of the run's durable rows, every attempt, judges included, so a ``--resume`` starts from what the
rows hold and a larger budget goes on from there); each shard builds a ``Budget`` over them
(``shared_budget``). A rollout reads the counter before each model call (one API call) and increments it
after (one more); once any process sees it reached, no call starts there. Overshoot: at most the calls in
flight when it was reached (one per rollout in flight over every shard, one per judge of a rollout
being scored); ``tests/scaleout/test_work_pool.py`` measures it. While the API is away the ledger
keeps counting in memory and sends the sum once it answers (its last read counts as the run's total).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import httpx
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.exceptions import ObjectNotFound
from prefect.states import Failed, State

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.errors import EvalFailedError
from prefect_rollouts.evals.budget import Budget, Spend, rows_spend
from prefect_rollouts.evals.plan import RolloutKey, retry_predicate
from prefect_rollouts.flows.services.keys import prefect_key
from prefect_rollouts.traces.store import DatasetRoot

log = logging.getLogger("prefect_rollouts.budget")

SLOT_MAX = 2**31 - 1
"""The largest ``limit`` and ``active_slots`` a global concurrency limit holds (a 32-bit integer column)."""
UNITS_MAX = 10**9
"""A budget is counted in units small enough that it fits this many (twice over within ``SLOT_MAX``)."""
MICRO_USD = 1e-6
"""The cost counter's unit before scaling: one micro-dollar."""
STATE_NAME = "BudgetReached"
"""The name of the eval flow run's final (Failed) state when its budget stopped it."""


class BudgetReachedError(EvalFailedError):
    """The eval's token or cost budget stopped it with rollouts not done: held by its ``BudgetReached``
    flow run state. ``spent`` is the run's ``Spend``; ``summary`` its ``EvalSummary``."""

    def __init__(self, message: str, summary: object, spent: Spend) -> None:
        super().__init__(message, summary)
        self.spent = spent


def counter_name(run_id: str, kind: str) -> str:
    """``budget-tokens-<run id>`` or ``budget-usd-<run id>`` (the run id made a key: ``keys.prefect_key``)."""
    return prefect_key(f"budget-{kind}-", run_id, limit=200)


class GclLedger:
    """A ``Ledger`` over the run's global concurrency limits (see the module docstring).

    Args:
        run_id: The eval run.
        token_budget, cost_budget_usd: The run's budgets; a counter exists for each one set. They fix
            each counter's unit: 1 token (or 1 micro-dollar) unless the budget exceeds ``UNITS_MAX`` of
            them, then ``ceil(budget / UNITS_MAX)``; a call's count is rounded up to whole units.
    """

    def __init__(self, run_id: str, token_budget: int | None, cost_budget_usd: float | None,
                 client: PrefectClient | None = None) -> None:
        self.client = client
        """An open client to use for every call (``open_shared_budget``); None: one per call (each costs a
        new HTTP client: ~50 ms of CPU, benchmarks/budget_counter.py)."""
        self.names: dict[str, str] = {}
        self.units: dict[str, float] = {}
        if token_budget is not None:
            self.names["tokens"] = counter_name(run_id, "tokens")
            self.units["tokens"] = float(max(1, math.ceil(token_budget / UNITS_MAX)))
        if cost_budget_usd is not None:
            self.names["usd"] = counter_name(run_id, "usd")
            self.units["usd"] = MICRO_USD * max(1, math.ceil(cost_budget_usd / MICRO_USD / UNITS_MAX))
        self._unsent = Spend()
        self._last = Spend()

    def slots(self, spend: Spend) -> dict[str, int]:
        """``spend`` as whole units of each counter (rounded up: a call is never counted as less)."""
        amounts = {"tokens": spend.tokens, "usd": spend.cost_usd}
        return {kind: math.ceil(amounts[kind] / unit - 1e-9) for kind, unit in self.units.items()}

    def spend_of(self, slots: dict[str, int]) -> Spend:
        """The ``Spend`` counters hold (``slots`` by kind)."""
        return Spend(int(slots.get("tokens", 0) * self.units.get("tokens", 1)),
                     slots.get("usd", 0) * self.units.get("usd", MICRO_USD))

    async def add(self, spend: Spend) -> None:
        """Increment each counter by ``spend`` (and whatever an outage left unsent)."""
        pending = self._unsent + spend
        try:
            async with self._client() as client:
                for kind, count in self.slots(pending).items():
                    if count > 0:
                        await client.increment_concurrency_slots([self.names[kind]], count, "concurrency")
        except (httpx.HTTPError, OSError) as exc:
            log.warning("budget counters of %s: could not add the spend (%s); kept to send later",
                        ", ".join(self.names.values()), exc)
            self._unsent = pending
            return
        self._unsent = Spend()

    async def total(self) -> Spend:
        """The counters' ``active_slots`` as a ``Spend`` (plus what is still unsent); the last read
        (with the unsent spend) when the API does not answer."""
        try:
            async with self._client() as client:
                slots = {kind: (await client.read_global_concurrency_limit_by_name(name)).active_slots
                         for kind, name in self.names.items()}
        except (httpx.HTTPError, OSError, ObjectNotFound) as exc:
            log.warning("budget counters of %s: could not read them (%s); using the last total",
                        ", ".join(self.names.values()), exc)
            return self._last + self._unsent
        self._last = self.spend_of(slots)
        return self._last + self._unsent


    def _client(self) -> contextlib.AbstractAsyncContextManager[PrefectClient]:
        """The open client (kept open), else a new one for this call."""
        return contextlib.nullcontext(self.client) if self.client is not None else get_client()


def shared_budget(config: EvalConfig, run_id: str, client: PrefectClient | None = None) -> Budget | None:
    """The run's ``Budget`` over its counters (``GclLedger``, through ``client`` if given); None without a budget."""
    if config.token_budget is None and config.cost_budget_usd is None:
        return None
    return Budget(config.token_budget, config.cost_budget_usd,
                  GclLedger(run_id, config.token_budget, config.cost_budget_usd, client))


@contextlib.asynccontextmanager
async def open_shared_budget(config: EvalConfig, run_id: str) -> AsyncIterator[Budget | None]:
    """``shared_budget`` over one Prefect client kept open while it is used (a shard's rollouts: two API
    calls per model call); None without a budget (and no client opened)."""
    if config.token_budget is None and config.cost_budget_usd is None:
        yield None
        return
    async with get_client() as client:
        yield shared_budget(config, run_id, client)


async def seed_shared_budget(config: EvalConfig, root: DatasetRoot, run_id: str, client: PrefectClient | None = None,
                             *, local: bool = False) -> Budget | None:
    """Create the run's counters, or raise them to the spend of its durable rows (``rows_spend``), before
    any rollout runs, and return the eval's own ``Budget`` over them; None without a budget.

    A counter is never lowered: its spend is ``max(counter, rows)`` (a killed process counted calls its
    rows never held). ``local`` (an eval without a work pool): the budget is a ``MirroredLedger`` over the
    counters (``client`` its open Prefect client), so the spend survives a killed eval on the server.
    """
    budget = shared_budget(config, run_id)
    if budget is None:
        return None
    ledger = budget.ledger
    assert isinstance(ledger, GclLedger)
    slots = ledger.slots(rows_spend(root, run_id))
    async with contextlib.nullcontext(client) if client is not None else get_client() as api:
        for kind, name in ledger.names.items():
            try:
                counted = (await api.read_global_concurrency_limit_by_name(name)).active_slots
            except ObjectNotFound:
                await api.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                    name=name, limit=SLOT_MAX, active_slots=min(slots[kind], SLOT_MAX), slot_decay_per_second=0.0))
                continue
            slots[kind] = max(slots[kind], counted)
            await api.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(
                limit=SLOT_MAX, active_slots=min(slots[kind], SLOT_MAX), active=True, slot_decay_per_second=0.0))
    if not local:
        return budget
    mirrored = GclLedger(run_id, config.token_budget, config.cost_budget_usd, client)
    return Budget(config.token_budget, config.cost_budget_usd, MirroredLedger(ledger.spend_of(slots), mirrored))


class MirroredLedger:
    """A local eval's ``Ledger``: the total in memory (read before each call at no cost: one process runs
    every rollout), each addition also sent to the run's counters (``GclLedger``: one API call per model
    call), so the spend of an eval killed before its rows were written survives on the Prefect server and a
    resume starts from it (``seed_shared_budget``). While the API is away the counters get the sum later."""

    def __init__(self, start: Spend, counters: GclLedger) -> None:
        self._total = start
        self.counters = counters

    async def add(self, spend: Spend) -> None:
        """See ``Ledger.add``."""
        self._total = self._total + spend
        await self.counters.add(spend)

    async def total(self) -> Spend:
        """See ``Ledger.total``."""
        return self._total


async def budget_stop(config: EvalConfig, root: DatasetRoot, run_id: str, plan: list[RolloutKey],
                      budget: Budget | None, due: Mapping[RolloutKey, int] | None = None) -> BudgetStopped | None:
    """Whether the run's budget stopped it (``BudgetStopped``), or None when there is no budget, it was not
    reached, or every planned rollout is done anyway.

    A rollout is **not done** when it has no row, its latest attempt is not done (``budget``), its latest
    attempt is older than the one this eval meant to run (``due``: the eval's ``todo``, e.g. an error
    ``--retry-errors`` was to run again), or it errored and ``max_rollout_attempts`` still retries it
    (``plan.retry_predicate``). The spend is the larger of the rows' (``rows_spend``) and the shared
    counters' (work pool: a shard that died spent what its rows never held). The message names the spend,
    the budget and how many rollouts are not done, e.g. ``spent 1,234 tokens, $0.0000 of token_budget =
    1,000: 5 of 8 rollouts not done (2 stopped as budget, 1 not started, 2 errored and due a retry)``.
    """
    if config.token_budget is None and config.cost_budget_usd is None:
        return None
    from prefect_rollouts.traces.read import latest_attempts

    budget = budget or Budget(config.token_budget, config.cost_budget_usd, _NoLedger())
    spent = rows_spend(root, run_id)
    if not isinstance(budget.ledger, _NoLedger):
        counted = await budget.ledger.total()
        spent = Spend(max(spent.tokens, counted.tokens), max(spent.cost_usd, counted.cost_usd))
    latest = latest_attempts(root, run_id)
    due, in_run = due or {}, retry_predicate(config)
    stopped = sum(1 for key in plan if key in latest and not latest[key].done)
    unstarted = sum(1 for key in plan if key not in latest)
    retry = sum(1 for key in plan if key in latest and latest[key].done
                and (latest[key].attempt < due.get(key, 0) or in_run(latest[key])))
    not_done = stopped + unstarted + retry
    if not budget.over(spent) or not not_done:
        return None
    budget.spent = spent
    retried = f", {retry} errored and due a retry" if retry else ""
    return BudgetStopped(f"spent {spent.text()} of {budget.limits_text()}: {not_done} of {len(plan)} rollouts not "
                         f"done ({stopped} stopped as budget, {unstarted} not started{retried})", spent, not_done)


@dataclass(frozen=True, slots=True)
class BudgetStopped:
    """How the budget stopped a run: ``message`` (spend, budget, rollouts not done), ``spent``, ``not_done``
    (rollouts a resume with a larger budget runs: no row, stopped as ``budget``, or an error due a retry)."""

    message: str
    spent: Spend
    not_done: int


def budget_state(message: str, summary: object, spent: Spend) -> State[object]:
    """The eval flow run's final state when its budget stopped it: Failed, named ``BudgetReached``."""
    return Failed(name=STATE_NAME, message=f"budget reached: {message}",
                  data=BudgetReachedError(f"budget reached: {message}", summary, spent))


class _NoLedger:
    """Stands in where only the rows count (an eval in one process: its rows hold every call)."""

    async def add(self, spend: Spend) -> None:
        """Nothing to add."""

    async def total(self) -> Spend:
        """Nothing beyond the rows."""
        return Spend()
