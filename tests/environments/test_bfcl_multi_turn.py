"""The bfcl taskset's ``multi_turn_base``: live tools per rollout, and replay scoring that agrees
with BFCL's own multi-turn checker."""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import json

import pytest

from tests.support.extras import require_module

pytestmark = pytest.mark.unit

require_module("bfcl_eval", "bfcl-eval, which scripts/test installs with pip install --no-deps")

import prefect_rollouts as vf  # noqa: E402
from prefect_rollouts.environments import load_taskset  # noqa: E402
from prefect_rollouts.environments.bfcl.multi_turn_scoring import Backend, parse_call  # noqa: E402
from prefect_rollouts.environments.bfcl.taskset import load  # noqa: E402
from prefect_rollouts.errors import ConfigError  # noqa: E402
from prefect_rollouts.trace import ToolCall, Trace  # noqa: E402
from tests.fakes.openai_server import delayed, reply, tool_call, tool_calls  # noqa: E402

NO_RUNTIME_TOOLS = vf.HarnessConfig(id="tools", runtime_tools=[])


@pytest.fixture(scope="module")
def tasks():
    """All 200 ``multi_turn_base`` tasks."""
    return load("multi_turn_base")


@pytest.fixture(scope="module")
def package_checker():
    """BFCL's own verdict (multi_turn_checker and its irrelevance checker) on per-turn calls.

    It caches instances in its module's ``globals()`` by model name and item id, so every
    call gets a model name of its own.
    """
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        multi_turn_checker,
        multi_turn_irrelevance_checker,
    )
    names = itertools.count()

    def run(task, turns):
        info = task.data.info
        decoded = [[[call_text(name, arguments) for name, arguments in turn]] if turn else [] for turn in turns]
        entry = {"id": task.id, "initial_config": copy.deepcopy(info["initial_config"]),
                 "involved_classes": info["involved_classes"]}
        model_name = f"agreement_test_{next(names)}"
        return (multi_turn_checker(decoded, info["ground_truth"], entry, "multi_turn_base", model_name)["valid"]
                and multi_turn_irrelevance_checker(decoded, info["ground_truth"])["valid"])
    return run


def call_text(name, arguments):
    """A call as BFCL's decoder writes one: ``cd(folder='document')``."""
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"


def truth_turns(task):
    """The ground truth as model calls: per turn ``[(name, keyword arguments)]``, positional
    arguments named from the method's signature."""
    info = task.data.info
    methods = Backend(info["involved_classes"], info["initial_config"]).methods
    turns = []
    for calls in info["ground_truth"]:
        turn = []
        for name, args, kwargs in map(parse_call, calls):
            turn.append((name, dict(inspect.signature(methods[name]).bind(*args, **kwargs).arguments)))
        turns.append(turn)
    return turns


def trace_of(task, turns):
    """A finished trace whose tool calls are ``turns`` (segment = turn index)."""
    trace = Trace(task_id=task.id, model="replay")
    for segment, turn in enumerate(turns):
        for name, arguments in turn:
            trace.tool_calls.append(ToolCall(segment=segment, id=f"call_{len(trace.tool_calls)}", name=name,
                                             arguments=json.dumps(arguments), output="", latency_ms=0.0))
    return trace


def changed(value):
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return [*value, value[0]] if value else ["x"]
    return {"x": 1}


def wrong_variants(turns):
    """Deliberately wrong answers: drop the last call of the last turn that has calls, change the
    first argument of the first call that has one, move the last call of a turn into the next."""
    variants = {}
    full = [i for i, turn in enumerate(turns) if turn]
    dropped = copy.deepcopy(turns)
    dropped[full[-1]].pop()
    variants["drop_last_call"] = dropped
    edited = copy.deepcopy(turns)
    _, arguments = next(call for turn in edited for call in turn if call[1])
    key = next(iter(arguments))
    arguments[key] = changed(arguments[key])
    variants["change_argument"] = edited
    movable = [i for i in full if i + 1 < len(turns)]
    if movable:
        moved = copy.deepcopy(turns)
        moved[movable[0] + 1].insert(0, moved[movable[0]].pop())
        variants["move_call_later"] = moved
    return variants


def test_every_ground_truth_replayed_as_the_model_scores_one(tasks, package_checker):
    assert len(tasks) == 200
    for task in tasks:
        turns = truth_turns(task)
        trace = trace_of(task, turns)
        assert task.correct(trace) == 1.0, (task.id, trace.info.get("bfcl_failure"))
        assert task.turns_passed(trace) == len(turns) and "bfcl_failure" not in trace.info
        assert package_checker(task, turns), task.id


def test_wrong_variants_score_zero_and_agree_with_the_package_checker(tasks, package_checker):
    all_wrong = checked = 0
    for task in tasks:
        scores = []
        for kind, turns in wrong_variants(truth_turns(task)).items():
            trace = trace_of(task, turns)
            ours = task.correct(trace)
            assert ours == float(package_checker(task, turns)), (task.id, kind, trace.info.get("bfcl_failure"))
            if ours == 0.0:
                failure = trace.info["bfcl_failure"]
                assert failure["check"] in ("empty_turn", "state", "response") and json.dumps(failure)
                assert task.turns_passed(trace) == failure["turn"]
            scores.append(ours)
            checked += 1
        all_wrong += not any(scores)
    assert checked >= 590
    # a few changed arguments are harmless under BFCL's rules (e.g. ls(a=False) where there is no hidden file)
    assert all_wrong >= 170


def test_a_call_in_a_turn_that_needs_none_fails_the_irrelevance_check(tasks):
    task = next(t for t in tasks if t.id == "multi_turn_base_167")      # turn 4: no function fits
    turns = truth_turns(task)
    assert turns[4] == []
    turns[4] = [("get_flight_cost", {"travel_from": "RMS", "travel_to": "LAX", "travel_date": "2026-12-15",
                                     "travel_class": "business"})]
    trace = trace_of(task, turns)
    assert task.correct(trace) == 0.0 and trace.info["bfcl_failure"]["check"] == "irrelevance"
    assert task.turns_passed(trace) == 4


def test_a_rollout_that_stopped_early_fails_at_its_first_missing_turn(tasks):
    task = tasks[0]
    trace = trace_of(task, truth_turns(task)[:2])
    assert task.correct(trace) == 0.0
    assert trace.info["bfcl_failure"] == {"turn": 2, "check": "empty_turn", "details": {"expected_calls": 1},
                                          "expected": task.data.info["ground_truth"][2]}
    assert (task.turns_passed(trace), task.num_calls(trace)) == (2.0, 5.0)


def test_the_executor_refuses_private_denied_excluded_and_malformed_calls(tasks):
    info = tasks[0].data.info                                          # excluded_function: ["cp"]
    backend = Backend(info["involved_classes"], info["initial_config"], info["excluded_function"])
    before = vars(backend.instances["GorillaFileSystem"]).copy()
    assert backend.call("kill") == "Error during execution: Function call kill is not allowed."
    assert backend.call("_load_scenario", ({},)) == "Error during execution: name '_load_scenario' is not defined"
    assert backend.call("cp", (), {"source": "a", "destination": "b"}) == \
        "Error during execution: name 'cp' is not defined"
    assert backend.call_json("cd", "[1]").startswith(
        "Error during execution: the arguments of cd are not a JSON object")
    assert backend.call_json("cd", "[" * 100_000 + "]" * 100_000) == (   # a model's, never a RecursionError
        "Error during execution: the arguments of cd are not a JSON object "
        "(the text nests deeper than 128 levels (MAX_JSON_DEPTH))")
    assert backend.call_json("cd", '{"nope": 1}') == ("Error during execution: GorillaFileSystem.cd() got an "
                                                      "unexpected keyword argument 'nope'")
    assert vars(backend.instances["GorillaFileSystem"]) == before
    assert backend.call_json("cd", '{"folder": "document"}') == '{"current_working_directory": "document"}'
    assert backend.call("mkdir", (), {"dir_name": "temp"}) == "None"
    assert parse_call("sort('final_report.pdf')") == ("sort", ["final_report.pdf"], {})
    with pytest.raises(ValueError, match="ground-truth call"):
        parse_call("__import__('os').system('true')")


def test_load_taskset_gives_tasks_with_live_tools_and_user_turns():
    tasks = load_taskset("bfcl", {"category": "multi_turn_base"}, 5)
    assert [t.id for t in tasks] == [f"multi_turn_base_{i}" for i in range(5)]
    for task in tasks:
        tools = task.tools()
        names = {tool.name for tool in tools}
        assert task.data.user_turns and task.data.tool_choice is None
        assert tools and all(tool.fn is not None for tool in tools)
        assert not names & set(task.data.info["excluded_function"])
        assert all(tool.schema["function"]["parameters"]["type"] == "object" for tool in tools)
    assert "cp" not in {tool.name for tool in tasks[0].tools()} and "mv" in {tool.name for tool in tasks[0].tools()}
    assert len(tasks[0].data.user_turns) == 3 and tasks[0].data.prompt[0]["role"] == "user"
    with pytest.raises(ConfigError, match="force_tool_choice = true: does not apply"):
        load_taskset("bfcl", {"category": "multi_turn_base", "force_tool_choice": True})


async def test_a_rollout_playing_the_ground_truth_sees_live_results_and_scores_one(openai_server, agent_config,
                                                                                   tasks):
    task = tasks[0]
    turns = truth_turns(task)
    script = []
    for turn in turns:
        script += [tool_calls(*turn), reply("done")]
    openai_server.play(script)
    async with vf.make_agent(agent_config(harness=NO_RUNTIME_TOOLS, max_turns=20)) as agent:
        trace = await agent.run(task)
    assert (trace.stop_condition, trace.reward, len(trace.segments)) == ("agent_completed", 1.0, 4)
    assert trace.metrics == {"num_calls": 10.0, "turns_passed": 4.0}
    assert [c.segment for c in trace.tool_calls] == [0, 0, 0, 1, 1, 2, 3, 3, 3, 3]
    outputs = [c.output for c in trace.tool_calls]
    assert outputs[0] == '{"current_working_directory": "document"}' and outputs[1] == "None"
    assert json.loads(outputs[4]) == {"matching_lines": [
        "Year2024 This is the final report content including budget analysis and other sections."]}
    assert json.loads(outputs[9])["diff_lines"].startswith("- Year2024")
    received = [m["content"] for m in openai_server.requests[-1].messages if m["role"] == "tool"]
    assert received == outputs                                       # what the model was sent
    assert not any(c.is_error for c in trace.tool_calls)
    assert task.backend is None                                      # the loaded task stays untouched


async def test_a_model_that_answers_without_calls_fails_the_first_turn(openai_server, agent_config, tasks):
    openai_server.play([reply("I moved it.")] * 4)
    async with vf.make_agent(agent_config(harness=NO_RUNTIME_TOOLS, max_turns=20)) as agent:
        trace = await agent.run(tasks[0])
    assert (trace.reward, len(trace.segments), trace.metrics["turns_passed"]) == (0.0, 4, 0.0)
    assert trace.info["bfcl_failure"] == {"turn": 0, "check": "empty_turn", "details": {"expected_calls": 3},
                                          "expected": tasks[0].data.info["ground_truth"][0]}


async def test_concurrent_rollouts_of_one_task_keep_their_own_file_system(openai_server, agent_config, tasks):
    made = itertools.count()

    def step(request):
        done = sum(m["role"] == "tool" for m in request.messages)
        if done == 0:
            return tool_call("mkdir", dir_name=f"dir_{next(made)}")
        if done == 1:
            return delayed(0.2, tool_call("ls"))                  # both mkdirs have run by now
        return reply("done")
    openai_server.default = step
    async with vf.make_agent(agent_config(harness=NO_RUNTIME_TOOLS, max_turns=20)) as agent:
        traces = await asyncio.gather(*(agent.run(tasks[0]) for _ in range(2)))
    listings = []
    for trace in traces:
        own = json.loads(trace.tool_calls[0].arguments)["dir_name"]
        listing = json.loads(trace.tool_calls[1].output)["current_directory_content"]
        assert own in listing
        listings.append(set(listing))
    assert listings[0] ^ listings[1] == {"dir_0", "dir_1"}        # neither sees the other's directory
    assert tasks[0].backend is None


def test_a_tool_class_that_does_not_import_is_a_config_error_at_load(monkeypatch):
    from prefect_rollouts.environments.bfcl import multi_turn as bfcl_multi_turn

    def missing(class_name):
        if class_name == "MathAPI":
            raise ModuleNotFoundError("No module named 'mpmath'")
        return object
    monkeypatch.setattr(bfcl_multi_turn, "tool_class", missing)
    with pytest.raises(ConfigError, match=r"MathAPI does not import .*pip install 'prefect-rollouts\[bfcl\]'"):
        bfcl_multi_turn.load("multi_turn_base")
