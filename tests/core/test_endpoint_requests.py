"""What the interception endpoint takes and what it says back: request bodies nested past the bound,
routes it does not serve, the refusals recorded on the trace and a failed program's message (real
sockets; the program tests run real processes on the local runtime)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses import endpoint_body, mini_swe_agent
from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
from prefect_rollouts.harnesses.session import MAX_REFUSED, ProgramSession
from prefect_rollouts.nesting import MAX_JSON_DEPTH, count_values
from prefect_rollouts.traces import TraceWriter, read_rollouts
from tests.core.test_program_harness import KEY, Said, program
from tests.fakes.openai_server import reply

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


async def _not_reached() -> bool:
    return False


@pytest.fixture
async def served() -> AsyncIterator[tuple[InterceptionEndpoint, ProgramSession, httpx.AsyncClient]]:
    """A started endpoint, one open session (on a bare trace: nothing here reaches the model) and a
    client on the endpoint's Unix socket."""
    endpoint = InterceptionEndpoint()
    await endpoint.start()
    ctx = SimpleNamespace(config=vf.AgentConfig(model="m"), client=None, trace=vf.Trace(task_id="t", model="m"),
                          stopped=False, turn_limit_reached=lambda: False, budget_reached=_not_reached)
    session = ProgramSession(ctx, "p", None, carried=[])   # type: ignore[arg-type]
    endpoint.open_session(session)
    transport = httpx.AsyncHTTPTransport(uds=str(endpoint.socket_path))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://endpoint", timeout=30,
                                     headers={"Authorization": f"Bearer {session.secret}"}) as client:
            yield endpoint, session, client
    finally:
        await endpoint.stop()


def nested(levels: int) -> bytes:
    """A chat-completions body whose user message content nests ``levels`` arrays deep."""
    return b'{"messages": [{"role": "user", "content": ' + b"[" * levels + b"]" * levels + b"}]}"


@pytest.mark.parametrize("levels", [300, 100_000])
async def test_a_body_nested_past_the_bound_is_a_400_naming_it_without_a_traceback(
        served, capfd, caplog, levels):
    _, session, client = served
    with caplog.at_level(logging.DEBUG):
        response = await client.post("/v1/chat/completions", content=nested(levels))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == ("the request body nests deeper than 128 levels (MAX_JSON_DEPTH). "
                                "Send a body nested at most 128 levels deep")
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    assert session.ctx.trace.info["endpoint"]["refused"] == [
        {"method": "POST", "path": "/v1/chat/completions", "status": 400, "reason": error["message"]}]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "RecursionError" not in out + err
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_body_at_the_bound_is_taken(served):
    """One level less than refused reaches the session (which refuses it for its content: the
    message content must be a string or a list of parts, not a nested list)."""
    _, _, client = served
    response = await client.post("/v1/chat/completions", content=nested(MAX_JSON_DEPTH - 3))
    assert response.status_code == 400 and "nests deeper" not in response.json()["error"]["message"]
    assert response.json()["error"]["message"].startswith("messages.0.content")


async def test_an_unserved_route_is_a_404_in_the_openai_shape_recorded_on_the_trace(served):
    endpoint, session, client = served
    response = await client.post("/v1/embeddings?beta=true", json={"input": "hi"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"].startswith("POST /v1/embeddings is not served here: this endpoint serves "
                                       "POST /v1/chat/completions, ")
    assert error["message"].endswith(", GET /v1/models")
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")
    wrong_method = await client.get("/v1/chat/completions")
    assert wrong_method.status_code == 405 and "not with this method" in wrong_method.json()["error"]["message"]
    refused = session.ctx.trace.info["endpoint"]["refused"]
    assert [(r["method"], r["path"], r["status"]) for r in refused] == [
        ("POST", "/v1/embeddings", 404), ("GET", "/v1/chat/completions", 405)]
    assert session.unserved == "POST /v1/embeddings" and endpoint.unknown_refused == 0


async def test_refusals_without_a_valid_key_are_only_counted(served):
    endpoint, session, client = served
    for path in ("/v1/responses", "/v1/chat/completions", "/v1/messages", "/v1/embeddings"):
        response = await client.post(path, json={}, headers={"Authorization": "Bearer sk-someone-else"})
        assert response.status_code in (401, 404)
    assert endpoint.unknown_refused == 4 and "endpoint" not in session.ctx.trace.info


async def test_the_refusals_listed_on_a_trace_are_capped_and_the_rest_counted(served):
    _, session, client = served
    for index in range(MAX_REFUSED + 5):
        await client.post(f"/v1/nowhere/{index}")
    record = session.ctx.trace.info["endpoint"]
    assert len(record["refused"]) == MAX_REFUSED and record["refused_more"] == 5
    assert record["refused"][-1]["path"] == f"/v1/nowhere/{MAX_REFUSED - 1}"


CODEX_LIKE = """
    import json, os, sys, urllib.request, urllib.error
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/embeddings", b"{}",
                                     {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        urllib.request.urlopen(request)
    except urllib.error.HTTPError as exc:
        print("warming up the model session " + "." * 150)   # several lines, more than the message keeps
        for attempt in range(8):
            print(f"retrying request to /embeddings (attempt {attempt}): stream disconnected " + "." * 80)
        print(f"ERROR: unexpected status {exc.code} Not Found: {json.load(exc)['error']['code']}")
    sys.exit(1)
"""


async def test_a_failed_program_says_which_route_it_asked_for_and_the_last_lines_of_its_stdout(
        openai_server, agent_config, tmp_path):
    async with vf.make_agent(agent_config(harness=program(tmp_path, CODEX_LIKE))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    message = trace.errors[0].message
    assert message.startswith('harness "program": the program exited with code 1; it asked for POST /v1/embeddings, '
                              "which the endpoint does not serve. stdout (stderr empty): retrying request")
    assert message.endswith("\nERROR: unexpected status 404 Not Found: not_found")
    shown = message.split("stdout (stderr empty): ", 1)[1]
    assert all(line.startswith(("retrying request", "ERROR:")) for line in shown.splitlines())
    assert len(shown.encode()) <= 800 and "(no stderr)" not in message
    assert trace.info["endpoint"]["refused"][0]["path"] == "/v1/embeddings" and openai_server.requests == []


async def test_a_failed_programs_stderr_is_shown_from_a_line_start_with_its_last_line_whole(
        openai_server, agent_config, tmp_path):
    loud = """
        import sys
        for index in range(40):
            sys.stderr.write(f"line {index} " + "x" * 60 + "\\n")
        sys.stderr.write("fatal: " + "y" * 900 + " 404\\n")
        sys.exit(3)
    """
    harness = program(tmp_path, loud, output_tail_chars=2000)
    async with vf.make_agent(agent_config(harness=harness)) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert (trace.stop_condition, trace.errors) == ("program_failed", [])   # scored: it started, then failed
    shown = trace.info["agent_failure"]["message"].split(". stderr: ", 1)[1]
    assert shown == "fatal: " + "y" * 900 + " 404", shown[:120]



DEEP_REQUEST = """
    import json, os, urllib.request, urllib.error
    deep = "x"
    for _ in range(300):
        deep = [deep]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "detail": deep}]}]}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                     {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        urllib.request.urlopen(request)
    except urllib.error.HTTPError as exc:
        print(exc.code, json.load(exc)["error"]["message"])
"""


async def test_a_program_request_nested_300_levels_is_refused_and_its_rollout_has_a_row(
        openai_server, agent_config, tmp_path):
    """The adversarial pass's case: the request was answered 200, then the row could not be written."""
    openai_server.default = reply("done")
    async with vf.make_agent(agent_config(harness=program(tmp_path, DEEP_REQUEST))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert trace.info["program"][0]["stdout_tail"].startswith("400 the request body nests deeper than 128 levels")
    assert openai_server.requests == [] and trace.model_calls == []
    writer = TraceWriter(tmp_path / "traces", "deep")
    writer.add(trace, rollout_index=0, environment="e", config_hash="h", elapsed_s=1.0)
    assert writer.flush() == 1
    assert read_rollouts(tmp_path / "traces", run_id="deep")["rollout_id"].tolist() == [trace.id]


@pytest.mark.parametrize("said", ["[" * 100_000 + "]" * 100_000, '["a list"]'])
def test_a_mini_swe_agent_report_nested_too_deep_or_not_an_object_is_no_report(said):
    """The driver's report line comes from the box: a hostile one is ignored, never a crash of the harness."""
    assert mini_swe_agent.report("patch", f"log\n{mini_swe_agent.MARKER}{said}\n") == {}
    assert mini_swe_agent.report("patch", f'{mini_swe_agent.MARKER}{{"exit_status": "Submitted"}}\n')[
        "exit_status"] == "Submitted"


async def test_a_body_of_more_values_than_the_bound_is_a_413_before_it_is_parsed(served, monkeypatch):
    monkeypatch.setattr(endpoint_body, "MAX_JSON_VALUES", 1000)
    _, session, client = served
    junk = b"[" + b",".join([b"{}"] * 1001) + b"]"
    response = await client.post("/v1/chat/completions", content=b'{"messages": [], "junk": ' + junk + b"}")
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["message"].startswith("the request body holds more than 1000 JSON values (objects, arrays, keys "
                                       "and items: MAX_JSON_VALUES)")
    assert error["code"] == "request_too_large"
    assert [r["status"] for r in session.ctx.trace.info["endpoint"]["refused"]] == [413]
    commas = json.dumps({"messages": [{"role": "user", "content": [[]]}], "note": "a, b: [c]" * 1000}).encode()
    response = await client.post("/v1/chat/completions", content=commas)   # within the bound outside strings
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("messages.0.content")


@pytest.mark.parametrize(("text", "outside"), [
    (b'[{"a": 1}, [2, 3]]', 6),
    (b'["a, b: {c", "d\\", e", "f\\\\", {"g\\\\\\"h,": 1}]', 6),   # brackets, commas, colons in strings skipped
    (b'[1, 2, "open, string, to: the end', 3),   # an unterminated string runs to the end
    (b'["a" "b" "c" "d", 1, 2, 3]', 1),   # strings without separators: invalid from there, json.loads stops
])
def test_the_values_counted_are_the_brackets_commas_and_colons_outside_strings(text, outside):
    assert count_values(text, limit=outside) == outside   # the bytes counted anywhere are more: the text is walked
    assert count_values(text, limit=outside - 1) == outside   # one past the limit: too many


async def test_a_number_past_a_floats_range_is_a_400_naming_it_without_a_traceback(served, capfd):
    _, session, client = served
    response = await client.post("/v1/chat/completions", content=b'{"messages": [], "temperature": 1e400}')
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message == ("a number in the request body is out of range (1e400). Send numbers a 64-bit float holds "
                       "(at most 1.7e308 in size)")
    assert session.ctx.trace.info["endpoint"]["refused"] == [
        {"method": "POST", "path": "/v1/chat/completions", "status": 400, "reason": message}]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
