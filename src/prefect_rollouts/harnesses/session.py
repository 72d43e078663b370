"""One launch of an agent program as the interception endpoint sees it: rewrites, limits, recording.

A ``ProgramSession`` lives from the program's launch to its exit (one segment, or one attempt of
it). ``exchange`` turns each request of the program into one recorded model call of the rollout.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from prefect_rollouts.errors import ProviderError, scrub
from prefect_rollouts.harnesses.base import SegmentContext, request_template, sample, scrub_message
from prefect_rollouts.model.apis.base import IMPOSED_KEYS, NATIVE_KEY

IMPOSED_OUT = ("stream", "stream_options", "n", "max_completion_tokens", "user", "store", "metadata")
"""Request keys the endpoint does not pass upstream: it always asks for one non-streamed choice
(and streams the recorded one back itself); ``max_completion_tokens`` becomes ``max_tokens``."""

MAX_REFUSED = 20
"""Refused requests listed on a trace (``trace.info["endpoint"]["refused"]``); past it, ``refused_more``
counts them: a program retrying a refused request in a loop must not grow its trace without bound."""

RETRY_HEADER = "x-stainless-retry-count"
"""The OpenAI SDKs' retry counter: above 0 on the same body, the exchange is a retry."""


def stopped_message(condition: str) -> str:
    """The refusal text of a request after the rollout stopped (HTTP 400; the dialect's ``stop_status``)."""
    return f"rollout stopped: {condition}"


@dataclass(eq=False)
class ProgramSession:
    """The endpoint's state for one launch of a program.

    Attributes:
        ctx: The rollout's segment context (trace, client, config, steer inbox).
        prompt: The turn's user message, as text (the launcher writes it to ``PROMPT_FILE``).
        system_prompt: The task's system prompt on the first turn (``SYSTEM_PROMPT_FILE``), else None.
        carried: The conversation before this segment, sent ahead of the program's own messages
            (a later turn of an interaction continues it).
        secret: The bearer token of this launch (``OPENAI_API_KEY`` in the runtime).
        stopped: Set once the rollout stopped (a limit hit, a refusal sent).
    """

    ctx: SegmentContext
    prompt: str
    system_prompt: str | None
    carried: list[dict[str, Any]]
    secret: str = field(default_factory=lambda: "sk-rollout-" + secrets.token_urlsafe(24))
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    calls: int = 0
    """Model calls made for this launch (sampled responses, failed ones included)."""
    provider_error: ProviderError | None = None
    """The upstream failure relayed to the program, when no call has succeeded since."""
    unserved: str | None = None
    """The first route the program asked for that the endpoint does not serve (``"POST /v1/responses"``)."""
    main_model: str | None = None
    """The model the launch's first request (not a probe) asked for: a request asking another is a side
    request (``side``)."""
    _main_known: bool = False
    _main_tools: bool = False
    _splices: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _template: dict[str, Any] | None = None

    @property
    def upstream_api(self) -> str:
        """The wire API the agent's client speaks upstream (``ClientConfig.api``; ``"chat"`` for a client
        without one, e.g. a harness that needs no model)."""
        api = getattr(getattr(self.ctx, "client", None), "api", None)
        return getattr(api, "name", "chat")

    def refused(self, method: str, path: str, status: int, reason: str) -> None:
        """Record a request the endpoint refused or does not serve on the trace:
        ``trace.info["endpoint"]["refused"]``, a list of ``{"method", "path", "status", "reason"}``
        (path and reason scrubbed and cut to 200 and 300 characters), at most ``MAX_REFUSED``, then
        ``refused_more`` counts the rest. A 404 or 405 also sets ``unserved`` (the first one)."""
        path, reason = scrub(path, (self.secret,))[:200], scrub(reason, (self.secret,))[:300]
        if status in (404, 405) and self.unserved is None:
            self.unserved = f"{method} {path}"
        record = self.ctx.trace.info.setdefault("endpoint", {})
        listed = record.setdefault("refused", [])
        if len(listed) < MAX_REFUSED:
            listed.append({"method": method, "path": path, "status": status, "reason": reason})
        else:
            record["refused_more"] = record.get("refused_more", 0) + 1

    async def exchange(self, body: Any, raw: bytes, headers: Mapping[str, str],
                       translated: dict[str, Any] | None = None,
                       alternates: bool = False) -> tuple[int, dict[str, Any]]:
        """Answer one chat-completions request of the program: ``(HTTP status, JSON body)``, the body
        a ``chat.completion`` or an OpenAI-shaped error (the route re-shapes both for its dialect).

        ``raw`` is the request's body as the program sent it, in its own dialect (a retry is known by
        its hash); ``translated``, for a request in another dialect (``harnesses/dialects``), is
        ``{"dialect": name, **what the translation lost}``, recorded with the call's rewrites;
        ``alternates``: the dialect's turns alternate strictly (Messages), so a steer landing after a
        user message joins it as a text part instead of following it.

        A side request (``side``: a probe, another model than the launch's first request asked for, no
        tools where it offered some: Claude Code's background calls) is sampled and counted like any other
        (``max_turns``, usage, ``model_calls``) but does not touch the conversation: the trace's
        messages stay the main one's, no steer is delivered into it, no carried history is put ahead of
        it, a ``length`` finish under the program's own smaller ``max_tokens`` does not stop the run as
        ``max_turn_tokens``; its rewrites record ``side`` and ``trace.info["endpoint"]["side_requests"]``
        lists it (call index, kind, model asked, the reply's first 200 characters).

        In order: a retried exchange (same ``Idempotency-Key``, or ``x-stainless-retry-count`` > 0
        with a body already answered) gets the recorded response, nothing is sampled twice; once the
        rollout stopped (or ``max_turns`` responses were sampled) the request is refused, 400
        ``rollout stopped: <condition>`` (``max_turns``, ``max_turn_tokens``, ``max_rollout_tokens``, the
        eval's ``budget``); a body that is not a chat-completions request (no
        ``messages``, a field of the wrong type: ``_Request``) is a 400 naming the fields.
        Otherwise the request is rewritten and sent upstream through the agent's client: the
        carried conversation ahead of the program's messages (the program's own leading system and
        developer messages dropped when the carried one starts with one; their text and tool-call
        arguments scrubbed of secrets,
        as the in-process loop scrubs its tool results), steer messages spliced as user messages (a new one
        after the program's last message, and every earlier one at its place again), ``model``
        and ``[env.agent.sampling]`` imposed, ``max_tokens`` capped at ``max_turn_tokens``. The
        call is recorded (``sample``) with every rewrite in ``trace.info["program_rewrites"]``.
        An upstream failure is relayed with its status (502 when none) and kept for the segment.
        """
        async with self._lock:
            key = headers.get("idempotency-key")
            digest = hashlib.sha256(raw).hexdigest()
            retry = headers.get(RETRY_HEADER, "0").strip() not in ("", "0")
            recorded = self._replies.get(f"key:{key}") if key else None
            if recorded is None and retry:
                recorded = self._replies.get(f"body:{digest}")
            if recorded is not None:
                return 200, recorded
            ctx = self.ctx
            if ctx.stopped or ctx.turn_limit_reached() or await ctx.budget_reached():
                self.stopped.set()
                return 400, _error(stopped_message(ctx.trace.stop_condition or "max_turns"), "rollout_stopped")
            problem = _check(body)
            if problem:
                return 400, _error(problem, "invalid_request")
            first = not self._main_known
            kind = self.side(body)
            request, messages, rewrites = self._rewrite(body, kind, alternates)
            if translated is not None:
                rewrites["translated"] = translated
            main = list(ctx.trace.messages) if kind else None
            ctx.trace.messages[:] = messages
            if first and kind is None:   # the program's input messages are not part of the segment's output
                ctx.segment_inputs = _inputs(messages[len(self.carried):])
            self.calls += 1
            before = ctx.trace.stop_condition
            try:
                message = await sample(ctx, request)
            except ProviderError as exc:
                self.provider_error = exc
                status = exc.status_code if exc.status_code and exc.status_code >= 400 else 502
                return status, _error(scrub(f"upstream model call failed: {exc}"), "upstream_error")
            finally:
                if kind is not None and main is not None:
                    self._aside(kind, body, request, before, main, len(messages))
                if rewrites:
                    ctx.trace.info.setdefault("program_rewrites", []).append(
                        {"call": len(ctx.trace.model_calls) - 1, **rewrites})
            self.provider_error = None
            if ctx.stopped:
                self.stopped.set()
            if message is None:   # only when the turn cap or the eval's budget was reached meanwhile
                self.stopped.set()
                return 400, _error(stopped_message(ctx.trace.stop_condition or "max_turns"), "rollout_stopped")
            reply = _completion(ctx, message)
            self._replies[f"body:{digest}"] = reply
            if key:
                self._replies[f"key:{key}"] = reply
            return 200, reply

    def side(self, body: dict[str, Any]) -> str | None:
        """What kind of side request ``body`` is (``exchange``), or None for the main conversation:
        ``"probe"`` (``max_tokens`` 1: Claude Code's quota check), ``"other_model"`` (a model other than
        the one the launch's first non-probe request asked for, ``main_model``: Claude Code's calls to
        its small fast model, when that has a name of its own), ``"no_tools"`` (no tools, where that
        first request offered some: an agent's main loop always offers its tools, its title and
        summary calls do not)."""
        if body.get("max_tokens", body.get("max_completion_tokens")) == 1:
            return "probe"
        if not self._main_known:
            self.main_model, self._main_known, self._main_tools = body.get("model"), True, bool(body.get("tools"))
            return None
        if body.get("model") != self.main_model:
            return "other_model"
        return "no_tools" if self._main_tools and not body.get("tools") else None

    def _aside(self, kind: str, body: dict[str, Any], request: dict[str, Any], before: str | None,
               main: list[dict[str, Any]], sent: int) -> None:
        """After a side request's call (``sent`` messages): the main conversation back on the trace,
        the side call listed."""
        trace = self.ctx.trace
        reply = trace.messages[-1] if len(trace.messages) > sent else None
        trace.messages[:] = main
        cap = self.ctx.config.max_turn_tokens
        if before is None and trace.stop_condition == "max_turn_tokens" and cap is not None \
                and request.get("max_tokens", cap) < cap:   # its own small max_tokens, not the rollout's cap
            trace.stop_condition = None
        listed = trace.info.setdefault("endpoint", {}).setdefault("side_requests", [])
        if len(listed) < MAX_REFUSED:
            text = reply.get("content") if reply and reply.get("role") == "assistant" else None
            listed.append({"call": len(trace.model_calls) - 1, "kind": kind, "model": body.get("model"),
                           "reply": scrub(text, (self.secret,))[:200] if isinstance(text, str) else None})

    def _rewrite(self, body: dict[str, Any], side: str | None = None,
                 alternates: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        """``(request keys but messages, upstream messages, rewrites made)`` for ``body``; a ``side``
        request gets no steer and no carried history."""
        ctx = self.ctx
        rewrites: dict[str, Any] = {"side": side} if side else {}
        carried = self.carried if side is None else []
        if self._template is None:
            self._template = request_template(ctx.config)
        template = self._template
        own = [scrub_message(message, (self.secret,)) for message in body["messages"]]
        if carried and carried[0].get("role") in _INSTRUCTING:
            dropped = 0
            while own and own[0].get("role") in _INSTRUCTING:
                own.pop(0)
                dropped += 1
            if dropped:
                rewrites["dropped_system_messages"] = dropped
        if ctx.steer_inbox and side is None:
            landed = []
            for record in ctx.steer_inbox:
                self._splices.append((len(own), {"role": "user", "content": record.text}))
                record.status, record.delivered_segment = "delivered", ctx.segment_index
                record.delivered_call = len(ctx.trace.model_calls)
                landed.append(record.message_id)
            ctx.steer_inbox.clear()
            rewrites["steers_delivered"] = landed
        spliced: list[dict[str, Any]] = []
        at = 0
        for position, message in self._splices if side is None else ():
            position = min(position, len(own))
            spliced.extend(own[at:position])
            if alternates and spliced and spliced[-1].get("role") == "user":   # a text block of that turn
                spliced[-1] = _joined(spliced[-1], message["content"])
            else:
                spliced.append(message)
            at = max(at, position)
        spliced.extend(own[at:])
        if self._splices and side is None:
            rewrites["steers_spliced"] = len(self._splices)
        if carried:
            rewrites["carried_messages"] = len(carried)
        request = {key: value for key, value in body.items() if key != "messages" and key not in IMPOSED_OUT}
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        imposed: dict[str, Any] = {}
        for key, value in template.items():
            if key == "max_tokens" and isinstance(asked, int) and 0 < asked < value:
                value = asked
            if key in request or (key == "max_tokens" and asked is not None):
                previous = asked if key == "max_tokens" else request[key]
                if previous != value:
                    imposed[key] = {"program": previous, "sent": value}
            elif key == "model" and key not in request:
                imposed[key] = {"program": None, "sent": value}
            request[key] = value
        if "max_tokens" not in template and isinstance(asked, int):
            request["max_tokens"] = asked
        if body.get("n") not in (None, 1):
            imposed["n"] = {"program": body["n"], "sent": 1}
        if imposed:
            rewrites["imposed"] = imposed
        if isinstance(request.get(NATIVE_KEY), dict):   # the wire API lets none of the program's fields over these
            request[NATIVE_KEY] = {**request[NATIVE_KEY], IMPOSED_KEYS: sorted(template)}
        return request, [*carried, *spliced], rewrites


_INSTRUCTING = ("system", "developer")
"""Roles of the leading messages a program resends on every launch (its instructions: a Responses program
to a Responses upstream keeps ``developer`` as it is), dropped when the carried conversation has them."""


def _joined(message: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of user ``message`` with ``text`` as a last text part."""
    content = message.get("content")
    parts = list(content) if isinstance(content, list) else [{"type": "text", "text": content or ""}]
    return {**message, "content": [*parts, {"type": "text", "text": text}]}


class _Part(BaseModel):
    """A content part: its ``type`` a string (a list or object there was a 500: ``unhashable type``)."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[_Part] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None
    name: StrictStr | None = None


class _Request(BaseModel):
    """The keys of a chat-completions request the endpoint reads or passes on, with the types the
    OpenAI API gives them; any other key goes upstream as it is."""

    model_config = ConfigDict(extra="allow")
    messages: list[_Message] = Field(min_length=1)
    model: StrictStr | None = None
    stream: StrictBool | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    n: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | StrictInt | None = None
    top_p: StrictFloat | StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    stop: StrictStr | list[StrictStr] | None = None


def _check(body: Any) -> str | None:
    """What makes ``body`` unanswerable (each bad field with its place), or None."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    try:
        _Request.model_validate(body)
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
                         for error in exc.errors()[:5])
    return None


def _inputs(messages: list[dict[str, Any]]) -> int:
    """How many of a segment's first messages are input (before the first assistant message)."""
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            return index
    return len(messages)


def _completion(ctx: SegmentContext, message: dict[str, Any]) -> dict[str, Any]:
    """The recorded call as a ``chat.completion`` body for the program."""
    call = ctx.trace.model_calls[-1]
    usage: dict[str, Any] = {"prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
                             "total_tokens": call.prompt_tokens + call.completion_tokens}
    if call.cached_tokens is not None or call.cache_write_tokens is not None:   # the write: not chat's own
        usage["prompt_tokens_details"] = {"cached_tokens": call.cached_tokens or 0,
                                          **({"cache_write_tokens": call.cache_write_tokens}
                                             if call.cache_write_tokens is not None else {})}
    if call.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": call.reasoning_tokens}
    return {"id": f"chatcmpl-{ctx.trace.id}-{len(ctx.trace.model_calls)}", "object": "chat.completion",
            "created": int(call.started_at), "model": ctx.config.model,
            "choices": [{"index": 0, "message": message, "finish_reason": call.finish_reason or "stop"}],
            "usage": usage}


def _error(message: str, code: str) -> dict[str, Any]:
    kind = "invalid_request_error" if code != "upstream_error" else "api_error"
    return {"error": {"message": message, "type": kind, "code": code}}
