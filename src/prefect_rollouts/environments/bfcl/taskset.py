"""``bfcl``: categories of the Berkeley Function Calling Leaderboard (PyPI ``bfcl-eval``).

Single-turn categories: the task's functions are offered as answer tools (never executed); the
model's tool calls are its answer, scored by BFCL's AST rules (``bfcl/scoring.py``); a miss records
the ground truth beside the answer and the rule broken in ``trace.info["bfcl_failure"]``. Function
names with dots (not allowed in tool names) are sent with ``_`` and mapped back before scoring.
For these, only bfcl-eval's data files are read, located with ``importlib.util.find_spec``.

Multi-turn category ``multi_turn_base`` (``bfcl/multi_turn.py``): user turns against live,
stateful tools (bfcl-eval's tool classes, which import only the standard library and
``mpmath``), scored by replaying the calls beside the ground truth under BFCL's multi-turn rules
(``bfcl/multi_turn_scoring.py``). ``bfcl-eval`` is installed with ``--no-deps`` (its pinned
dependencies are heavy); nothing else of it is imported.

Options: ``category`` (``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``,
``irrelevance``, ``multi_turn_base``) or ``categories`` (a list of them, one taskset),
``count`` (first N items of each category), ``force_tool_choice``
(single-turn only, default on: force a call of the task's function when it has exactly one,
and ``"required"`` otherwise; models such as SmolLM2-135M make no tool calls unless forced; off
for ``irrelevance``. Multi-turn never forces: the model decides when a turn is done, so
``force_tool_choice = true`` is refused there).
"""

from __future__ import annotations

import json
from typing import Any

from prefect_rollouts.environments.bfcl.data import data_dir, read_jsonl, tool_name, wire_schema
from prefect_rollouts.environments.bfcl.scoring import mismatch
from prefect_rollouts.errors import ConfigError, scrub_cut
from prefect_rollouts.harnesses.schema import ToolSpec, answer_tool
from prefect_rollouts.nesting import loads
from prefect_rollouts.task import Task, TaskData, metric, reward
from prefect_rollouts.trace import Trace

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "multi_turn_base")
MULTI_TURN_CATEGORIES = ("multi_turn_base",)
class BfclTask(Task):
    """One BFCL item: ``info`` holds ``category``, ``functions`` and ``ground_truth``."""

    def tools(self) -> list[ToolSpec]:
        """The item's functions as answer tools, names sanitised for the wire."""
        return [answer_tool(tool_name(f["name"]), f.get("description", ""), wire_schema(f["parameters"]))
                for f in self.data.info["functions"]]

    def calls(self, trace: Trace) -> list[dict[str, dict[str, Any]]] | None:
        """The model's answer: the calls of its first tool-calling message, original names; None if
        an argument string is not a JSON object."""
        names = {tool_name(f["name"]): f["name"] for f in self.data.info["functions"]}
        for message in trace.messages:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                answer = []
                for call in message["tool_calls"]:
                    function = call.get("function") or {}
                    try:
                        arguments = loads(function.get("arguments") or "{}", "the arguments")
                    except ValueError:   # not JSON, or nested past MAX_JSON_DEPTH (never a RecursionError)
                        return None
                    if not isinstance(arguments, dict):
                        return None
                    answer.append({names.get(function.get("name", ""), function.get("name", "")): arguments})
                return answer
        return []

    @reward
    def ast_match(self, trace: Trace) -> float:
        """1.0 when the calls satisfy BFCL's AST rules for the category; 0.0 otherwise, with what was
        compared in ``trace.info["bfcl_failure"]``: ``check`` (``"ast"``), ``details`` (the rule
        broken, ``bfcl_scoring.mismatch``), ``expected`` (the ground truth: per expected call, each
        parameter's accepted values, ``""`` meaning it may be left out) and ``answer`` (the model's
        calls, original names), each as JSON-like data or, past ``FAILURE_JSON_CHARS`` of JSON, the cut
        text (``traces show`` prints them)."""
        calls = self.calls(trace)
        info = self.data.info
        if calls is None:
            reason: str | None = "a call's arguments are not a JSON object"
        else:
            reason = mismatch(info["category"], info["functions"], calls, info["ground_truth"])
        if reason is None:
            trace.info.pop("bfcl_failure", None)   # an earlier scoring attempt may have recorded one
            return 1.0
        trace.info["bfcl_failure"] = {"check": "ast", "details": reason, "expected": shown(info["ground_truth"]),
                                      "answer": shown(calls if calls is not None else answer_text(trace))}
        return 0.0

    @metric
    def num_calls(self, trace: Trace) -> float:
        """How many calls the answer makes."""
        return float(len(self.calls(trace) or []))


FAILURE_JSON_CHARS = 2000
"""Characters of JSON of the ground truth, and of the answer, kept in ``info["bfcl_failure"]``."""


def shown(value: Any) -> Any:
    """``value`` when its JSON (scrubbed of secrets) fits ``FAILURE_JSON_CHARS``; else that JSON, scrubbed and cut."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    safe = scrub_cut(text, FAILURE_JSON_CHARS)
    return value if safe == text else safe


def answer_text(trace: Trace) -> list[str]:
    """The raw tool calls of the first tool-calling message, ``name(arguments text)``: an answer
    whose arguments are not JSON objects."""
    message = next((m for m in trace.messages if m.get("role") == "assistant" and m.get("tool_calls")), {})
    return [f"{(call.get('function') or {}).get('name', '?')}({(call.get('function') or {}).get('arguments', '')})"
            for call in message.get("tool_calls") or []]


def load(category: str = "simple_python", count: int | None = None,
         force_tool_choice: bool | None = None, categories: list[str] | None = None) -> list[Task]:
    """The first ``count`` items (all when None) of a BFCL category, or of each of several, as tasks.

    Args:
        category: One of ``CATEGORIES``; ``multi_turn_base`` gives
            ``BfclMultiTurnTask``s (``bfcl_multi_turn.load``), the others ``BfclTask``s.
        count: How many items of each category, from the first; None for all.
        categories: Several categories in one taskset, in this order (instead of ``category``,
            which must then be left at its default);
            each task's ``info["category"]`` says which, so the summary and ``traces compare``
            report each category.
        force_tool_choice: Single-turn only: None (default) or True forces the call (see the
            module docstring), False leaves ``tool_choice`` to the agent's sampling config.

    Raises:
        ConfigError: unknown category, ``force_tool_choice = true`` with a multi-turn
            category, or bfcl-eval not installed.
    """
    if categories is not None:
        if category != "simple_python":
            raise ConfigError(f"[env.taskset] category = {category!r} and categories = {categories!r}: give one. "
                              "Remove category, or put it in the list")
        if not categories or len(set(categories)) != len(categories):
            raise ConfigError(f"[env.taskset] categories = {categories!r}: list each category once, at least one "
                              f"(of {', '.join(CATEGORIES)})")
        return [task for name in categories for task in load(name, count, force_tool_choice)]
    if category not in CATEGORIES:
        raise ConfigError(f"[env.taskset] category = {category!r}: not supported. Use one of {', '.join(CATEGORIES)}")
    if category in MULTI_TURN_CATEGORIES:
        if force_tool_choice:
            raise ConfigError(f"[env.taskset] force_tool_choice = true: does not apply to category {category!r} "
                              "(the model decides when to call a tool; a call forced on every step would never "
                              "end a turn). Remove the key, or set it to false")
        from prefect_rollouts.environments.bfcl import multi_turn as bfcl_multi_turn

        return list(bfcl_multi_turn.load(category, count))  # list[Task]: list is invariant
    force_tool_choice = True if force_tool_choice is None else force_tool_choice
    root = data_dir()
    items = read_jsonl(root / f"BFCL_v4_{category}.json", count)
    answer_file = root / "possible_answer" / f"BFCL_v4_{category}.json"
    answers = {} if category == "irrelevance" else {
        row["id"]: row["ground_truth"] for row in read_jsonl(answer_file, None)}
    tasks: list[Task] = []
    for item in items:
        functions = item["function"]
        choice: Any = None
        if force_tool_choice and category != "irrelevance":
            choice = ({"type": "function", "function": {"name": tool_name(functions[0]["name"])}}
                      if len(functions) == 1 else "required")
        tasks.append(BfclTask(TaskData(
            id=item["id"], prompt=item["question"][0], tool_choice=choice,
            info={"category": category, "functions": functions, "ground_truth": answers.get(item["id"], [])})))
    return tasks
