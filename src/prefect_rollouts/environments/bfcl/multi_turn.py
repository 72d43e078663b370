"""``bfcl`` multi-turn category ``multi_turn_base``: live stateful tools, scored by replay.

Each item is a conversation (1 to 7 user turns, 3.7 on average) with tools backed by the stateful
Python classes bfcl-eval ships (a file system, messaging, Twitter, tickets, trading, travel,
vehicle control, math). The first turn is the prompt and each further turn one more segment, so
``trace.tool_calls[i].segment`` is the turn a call belongs to. ``setup`` loads the item's
classes with its initial state on the rollout's own copy of the task; the model's calls run on
those live instances and it sees their results (``bfcl_multi_turn_scoring.Backend``). The
offered functions are the classes' functions minus the item's ``excluded_function``.

The reward ``correct`` replays the calls on fresh instances, turn by turn, beside the ground
truth, under BFCL's multi-turn rules (``bfcl_multi_turn_scoring.check``); a failed rollout
gets ``trace.info["bfcl_failure"] = {"turn", "check", "details", "expected"}`` (``expected``: the
failed turn's ground-truth calls). Metrics: ``turns_passed``
(leading turns that passed) and ``num_calls``. Run it with ``runtime_tools = []``: a call of
a runtime tool (``bash``, ...) is no BFCL function and replays as a failed call.

``tool_choice`` is never forced: the model decides in each step whether to call a tool or
answer, and a forced call on every step would never end a turn.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from prefect_rollouts.environments.bfcl.data import data_dir, read_jsonl, tool_name, wire_schema
from prefect_rollouts.environments.bfcl.multi_turn_scoring import (
    DENIED,
    Backend,
    Verdict,
    check,
    constants,
    tool_class,
)
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.harnesses.schema import ToolSpec
from prefect_rollouts.task import Task, TaskData, metric, reward
from prefect_rollouts.trace import Trace

CATEGORIES = ("multi_turn_base",)


class PassThroughArguments(BaseModel):
    """A tool's JSON arguments, handed on untouched as ``arguments``: the BFCL classes receive
    exactly what the model sent (BFCL validates nothing either), so a live call and its replay at
    scoring time run the same way."""

    model_config = ConfigDict(extra="forbid")

    arguments: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _wrap(cls, data: Any) -> Any:
        return {"arguments": data}


class BfclMultiTurnTask(Task):
    """One multi-turn BFCL item. ``info`` holds ``category``, ``involved_classes``,
    ``initial_config`` (``{class: scenario}``), ``excluded_function`` and ``ground_truth`` (per
    turn, a list of call strings such as ``"cd(folder='document')"``)."""

    backend: Backend | None = None
    _verdict: tuple[tuple[str, int], Verdict] | None = None

    async def setup(self, runtime: Any = None) -> None:
        """Load the item's classes with their initial state, for this rollout only (each rollout
        runs on its own copy of the task)."""
        info = self.data.info
        self.backend = Backend(info["involved_classes"], info["initial_config"], info.get("excluded_function") or ())

    def tools(self) -> list[ToolSpec]:
        """The item's functions (minus ``excluded_function``), with their BFCL schemas, running on
        the live instances of ``setup``."""
        info = self.data.info
        excluded = set(info.get("excluded_function") or ()) | DENIED
        return [self._tool(doc) for class_name in info["involved_classes"]
                for doc in function_docs(class_name) if doc["name"] not in excluded]

    def _tool(self, doc: dict[str, Any]) -> ToolSpec:
        name = doc["name"]

        def run(arguments: dict[str, Any]) -> str:
            if self.backend is None:
                raise RuntimeError(f"tool {name!r} called before setup(); the harness opens after it")
            return self.backend.call(name, (), arguments)

        wire = tool_name(name)
        function = {"name": wire, "description": doc.get("description") or name,
                    "parameters": wire_schema(doc["parameters"])}
        return ToolSpec(name=wire, schema={"type": "function", "function": function},
                        arguments=PassThroughArguments, fn=run)

    def verdict(self, trace: Trace) -> Verdict:
        """``check`` on the trace's calls, grouped by segment (= turn); computed once per trace.
        A failure is recorded as ``trace.info["bfcl_failure"]``."""
        key = (trace.id, len(trace.tool_calls))
        if self._verdict is None or self._verdict[0] != key:
            turns: list[list[tuple[str, str]]] = [[] for _ in self.data.info["ground_truth"]]
            for call in trace.tool_calls:
                if 0 <= call.segment < len(turns):
                    turns[call.segment].append((call.name, call.arguments))
            self._verdict = key, check(self.data.info, turns)
        verdict = self._verdict[1]
        if verdict.failure is not None:
            trace.info["bfcl_failure"] = verdict.failure
        return verdict

    @reward
    def correct(self, trace: Trace) -> float:
        """1.0 when every turn passes BFCL's multi-turn checks."""
        return float(self.verdict(trace).valid)

    @metric
    def turns_passed(self, trace: Trace) -> float:
        """How many leading turns passed."""
        return float(self.verdict(trace).turns_passed)

    @metric
    def num_calls(self, trace: Trace) -> float:
        """How many tool calls the model made, over all turns."""
        return float(len(trace.tool_calls))


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs (name, description, parameters) of the tool class ``class_name``.

    Raises:
        ValueError: bfcl-eval has no function docs for the class.
    """
    files = constants().MULTI_TURN_FUNC_DOC_FILE_MAPPING
    if class_name not in files:
        raise ValueError(f"involved class {class_name!r}: bfcl-eval has no function docs for it")
    return tuple(read_jsonl(data_dir() / "multi_turn_func_doc" / files[class_name], None))


def load(category: str = "multi_turn_base", count: int | None = None) -> list[BfclMultiTurnTask]:
    """The first ``count`` items (all when None) of a multi-turn BFCL category as tasks.

    Raises:
        ConfigError: bfcl-eval is not installed (``data_dir``), or a tool class needs a package
            that is missing (``mpmath``: the ``bfcl`` extra).
        ValueError: ``category`` is not in ``CATEGORIES`` (``bfcl.load`` checks it first).
    """
    if category not in CATEGORIES:
        raise ValueError(f"category {category!r}: not a multi-turn category ({', '.join(CATEGORIES)})")
    root = data_dir()
    items = read_jsonl(root / f"BFCL_v4_{category}.json", count)
    answers = {row["id"]: row["ground_truth"]
               for row in read_jsonl(root / "possible_answer" / f"BFCL_v4_{category}.json", None)}
    for class_name in sorted({name for item in items for name in item["involved_classes"]}):
        try:
            tool_class(class_name)
        except ImportError as exc:
            raise ConfigError(f'[env.taskset] category = "{category}": bfcl-eval\'s tool class {class_name} does not '
                              f"import ({exc}). Install the bfcl extra: pip install 'prefect-rollouts[bfcl]'") from exc
    tasks = []
    for item in items:
        first, *rest = item["question"]
        tasks.append(BfclMultiTurnTask(TaskData(
            id=item["id"], prompt=first, user_turns=rest,
            info={"category": category, "involved_classes": item["involved_classes"],
                  "initial_config": item["initial_config"], "excluded_function": item.get("excluded_function", []),
                  "ground_truth": answers[item["id"]]})))
    return tasks

