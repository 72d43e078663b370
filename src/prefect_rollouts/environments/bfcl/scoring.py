"""BFCL's AST rules for Python function calls, as our own code.

A model answer is a list of calls ``[{function_name: {param: value}}]``; the ground truth gives,
per expected call, each parameter's acceptable values (``""`` among them: the parameter may be
left out). Rules, as the Berkeley Function Calling Leaderboard's checker applies them:

- simple: exactly one call, to the expected function; every required parameter present; no
  parameter the function or the answer does not know; each value of the declared type (an int
  passes for a float; a value of the answer's type passes as a "variable") and among the
  acceptable values: strings compared after dropping spaces and ``,./-_*^`` and lowering case,
  lists element-wise the same way, dicts key by key; every answer parameter without ``""`` given.
- multiple: one call, checked as simple against the expected function.
- parallel, parallel_multiple: as many calls as expected, each expected call matched by a
  distinct model call, in any order.
- irrelevance: correct when there is no call.

``mismatch`` says which rule an answer breaks (``check`` is whether it breaks none).

``tests/environments/test_bfcl.py`` checks agreement with the package's own checker.
"""

from __future__ import annotations

import re
from typing import Any, cast

from prefect_rollouts.errors import scrub

_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                           "tuple": list, "dict": dict, "any": str}
_NESTED = ("array", "tuple")
_DROP = re.compile(r"[ ,./\-_*^]")
SHOWN_CHARS = 200
"""Characters of a value kept in a ``mismatch`` line."""

Call = dict[str, dict[str, Any]]


def check(category: str, functions: list[dict[str, Any]], calls: list[Call], answers: list[Call]) -> bool:
    """True when ``calls`` answer the task under ``category``'s rules (see the module docstring)."""
    return mismatch(category, functions, calls, answers) is None


def mismatch(category: str, functions: list[dict[str, Any]], calls: list[Call], answers: list[Call]) -> str | None:
    """Why ``calls`` do not answer the task: the first rule they break, in one line naming the call,
    the parameter, the value given and the values accepted (each value cut to ``SHOWN_CHARS``), e.g.
    ``calculate_area: unit = 'cm' is not an accepted value (['units'])``; None when they answer it.
    With parallel calls the line names the first expected call no model call matches, and why the
    closest one (the first unmatched call to the same function, else any) does not."""
    if category == "irrelevance":
        return f"{len(calls)} call(s) made; this item expects none" if calls else None
    if len(calls) != len(answers):
        return f"{len(calls)} call(s) made; {len(answers)} expected"
    if "parallel" in category:
        used: set[int] = set()
        for number, answer in enumerate(answers, 1):
            function = _describe(functions, next(iter(answer)))
            reasons: dict[int, str] = {}
            for i, call in enumerate(calls):
                if i in used:
                    continue
                if (reason := _one(function, call, answer)) is None:
                    used.add(i)
                    break
                reasons[i] = reason
            else:
                closest = next((reasons[i] for i in reasons if function["name"] in calls[i]),
                               next(iter(reasons.values()), ""))
                return f"expected call {number} of {len(answers)} ({function['name']}) matches no model call: {closest}"
        return None
    function = _describe(functions, next(iter(answers[0])))
    return _one(function, calls[0], answers[0])


def _describe(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((f for f in functions if f["name"] == name), functions[0])


def _one(function: dict[str, Any], call: Call, answer: Call) -> str | None:
    """Why ``call`` is not ``answer``'s call of ``function`` (``mismatch``'s line), or None."""
    accepted = next(iter(answer.values()))
    name = function["name"]
    if name not in call:
        return f"called {', '.join(call) or 'no function'}; expected {name}"
    given = call[name]
    properties = function["parameters"]["properties"]
    for param in function["parameters"].get("required", []):
        if param not in given:
            return f"{name}: required parameter {param} is missing"
    for param, value in given.items():
        if param not in properties:
            return f"{name}: {param} is not a parameter of the function"
        if param not in accepted:
            return f"{name}: {param} is given, but the expected call leaves it out"
        declared = properties[param]["type"]
        expected = _TYPES[declared]
        nested = _TYPES[properties[param]["items"]["type"]] if declared in _NESTED else None
        if declared == "float" and type(value) is int:
            value = float(value)
        ok, is_variable = _type_ok(value, accepted[param], expected, nested)
        if not ok:
            return f"{name}: {param} = {_shown(value)} is a {type(value).__name__}; the function declares {declared}"
        if not _value_ok(value, accepted[param], expected, nested, is_variable):
            return (f"{name}: {param} = {_shown(value)} is not an accepted value "
                    f"({_shown([v for v in accepted[param] if v != ''])})")
    for param, values in accepted.items():
        if param not in given and "" not in values:
            return f"{name}: {param} is missing; accepted values: {_shown(values)}"
    return None


def _shown(value: Any) -> str:
    """``repr(value)`` scrubbed of secrets, then cut to ``SHOWN_CHARS``."""
    text = scrub(repr(value))
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _answer_type(values: list[Any]) -> type | None:
    return next((type(v) for v in values if v != ""), None)


def _type_ok(value: Any, values: list[Any], expected: type | None, nested: type | None) -> tuple[bool, bool]:
    """``(type acceptable, value is a "variable")`` under BFCL's one-level type check: a value of
    the answer's own type (when it differs from the declared one) passes as a variable."""
    answer_type = _answer_type(values)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for candidate in values:
            items = cast(list[Any], value)   # a list: its type is the declared one
            if type(candidate) is not list or all(_type_ok(item, candidate, nested, None)[0] for item in items):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _norm(value: Any) -> Any:
    return _DROP.sub("", value).lower().replace("'", '"') if isinstance(value, str) else value


def _value_ok(value: Any, values: list[Any], expected: type, nested: type | None, is_variable: bool) -> bool:
    if not is_variable:
        if expected is dict:
            return any(_dict_ok(value, candidate) for candidate in values if candidate != "")
        if expected is list and nested is dict:
            return any(isinstance(candidate, list) and len(value) == len(candidate)
                       and all(_dict_ok(v, c) for v, c in zip(value, candidate, strict=True)) for candidate in values)
        if expected is str:
            return _norm(value) in [_norm(v) for v in values if isinstance(v, str)]
        if expected is list:
            return [_norm(v) for v in value] in [[_norm(v) for v in c] for c in values if isinstance(c, (list, str))]
    return value in values


def _dict_ok(value: dict[str, Any], candidate: dict[str, Any]) -> bool:
    if not isinstance(value, dict) or not isinstance(candidate, dict):
        return False
    for key, item in value.items():
        if key not in candidate or _norm(item) not in [_norm(c) for c in candidate[key]]:
            return False
    return all(key in value or "" in options for key, options in candidate.items())
