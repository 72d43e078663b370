"""The local model server process: llama-cpp-python's server with a tool-calling chat format that
shows the model its whole conversation.

Run as ``python -m prefect_rollouts.model.llama_server <llama_cpp.server arguments>`` (what
``LocalModelServer`` does); pass ``--chat_format prefect-rollouts-tools``. That format is
llama-cpp-python's ``chatml-function-calling`` with four fixes applied to each request, found
by reading what it renders (llama-cpp-python 0.3):

1. Its template is rendered with HTML autoescaping, so every quote, ``<`` and ``&`` reached the
   model as ``&#39;``, ``&lt;``, ``&amp;``. Autoescaping is switched off in this process, which
   renders nothing but chat templates.
2. It lists the tools only inside a system message: a request with tools and no system
   message gets an empty one first.
3. It renders no ``tool`` message at all, so the model never saw a tool's result: each becomes
   a user message ``functions.<name> returned:`` followed by the result.
4. Without ``tool_choice`` it leaves the tools out entirely; OpenAI's default with tools is
   ``"auto"``, which is what is sent.
"""

from __future__ import annotations

from typing import Any

from prefect_rollouts.trace import content_text

CHAT_FORMAT = "prefect-rollouts-tools"


def prepare_messages(messages: list[dict[str, Any]], tools: list[Any] | None) -> list[dict[str, Any]]:
    """Fixes 2 and 3 of the module docstring on a request's ``messages`` (returns a new list).

    Also what the template cannot render: content given as parts (or missing) becomes text,
    ``developer`` messages count as ``system``, and all system messages merge into one leading
    message (the template lists the tools once per system message).

    Args:
        messages: OpenAI wire messages.
        tools: The request's ``tools`` (None or empty: no system message is added).
    """
    names = {call.get("id"): (call.get("function") or {}).get("name", "tool")
             for message in messages if message.get("role") == "assistant"
             for call in message.get("tool_calls") or []}
    system: list[str] = []
    prepared = []
    for message in messages:
        role, text = message.get("role"), content_text(message.get("content"))
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool":
            name = names.get(message.get("tool_call_id"), "tool")
            prepared.append({"role": "user", "content": f"functions.{name} returned:\n{text}"})
        else:
            prepared.append({**message, "content": text})
    if system or tools:
        prepared.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return prepared


def install() -> None:
    """Switch off template autoescaping in this process and register ``CHAT_FORMAT``."""
    import jinja2
    from llama_cpp import llama_chat_format

    jinja2.select_autoescape = lambda *args, **kwargs: (lambda template_name=None: False)

    @llama_chat_format.register_chat_completion_handler(CHAT_FORMAT)
    def tools_chat(**kwargs: Any) -> Any:
        tools = kwargs.get("tools")
        kwargs["messages"] = prepare_messages(list(kwargs.get("messages") or []), tools)
        if tools and kwargs.get("tool_choice") is None:
            kwargs["tool_choice"] = "auto"
        return llama_chat_format.chatml_function_calling(**kwargs)


def main() -> None:
    """Install the fixes, then run llama_cpp.server's own entry point on ``sys.argv``."""
    install()
    from llama_cpp.server.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()
