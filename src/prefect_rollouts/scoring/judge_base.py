"""The base of judge plugins (``Judge``) and the text helpers judges share.

``judges.py`` runs judges (clients, loading, recording); ``judge_plugins.py`` holds the
built-in ones. Both build on this module, which imports neither.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol

from prefect_rollouts.config.judge import JudgeConfig
from prefect_rollouts.errors import BudgetStop, JudgeError, ProviderError, scrub, scrub_cut
from prefect_rollouts.model.client import ModelClient
from prefect_rollouts.pricing import call_cost_usd
from prefect_rollouts.task import Task, qualname
from prefect_rollouts.threads import note_in, run_sync
from prefect_rollouts.trace import AttemptRecord, JudgeCall, Trace, content_text, note_unknown_usage

REPLY_CAP_CHARS = 4_000
"""Judge prompts and replies longer than this are cut on the trace (the parser sees the whole reply)."""

TOOL_OUTPUT_CAP_CHARS = 500
"""Tool results longer than this are cut in the transcript a judge reads."""



class JudgeBudget(Protocol):
    """What a judge call asks of the eval's budget (``evals.budget.Budget``), as an agent call does."""

    async def check(self) -> bool:
        """True when the run's spend has reached the budget (then no call starts)."""
        ...

    async def charge(self, tokens: int, cost_usd: float | None, usage_note: str | None = None) -> None:
        """Count one call's tokens and cost; ``usage_note``: its usage was missing or invalid (logged once)."""
        ...


JUDGE_BUDGET: ContextVar[JudgeBudget | None] = ContextVar("judge_budget", default=None)
"""The eval's budget while a rollout is scored (``stages.score`` sets it); None outside an eval with a budget.
Every judge call checks it before it starts and charges it after, so judges stop at the budget as agent
calls do (``docs/budgets.md``)."""


class Judge:
    """Base of judge plugins: renders a prompt, asks the judge model, parses the reply.

    Subclasses set ``template`` and implement ``score``; ``ask`` does the call and its
    bookkeeping. ``config`` is the plugin's config (``JudgeConfig`` or a subclass).

    Args:
        config: The judge's config; ``config.prompt`` replaces ``template`` when set.
        client: The judge model's client.
    """

    template: str = ""

    def __init__(self, config: JudgeConfig, client: ModelClient) -> None:
        self.config = config
        self.client = client
        self.name = config.reward_name

    def render(self, **fields: str) -> str:
        """The prompt: ``{field}`` placeholders of the template replaced in one pass; unknown
        placeholders (and any other braces, e.g. JSON examples) stay as they are."""
        template = self.config.prompt or self.template
        return re.sub(r"\{(\w+)\}", lambda m: fields.get(m.group(1), m.group(0)), template)

    async def ask(self, trace: Trace, prompt: str, parse: Callable[[str], Any]) -> Any:
        """Send ``prompt`` as one user message, record the call, return ``parse(reply)``.

        ``parse`` raises (e.g. ``ValueError``) when the reply is not a verdict; it runs in a worker
        thread (``threads.py``), so a slow or blocking parser stalls neither the event loop nor the
        other rollouts, and the scoring deadline still holds. The verdict is stored on the
        ``JudgeCall`` as JSON data (other values as their ``repr``).

        With an eval budget (``JUDGE_BUDGET``) the call checks it first and charges its tokens and cost after.

        Raises:
            JudgeError: the endpoint failed (after the client's retries) or ``parse`` raised;
                the call is on the trace either way, its tokens (and cost, with a ``price`` on the judge's
                client) in ``trace.judge_usage``.
            BudgetStop: the eval's budget was reached before the call (no call is made or recorded).
        """
        budget = JUDGE_BUDGET.get()
        if budget is not None and await budget.check():
            raise BudgetStop(f"judge {self.name!r}: the eval's budget was reached before its call")
        body = {**sampling_body(self.config), "model": self.config.model,
                "messages": [{"role": "user", "content": prompt}]}
        record = JudgeCall(judge=self.name, model=self.config.model, started_at=time.time(), latency_ms=0.0,
                           prompt=scrub_cut(prompt, REPLY_CAP_CHARS, note=False))
        trace.judge_calls.append(record)
        started = time.perf_counter()
        try:
            completion = await self.client.complete(body)
        except ProviderError as exc:
            record.status_code, record.retries = exc.status_code, exc.retries
            record.attempts = [AttemptRecord.model_validate(a) for a in exc.attempts]
            record.error = cap_text(str(exc))
            raise JudgeError(f"judge {self.name!r}: {record.error}", status_code=exc.status_code) from None
        except Exception as exc:
            record.error = cap_text(f"{type(exc).__name__}: {exc}")
            raise JudgeError(f"judge {self.name!r}: the call failed ({record.error})") from None
        except BaseException:  # cancelled, e.g. by the scoring deadline
            record.error = "cancelled"
            raise
        finally:
            record.latency_ms = (time.perf_counter() - started) * 1000
        record.status_code, record.retries = completion.status_code, completion.retries
        record.attempts = [AttemptRecord.model_validate(a) for a in completion.attempts]
        record.prompt_tokens, record.completion_tokens = completion.prompt_tokens, completion.completion_tokens
        record.cached_tokens, record.reasoning_tokens = completion.cached_tokens, completion.reasoning_tokens
        record.cache_write_tokens = completion.cache_write_tokens
        cost = call_cost_usd(getattr(self.client.config, "price", None), completion.prompt_tokens,
                             completion.completion_tokens, completion.cached_tokens, completion.cache_write_tokens)
        trace.judge_usage.add(completion.prompt_tokens, completion.completion_tokens, completion.cached_tokens,
                              completion.reasoning_tokens, cost, completion.cache_write_tokens)
        note = f"judge {self.name!r}: {completion.usage_note}" if completion.usage_note else None
        if note:
            note_unknown_usage(trace, note)
        if budget is not None:
            await budget.charge(completion.prompt_tokens + completion.completion_tokens, cost, note)
        reply = content_text(completion.message.get("content"))
        record.reply = scrub_cut(reply, REPLY_CAP_CHARS, note=False)
        try:   # parsers are plugin code: off the loop, like sync rewards (threads.py)
            verdict = await run_sync(functools.partial(parse, reply), f"the reply parser of judge {self.name!r} "
                                     f"({qualname(parse)})", note_in(trace.info))
        except asyncio.CancelledError:   # the scoring deadline
            record.error = "cancelled"
            raise
        except Exception as exc:
            record.error = cap_text(f"unparseable reply: {exc}")
            raise JudgeError(f"judge {self.name!r}: cannot parse the reply of {self.config.model!r} "
                             f"({cap_text(str(exc))}); a stronger judge model or a clearer prompt may help") from None
        record.verdict = _json_safe(verdict)
        return verdict

    async def score(self, task: Task, trace: Trace) -> float:
        """The judge's score of ``trace``, a finite number (the reward before ``weight``).

        May record metrics on ``trace`` (``<name>/<key>``). Raises ``JudgeError`` on failure.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement score(task, trace)")


def sampling_body(config: JudgeConfig) -> dict[str, Any]:
    """Request-body keys of the judge's ``sampling``: temperature 0 unless set, no tool choice
    (judges offer no tools), then ``sampling.extra``."""
    sampling = config.sampling
    return {"temperature": 0.0, **sampling.request_keys(), **sampling.extra}


def cap_text(text: str, limit: int = 300) -> str:
    """``text`` scrubbed of secrets, then cut to ``limit`` characters with a note of how many more
    there were (messages go to traces and Parquet)."""
    return scrub_cut(text, limit)


def _json_safe(value: Any) -> Any:
    """``value`` as JSON data (anything else becomes its ``repr``), scrubbed of secrets, capped like a reply."""
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):  # circular or too deep
        text = json.dumps(repr(value))
    text = scrub(text)
    if len(text) > REPLY_CAP_CHARS:
        return text[:REPLY_CAP_CHARS]
    try:
        return json.loads(text)
    except ValueError:  # a scrubbed secret spanned JSON syntax
        return text
