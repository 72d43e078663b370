"""The request side of the OpenAI Responses dialect (``dialects.responses``): ``input`` items, content
parts, tools, ``tool_choice`` and ``text.format`` in chat-completions form, with what is lost counted.
``native`` (the agent's client speaks Responses too): nothing but what the chat form cannot hold is
changed, and that is kept (``trace.RESPONSES_ITEM``, parts and items verbatim). Plain data in and out."""

from __future__ import annotations

from typing import Any

from prefect_rollouts.harnesses.dialects import echo
from prefect_rollouts.trace import RESPONSES_ITEM

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text"})


def count(lost: dict[str, Any], group: str, kind: Any) -> None:
    counts = lost.setdefault(group, {})
    counts[str(kind)] = counts.get(str(kind), 0) + 1


def text_of(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string")
    return value


def _content(content: Any, where: str, lost: dict[str, Any], native: bool = False) -> str | list[dict[str, Any]]:
    """A message's ``content`` in chat form: a string, or parts when an image is among them; ``native``
    (a Responses upstream): a list stays a list, its text parts keeping their other keys, parts of any
    other type kept verbatim."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: must be a string or a list of content parts")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        if not isinstance(part, dict):
            raise ValueError(f"{where}.{index}: must be an object")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise ValueError(f"{where}.{index}.type = {echo(kind)}: must be a string (input_text, input_image, ...)")
        if kind in _TEXT_PARTS:
            text = text_of(part.get("text"), f"{where}.{index}.text")
            extra = {key: value for key, value in part.items() if key not in ("type", "text")} if native else {}
            parts.append({"type": "text", "text": text, **extra})
        elif kind == "refusal" and not native:
            parts.append({"type": "text", "text": text_of(part.get("refusal"), f"{where}.{index}.refusal")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image = {"url": part["image_url"], **({"detail": part["detail"]} if part.get("detail") else {})}
            parts.append({"type": "image_url", "image_url": image})
        elif native:
            parts.append(dict(part))
        else:
            count(lost, "dropped_parts", kind)
    if not native and all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def messages_of(body: dict[str, Any], lost: dict[str, Any], native: bool = False) -> list[dict[str, Any]]:
    """Chat messages for ``instructions`` and ``input`` (the module docstring has the rules; ``native``:
    to a Responses upstream)."""
    system: list[str] = []
    if body.get("instructions") is not None:
        system.append(text_of(body["instructions"], "instructions"))
    items = body.get("input")
    if items is None:
        raise ValueError("input: Field required. Send the conversation as a string or a list of items")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValueError("input: must be a string or a list of items")
    messages: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None   # the assistant message being assembled from output items

    def assistant_turn() -> dict[str, Any]:
        nonlocal turn
        if turn is None or _has_text(turn) or turn.get("tool_calls"):
            turn = {"role": "assistant", "content": [] if native else ""}
            messages.append(turn)
        return turn

    for index, item in enumerate(items):
        where = f"input.{index}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ValueError(f"{where}.role = {echo(role)}: must be user, assistant, system or "
                                 "developer")
            content = _content(item.get("content"), f"{where}.content", lost, native)
            if role in ("system", "developer") and not messages and isinstance(content, str) and not native:
                system.append(content)   # leading instructions: one system message
                continue
            fields = _fields(item, ("type", "role", "content")) if native else {}
            if role == "assistant":
                _add_text(current := assistant_turn(), content)
                current.update(fields)
                continue
            turn = None
            messages.append({"role": "system" if role == "developer" and not native else role, "content": content,
                             **fields})
        elif kind == "reasoning" or (native and kind not in ("function_call", "function_call_output")):
            current = assistant_turn()
            parts = current["content"] if isinstance(current["content"], list) else []
            current["content"] = [*parts, dict(item)]
            if not native:
                lost["reasoning_items"] = lost.get("reasoning_items", 0) + 1
        elif kind == "function_call":
            call = {"id": text_of(item.get("call_id"), f"{where}.call_id"), "type": "function",
                    "function": {"name": text_of(item.get("name"), f"{where}.name"),
                                 "arguments": text_of(item.get("arguments"), f"{where}.arguments")},
                    **(_fields(item, ("type", "call_id", "name", "arguments")) if native else {})}
            if turn is None:
                turn = {"role": "assistant", "content": [] if native else ""}
                messages.append(turn)
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            turn = None
            output = _content(item.get("output"), f"{where}.output", lost, native)
            if isinstance(output, list) and not native:   # a tool message holds text: its images are lost
                for part in output:
                    if part["type"] != "text":
                        count(lost, "dropped_parts", "input_image")
                output = "".join(part.get("text", "") for part in output)
            messages.append({"role": "tool", "tool_call_id": text_of(item.get("call_id"), f"{where}.call_id"),
                             "content": output, **(_fields(item, ("type", "call_id", "output")) if native else {})})
        else:
            count(lost, "dropped_items", kind)
    if not [message for message in messages if message["role"] not in ("system", "developer")]:
        raise ValueError("input: holds no message (system and developer ones aside). Send at least one user message")
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return messages


def _fields(item: dict[str, Any], carried: tuple[str, ...]) -> dict[str, Any]:
    """``{RESPONSES_ITEM: the fields of item but those carried}``, or ``{}`` when there are none."""
    rest = {key: value for key, value in item.items() if key not in carried}
    return {RESPONSES_ITEM: rest} if rest else {}


def _has_text(message: dict[str, Any]) -> bool:
    content = message["content"]
    return bool(content) if isinstance(content, str) else any(part.get("type") == "text" for part in content)


def _add_text(message: dict[str, Any], content: str | list[dict[str, Any]]) -> None:
    """Append an assistant ``message`` item's text to the assistant message being assembled (its parts,
    when it holds a list: to a Responses upstream)."""
    if isinstance(message["content"], list) and isinstance(content, list):
        message["content"] = [*message["content"], *content]
        return
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
    if isinstance(message["content"], list):
        message["content"] = [*message["content"], {"type": "text", "text": text}]
    else:
        message["content"] += text


def tools_of(tools: Any, lost: dict[str, Any]) -> list[dict[str, Any]]:
    """Function tools in chat's nested form; other types dropped (listed), ``strict`` counted."""
    if not isinstance(tools, list):
        raise ValueError("tools: must be a list")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools.{index}: must be an object")
        if tool.get("type") != "function":
            lost.setdefault("dropped_tools", []).append(str(tool.get("name") or tool.get("type")))
            continue
        function = {"name": text_of(tool.get("name"), f"tools.{index}.name")}
        if tool.get("description") is not None:
            function["description"] = text_of(tool["description"], f"tools.{index}.description")
        if tool.get("parameters") is not None:
            function["parameters"] = tool["parameters"]
        if tool.get("strict"):
            lost["strict_tools"] = lost.get("strict_tools", 0) + 1
        out.append({"type": "function", "function": function})
    return out


def tool_choice_of(choice: Any, lost: dict[str, Any]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    lost["dropped_tool_choice"] = choice if isinstance(choice, str) else choice.get("type") \
        if isinstance(choice, dict) else echo(choice)
    return None


def response_format_of(text: Any, lost: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (``text``: none needed); ``verbosity`` is lost."""
    if not isinstance(text, dict):
        raise ValueError("text: must be an object")
    if text.get("verbosity") is not None:
        lost["text_verbosity"] = text["verbosity"]
    form = text.get("format")
    if not isinstance(form, dict) or form.get("type") in (None, "text"):
        return None
    if form["type"] == "json_object":
        return {"type": "json_object"}
    if form["type"] == "json_schema":
        schema = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
        return {"type": "json_schema", "json_schema": schema}
    lost["dropped_text_format"] = str(form["type"])
    return None
