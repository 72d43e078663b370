"""The harness protocol, the narrow context a segment sees, and the one model call every harness makes."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from prefect_rollouts.config.agent import AgentConfig
from prefect_rollouts.errors import ProviderError, scrub
from prefect_rollouts.pricing import call_cost_usd
from prefect_rollouts.trace import KEPT_MESSAGE_KEYS, ModelCall, SendRecord, Trace, note_unknown_usage

if TYPE_CHECKING:
    from prefect_rollouts.model import ModelClient
    from prefect_rollouts.runtimes import Runtime
    from prefect_rollouts.task import Task


class SegmentContext(Protocol):
    """What a harness sees of its rollout: the conversation (``trace``), the model ``client``,
    the agent ``config`` (sampling, caps), the ``task`` (its tools), the ``runtime``, the steer
    inbox, the sampled-response count and how many of the segment's first messages are its input
    (a program harness replaces them with the program's own). Nothing of the orchestration."""

    config: AgentConfig
    task: Task
    client: ModelClient
    trace: Trace
    runtime: Runtime | None
    steer_inbox: list[SendRecord]
    turns: int
    segment_inputs: int

    @property
    def stopped(self) -> bool: ...
    @property
    def segment_index(self) -> int: ...
    def turn_limit_reached(self) -> bool: ...
    async def budget_reached(self) -> bool: ...
    async def charge(self, tokens: int, cost_usd: float | None, usage_note: str | None = None) -> None: ...


class Harness(Protocol):
    """Drives the model through one segment at a time.

    ``open`` runs once in setup (after the runtime started); ``run_segment`` runs the model
    on ``ctx.trace.messages`` (the new user input is already appended) until the segment
    ends, appending every message to the trace and stopping it (``trace.stop``) when the run
    is over. ``can_steer`` says whether it injects ``ctx.steer_inbox`` messages at its safe
    points (before each model call). An optional ``close()`` runs once in teardown, after the
    runtime stopped (a program harness removes its socket's directory). Raising ends the segment;
    the rollout records the error or, for a retryable one, runs the segment again, resuming from
    the trace.
    """

    id: str
    can_steer: bool
    binds: dict[str, str]
    """Host directories the runtime must mount (host path -> path inside); empty for in-process loops."""

    async def open(self, ctx: SegmentContext) -> None: ...
    async def run_segment(self, ctx: SegmentContext) -> None: ...


def request_template(config: AgentConfig) -> dict[str, Any]:
    """The request-body keys every call of a rollout shares: model and sampling (built once)."""
    sampling = config.sampling
    body: dict[str, Any] = {"model": config.model, **sampling.request_keys()}
    if config.max_turn_tokens is not None:
        body["max_tokens"] = config.max_turn_tokens
    body.update(sampling.extra)
    return body


def scrub_message(message: dict[str, Any], extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """``message`` with registered secrets (and ``extra``) scrubbed from its text: a string
    ``content``, the text of content parts (a thinking block's too), and the ``arguments`` of its tool
    calls. Returns the same dict when nothing changed, else a copy (the caller's message is never mutated)."""
    changed: dict[str, Any] = {}
    content = message.get("content")
    if isinstance(content, str):
        if (cleaned := scrub(content, extra)) != content:
            changed["content"] = cleaned
    elif isinstance(content, list):
        parts = [_scrub_part(part, extra) for part in content]
        if parts != content:
            changed["content"] = parts
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        cleaned_calls = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(function, dict) and isinstance(arguments, str) \
                    and (cleaned := scrub(arguments, extra)) != arguments:
                call = {**call, "function": {**function, "arguments": cleaned}}
            cleaned_calls.append(call)
        if cleaned_calls != calls:
            changed["tool_calls"] = cleaned_calls
    return {**message, **changed} if changed else message


def _scrub_part(part: Any, extra: tuple[str, ...]) -> Any:
    """A content part with its ``text`` (and a kept Anthropic thinking block's ``thinking``) scrubbed;
    the same part when nothing changed."""
    if not isinstance(part, dict):
        return part
    changed = {key: cleaned for key in ("text", "thinking") if isinstance(part.get(key), str)
               and (cleaned := scrub(part[key], extra)) != part[key]}
    return {**part, **changed} if changed else part


async def sample(ctx: SegmentContext, template: dict[str, Any]) -> dict[str, Any] | None:
    """Make one model call on the trace's messages and append the assistant message.

    Checks ``max_turns`` first (the cap reached -> stop ``max_turns``, returns None, no call), then the
    eval's budget (reached -> stop ``budget``, returns None, no call). After the call, a ``length`` finish
    under ``max_turn_tokens`` stops the run as ``max_turn_tokens``, and the rollout's tokens reaching
    ``max_rollout_tokens`` stop it as ``max_rollout_tokens`` (before the next call). Records a
    ``ModelCall`` (also for a failed or cancelled call: its failed attempts, status and error) and the
    usage, cached and reasoning tokens and the cost (``pricing.call_cost_usd``, the client's ``price``)
    included, and charges the call to the eval's budget.

    Returns:
        The assistant message as appended (content ``""`` rather than null), or None.

    Raises:
        ProviderError: the call failed after the client's retries.
    """
    config, trace = ctx.config, ctx.trace
    if ctx.turn_limit_reached() or await ctx.budget_reached():
        return None
    body = dict(template)
    body["messages"] = trace.messages
    started_at, started = time.time(), time.perf_counter()
    try:
        completion = await ctx.client.complete(body)
    except ProviderError as exc:
        trace.model_calls.append(ModelCall(
            segment=ctx.segment_index, started_at=started_at, latency_ms=(time.perf_counter() - started) * 1e3,
            retries=exc.retries, attempts=exc.attempts, status_code=exc.status_code, error=scrub(str(exc))))
        raise
    except asyncio.CancelledError:  # a deadline (or the caller) cut the call short: keep it visible
        trace.model_calls.append(ModelCall(
            segment=ctx.segment_index, started_at=started_at, latency_ms=(time.perf_counter() - started) * 1e3,
            error="cancelled before the response arrived (a stage deadline or the caller)"))
        raise
    trace.model_calls.append(ModelCall(
        segment=ctx.segment_index, started_at=started_at, latency_ms=(time.perf_counter() - started) * 1e3,
        prompt_tokens=completion.prompt_tokens, completion_tokens=completion.completion_tokens,
        cached_tokens=completion.cached_tokens, reasoning_tokens=completion.reasoning_tokens,
        cache_write_tokens=completion.cache_write_tokens, finish_reason=completion.finish_reason,
        retries=completion.retries, attempts=completion.attempts, status_code=completion.status_code))
    cost = call_cost_usd(getattr(ctx.client.config, "price", None), completion.prompt_tokens,
                         completion.completion_tokens, completion.cached_tokens, completion.cache_write_tokens)
    trace.usage.add(completion.prompt_tokens, completion.completion_tokens, completion.cached_tokens,
                    completion.reasoning_tokens, cost, completion.cache_write_tokens)
    if completion.usage_note:
        note_unknown_usage(trace, completion.usage_note)
    await ctx.charge(completion.prompt_tokens + completion.completion_tokens, cost, completion.usage_note)
    ctx.turns += 1
    raw = completion.message
    # text from outside: a server or proxy may echo the request's key into the reply
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content") or ""}
    if raw.get("tool_calls"):
        message["tool_calls"] = raw["tool_calls"]
    message.update((key, raw[key]) for key in KEPT_MESSAGE_KEYS if key in raw)
    message = scrub_message(message)
    trace.messages.append(message)
    if config.max_turn_tokens is not None and completion.finish_reason == "length":
        trace.stop("max_turn_tokens")
    if config.max_rollout_tokens is not None and trace.usage.total_tokens >= config.max_rollout_tokens:
        trace.stop("max_rollout_tokens")
    return message
