"""The trace: everything one rollout did, as data that round-trips through JSON.

Messages are kept in OpenAI wire form (plain dicts) and shared with the harness, so a model
call appends to the trace instead of copying it.

Typed parts (version 3): what another wire dialect needs resent unchanged and chat completions cannot
take is kept in a message's ``content`` list, beside its text parts, as that dialect's own item or
block, verbatim: a Responses ``reasoning`` item (``{"type": "reasoning", "id", "summary",
"encrypted_content"}``) on the assistant message it preceded; an Anthropic ``thinking`` or
``redacted_thinking`` block. Their types are ``KEPT_PART_TYPES``; a part may also carry keys of
``KEPT_PART_KEYS`` (Anthropic's ``cache_control``). The chat-completions client sends neither
(``model.wire.chat_messages``); the endpoint records what it kept back in
``info["program_rewrites"]``. A message or tool call from a Responses item may carry that item's own
fields (its ``id``, ``status``) under ``RESPONSES_ITEM``. For a Messages upstream
(``ClientConfig.api = "messages"``) a Messages program's messages keep all of its blocks (documents,
citations, server tool blocks verbatim), a ``tool`` message the ``is_error`` and ``cache_control`` of
its ``tool_result`` and a tool call its ``tool_use``'s ``cache_control`` (``model.apis.messages``).
A message without such parts is as before.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from prefect_rollouts.errors import AgentFailure, ProviderError, RuntimeUnavailableError, scrub

#: 2: token details (``cached_tokens``, ``reasoning_tokens``) and failed ``attempts`` on call records.
#: 3: messages may hold typed parts (``KEPT_PART_TYPES``, ``KEPT_PART_KEYS``; the module docstring).
#: 4: ``cache_write_tokens`` on call records and usage (input written to a prompt cache: Anthropic's).
TRACE_VERSION = 4

KEPT_PART_TYPES = frozenset({"reasoning", "thinking", "redacted_thinking"})
"""Content-part types kept on the trace for the dialect that resends them, never sent to a
chat-completions upstream (``model.wire.chat_messages`` drops them)."""

KEPT_PART_KEYS = frozenset({"cache_control"})
"""Keys of a content part kept on the trace and left out of a chat-completions request."""

RESPONSES_ITEM = "responses_item"
"""Key, on a message or a tool call, of the fields its OpenAI Responses item had beside those the chat form
carries (``{"id": "fc_1", "status": "completed"}``): resent as they came to a Responses upstream
(``model.apis.responses``), kept on the reply a Responses program gets back."""

KEPT_MESSAGE_KEYS = frozenset({RESPONSES_ITEM})
"""Keys of a message that ``harnesses.base.sample`` keeps on a reply, beside ``content`` and ``tool_calls``."""

#: Stop conditions that mean a turn or token cap cut the run short.
TRUNCATING_STOPS = frozenset({"max_turns", "max_turn_tokens", "max_rollout_tokens"})

#: Stop conditions of an agent that finished normally; a failure recorded after them (in
#: finalize or scoring) replaces them, so the stop condition says what failed.
COMPLETED_STOPS = frozenset({"agent_completed", "user_closed"})

#: Stop conditions of a rollout that was stopped from outside before it could finish and counts as not
#: done: its row is kept as an attempt, and a resume runs the rollout again as a new attempt.
#: ``budget``: the eval's token or cost budget was reached (``EvalConfig.token_budget``).
UNFINISHED_STOPS = frozenset({"budget"})


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Record):
    """Token counts summed over model calls (as reported by the server's ``usage``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = None
    """Prompt tokens served from the server's cache (``prompt_tokens_details.cached_tokens``),
    summed over the calls that report it; None when none did (unknown, not 0)."""
    reasoning_tokens: int | None = None
    """Completion tokens spent reasoning (``completion_tokens_details.reasoning_tokens``), summed
    over the calls that report it; None when none did."""
    cache_write_tokens: int | None = None
    """Prompt tokens written to the server's prompt cache (Anthropic's ``cache_creation_input_tokens``),
    summed over the calls that report it; None when none did."""
    cost_usd: float | None = None
    """USD of the calls made through a client with a ``price`` (``pricing.call_cost_usd``), summed; None
    when no call had one (unknown, not free)."""

    def add(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
            reasoning_tokens: int | None = None, cost_usd: float | None = None,
            cache_write_tokens: int | None = None) -> None:
        """Add one call's counts; a detail the call does not report (None) leaves its sum as it is."""
        if cache_write_tokens is not None:
            self.cache_write_tokens = (self.cache_write_tokens or 0) + cache_write_tokens
        if cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost_usd
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.total_tokens += prompt_tokens + completion_tokens
        if cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + cached_tokens
        if reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + reasoning_tokens


class AttemptRecord(_Record):
    """One failed attempt of a call that the model client retried (or gave up on). No clock:
    ``_CallRecord.latency_ms`` covers all attempts, and traces of the same replies stay equal."""

    status_code: int | None
    """HTTP status; None when no response arrived (connection refused or dropped), 504 timeout,
    502 malformed body."""
    error: str
    """What went wrong, scrubbed of secrets, then cut (an error body keeps 300 characters)."""


class _CallRecord(_Record):
    """What every chat-completions request records, successful or not."""

    started_at: float
    """Unix time (s) the first attempt started."""
    latency_ms: float
    """Wall time of the call including retries, in milliseconds."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens``; None when the server does not report it."""
    reasoning_tokens: int | None = None
    """``usage.completion_tokens_details.reasoning_tokens``; None when the server does not report it."""
    cache_write_tokens: int | None = None
    """Prompt tokens written to the server's prompt cache (Messages' ``cache_creation_input_tokens``; part
    of ``prompt_tokens``); None when the server does not report it."""
    retries: int = 0
    """Attempts beyond the first."""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    """Each failed attempt, in order (for a failed call, the last one too)."""
    status_code: int | None = None
    """HTTP status of the final attempt (None: no response arrived, e.g. connection refused; 504
    timeout); also None for a call cancelled before its response."""
    error: str | None = None


class ModelCall(_CallRecord):
    """One request of the agent's model."""

    segment: int
    """Index of the segment (``Trace.segments``) the call belongs to."""
    finish_reason: str | None = None
    """``stop``, ``length``, ``tool_calls``, ...; None when the call failed."""


class JudgeCall(_CallRecord):
    """One request of a judge to its model; ``error`` also says why its reply could not be parsed
    (the rollout's reward is then None, never 0)."""

    judge: str
    """The judge's reward name."""
    model: str
    prompt: str | None = None
    """What the judge was asked, capped at 4,000 characters."""
    reply: str | None = None
    """The judge model's text, capped at 4,000 characters."""
    verdict: Any = None
    """What the judge parsed from the reply (e.g. ``"yes"`` or ``{"criterion": "choice"}``)."""


class ToolCall(_Record):
    """One executed tool call."""

    segment: int
    id: str
    name: str
    arguments: str
    """The arguments string as the model sent it."""
    output: str
    is_error: bool = False
    latency_ms: float


class SegmentRecord(_Record):
    """One harness segment: which messages it added and how it ended."""

    index: int
    start: int
    """Index into ``Trace.messages`` of the segment's first new message (user input included)."""
    end: int
    """Index one past its last message."""
    terminated: bool
    model_calls: int


class Receipt(_Record):
    """Answer to ``Interaction.send``: whether the message was accepted for delivery (not acted on)."""

    accepted: bool
    message_id: str
    mode: Literal["steer", "queue"]
    reason: str | None = None
    """Why it was refused, or how it will be delivered (e.g. ``"woke idle interaction"``)."""


class SendRecord(_Record):
    """One ``send`` with its receipt and the segment it landed in (None = never delivered)."""

    message_id: str
    text: str
    mode: Literal["steer", "queue"]
    receipt: Receipt
    delivered_segment: int | None = None
    delivered_call: int | None = None
    """Index in ``Trace.model_calls`` of the request a program harness's steer was spliced into."""
    status: Literal["pending", "delivered", "refused", "cancelled"] = "pending"


class NetworkRecord(_Record):
    """One connection the egress proxy (``runtimes/egress/proxy.py``) saw from the rollout's runtime, allowed or
    denied."""

    phase: str
    """``setup``, ``agent`` or ``scoring``: the part of the rollout the runtime was in."""
    method: str
    """``CONNECT`` (a tunnel, counted as https) or the HTTP method of a plain proxied request."""
    host: str
    """The host asked for (request line; cut to 255 characters)."""
    port: int
    sni: str | None = None
    """The TLS server name the client sent inside the tunnel; None when it sent none (or no TLS)."""
    address: str | None = None
    """The IPv4 address the proxy connected to; None when it did not connect."""
    allowed: bool
    reason: str
    """Which rule allowed or denied it, or why it was refused (e.g. a loopback address)."""
    error: str | None = None
    """An allowed connection that failed: the upstream could not be reached."""
    bytes_sent: int = 0
    """Bytes from the runtime to the host (after the request head, for CONNECT)."""
    bytes_received: int = 0
    """Bytes from the host back to the runtime."""
    started_at: float
    """Unix time (s) the proxy read the request."""
    duration_s: float = 0.0
    """Until the connection closed (or was refused)."""


class ErrorRecord(_Record):
    """A failure recorded on the trace instead of raised."""

    type: str
    message: str
    stage: str
    status_code: int | None = None


class Trace(BaseModel):
    """Everything one rollout did.

    ``reward`` is the weighted sum of ``rewards`` (None when scoring failed or did not run; 0
    when it was skipped by a skip rule). ``is_truncated`` and ``last_reply`` are derived and
    serialised for readers; loading ignores them.
    """

    model_config = ConfigDict(extra="ignore")

    version: int = TRACE_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """Rollout id."""
    task_id: str
    task_type: str = "Task"
    model: str
    agent: dict[str, Any] = Field(default_factory=dict)
    """The agent config with secrets (header values, literal scoring env values) redacted."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    segments: list[SegmentRecord] = Field(default_factory=list)
    model_calls: list[ModelCall] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    sends: list[SendRecord] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    """Tokens of the agent's model calls."""
    judge_calls: list[JudgeCall] = Field(default_factory=list)
    network: list[NetworkRecord] = Field(default_factory=list)
    """Connections through the egress proxy under a ``{ allow, block }`` network policy, in order;
    empty under ``open`` and ``none`` (nothing is proxied). ``info["network_log_dropped"]`` counts
    records past ``runtimes.egress.MAX_RECORDS``."""
    judge_usage: Usage = Field(default_factory=Usage)
    """Tokens of the judges' calls (not in ``usage``)."""
    rewards: dict[str, float | None] = Field(default_factory=dict)
    reward_weights: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    reward: float | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    errors: list[ErrorRecord] = Field(default_factory=list)
    stop_condition: str | None = None
    """Why the run stopped: ``agent_completed``, ``user_closed``, ``max_turns``, ``max_turn_tokens``,
    ``max_rollout_tokens``, ``budget`` (the eval's budget: ``UNFINISHED_STOPS``), ``<stage>_timeout``, the
    agent's own failure (``record_agent_failure``: e.g. ``program_failed``, ``storage_quota``; scored, not an
    error) or ``<kind>_error`` (e.g. ``provider_error``, ``task_error``, ``scoring_error``)."""
    is_timeout: bool = False
    started_at: float = Field(default_factory=time.time)
    """Unix time (s) the rollout started."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Wall seconds per stage: setup, agent, finalize, scoring, teardown (those that ran)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_truncated(self) -> bool:
        """A turn or token cap stopped the run, or the last model response finished with ``length``."""
        if self.stop_condition in TRUNCATING_STOPS:
            return True
        for call in reversed(self.model_calls):
            if call.finish_reason is not None:
                return call.finish_reason == "length"
        return False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def last_reply(self) -> str:
        """Content of the last assistant message, stripped; ``""`` if there is none."""
        return last_assistant_text(self.messages)

    @property
    def ok(self) -> bool:
        """True when nothing failed (a stop by a limit or timeout is not a failure)."""
        return not self.errors

    def stop(self, condition: str, *, override: bool = False) -> None:
        """Set the stop condition; the first one wins unless ``override``."""
        if self.stop_condition is None or override:
            self.stop_condition = condition

    def record_error(self, exc: BaseException, stage: str) -> None:
        """Append ``exc`` as an ``ErrorRecord`` (its message scrubbed of secrets) and stop the run
        as ``<kind>_error``: ``scoring_error`` for any failure while scoring. A failure after the
        agent finished normally (``COMPLETED_STOPS``) replaces that stop condition; any other
        stop (a limit, a deadline, an earlier error) stays."""
        self.errors.append(ErrorRecord(type=type(exc).__name__, message=scrub(str(exc)), stage=stage,
                                       status_code=getattr(exc, "status_code", None)))
        self.stop(f"{_error_kind(exc, stage)}_error", override=self.stop_condition in COMPLETED_STOPS)

    def record_agent_failure(self, failure: AgentFailure) -> None:
        """Record the agent's own failure as the rollout's result (``errors.AgentFailure``): stop as
        ``failure.stop_condition`` (replacing a normal end, never a limit, deadline or error already
        recorded), ``is_timeout`` when its deadline stopped it, and ``info["agent_failure"]`` =
        ``{"stop_condition", "message" (scrubbed), "scored"}``. Not an error: ``ok`` stays True and
        scoring runs, unless ``scored`` is False (then ``stages.skip_check`` gives reward 0)."""
        self.stop(failure.stop_condition, override=self.stop_condition in COMPLETED_STOPS)
        if failure.timeout:
            self.is_timeout = True
        self.info["agent_failure"] = {"stop_condition": failure.stop_condition, "message": scrub(str(failure)),
                                      "scored": failure.scored}

    def record_timeout(self, stage: str) -> None:
        """Mark a stage deadline as expired: ``is_timeout`` and stop condition ``<stage>_timeout``."""
        self.is_timeout = True
        self.stop(f"{stage}_timeout", override=True)


def _error_kind(exc: BaseException, stage: str) -> str:
    if stage == "scoring":   # whatever failed (a reward, a judge, an isolated runtime), scoring did
        return "scoring"
    if isinstance(exc, ProviderError):
        return "provider"
    if isinstance(exc, RuntimeUnavailableError):
        return "runtime"
    return {"setup": "setup", "segment": "harness", "finalize": "task", "scoring": "scoring"}.get(stage, stage)


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """Text of the last assistant message in ``messages`` (content parts joined), stripped; ``""`` if none."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return content_text(message.get("content")).strip()
    return ""


def content_text(content: Any) -> str:
    """A message's ``content`` as text: a string as is, content parts (``{"text": ...}`` or bare
    strings) joined, None as ``""``, anything else ``str``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part if isinstance(part, str) else str(part.get("text", ""))
                       for part in content if isinstance(part, (str, dict)))
    return "" if content is None else str(content)


USAGE_NOTES_MAX = 10
"""Notes of unknown usage kept on one trace (``info["usage_unknown"]``); later ones are counted only."""


def note_unknown_usage(trace: Trace, note: str) -> None:
    """Record on ``trace`` that a call's usage was missing or invalid (``model.client.Completion.usage_note``):
    ``info["usage_unknown"]`` = ``{"calls": n, "notes": [first USAGE_NOTES_MAX notes]}``."""
    unknown = trace.info.setdefault("usage_unknown", {"calls": 0, "notes": []})
    unknown["calls"] += 1
    if len(unknown["notes"]) < USAGE_NOTES_MAX:
        unknown["notes"].append(note)
