"""Anthropic Messages (``api = "messages"``): ``POST {base_url}/messages``, ``x-api-key`` and
``anthropic-version: 2023-06-01`` (never ``Authorization``).

The request is built from the client's one form (a chat-completions body whose messages are the
trace's, typed parts included; ``request``):

- the leading ``system`` messages -> ``system`` (a string, or text blocks with their ``cache_control``);
  a system message after the first turn (Claude Code's environment turn) stays a turn in its place;
- ``user`` and ``assistant`` messages -> turns, strictly alternating (consecutive messages of one role
  merged into one turn); a ``tool`` message -> a ``tool_result`` block (``tool_use_id``; its content, a
  string or blocks; ``is_error`` and ``cache_control`` where the message carries them) in a user turn,
  consecutive ones and the user message after them merged into that turn, the results first;
- content parts: ``text`` (verbatim, ``cache_control`` and ``citations`` kept), ``image_url`` -> an
  ``image`` block (a ``data:`` URL as a base64 source, else a url source), ``thinking`` and
  ``redacted_thinking`` verbatim in place (signatures unchanged, as Anthropic requires them back),
  a Responses ``reasoning`` item left out (Anthropic cannot read it), any other typed part verbatim;
- an assistant's ``tool_calls`` -> ``tool_use`` blocks after its content, with their ids (``input``: the
  arguments' JSON object; ``{}`` for none; ``{"_raw": text}`` when they are not one);
- ``tools`` -> ``{"name", "description", "input_schema"}``; ``tool_choice`` ``auto``/``required``/
  ``none``/a function -> ``auto``/``any``/``none``/``tool``; ``parallel_tool_calls = false`` ->
  ``disable_parallel_tool_use``; ``stop`` -> ``stop_sequences``;
- ``max_tokens`` (``max_completion_tokens``): the imposed one; Messages requires it, so without one
  ``DEFAULT_MAX_TOKENS``;
- chat-only keys Messages has no field for (``CHAT_ONLY``: ``seed``, ``n``, ``response_format``, ...) are
  left out (``unsent`` names them; the endpoint records them as lost); any other key is passed as it
  is (``sampling.extra`` may name Anthropic's own: ``top_k``, ``thinking``, ``metadata``);
- ``NATIVE_KEY`` of a request the endpoint received in Messages itself: its ``params`` (``tools``,
  ``tool_choice``, ``thinking``, ``metadata``, ``context_management``, ...) are used as the program sent
  them, never over an imposed field (model, sampling and ``sampling.extra``: ``IMPOSED_KEYS``,
  ``max_tokens``, messages, system), and its
  ``headers`` (``anthropic-beta``) go with the request (``request_headers``).

The response (``messages_parse``): text and thinking blocks kept as typed parts, ``tool_use`` ->
``tool_calls``, usage and ``stop_reason`` normalised to chat completions' meaning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from prefect_rollouts.model.apis import messages_parse
from prefect_rollouts.model.apis.base import NATIVE_KEY, WireApi, imposed_keys
from prefect_rollouts.model.completion import Completion

VERSION = "2023-06-01"
"""The ``anthropic-version`` header: the one version of the Messages API (docs.anthropic.com, "Versions")."""

DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` of a request that names none (Messages requires one): the largest output every Claude
model since Claude 3 accepts (Claude 3 Haiku's and Opus's limit). Set ``max_turn_tokens`` or
``[env.agent.sampling] max_tokens`` for more."""

CHAT_ONLY = frozenset({"seed", "n", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
                       "top_logprobs", "response_format", "user", "store", "stream_options", "reasoning_effort",
                       "modalities", "prediction", "audio", "web_search_options", "verbosity",
                       "parallel_tool_calls", "max_completion_tokens", "prompt_cache_key", "safety_identifier"})
"""Chat-completions request keys the Messages API has no field for (``parallel_tool_calls`` and
``max_completion_tokens`` are mapped, the others left out)."""

IMPOSED = frozenset({"model", "max_tokens", "temperature", "top_p", "messages", "system", "stream",
                     "stop_sequences"})
"""Request keys ``NATIVE_KEY``'s params never set: the rollout imposes them, or they come from the messages."""

_DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.DOTALL)


class MessagesApi(WireApi):
    """Anthropic Messages (the module docstring)."""

    name = "messages"
    path = "/messages"

    def auth_headers(self, key: str | None) -> dict[str, str]:
        """``x-api-key: <key>`` (none without a key) and ``anthropic-version``."""
        return {"x-api-key": key, "anthropic-version": VERSION} if key else {"anthropic-version": VERSION}

    def unsent_keys(self, body: dict[str, Any]) -> list[str]:
        """The keys of ``body`` this API drops (``unsent``), sorted."""
        return unsent(body)

    def request_headers(self, body: Mapping[str, Any]) -> dict[str, str]:
        """The headers of ``NATIVE_KEY`` (``anthropic-beta``: features the program asked for), when it is
        this API's; else none."""
        headers = _native(body).get("headers")
        return {str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Messages request for ``body`` (the module docstring). Does not mutate ``body``.

        Raises:
            ValueError: ``messages`` is not a list of messages (naming the index).
        """
        native = _native(body)
        params: dict[str, Any] = native["params"] if isinstance(native.get("params"), dict) else {}
        system, turns = conversation(body.get("messages"))
        out: dict[str, Any] = {}
        if "model" in body:
            out["model"] = body["model"]
        out["messages"] = turns
        if system is not None:
            out["system"] = system
        tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        out["max_tokens"] = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else DEFAULT_MAX_TOKENS
        stop = body.get("stop")
        if stop:
            out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        if body.get("tools"):
            out["tools"] = [_tool(tool) for tool in body["tools"] if _is_function(tool)]
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None and out.get("tools"):
            out["tool_choice"] = choice
        for key, value in body.items():
            if key not in out and key not in CHAT_ONLY and key not in ("messages", "tools", "tool_choice", "stop",
                                                                       NATIVE_KEY):
                out[key] = value
        imposed = imposed_keys(native)   # the rollout's sampling.extra too: in out already, never replaced
        for key, value in params.items():
            if key not in IMPOSED and key not in CHAT_ONLY and key not in imposed:
                if key in ("tools", "tool_choice") or key not in out:
                    out[key] = value
        if not out.get("tools"):
            out.pop("tools", None)
            out.pop("tool_choice", None)
        return out

    def parse(self, data: Any, retries: int, status_code: int) -> Completion:
        """A ``message`` body as a ``Completion`` (``messages_parse.completion``)."""
        return messages_parse.completion(data, retries, status_code)

    def parse_events(self, events: list[tuple[str, str]], retries: int, status_code: int) -> Completion:
        """A streamed message's events (``messages_parse.assemble``) as a ``Completion``."""
        return messages_parse.completion(messages_parse.assemble(events), retries, status_code)

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        """``messages_parse.retry_after``: ``retry-after-ms``, ``retry-after``, else the reset of an
        exhausted ``anthropic-ratelimit-*`` limit."""
        return messages_parse.retry_after(headers)


def unsent(body: Mapping[str, Any]) -> list[str]:
    """The keys of a chat-completions request ``body`` that the Messages API cannot take and ``request``
    leaves out, sorted (``parallel_tool_calls`` and ``max_completion_tokens`` are mapped, so not among them)."""
    return sorted(key for key in body if key in CHAT_ONLY and key not in ("parallel_tool_calls",
                                                                          "max_completion_tokens"))


def _native(body: Mapping[str, Any]) -> dict[str, Any]:
    native = body.get(NATIVE_KEY)
    return native if isinstance(native, dict) and native.get("api") == "messages" else {}


def conversation(messages: Any) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """``(system, turns)`` of chat-form ``messages`` (the module docstring).

    Raises:
        ValueError: ``messages`` is not a list of objects with a role (naming the index).
    """
    if not isinstance(messages, list):
        raise ValueError("messages: must be a list of messages")
    system: str | list[dict[str, Any]] | None = None
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str):
            raise ValueError(f"messages.{index}.role: must be a string (system, user, assistant or tool)")
        content = message.get("content")
        if role in ("system", "developer"):
            if not turns:
                system = content if system is None else [*_blocks(system), *_blocks(content)]
            else:
                turns.append({"role": "system", "content": content})   # as the program placed it
        elif role == "tool":
            _add(turns, "user", [_tool_result(message)])
        elif role == "assistant":
            blocks = _blocks(content)
            uses = [_tool_use(call) for call in message.get("tool_calls") or []]
            if uses or not isinstance(content, str) or not content:
                _add(turns, "assistant", [*blocks, *uses])
            else:
                _add(turns, "assistant", content)
        else:
            _add(turns, "user", content if isinstance(content, str) and content else _blocks(content))
    return system, turns


def _add(turns: list[dict[str, Any]], role: str, content: str | list[dict[str, Any]]) -> None:
    """Append a turn, or merge ``content`` into the last turn when it has the same role (Messages
    alternates strictly); an empty turn is left out (Messages refuses empty content)."""
    if not content:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"] = [*_blocks(turns[-1]["content"]), *_blocks(content)]
    else:
        turns.append({"role": role, "content": content})


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Chat ``content`` (a string, parts, or None) as Messages content blocks (the module docstring)."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return [{"type": "text", "text": str(content)}]
    blocks = []
    for part in content:
        if isinstance(part, str):
            if part:
                blocks.append({"type": "text", "text": part})
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and not part.get("text"):
            continue   # Messages refuses an empty text block
        if kind == "image_url":
            blocks.append(_image(part))
        elif kind != "reasoning":   # a Responses item: Anthropic cannot read it
            blocks.append(part)
    return blocks


def _image(part: dict[str, Any]) -> dict[str, Any]:
    """An ``image_url`` part as an ``image`` block (its ``cache_control`` kept)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    found = _DATA_URL.match(url) if isinstance(url, str) else None
    source = {"type": "base64", "media_type": found.group(1), "data": found.group(2)} if found \
        else {"type": "url", "url": url}
    block: dict[str, Any] = {"type": "image", "source": source}
    if part.get("cache_control") is not None:
        block["cache_control"] = part["cache_control"]
    return block


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                             "content": content if isinstance(content, str) else _blocks(content)}
    for key in ("is_error", "cache_control"):
        if key in message:
            block[key] = message[key]
    return block


def _tool_use(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ValueError("tool_calls: each needs a function with a name and arguments")
    block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
             "input": tool_input(function.get("arguments"))}
    if call.get("cache_control") is not None:
        block["cache_control"] = call["cache_control"]
    return block


def tool_input(arguments: Any) -> Any:
    """A tool call's ``arguments`` as ``tool_use.input``: the JSON object; ``{}`` for none; ``{"_raw":
    arguments}`` when they are not a JSON object (the endpoint's Messages dialect turns it back)."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_raw": arguments if isinstance(arguments, str)
                                                    else json.dumps(arguments)}


def _is_function(tool: Any) -> bool:
    return isinstance(tool, dict) and tool.get("type", "function") == "function" \
        and isinstance(tool.get("function"), dict)


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    out: dict[str, Any] = {"name": function.get("name")}
    if function.get("description") is not None:
        out["description"] = function["description"]
    out["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    """Chat's ``tool_choice`` (and ``parallel_tool_calls = false``) in Messages' form; None: not set."""
    out: dict[str, Any] | None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name")}
    else:
        out = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]} \
            if choice in ("auto", "required", "none") else None
    if parallel is False and (out is None or out["type"] != "none"):
        out = {**(out or {"type": "auto"}), "disable_parallel_tool_use": True}
    return out


API = MessagesApi()
