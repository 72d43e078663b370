"""The bfcl taskset: data loading, wire schemas, and our scorer agreeing with BFCL's own checker."""

from __future__ import annotations

import copy
import sys
import types

import pytest

from tests.support.extras import require_module

pytestmark = pytest.mark.unit

require_module("bfcl_eval", "bfcl-eval, which scripts/test installs with pip install --no-deps")

from prefect_rollouts.environments import load_taskset  # noqa: E402
from prefect_rollouts.environments.bfcl.scoring import check  # noqa: E402
from prefect_rollouts.environments.bfcl.taskset import load, tool_name, wire_schema  # noqa: E402


@pytest.fixture(scope="module")
def package_checker():
    """BFCL's ast_checker, importable without its heavy dependencies: a stand-in model_config."""
    stand_in = types.ModuleType("bfcl_eval.constants.model_config")
    stand_in.MODEL_CONFIG_MAPPING = {"stand/in": types.SimpleNamespace(underscore_to_dot=False)}
    sys.modules.setdefault("bfcl_eval.constants.model_config", stand_in)
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    def run(category, functions, calls, answers):
        return ast_checker(functions, calls, answers, Language.PYTHON, category, "stand_in")["valid"]
    return run


def pick(value):
    """A concrete value from an answer value (dict answers hold lists of acceptable values per key)."""
    if isinstance(value, dict):
        return {k: pick(v[0]) for k, v in value.items() if v and v[0] != ""}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [pick(v) for v in value]
    return value


def first_acceptable(answers):
    """A model answer built from the ground truth: the first acceptable value of each parameter."""
    calls = []
    for answer in answers:
        name, params = next(iter(answer.items()))
        calls.append({name: {p: pick(values[0]) for p, values in params.items() if values and values[0] != ""}})
    return calls


def wrong_variants(calls, functions):
    """Deliberately wrong answers: other name, changed value, missing required, extra param, an extra call."""
    variants = []
    renamed = copy.deepcopy(calls)
    name = next(iter(renamed[0]))
    renamed[0] = {name + "_x": renamed[0][name]}
    variants.append(renamed)
    changed = copy.deepcopy(calls)
    params = next(iter(changed[0].values()))
    for key, value in params.items():
        params[key] = value + 7 if isinstance(value, (int, float)) and not isinstance(value, bool) else (
            f"{value} zzz" if isinstance(value, str) else [value, value])
        break
    variants.append(changed)
    required = functions[0]["parameters"].get("required", [])
    if required:
        missing = copy.deepcopy(calls)
        next(iter(missing[0].values())).pop(required[0], None)
        variants.append(missing)
    extra = copy.deepcopy(calls)
    next(iter(extra[0].values()))["unexpected_parameter"] = 1
    variants.append(extra)
    variants.append(calls + copy.deepcopy(calls))
    variants.append([])
    return variants


@pytest.mark.parametrize(("category", "count"), [("simple_python", 100), ("multiple", 40), ("parallel", 40),
                                                 ("parallel_multiple", 40)])
def test_our_scorer_agrees_with_the_package_checker(package_checker, category, count):
    tasks = load(category, count)
    assert len(tasks) == count
    checked = truths_valid = 0
    for task in tasks:
        info = task.data.info
        truth = first_acceptable(info["ground_truth"])
        for calls in [truth, *wrong_variants(truth, info["functions"])]:
            ours = check(category, info["functions"], calls, info["ground_truth"])
            theirs = package_checker(category, info["functions"], calls, info["ground_truth"])
            assert ours == theirs, (task.id, calls)
            checked += 1
        truths_valid += check(category, info["functions"], truth, info["ground_truth"])
    assert checked >= count * 5
    assert truths_valid >= 0.9 * count          # the answers built from the ground truth mostly pass


def test_irrelevance_means_no_call():
    task = load("irrelevance", 1)[0]
    assert check("irrelevance", task.data.info["functions"], [], [])
    assert not check("irrelevance", task.data.info["functions"], [{"f": {}}], [])
    assert task.data.tool_choice is None


def test_tasks_offer_sanitised_answer_tools_and_force_the_single_function():
    task = load_taskset("bfcl", {"category": "simple_python", "count": 2})[1]
    assert task.id == "simple_python_1" and task.data.info["functions"][0]["name"] == "math.factorial"
    tool = task.tools()[0]
    assert tool.name == "math_factorial" and tool.fn is None
    assert tool.schema["function"]["parameters"]["type"] == "object"
    assert task.data.tool_choice == {"type": "function", "function": {"name": "math_factorial"}}
    schema = {"type": "dict", "properties": {"x": {"type": "float"}, "t": {"type": "tuple", "items": {"type": "any"}}}}
    assert wire_schema(schema) == {"type": "object", "properties": {
        "x": {"type": "number"}, "t": {"type": "array", "items": {"type": "string"}}}}
    assert tool_name("a.b-c d") == "a_b-c_d"


async def test_a_rollout_scores_the_calls_mapped_back_to_dotted_names(openai_server, agent_config):
    import prefect_rollouts as vf
    from tests.fakes.openai_server import tool_call

    task = load("simple_python", 2)[1]                         # math.factorial(number=5)
    openai_server.play([tool_call("math_factorial", number=5), tool_call("math_factorial", number=6)])
    async with vf.make_agent(agent_config()) as agent:
        right = await agent.run(task)
        wrong = await agent.run(task)
    assert (right.reward, right.stop_condition, len(openai_server.requests)) == (1.0, "agent_completed", 2)
    assert wrong.reward == 0.0
    assert openai_server.requests[0].body["tool_choice"] == {"type": "function", "function": {"name": "math_factorial"}}


def test_arguments_nested_100000_deep_are_no_answer_not_a_recursion_error():
    import prefect_rollouts as vf

    task = load("simple_python", 1)[0]
    trace = vf.Trace(task_id=task.id, model="m")
    deep = "[" * 100_000 + "]" * 100_000
    trace.messages.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "math_factorial", "arguments": deep}}]})
    assert task.calls(trace) is None


async def test_show_prints_the_ground_truth_beside_the_answer_of_a_near_miss(openai_server, agent_config, tmp_path):
    from typer.testing import CliRunner

    import prefect_rollouts as vf
    from prefect_rollouts.cli import app
    from prefect_rollouts.traces import TraceWriter
    from tests.fakes.openai_server import tool_call

    task = load("simple_python", 2)[1]                         # math.factorial(number=5)
    openai_server.play([tool_call("math_factorial", number=6), tool_call("math_factorial", number=5)])
    async with vf.make_agent(agent_config()) as agent:
        near_miss = await agent.run(task)
        right = await agent.run(task)
    assert near_miss.info["bfcl_failure"] == {
        "check": "ast", "details": "math.factorial: number = 6 is not an accepted value ([5])",
        "expected": [{"math.factorial": {"number": [5]}}], "answer": [{"math.factorial": {"number": 6}}]}
    assert right.reward == 1.0 and "bfcl_failure" not in right.info
    writer = TraceWriter(tmp_path, "r")
    writer.add(near_miss, rollout_index=0, environment="bfcl", config_hash="h", elapsed_s=1.0)
    assert writer.flush() == 1
    result = CliRunner().invoke(app, ["traces", "show", str(tmp_path), "r", "simple_python_1"])
    assert result.exit_code == 0
    assert '→ math_factorial({"number": 6})' in result.output
    assert ("  bfcl_failure:\n    check: \"ast\"\n"
            '    details: "math.factorial: number = 6 is not an accepted value ([5])"\n'
            '    expected: [{"math.factorial": {"number": [5]}}]\n'
            '    answer: [{"math.factorial": {"number": 6}}]\n') in result.output


def test_mismatch_names_the_rule_an_answer_breaks():
    from prefect_rollouts.environments.bfcl.scoring import mismatch

    functions = [{"name": "area", "parameters": {"type": "dict", "required": ["base"], "properties": {
        "base": {"type": "integer"}, "unit": {"type": "string"}}}}]
    answers = [{"area": {"base": [10], "unit": ["units", ""]}}]
    assert mismatch("simple_python", functions, [{"area": {"base": 10}}], answers) is None
    assert mismatch("simple_python", functions, [{"area": {"base": 10, "unit": "cm"}}], answers) == (
        "area: unit = 'cm' is not an accepted value (['units'])")
    assert mismatch("simple_python", functions, [{"area": {"base": "10"}}], answers) == (
        "area: base = '10' is a str; the function declares integer")
    assert mismatch("simple_python", functions, [{"area": {"unit": "units"}}], answers) == (
        "area: required parameter base is missing")
    assert mismatch("simple_python", functions, [{"volume": {"base": 10}}], answers) == "called volume; expected area"
    assert mismatch("simple_python", functions, [], answers) == "0 call(s) made; 1 expected"
    assert mismatch("parallel", functions, [{"area": {"base": 10}}, {"area": {"base": 11}}],
                    [*answers, {"area": {"base": [12]}}]) == (
        "expected call 2 of 2 (area) matches no model call: area: base = 11 is not an accepted value ([12])")
    assert mismatch("irrelevance", functions, [{"area": {"base": 1}}], []) == "1 call(s) made; this item expects none"
