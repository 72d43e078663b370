"""The Anthropic Messages dialect's requests in the endpoint's chat-completions form (``translate``).

What the translation does, per field of a request (``messages`` has the answer's side):

- ``system`` (a string or text blocks) -> a system message (blocks kept as text parts);
- ``messages``: a ``tool_result`` block -> a chat ``tool`` message, in order; the other blocks of that
  user turn (text beside the results, images, a tool result's images) -> one user message after them;
  ``tool_use`` -> the assistant message's ``tool_calls`` (``input`` as JSON arguments); ``image``
  (base64 or url source) -> an ``image_url`` part (a data URL), sent upstream as it is: a model that
  takes no images says so itself; ``thinking`` and ``redacted_thinking`` -> kept verbatim on the
  trace's message as typed parts (``trace.KEPT_PART_TYPES``), never sent to a chat upstream;
  ``cache_control`` marks kept on their parts (``trace.KEPT_PART_KEYS``), not sent; any other block
  (``document``, ``search_result``, ...) is dropped. Each of these is counted in the loss report. A
  ``{"role": "system"}`` turn among the messages (Claude Code's environment block) stays in place;
- ``tools`` with ``input_schema`` -> functions; a server tool (``web_search_20250305``,
  ``bash_20250124``: a ``type`` and no ``input_schema``) is refused, 400 naming it: the model is reached
  through chat completions, which run function tools only, and dropping it would let the model answer
  as if it had searched (Claude Code offers one only in its WebSearch tool's own request, which then
  fails as a tool error, and the agent goes on);
- ``tool_choice`` ``auto``/``any``/``tool``/``none`` -> ``auto``/``required``/a function/``none``;
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls = false``;
- ``max_tokens`` (required, as in Anthropic's API), ``temperature``, ``top_p`` -> the same keys (the
  rollout's own caps and sampling are imposed after); ``stop_sequences`` -> ``stop``;
- recorded and not sent (``ACCEPTED``): ``top_k``, ``metadata``, ``thinking``, ``service_tier``,
  ``container``, ``context_management``, ``output_config``, tool keys such as ``defer_loading``,
  ``mcp_servers`` when empty (a non-empty list is refused:
  connecting MCP servers is the API's own work), and any other key.

To a Messages upstream (``native``: the client's ``api = "messages"``) nothing is lost: every block is
kept on the trace's messages as it came (text blocks with their ``citations``, documents, server tool
blocks verbatim as typed parts; a tool result's string-or-blocks content, ``is_error`` and
``cache_control`` on its ``tool`` message; a ``tool_use``'s ``cache_control`` on its tool call; an
assistant's blocks as a list), server tools and MCP servers pass, and every top-level key but those the
rollout imposes or the messages carry (``NATIVE_OUT``) goes to ``model.apis.NATIVE_KEY``'s ``params``
for ``model.apis.messages`` to send as it came; the loss report is empty.
"""

from __future__ import annotations

import json
from typing import Any

from prefect_rollouts.harnesses.dialects import echo
from prefect_rollouts.model.apis.base import NATIVE_KEY

ACCEPTED = ("top_k", "metadata", "thinking", "service_tier", "container", "context_management", "output_config",
            "mcp_servers")
"""Request keys Claude Code or the SDK send that a chat upstream cannot use: accepted, recorded as
``ignored`` in the loss report, not sent (for the reader: any other key not in ``TRANSLATED`` is too)."""

TRANSLATED = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "stop_sequences",
                        "tools", "tool_choice", "stream"})
"""Request keys the translation uses."""

NATIVE_OUT = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "stop_sequences",
                        "stream"})
"""Request keys a same-API request does not put under ``NATIVE_KEY``: imposed by the rollout (model,
sampling, ``max_tokens``, streaming) or carried by the chat form (messages, system, stop sequences)."""

_TOOL_KEYS = frozenset({"name", "description", "input_schema", "type", "cache_control"})


def tool_arguments(value: Any) -> str:
    """A resent ``tool_use`` block's ``input`` as chat arguments (the inverse of ``tool_input``)."""
    if isinstance(value, dict) and list(value) == ["_raw"] and isinstance(value["_raw"], str):
        return value["_raw"]
    return json.dumps(value)


def translate(body: Any, counting: bool, native: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(chat request, loss report)`` for a Messages request (``counting``: a count_tokens body,
    which has no ``max_tokens``; ``native``: for a Messages upstream, nothing lost). See the module docstring.

    Raises:
        ValueError: the first problem, naming its field: ``<field> = <value>: <what is wrong>. <fix>``.
    """
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object (a Messages request)")
    lost = _Loss(native)
    request: dict[str, Any] = {}
    if "model" in body:
        request["model"] = _typed(body, "model", str)
    if not counting:
        tokens = body.get("max_tokens")
        if tokens is None:
            raise ValueError("max_tokens: required in a Messages request. Send the most tokens to sample")
        if type(tokens) is not int or tokens < 1:
            raise ValueError(f"max_tokens = {echo(tokens)}: must be an integer of at least 1")
        request["max_tokens"] = tokens
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            if type(body[key]) not in (int, float):
                raise ValueError(f"{key} = {echo(body[key])}: must be a number")
            request[key] = body[key]
    if body.get("stop_sequences") is not None:
        stops = body["stop_sequences"]
        if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
            raise ValueError("stop_sequences: must be a list of strings")
        if stops:
            request["stop"] = stops
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise ValueError(f"stream = {echo(body['stream'])}: must be true or false")
    if body.get("mcp_servers") and not native:
        raise ValueError("mcp_servers: this endpoint connects no MCP servers (the Anthropic API's own work). "
                         "Run the MCP servers in the program, or send an empty list")
    messages = _system(body.get("system"), lost)
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise ValueError("messages: required, a non-empty list of user and assistant turns")
    for index, turn in enumerate(turns):
        messages.extend(_turn(turn, f"messages.{index}", lost))
    request["messages"] = messages
    if body.get("tools"):
        request["tools"] = _tools(body["tools"], lost)
    if body.get("tool_choice") is not None:
        request.update(_tool_choice(body["tool_choice"]))
    lost.ignored.extend(key for key in body if key not in TRANSLATED and key != "max_tokens")
    if native:   # a NATIVE_KEY of the program's own is not sent on (only the endpoint sets one): the loss
        request[NATIVE_KEY] = {"api": "messages", "params": {
            key: value for key, value in body.items() if key not in NATIVE_OUT and key != NATIVE_KEY}}
        return request, {"ignored": [NATIVE_KEY]} if NATIVE_KEY in body else {}
    return request, lost.report()


class _Loss:
    """What a translation kept back or dropped, counted by kind."""

    def __init__(self, native: bool = False) -> None:
        self.native = native
        """To a Messages upstream: everything is kept, nothing reported."""
        self.ignored: list[str] = []
        self.counts: dict[str, int] = {}

    def add(self, kind: str, count: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + count

    def report(self) -> dict[str, Any]:
        if self.native:
            return {}
        out: dict[str, Any] = dict(sorted(self.counts.items()))
        if self.ignored:
            out["ignored"] = sorted(set(self.ignored))
        return out


def _typed(body: dict[str, Any], key: str, kind: type) -> Any:
    value = body[key]
    if not isinstance(value, kind):
        raise ValueError(f"{key} = {echo(value)}: must be a {kind.__name__}")
    return value


def _system(system: Any, lost: _Loss, where: str = "system") -> list[dict[str, Any]]:
    """A system message for ``system`` (a string or text blocks), or none. Claude Code also sends a
    ``{"role": "system"}`` turn among its messages (its environment block): kept in its place."""
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if not isinstance(system, list):
        raise ValueError(f"{where}: must be a string or a list of text blocks")
    parts = []
    for index, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ValueError(f"{where}.{index}: must be a text block ({{\"type\": \"text\", \"text\": ...}})")
        parts.append(_text_part(block, lost))
    return [{"role": "system", "content": parts}]


def _text_part(block: dict[str, Any], lost: _Loss) -> dict[str, Any]:
    if lost.native:
        return dict(block)
    part: dict[str, Any] = {"type": "text", "text": block["text"]}
    if block.get("cache_control") is not None:
        part["cache_control"] = block["cache_control"]
        lost.add("cache_control")
    if block.get("citations"):
        lost.add("citations")
    return part


def _image_part(block: dict[str, Any], where: str, lost: _Loss) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise ValueError(f"{where}.source: an image block needs a source (base64 or url)")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    elif lost.native:   # a file source, ...: the upstream reads it
        return dict(block)
    else:
        raise ValueError(f"{where}.source.type = {echo(source.get('type'))}: takes \"base64\" (with "
                         "media_type and data) or \"url\" here")
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if block.get("cache_control") is not None:
        part["cache_control"] = block["cache_control"]
        lost.add("cache_control")
    return part


def _turn(turn: Any, where: str, lost: _Loss) -> list[dict[str, Any]]:
    """One Messages turn as chat messages (a user turn with tool results: one or more)."""
    if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant", "system"):
        raise ValueError(f"{where}.role: must be \"user\" or \"assistant\" (or \"system\", as Claude Code sends)")
    role, content = turn["role"], turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "system":
        return _system(content, lost, f"{where}.content")
    if not isinstance(content, list):
        raise ValueError(f"{where}.content: must be a string or a list of content blocks")
    if role == "assistant":
        return [_assistant(content, where, lost)]
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content.{index}"
        kind = _kind(block, at)
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(_text_part(block, lost))
        elif kind == "image":
            parts.append(_image_part(block, at, lost))
        elif kind == "tool_result":
            tools.append(_tool_result(block, at, parts, lost))
        elif kind is None or kind == "text":
            raise ValueError(f"{at}: must be a content block with a type (and a text block, its text)")
        elif lost.native:
            parts.append(dict(block))
        else:
            lost.add(f"dropped_{kind}_blocks")
    messages = tools
    if parts:
        messages.append({"role": "user", "content": parts})
    return messages


def _kind(block: Any, where: str) -> str | None:
    """A content block's ``type`` (None: not an object, or no type).

    Raises:
        ValueError: the type is not a string (a list there was a loss key ``dropped_['x']_blocks``).
    """
    kind = block.get("type") if isinstance(block, dict) else None
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"{where}.type = {echo(kind)}: must be a string (text, image, tool_use, tool_result, ...)")
    return kind


def _tool_result(block: dict[str, Any], where: str, parts: list[dict[str, Any]], lost: _Loss) -> dict[str, Any]:
    """A chat tool message; the result's images go to the user message after the tool messages."""
    call = block.get("tool_use_id")
    if not isinstance(call, str) or not call:
        raise ValueError(f"{where}.tool_use_id: required, the id of the tool_use block it answers")
    content = block.get("content", "")
    if lost.native:
        return _native_result(call, content, block, where, lost)
    if block.get("is_error"):
        lost.add("tool_result_is_error")
    if isinstance(content, str):
        return _tool_message(call, content, block, lost)
    if not isinstance(content, list):
        raise ValueError(f"{where}.content: must be a string or a list of text and image blocks")
    texts: list[str] = []
    for index, item in enumerate(content):
        kind = _kind(item, f"{where}.content.{index}")
        if kind == "text" and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif kind == "image":
            parts.append(_image_part(item, f"{where}.content.{index}", lost))
            lost.add("tool_result_images_moved")
        else:
            lost.add(f"dropped_{kind}_blocks")
    return _tool_message(call, "\n".join(texts), block, lost)


def _native_result(call: str, content: Any, block: dict[str, Any], where: str, lost: _Loss) -> dict[str, Any]:
    """A tool message that keeps all of a ``tool_result`` (a Messages upstream rebuilds it): its content
    as it came (a string, or its blocks as parts: images as ``image_url`` parts), ``is_error`` and
    ``cache_control`` as keys of the message."""
    if not isinstance(content, (str, list)):
        raise ValueError(f"{where}.content: must be a string or a list of text and image blocks")
    if isinstance(content, list):
        content = [_image_part(item, f"{where}.content.{index}", lost)
                   if _kind(item, f"{where}.content.{index}") == "image" else dict(item)
                   for index, item in enumerate(content)]
    message = {"role": "tool", "tool_call_id": call, "content": content}
    message.update({key: block[key] for key in ("is_error", "cache_control") if key in block})
    return message


def _tool_message(call: str, text: str, block: dict[str, Any], lost: _Loss) -> dict[str, Any]:
    """A chat tool message; a ``cache_control`` mark kept on a text part (the chat client sends the text)."""
    if block.get("cache_control") is None:
        return {"role": "tool", "tool_call_id": call, "content": text}
    lost.add("cache_control")
    return {"role": "tool", "tool_call_id": call,
            "content": [{"type": "text", "text": text, "cache_control": block["cache_control"]}]}


def _assistant(content: list[Any], where: str, lost: _Loss) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content.{index}"
        kind = _kind(block, at)
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(_text_part(block, lost))
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ValueError(f"{at}: a tool_use block needs a string id and name")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": tool_arguments(block.get("input", {}))}})
            if lost.native and block.get("cache_control") is not None:
                calls[-1]["cache_control"] = block["cache_control"]
        elif kind in ("thinking", "redacted_thinking"):
            parts.append(dict(block))   # kept verbatim, signature included: another upstream resends it
            lost.add(f"{kind}_blocks")
        elif kind is None or kind == "text":
            raise ValueError(f"{at}: must be a content block with a type (and a text block, its text)")
        elif lost.native:
            parts.append(dict(block))
        else:
            lost.add(f"dropped_{kind}_blocks")
    message: dict[str, Any] = {"role": "assistant"}
    if not lost.native and all(part["type"] == "text" and "cache_control" not in part for part in parts):
        message["content"] = "".join(part["text"] for part in parts)
    else:
        message["content"] = parts
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any, lost: _Loss) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ValueError("tools: must be a list of tools")
    functions = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools.{index}: must be an object")
        kind = tool.get("type")
        if lost.native and ("input_schema" not in tool or kind not in (None, "custom")):
            continue   # a server tool: the Messages upstream runs it (it goes in NATIVE_KEY's tools)
        if "input_schema" not in tool or kind not in (None, "custom"):
            raise ValueError(
                f"tools.{index} (type {echo(kind)}, name {echo(tool.get('name'))}): a server tool, which "
                "this endpoint cannot run: it reaches the model through chat completions, which call function "
                "tools only. Offer it as a tool with an input_schema that the program runs, or leave it out")
        if not isinstance(tool.get("name"), str) or not isinstance(tool["input_schema"], dict):
            raise ValueError(f"tools.{index}: needs a string name and an input_schema object")
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if tool.get("cache_control") is not None:
            lost.add("cache_control")
        lost.ignored.extend(f"tools[].{key}" for key in tool if key not in _TOOL_KEYS)
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool" and isinstance(choice.get("name"), str):
        chat: Any = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        chat = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise ValueError(f"tool_choice = {echo(choice, 80)}: takes {{\"type\": \"auto\"}}, \"any\", "
                         "\"none\" or {\"type\": \"tool\", \"name\": ...}")
    out: dict[str, Any] = {"tool_choice": chat}
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        out["parallel_tool_calls"] = False
    return out
