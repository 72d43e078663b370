"""Every rollout gets a row: a trace that cannot be written as it is (nested past pydantic's 255
levels, a cycle, a key JSON has no form for) is written with the offending parts cut and an error
saying so, never dropped."""

from __future__ import annotations

import json

import pytest

import prefect_rollouts as vf
from prefect_rollouts.nesting import CYCLE, MARKER, cut_deep, loads, nests_deeper
from prefect_rollouts.trace import JudgeCall
from prefect_rollouts.traces import TraceWriter, read_rollouts, read_traces

pytestmark = pytest.mark.unit


def deep(levels: int) -> object:
    value: object = "bottom"
    for _ in range(levels):
        value = {"inner": value}
    return value


def finished() -> vf.Trace:
    trace = vf.Trace(task_id="t", model="m", stop_condition="agent_completed", reward=1.0, rewards={"r": 1.0})
    trace.messages.append({"role": "user", "content": "go"})
    return trace


def written(tmp_path, trace: vf.Trace):
    writer = TraceWriter(tmp_path, "run")
    writer.add(trace, rollout_index=0, environment="e", config_hash="h", elapsed_s=1.0)
    assert writer.flush() == 1
    (row,) = read_rollouts(tmp_path, run_id="run").to_dict("records")
    (back,) = read_traces(tmp_path, run_id="run")
    return row, back


@pytest.mark.parametrize("levels", [220, 300])   # 220: pydantic writes it but cannot read it back; 300: cannot write it
@pytest.mark.parametrize("place", ["reward detail in info", "judge verdict", "message part"])
def test_a_trace_nested_too_deep_is_written_with_the_deep_part_cut_and_an_error(tmp_path, place, levels):
    trace = finished()
    if place == "reward detail in info":
        trace.info["reward_detail"] = deep(levels)
    elif place == "judge verdict":
        trace.judge_calls.append(JudgeCall(judge="j", model="m", started_at=0.0, latency_ms=1.0, verdict=deep(levels)))
    else:
        trace.messages.append({"role": "assistant", "content": [{"type": "text", "text": "x", "extra": deep(levels)}]})
    row, back = written(tmp_path, trace)
    assert (row["is_error"], row["error_type"], row["reward"], row["stop_condition"]) == (
        True, "TraceNotWritable", 1.0, "agent_completed")
    assert row["error_message"] == ("the trace could not be written as it was (it nests deeper than 128 levels, "
                                    "more than readers take back); 1 value(s) cut (nested deeper than 128 levels "
                                    "or in a cycle)")
    assert MARKER in row["trace"] and back.errors[0].stage == "record"
    assert back.rewards == {"r": 1.0} and back.messages[0] == {"role": "user", "content": "go"}
    assert trace.errors == []   # the rollout's own trace is left as it was


def test_a_cycle_and_a_tuple_key_in_info_still_give_a_row(tmp_path):
    trace = finished()
    loop: dict[str, object] = {}
    loop["self"] = loop
    loop["again"] = loop   # two ways into the cycle at every level: a walk of every path would never end
    trace.info["loop"] = loop
    trace.info["pairs"] = {(1, 2): "a tuple key"}
    row, back = written(tmp_path, trace)
    assert row["is_error"] and "Circular reference" in row["error_message"]
    assert back.info["loop"] == {"self": CYCLE, "again": CYCLE}
    assert back.info["pairs"] == {"(1, 2)": "a tuple key"}


def test_a_lone_surrogate_in_a_message_and_a_key_still_gives_a_row(tmp_path):
    trace = finished()   # "a\ud800b" is valid JSON; pydantic's writer (UTF-8) refuses it
    trace.messages.append({"role": "assistant", "content": "a\ud800b"})
    trace.info["odd\udc00key"] = 1
    row, back = written(tmp_path, trace)
    assert (row["is_error"], row["error_type"], row["reward"]) == (True, "TraceNotWritable", 1.0)
    assert "surrogates not allowed" in row["error_message"]
    assert back.messages[1] == {"role": "assistant", "content": "a\ufffdb"}
    assert back.info["odd\ufffdkey"] == 1


def test_a_writable_trace_is_written_as_it_is(tmp_path):
    trace = finished()
    trace.info["reward_detail"] = deep(100)
    row, back = written(tmp_path, trace)
    assert not row["is_error"] and back.info["reward_detail"] == deep(100)


@pytest.mark.parametrize("levels", [129, 300, 100_000])
def test_json_from_outside_is_refused_past_the_bound_without_a_recursion_error(levels):
    text = "[" * levels + "]" * levels
    with pytest.raises(ValueError, match=r"^the file nests deeper than 128 levels \(MAX_JSON_DEPTH\)$"):
        loads(text, "the file")
    assert loads("[" * 128 + "]" * 128, "the file") is not None


def test_cut_deep_keeps_what_is_within_the_bound():
    value, cuts = cut_deep({"a": [1, {"b": deep(3)}]})
    assert (value, cuts) == ({"a": [1, {"b": deep(3)}]}, 0)
    value, cuts = cut_deep(deep(200))
    assert cuts == 1 and not nests_deeper(value) and json.dumps(value).count("inner") == 128
