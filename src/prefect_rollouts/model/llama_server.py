"""The local model server process: llama-cpp-python's server with a tool-calling chat format that
shows the model its whole conversation.

Run as ``python -m prefect_rollouts.model.llama_server <llama_cpp.server arguments>`` (what
``LocalModelServer`` does); pass ``--chat_format prefect-rollouts-tools``. That format is
llama-cpp-python's ``chatml-function-calling`` with six fixes applied to each request, found
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
5. Under ``tool_choice = "auto"`` it generates in several steps (choosing a tool or a message,
   each tool's arguments, whether another call follows, or the message) and passes
   ``max_tokens=None`` to every step, so a tool's arguments ran until the context was full (one
   request of 550 tokens ran 384 s to the end of the 8192-token context, then failed with a
   context-length error). Every generation of a request now draws on one budget
   (``Steps``): the request's ``max_tokens``, else ``DEFAULT_MAX_TOKENS``; ``usage`` counts
   every token generated, and a response the budget cut short finishes as ``length``.
6. Under ``"auto"``, when the model chose to answer in words, it generated that message under the
   grammar for the next tool's name (a function name or the end), so the message was always
   empty: SmolLM2 answering "Hello! Who are you?" beside a tool got ``content: ""``. The message
   step now runs without a grammar.
"""

from __future__ import annotations

import json
from typing import Any

from prefect_rollouts.trace import content_text

CHAT_FORMAT = "prefect-rollouts-tools"
DEFAULT_MAX_TOKENS = 1024
"""Tokens a request may generate when it sends no ``max_tokens`` (llama-cpp-python's default is the
whole context, 8192 for SmolLM2). A shell command, a BFCL call or a HumanEval body is a few hundred
tokens; past 1024 a 135M model is almost always repeating itself. SmolLM2 generated 57 tokens/s
alone on 2 cores here and about 20 in the 384 s request (fix 5), so 1024 tokens is under a
minute. Send ``max_tokens`` (``max_turn_tokens`` or ``sampling.max_tokens``) for more."""


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


class Steps:
    """The ``llama`` a chat handler sees for one request, so that its generation steps can be mended:
    each ``create_completion`` may generate at most what is left of ``max_tokens`` over the request,
    whatever the handler passes (fix 5), and the message step runs without a grammar (fix 6).

    Args:
        llama: The server's ``llama_cpp.Llama``.
        max_tokens: The request's cap (None or below 1: ``DEFAULT_MAX_TOKENS``).

    Attributes:
        left: Tokens still to generate.
        generated: Completion tokens of every step so far.
        prompt_tokens: The first step's prompt tokens (the conversation as rendered), or 0.
        cut: True once a step ended at its cap (``finish_reason == "length"``) or found none left.
    """

    def __init__(self, llama: Any, max_tokens: int | None) -> None:
        self.llama = llama
        self.left = max_tokens if max_tokens is not None and max_tokens > 0 else DEFAULT_MAX_TOKENS
        self.generated = self.prompt_tokens = 0
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llama, name)

    def create_completion(self, **kwargs: Any) -> Any:
        """``Llama.create_completion`` with ``max_tokens`` at most ``left`` (a completion with no
        text when nothing is left: llama-cpp-python reads 0 as no cap)."""
        if self.left <= 0:
            self.cut = True
            return {"id": "cmpl-budget", "object": "text_completion", "created": 0, "model": kwargs.get("model"),
                    "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
        if str(kwargs.get("prompt", "")).endswith("message:\n"):   # only the message step's prompt ends so
            kwargs["grammar"] = None
        requested = kwargs.get("max_tokens")
        kwargs["max_tokens"] = self.left if requested is None or requested <= 0 else min(requested, self.left)
        completion = self.llama.create_completion(**kwargs)
        if not isinstance(completion, dict):   # a stream: the request's last step, capped all the same
            return completion
        usage = completion["usage"]
        self.prompt_tokens = self.prompt_tokens or usage["prompt_tokens"]
        self.generated += usage["completion_tokens"]
        self.left -= usage["completion_tokens"]
        self.cut = self.cut or completion["choices"][0]["finish_reason"] == "length"
        return completion

    def account(self, response: Any) -> Any:
        """``response`` (a chat completion) with ``usage`` counting every step, and ``finish_reason``
        ``length`` when the budget cut its tool calls short (none, or arguments that are not whole JSON)."""
        if not isinstance(response, dict):
            return response
        response["usage"] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.generated,
                             "total_tokens": self.prompt_tokens + self.generated}
        choice = response["choices"][0]
        calls = choice["message"].get("tool_calls")
        if self.cut and choice["finish_reason"] == "tool_calls" and not (calls and all(
                _is_json(call["function"]["arguments"]) for call in calls)):
            choice["finish_reason"] = "length"
        return response


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


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
        budget = kwargs["llama"] = Steps(kwargs["llama"], kwargs.get("max_tokens"))
        return budget.account(llama_chat_format.chatml_function_calling(**kwargs))


def main() -> None:
    """Install the fixes, then run llama_cpp.server's own entry point on ``sys.argv``."""
    install()
    from llama_cpp.server.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()
