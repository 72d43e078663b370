"""OpenAI Responses (``api = "responses"``): ``POST {base_url}/responses``, ``Authorization: Bearer``.

Request, from the client's chat form: a system or developer message is an ``input`` message item of that
role (the first system message is ``instructions`` when the program sent it so: ``_native`` says,
``INSTRUCTIONS``); a user message an item with ``input_text`` and ``input_image`` parts (a string
content stays a string); an assistant message its kept ``reasoning`` items, verbatim
(``encrypted_content`` and all), a ``message`` item of ``output_text`` parts and a ``function_call`` item
per tool call (``call_id`` = the chat tool call's id); a tool message a ``function_call_output``; an
item's own fields the chat form has no place for (its ``id``, ``status``: ``trace.RESPONSES_ITEM`` on the
message or tool call) go back on it as they came. Chat's nested function tools are flattened (``strict``
false unless set: Responses makes it true by default), ``tool_choice`` likewise, ``max_tokens`` is
``max_output_tokens``, ``response_format`` ``text.format``, ``reasoning_effort`` ``reasoning.effort``,
``verbosity`` ``text.verbosity``; chat-only keys (``CHAT_ONLY``: ``seed``, ``stop``, ...) are not sent
(the endpoint records them as lost). A request the endpoint received in Responses carries the
program's own top-level fields under ``NATIVE_KEY`` (``include``, ``reasoning``, ``store``, its tools as
it sent them, ``text``, ``prompt_cache_key``...): they are sent as they came, under the imposed ones
(``IMPOSED``: model, sampling, the token cap; and ``base.IMPOSED_KEYS``: ``sampling.extra`` replaces a field
it names, ``reasoning_effort`` and ``verbosity`` set theirs inside the program's ``reasoning`` and ``text``).

``store`` is false unless the program's native fields say otherwise: this client is stateless (it resends
the whole conversation every call, as the trace holds it), so a stored response would only keep a copy
of every rollout at the provider, and ``previous_response_id`` is never used. With ``store`` false a
reasoning item is resent only with its ``encrypted_content`` (one without it cannot be resolved and is
left out); ask for it with ``include = ["reasoning.encrypted_content"]`` (``[env.agent.sampling.extra]``;
Codex sends it).

Response: ``output`` items in order: ``reasoning`` items kept verbatim as typed parts of the assistant
message (``trace.KEPT_PART_TYPES``), ``message`` items' ``output_text`` as its text (a ``refusal`` as
``refusal``), ``function_call`` items as ``tool_calls``, their ids and statuses under ``trace.RESPONSES_ITEM``;
other item types are kept as parts too and resent.
``status`` ``incomplete`` with ``max_output_tokens`` (or ``content_filter``) is finish ``length`` (or
``content_filter``); ``failed`` raises. Usage: ``input_tokens`` (cache reads included, as chat counts),
``output_tokens`` (reasoning included), ``input_tokens_details.cached_tokens`` (and
``cache_write_tokens``), ``output_tokens_details.reasoning_tokens``. Streamed: the final response of
``response.completed`` (or ``response.incomplete``); without one, the items of ``response.output_item.done``
events.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prefect_rollouts.model.apis.base import NATIVE_KEY, WireApi, imposed_keys, requested_wait
from prefect_rollouts.model.completion import Completion, count, detail
from prefect_rollouts.nesting import loads
from prefect_rollouts.trace import RESPONSES_ITEM

IMPOSED = frozenset({"model", "input", "instructions", "temperature", "top_p", "max_output_tokens", "stream",
                     "stream_options"})
"""Native fields never taken from ``NATIVE_KEY``: the client's request sets them (the rollout's model,
sampling, token cap, the conversation; ``stream`` is ``ClientConfig.stream``'s)."""

INSTRUCTIONS = "instructions"
"""Key of ``NATIVE_KEY`` that, when true, says the first system message was the program's ``instructions``."""

CHAT_ONLY = frozenset({"seed", "stop", "n", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
                       "modalities", "audio", "prediction", "web_search_options", "functions", "function_call"})
"""Chat-completions request keys Responses has no place for: not sent (``unsent_keys``)."""

_MAPPED = frozenset({"messages", "max_tokens", "max_completion_tokens", "response_format", "reasoning_effort",
                     "verbosity", "tools", "tool_choice", NATIVE_KEY})


class ResponsesApi(WireApi):
    """OpenAI Responses (the module docstring has the mapping)."""

    name = "responses"
    path = "/responses"

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``/responses`` body for ``body`` (chat form, the trace's messages); never mutates it."""
        native = body.get(NATIVE_KEY)
        if not (isinstance(native, dict) and native.get("api") == self.name):
            native = {}
        given = native.get("params")
        imposed = imposed_keys(native)   # the rollout's: no field of the program goes over them
        params: dict[str, Any] = {key: value for key, value in given.items() if key not in imposed} \
            if isinstance(given, dict) else {}
        out: dict[str, Any] = {key: value for key, value in params.items() if key not in IMPOSED}
        out.setdefault("store", False)
        for key, value in body.items():
            if key not in _MAPPED and key not in CHAT_ONLY and (key in IMPOSED or key not in params):
                out[key] = value
        instructions, items = _input(body.get("messages") or [], native.get(INSTRUCTIONS) is True,
                                     keep_bare_reasoning=out.get("store") is True)
        out["input"] = items
        if instructions is not None:
            out["instructions"] = instructions
        limit = body.get("max_tokens", body.get("max_completion_tokens"))
        if limit is not None:
            out["max_output_tokens"] = limit
        if "tools" not in params and body.get("tools"):
            out["tools"] = [_tool(tool) for tool in body["tools"]]
        if ("tool_choice" not in params or "tool_choice" in imposed) and body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
        if ("text" not in params or "response_format" in imposed) and isinstance(body.get("response_format"), dict):
            out["text"] = {**_dict(out.get("text")), "format": _text_format(body["response_format"])}
        if ("reasoning" not in params or "reasoning_effort" in imposed) and body.get("reasoning_effort") is not None:
            out["reasoning"] = {**_dict(out.get("reasoning")), "effort": body["reasoning_effort"]}
        if ("text" not in params or "verbosity" in imposed) and body.get("verbosity") is not None:
            out["text"] = {**_dict(out.get("text")), "verbosity": body["verbosity"]}
        return out

    def unsent_keys(self, body: dict[str, Any]) -> list[str]:
        """The keys of ``body`` this API drops (``CHAT_ONLY``), sorted."""
        return sorted(key for key in body if key in CHAT_ONLY)

    def parse(self, data: Any, retries: int, status_code: int) -> Completion:
        """The ``Completion`` of a ``response`` object (the module docstring); raises on a shape error,
        and ``ValueError`` for a ``failed`` response (its error's code and message)."""
        if not isinstance(data, dict) or not isinstance(data.get("output"), list):
            raise TypeError("not a response object: no output list")
        if data.get("status") == "failed":
            error = data.get("error") or {}
            raise ValueError(f"the response failed: {error.get('code')}: {error.get('message')}")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        message: dict[str, Any] = {"role": "assistant"}
        refusal = None
        for index, item in enumerate(data["output"]):
            kind = item["type"]
            if kind == "message":
                if RESPONSES_ITEM not in message:
                    message[RESPONSES_ITEM] = _fields(item, _MESSAGE_CARRIED)
                for part in item.get("content") or []:
                    if part["type"] == "output_text":
                        parts.append({"type": "text", "text": str(part["text"])})
                    elif part["type"] == "refusal":
                        refusal = (refusal or "") + str(part["refusal"])
            elif kind == "function_call":
                calls.append({"id": str(item["call_id"]), "type": "function",
                              "function": {"name": str(item["name"]), "arguments": str(item["arguments"])},
                              RESPONSES_ITEM: _fields(item, _CALL_CARRIED)})
            elif isinstance(kind, str):
                parts.append(dict(item))   # a reasoning item (or another kind) resent as it came
            else:
                raise TypeError(f"output.{index}.type is {type(kind).__name__}, not a string")
        message["content"] = _joined(parts)
        if not message.get(RESPONSES_ITEM):
            message.pop(RESPONSES_ITEM, None)
        if calls:
            message["tool_calls"] = calls
        if refusal is not None:
            message["refusal"] = refusal
        usage = data.get("usage") or {}
        if not isinstance(usage, dict):
            raise TypeError(f"usage is {type(usage).__name__}, not an object")
        notes = [] if usage else ["the response reported no usage"]
        prompt, completion = (count(usage.get(key), f"usage.{key}", notes) for key in ("input_tokens", "output_tokens"))
        return Completion(message=message, finish_reason=_finish(data, bool(calls)),
                          prompt_tokens=prompt or 0, completion_tokens=completion or 0,
                          retries=retries, status_code=status_code,
                          cached_tokens=detail(usage, "input_tokens_details", "cached_tokens"),
                          reasoning_tokens=detail(usage, "output_tokens_details", "reasoning_tokens"),
                          cache_write_tokens=detail(usage, "input_tokens_details", "cache_write_tokens"),
                          usage_note="; ".join(notes) or None)

    def parse_events(self, events: list[tuple[str, str]], retries: int, status_code: int) -> Completion:
        """The ``Completion`` of a Responses stream: the response of its ``response.completed`` (or
        ``response.incomplete``) event; else one built from its ``response.output_item.done`` items. An
        ``error`` or ``response.failed`` event raises ``ValueError`` with its message."""
        done: list[dict[str, Any]] = []
        for name, text in events:
            data = loads(text, "an event")
            kind = (data.get("type") or name) if isinstance(data, dict) else name
            if kind in ("response.completed", "response.incomplete"):
                return self.parse(data["response"], retries, status_code)
            if kind == "response.failed":
                return self.parse(data["response"], retries, status_code)   # raises with its error
            if kind == "error":
                raise ValueError(f"the stream failed: {data.get('code')}: {data.get('message')}")
            if kind == "response.output_item.done":
                done.append(data["item"])
        if not done:
            raise ValueError("the stream ended without response.completed or any output item")
        return self.parse({"status": "completed", "output": done}, retries, status_code)

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        """``openai_retry_after``."""
        return openai_retry_after(headers)


def openai_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds OpenAI asks to wait: ``retry-after-ms`` (milliseconds, what the OpenAI SDKs read first),
    else ``Retry-After``, else the latest ``x-ratelimit-reset-requests`` / ``-tokens`` of a limit whose
    ``x-ratelimit-remaining-*`` is 0 (durations such as ``6m0s``, ``1.5s``, ``20ms``: OpenAI's rate-limit
    guide). None when none says anything usable."""
    seconds = requested_wait(headers)
    if seconds is not None:
        return seconds
    waits = [duration_s(headers.get(f"x-ratelimit-reset-{kind}")) for kind in ("requests", "tokens")
             if (headers.get(f"x-ratelimit-remaining-{kind}") or "").strip() == "0"]
    known = [wait for wait in waits if wait is not None]
    return max(known) if known else None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration_s(value: str | None) -> float | None:
    """Seconds of a Go-style duration (``6m0s``, ``1.5s``, ``20ms``, ``1h2m``); None if absent or unreadable."""
    text = (value or "").strip()
    if not text:
        return None
    matches = list(_DURATION.finditer(text))
    if not matches or "".join(match.group(0) for match in matches) != text:
        return None
    return sum(float(match.group(1)) * _UNIT_S[match.group(2)] for match in matches)


_MESSAGE_CARRIED = frozenset({"type", "role", "content"})
_CALL_CARRIED = frozenset({"type", "call_id", "name", "arguments"})
#: The fields of a ``function_call_output`` item the chat form's tool message carries.
OUTPUT_CARRIED = frozenset({"type", "call_id", "output"})


def _fields(item: dict[str, Any], carried: frozenset[str]) -> dict[str, Any]:
    """``item``'s fields the chat form has no place for (``trace.RESPONSES_ITEM``: its ``id``, ``status``)."""
    return {key: value for key, value in item.items() if key not in carried}


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text parts only: their text, joined (chat's string content); else the parts as they are."""
    if all(part.get("type") == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _finish(data: dict[str, Any], called: bool) -> str:
    """Chat's ``finish_reason`` for a response: ``length`` (``max_output_tokens``), ``content_filter``,
    ``tool_calls`` or ``stop``."""
    if data.get("status") == "incomplete":
        reason = (data.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if called else "stop"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _input(messages: list[dict[str, Any]], instructions_first: bool,
           keep_bare_reasoning: bool) -> tuple[str | None, list[dict[str, Any]]]:
    """``(instructions, input items)`` for chat ``messages`` (the module docstring)."""
    instructions = None
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if index == 0 and instructions_first and role == "system":
            instructions = content if isinstance(content, str) else _text(content)
        elif role in ("system", "developer", "user"):
            items.append({"type": "message", "role": role, "content": _parts(content, "input_text"),
                          **(message.get(RESPONSES_ITEM) or {})})
        elif role == "assistant":
            items.extend(_assistant(message, keep_bare_reasoning))
        elif role == "tool":
            output = content if isinstance(content, str) else _parts(content, "input_text")
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id"), "output": output,
                          **(message.get(RESPONSES_ITEM) or {})})
        else:
            raise ValueError(f"messages.{index}.role = {role!r}: the Responses API takes system, developer, "
                             "user, assistant and tool messages")
    return instructions, items


def _assistant(message: dict[str, Any], keep_bare_reasoning: bool) -> list[dict[str, Any]]:
    """An assistant message's items: its kept parts (reasoning) in place, its text as one ``message``
    item of ``output_text`` parts where it stands, then a ``function_call`` per tool call."""
    content = message.get("content")
    items: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []

    def flush() -> None:
        if texts:
            items.append({"type": "message", "role": "assistant", "content": list(texts),
                          **(message.get(RESPONSES_ITEM) or {})})
            texts.clear()

    for part in [{"type": "text", "text": content}] if isinstance(content, str) and content else \
            content if isinstance(content, list) else []:
        kind = part.get("type")
        if kind == "text":
            texts.append(_text_part(part, "output_text"))
        elif kind in ("thinking", "redacted_thinking"):
            continue   # Anthropic's: no place here
        elif kind == "reasoning" and not keep_bare_reasoning and not part.get("encrypted_content"):
            continue   # not resolvable without store: the module docstring
        else:
            flush()
            items.append(part)
    flush()
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append({"type": "function_call", "call_id": call.get("id"), "name": function.get("name"),
                      "arguments": function.get("arguments"), **(call.get(RESPONSES_ITEM) or {})})
    return items


def _parts(content: Any, text_type: str) -> Any:
    """A message's content as Responses content: a string as is, text parts as ``text_type``, chat's
    ``image_url`` as ``input_image``, other parts (``input_file``...) as they are; Anthropic's thinking
    blocks left out."""
    if not isinstance(content, list):
        return "" if content is None else content
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            out.append(_text_part(part, text_type))
        elif kind == "image_url":
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, dict) else image
            out.append({"type": "input_image", "image_url": url,
                        **({"detail": image["detail"]} if isinstance(image, dict) and image.get("detail") else {})})
        elif kind not in ("thinking", "redacted_thinking"):
            out.append(part)
    return out


def _text_part(part: dict[str, Any], text_type: str) -> dict[str, Any]:
    """A chat text part as a Responses one: its other keys (``annotations``...) kept, ``cache_control`` not."""
    return {"type": text_type, "text": part.get("text", ""),
            **{key: value for key, value in part.items() if key not in ("type", "text", "cache_control")}}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat tool as a Responses function tool (flat; ``strict`` false unless set)."""
    if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        return tool   # already another kind (sent as it is)
    function = tool["function"]
    out = {"type": "function", "name": function.get("name")}
    for key in ("description", "parameters"):
        if function.get(key) is not None:
            out[key] = function[key]
    out["strict"] = bool(function.get("strict", False))
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _text_format(form: dict[str, Any]) -> dict[str, Any]:
    """Chat's ``response_format`` as ``text.format`` (``json_schema``'s fields one level up)."""
    if form.get("type") == "json_schema" and isinstance(form.get("json_schema"), dict):
        return {"type": "json_schema", **form["json_schema"]}
    return dict(form)


API = ResponsesApi()
