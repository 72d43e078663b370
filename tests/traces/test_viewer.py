"""The trace viewer's data, page and server (issue 39, item 1), without a browser: what each view holds,
that a rollout's text reaches the page only as inert JSON under a strict policy, and that the server
answers only its token on a loopback Host. (tests/ui/test_viewer_in_browser.py drives the pages.)"""

from __future__ import annotations

import base64
import hashlib
import json
import re

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.traces.view import view_command
from prefect_rollouts.traces.view.data import TABLE_COLUMNS, Dataset
from prefect_rollouts.traces.view.page import asset, content_security_policy, embed_json, render_page
from prefect_rollouts.traces.view.render import file_data
from prefect_rollouts.traces.view.server import make_app
from tests.traces.viewer_runs import HOSTILE, make_two_runs

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, _openai_server_session):
    """Two runs (tests/traces/viewer_runs.py ``two_runs``), read through one ``Dataset``."""
    return Dataset(make_two_runs(tmp_path_factory.mktemp("viewer"), _openai_server_session))


def test_embedded_json_cannot_close_its_script_element_and_reads_back_the_same():
    data = {"text": "</script><script>alert(1)</script><!-- & \u2028", "n": float("nan")}
    text = embed_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {**data, "n": None}


def test_the_page_runs_only_its_own_script_pinned_by_hash(dataset):
    policy = content_security_policy(served=False)
    digest = base64.b64encode(hashlib.sha256(asset("app.js").encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy and "unsafe" not in policy
    assert "default-src 'none'" in policy and "connect-src 'none'" in policy and "img-src data:" in policy
    page = render_page(file_data(dataset), served=False)
    scripts = re.findall(r"<script[^>]*>", page)
    assert scripts == ['<script type="application/json" id="viewer-data">', "<script>"]
    assert HOSTILE not in page and "<img src=x" not in page and "<script>document" not in page
    embedded = json.loads(page.split('id="viewer-data">')[1].split("</script>")[0])
    texts = [m["text"] for view in embedded["details"].values() for m in view["conversation"]]
    assert texts.count(HOSTILE) == 3   # prompt, tool output and reply: all there, as data
    assert f'content="{policy}"' in page


def test_runs_carry_the_summary_with_its_interval_and_plots(dataset):
    runs = {run["run_id"]: run for run in dataset.runs()}
    assert list(runs) == ["run-a", "run-b"]
    a = runs["run-a"]
    assert (a["rollouts"], a["mean"], a["errors"]) == (4, 0.5, 0)
    assert a["ci"] == pytest.approx([0.5 - 1.96 * a["stderr"], 0.5 + 1.96 * a["stderr"]])
    assert a["summary"]["total_tokens"] > 0 and a["summary"]["timed_out"] == 0
    drawn = dataset.plots("run-a")
    assert sorted(drawn) == ["rewards", "tokens"]
    assert all(uri.startswith("data:image/svg+xml;base64,") for uri in drawn.values())
    svg = base64.b64decode(drawn["rewards"].split(",", 1)[1]).decode()
    assert "<svg" in svg and "<script" not in svg


def test_the_rollouts_table_has_one_row_per_rollout_in_task_order(dataset):
    table = dataset.rollouts("run-b")
    assert table["columns"] == TABLE_COLUMNS
    rows = [dict(zip(TABLE_COLUMNS, row, strict=True)) for row in table["rows"]]
    assert [r["task_id"] for r in rows] == ["hostile", "steered", "t1", "t2", "t3", "t4"]
    assert [r["reward"] for r in rows if r["task_id"].startswith("t")] == [1.0] * 4
    assert all(r["num_tool_calls"] == 1 and r["attempt"] == 1 for r in rows)


def test_a_rollout_view_joins_each_call_to_its_result_and_marks_a_steer(dataset):
    ids = {row[2]: row[0] for row in dataset.rollouts("run-b")["rows"]}
    steered = dataset.rollout("run-b", ids["steered"])
    conversation = steered["conversation"]
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "user", "assistant"]
    (call,) = conversation[1]["tool_calls"]
    assert (call["name"], call["result"]) == ("wait", "waited")
    assert (conversation[3]["text"], conversation[3]["provenance"], conversation[3]["message_id"]) == (
        "use the fast path", "steer", "s1")
    assert [c["finish_reason"] for c in steered["model_calls"]] == ["tool_calls", "stop"]
    assert steered["attempts"] == [{"attempt": 1, "rollout_id": ids["steered"], "reward": 0.0,
                                    "stop_condition": "user_closed", "error_type": None, "latest": True}]
    tools = dataset.rollout("run-b", ids["t2"])
    assert tools["rewards"] == [{"name": "correct", "value": 1.0, "weight": 1.0}]
    assert dataset.rollout("run-b", "no-such-id") is None


def test_a_comparison_is_the_one_traces_compare_computes_with_its_per_task_plot(dataset):
    compared = dataset.compare("run-a", "run-b")
    (group,) = compared["comparison"]["environments"]
    assert (group["mean_a"], group["mean_b"], group["n_paired"]) == (0.5, 1.0, 4)
    assert sorted(group["flipped_to_pass"]) == ["t3", "t4"]
    assert [(t["task_id"], t["difference"]) for t in compared["tasks"]] == [
        ("hostile", None), ("steered", None), ("t1", 0.0), ("t2", 0.0), ("t3", 1.0), ("t4", 1.0)]
    assert compared["plot"].startswith("data:image/svg+xml;base64,")


def test_the_server_answers_only_its_token_on_a_loopback_host(dataset):
    client = TestClient(make_app(dataset, "tok-1"), base_url="http://127.0.0.1:8000")
    assert client.get("/api/runs").status_code == 403
    assert client.get("/api/runs", params={"token": "tok-2"}).status_code == 403
    answered = client.get("/api/runs", params={"token": "tok-1"})
    assert answered.status_code == 200 and [r["run_id"] for r in answered.json()] == ["run-a", "run-b"]
    assert answered.headers["content-security-policy"] == content_security_policy(served=True)
    assert "connect-src 'self'" in answered.headers["content-security-policy"]
    rebound = TestClient(make_app(dataset, "tok-1"), base_url="http://evil.example:8000")
    assert rebound.get("/api/runs", params={"token": "tok-1"}).status_code == 400
    missing = client.get("/api/rollouts", params={"token": "tok-1", "run": "nope"})
    assert missing.status_code == 404 and "RUN = 'nope'" in missing.text
    page = client.get("/", params={"token": "tok-1"})
    assert page.status_code == 200 and '"token":"tok-1"' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    meta = page.text.split('http-equiv="Content-Security-Policy" content="')[1].split('"')[0]
    assert "frame-ancestors" not in meta and "connect-src 'self'" in meta   # a browser logs an error for it there


def test_a_non_ascii_token_or_a_missing_parameter_is_refused_not_a_server_error(dataset):
    client = TestClient(make_app(dataset, "tok-1"), base_url="http://127.0.0.1:8000", raise_server_exceptions=False)
    for wrong in ["%C3%A9", "tok-1%C3%A9", "%FF"]:   # compare_digest raises on a str with non-ASCII text
        refused = client.get(f"/api/runs?token={wrong}")
        assert refused.status_code == 403 and refused.text.startswith("a token is required")
    for path, present in [("/api/rollouts", {}), ("/api/plots", {}), ("/api/rollout", {"run": "run-a"}),
                          ("/api/compare", {"a": "run-a"})]:
        answered = client.get(path, params={"token": "tok-1", **present})
        missing = {"/api/rollout": "id", "/api/compare": "b"}.get(path, "run")
        assert answered.status_code == 400
        assert answered.text == f"{path} needs the parameter {missing}: add {missing}=... to the query"


@pytest.mark.parametrize("port", [-1, 65536])
def test_a_port_outside_its_range_is_a_clear_error(port):
    from prefect_rollouts.errors import ConfigError
    from prefect_rollouts.traces.view.server import bind

    with pytest.raises(ConfigError, match=f"--port {port}: cannot listen there .*port must be 0-65535"):
        bind("127.0.0.1", port)


def test_the_html_file_caps_what_it_embeds_and_names_a_bad_cap(dataset, tmp_path):
    data = file_data(dataset, max_rollouts=2)
    assert data["capped"] == {"run-a": 2, "run-b": 4} and len(data["details"]) == 4
    assert sorted(data["plots"]) == ["run-a", "run-b"]
    assert list(data["comparisons"]) == ["run-a\0run-b"]
    one = file_data(dataset, "run-a", max_rollouts=0)
    assert list(one["rollouts"]) == ["run-a"] and one["details"] == {} and one["run"] == "run-a"
    runner = CliRunner()
    out = tmp_path / "view.html"
    written = runner.invoke(app, ["traces", "view", dataset.root, "run-b", "--html", str(out)])
    assert written.exit_code == 0, written.output
    assert out.stat().st_size > 0 and f"wrote {out}" in written.output
    bad = runner.invoke(app, ["traces", "view", dataset.root, "--html", str(out), "--max-rollouts", "-1"])
    assert bad.exit_code == 1 and "--max-rollouts = -1: must be 0 or more" in bad.output
    unknown = runner.invoke(app, ["traces", "view", dataset.root, "nope", "--html", str(out)])
    assert unknown.exit_code == 1 and "RUN = 'nope'" in unknown.output and "run-a, run-b" in unknown.output


def test_the_view_command_is_quoted_for_a_shell():
    assert view_command("/data/traces", "nightly-1") == "prefect-rollouts traces view /data/traces nightly-1"
    assert view_command("/my data", "a;b") == "prefect-rollouts traces view '/my data' 'a;b'"


def test_thinking_and_reasoning_parts_are_shown_apart_from_the_text_and_go_to_atif_as_reasoning():
    from prefect_rollouts.trace import ModelCall, Trace
    from prefect_rollouts.traces.atif import trajectory
    from prefect_rollouts.traces.view.conversation import conversation

    trace = Trace(task_id="t", model="m", messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "let me think", "signature": "sig"},
                                          {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": [{"type": "reasoning", "id": "r1", "summary": [{"text": "short"}],
                                           "encrypted_content": "xyz"}, {"type": "text", "text": "bye"}]}],
        model_calls=[ModelCall(segment=0, started_at=1.8e9, latency_ms=5, prompt_tokens=7, completion_tokens=3,
                               cached_tokens=4, finish_reason="stop")] * 2)
    shown = conversation(trace)
    assert [(m["text"], m["parts"]) for m in shown if m["role"] == "assistant"] == [
        ("hello", [{"type": "thinking", "text": "let me think"}]), ("bye", [{"type": "reasoning", "text": "short"}])]
    document = trajectory(trace)
    assert [(s.source, s.message, s.reasoning_content) for s in document.steps] == [
        ("user", "hi", None), ("agent", "hello", "let me think"), ("user", "again", None), ("agent", "bye", "short")]
    assert document.steps[1].metrics.cached_tokens == 4 and document.steps[1].timestamp == "2027-01-15T08:00:00Z"


def test_viewing_an_empty_dataset_says_so_and_serves_nothing(tmp_path):
    result = CliRunner().invoke(app, ["traces", "view", str(tmp_path), "--no-open"])
    assert result.exit_code == 1 and f"no rollouts in {tmp_path}" in result.output
