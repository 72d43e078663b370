"""BFCL's multi-turn execution and checks, as our own code.

``Backend`` holds live instances of an item's tool classes (the Python classes bfcl-eval ships:
``GorillaFileSystem``, ``TradingBot``, ...) and calls their public methods by name, turning each
result into the text the model sees, as BFCL's executor does: a ``str`` as is, a ``dict`` as
JSON (``str`` when it is not serialisable), anything else ``str``; a raising call becomes
``"Error during execution: <message>"``. Unlike BFCL it never ``eval``s: names are looked up in
a table of the instances' public methods, ground-truth call strings are parsed with ``ast`` and
each argument read with ``ast.literal_eval``, and BFCL's deny list (``kill``, ``exit``, ...)
still applies.

``check`` replays a rollout under the rules of BFCL's ``multi_turn_checker`` (and its
irrelevance checker): fresh model and ground-truth instances loaded with the item's initial
config; per turn the model's calls and then the turn's ground-truth calls run on their own
instances; a turn whose ground truth is empty must have no model call; any other turn must have
at least one, every public attribute of every instance must equal the ground truth's (state),
and the turn's ground-truth results must all appear, as a multiset, among the results of the
model's calls so far (response). BFCL's checker keeps its instances in ``globals()`` keyed by
model name and item id, so it is not called here; ``tests/environments/test_bfcl_multi_turn.py``
checks agreement with it.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prefect_rollouts.nesting import loads

#: Method names BFCL's executor refuses to call (``multi_turn_utils.execute_multi_turn_func_call``).
DENIED = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
_SHORT = 200  # characters of a value kept in a failure's details
_EXPECTED_CALLS = 20  # ground-truth calls of the failed turn kept in a failure (multi_turn_base: at most 7)
#: One tool call at a time per process: ``MathAPI`` sets ``mpmath.mp.dps``, which is process-wide,
#: so concurrent rollouts (tools run in worker threads) would change each other's precision.
_CALL_LOCK = threading.Lock()


def constants() -> Any:
    """bfcl-eval's class tables (``CLASS_FILE_PATH_MAPPING``, ``STATELESS_CLASSES``,
    ``MULTI_TURN_FUNC_DOC_FILE_MAPPING``); the module imports nothing outside the standard library."""
    return importlib.import_module("bfcl_eval.constants.executable_backend_config")


def tool_class(class_name: str) -> type:
    """The bfcl-eval class ``class_name`` (imports its module, which uses only the standard
    library and, for ``MathAPI``, ``mpmath``).

    Raises:
        ValueError: bfcl-eval has no such class.
        ImportError: its module needs a package that is not installed (e.g. ``WebSearchAPI``).
    """
    modules = constants().CLASS_FILE_PATH_MAPPING
    if class_name not in modules:
        raise ValueError(f"involved class {class_name!r}: bfcl-eval has no such tool class "
                         f"(known: {', '.join(sorted(modules))})")
    return getattr(importlib.import_module(modules[class_name]), class_name)


def as_text(result: Any) -> str:
    """A method's result as the model sees it, as BFCL converts it (see the module docstring)."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class Backend:
    """Live instances of ``involved_classes``, each stateful one loaded with a deep copy of its
    ``initial_config`` entry (``long_context=False``), and the methods callable on them.

    Args:
        involved_classes: bfcl-eval class names, e.g. ``["GorillaFileSystem", "TwitterAPI"]``.
        initial_config: ``{class name: scenario dict}``; a class without an entry gets ``{}``.
        excluded: Method names not callable (the item's ``excluded_function``).

    Raises:
        ValueError, ImportError: as ``tool_class``.
    """

    def __init__(self, involved_classes: Iterable[str], initial_config: dict[str, Any],
                 excluded: Iterable[str] = ()) -> None:
        stateless = set(constants().STATELESS_CLASSES)
        excluded = set(excluded)
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for class_name in involved_classes:
            instance = tool_class(class_name)()
            if class_name not in stateless:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=False)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, inspect.ismethod):
                if not name.startswith("_") and name not in excluded:
                    self.methods[name] = method  # as in BFCL, a later class wins a shared name

    def call(self, name: str, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None) -> str:
        """Call method ``name`` and return its result as text (errors too, see the module docstring)."""
        if name in DENIED:
            return f"Error during execution: Function call {name} is not allowed."
        method = self.methods.get(name)
        if method is None:
            return f"Error during execution: name {name!r} is not defined"
        try:
            with _CALL_LOCK:
                return as_text(method(*args, **(kwargs or {})))
        except Exception as exc:  # the classes report misuse by raising, as BFCL relays it
            return f"Error during execution: {exc}"

    def call_json(self, name: str, arguments: str) -> str:
        """Call ``name`` with keyword arguments from a JSON object string (a model's tool call)."""
        try:
            kwargs = loads(arguments or "{}", "the text")   # a model's: nested past MAX_JSON_DEPTH is refused
        except ValueError as exc:
            kwargs, problem = None, str(exc)
        else:
            problem = "not a JSON object"
        if not isinstance(kwargs, dict):
            return f"Error during execution: the arguments of {name} are not a JSON object ({problem})"
        return self.call(name, (), kwargs)

    def differences(self, other: Backend) -> list[dict[str, Any]]:
        """Public attributes (BFCL's state) of ``other``'s instances that differ in ``self``'s:
        ``[{"class": name, "attributes": [names]}]``, empty when the states match."""
        found = []
        for class_name, expected in other.instances.items():
            actual = self.instances[class_name]
            names = [attr for attr, value in vars(expected).items()
                     if not attr.startswith("_") and getattr(actual, attr, _MISSING) != value]
            if names:
                found.append({"class": class_name, "attributes": names})
        return found


_MISSING = object()


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """A ground-truth call string such as ``"mv(source='a.txt', destination='temp')"`` or
    ``"sort('final_report.pdf')"`` as ``(name, positional args, keyword args)``.

    Raises:
        ValueError: not a single call of a plain name with literal arguments (never evaluated).
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a call of a plain function name")
        if any(k.arg is None for k in node.keywords):
            raise ValueError("**arguments are not supported")
        return (node.func.id, [ast.literal_eval(a) for a in node.args],
                {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None})
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"ground-truth call {text!r}: {exc}") from exc


@dataclass
class Verdict:
    """The outcome of ``check``: ``valid``, ``turns_passed`` (leading turns that passed),
    ``failure`` (``{"turn", "check", "details"}`` or None) and ``results`` (per turn, the
    model's call results in the replay)."""

    valid: bool
    turns_passed: int
    failure: dict[str, Any] | None = None
    results: list[list[str]] = field(default_factory=list)


def check(info: dict[str, Any], model_calls: list[list[tuple[str, str]]]) -> Verdict:
    """Replay and check a rollout under BFCL's multi-turn rules (see the module docstring).

    Args:
        info: The item's ``TaskData.info``: ``involved_classes``, ``initial_config``,
            ``excluded_function`` and ``ground_truth`` (call strings per turn).
        model_calls: Per turn, the model's calls as ``(name, JSON arguments string)`` in call
            order; turns past the end of the list (a rollout that stopped early) are empty.

    Returns:
        A ``Verdict``; ``failure["check"]`` is ``"irrelevance"``, ``"empty_turn"``, ``"state"``
        or ``"response"``, ``failure["details"]`` is small and JSON-serialisable, and
        ``failure["expected"]`` lists the failed turn's ground-truth calls (call strings, each cut
        to 200 characters), to read beside the model's calls of that turn.

    Raises:
        ValueError: a ground-truth call string does not parse (``parse_call``).
    """
    classes, config = info["involved_classes"], info["initial_config"]
    model = Backend(classes, config, info.get("excluded_function") or ())
    truth = Backend(classes, config)
    verdict = Verdict(valid=False, turns_passed=0)
    seen: list[str] = []
    for turn, expected_calls in enumerate(info["ground_truth"]):
        calls = model_calls[turn] if turn < len(model_calls) else []
        results = [model.call_json(name, arguments) for name, arguments in calls]
        verdict.results.append(results)
        seen.extend(results)
        expected = [truth.call(*parse_call(text)) for text in expected_calls]
        failure: tuple[str, Any] | None = None
        if not expected_calls:
            if calls:
                failure = "irrelevance", {"calls": [name for name, _ in calls][:10]}
        elif not calls:
            failure = "empty_turn", {"expected_calls": len(expected_calls)}
        elif differences := model.differences(truth):
            failure = "state", {"differences": differences}
        elif missing := _missing(expected, seen):
            failure = "response", {"missing": [_short(item) for item in missing[:5]], "count": len(missing)}
        if failure is not None:
            verdict.failure = {"turn": turn, "check": failure[0], "details": failure[1],
                               "expected": [_short(text) for text in expected_calls[:_EXPECTED_CALLS]]}
            return verdict
        verdict.turns_passed = turn + 1
    verdict.valid = True
    return verdict


def _missing(expected: list[str], seen: list[str]) -> list[str]:
    """Items of ``expected`` not matched one-for-one in ``seen`` (an unordered multiset test)."""
    pool = list(seen)
    missing = []
    for item in expected:
        if item in pool:
            pool.remove(item)
        else:
            missing.append(item)
    return missing


def _short(text: str) -> str:
    return text if len(text) <= _SHORT else text[:_SHORT] + "..."
