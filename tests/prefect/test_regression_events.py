"""Issue 14, part 2: an eval compared with its series' baseline at its end, on a real PostgreSQL-backed
Prefect server: the comparison artifact, the ``prefect-rollouts.eval.regressed`` event on the server's
event feed, and the automation made by ``prefect-rollouts alerts create`` sending it to a webhook
block (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.variables import Variable
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.evals.baseline import IMPROVED, REGRESSED
from prefect_rollouts.flows.services.keys import variable_name
from prefect_rollouts.traces import EvalSummary
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply
from tests.support.waiting import stays_false, wait_until

REPO = Path(__file__).resolve().parents[2]
TASKS = 40


@pytest.fixture
def webhook():
    """A loopback HTTP server that keeps the JSON bodies POSTed to it."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:   # http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()


def answers(wrong_every: int | None):
    """Task i asks for i; with ``wrong_every`` the tasks divisible by it get a wrong answer."""
    def step(request: Any) -> Any:
        number = int(re.search(r"say (\d+)", request.messages[-1]["content"]).group(1))
        wrong = wrong_every is not None and number % wrong_every == 0
        return reply(str(number + 1 if wrong else number))
    return step


EVAL = """import asyncio, sys
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import run_eval
summary, _ = asyncio.run(run_eval(load_eval_config(sys.argv[1]), run_id=sys.argv[2]))
print(summary.model_dump_json())"""


def run(tmp_path, openai_server, run_id: str, wrong_every: int | None, **top: Any) -> EvalSummary:
    """``eval_flow`` in a process of its own, as a nightly job runs it: a process whose Prefect client
    first served the session's other server keeps that server in its event loop thread, and the
    events it sends then fail."""
    openai_server.default = answers(wrong_every)
    top = {"run_name": "regress", "baseline": "last", **top}
    toml = tmp_path / f"{run_id}.toml"
    toml.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="batch",
                              taskset={"id": "tests.prefect.tasksets:numbered", "count": TASKS}, **top))
    path = os.pathsep.join([str(REPO / "src"), str(REPO)])   # this checkout's code, not the installed one
    done = subprocess.run([sys.executable, "-c", EVAL, str(toml), run_id], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    return EvalSummary.model_validate_json(done.stdout.strip().splitlines()[-1])


def events(api_url: str) -> list[dict[str, Any]]:
    response = httpx.post(f"{api_url}/events/filter", json={
        "filter": {"event": {"prefix": ["prefect-rollouts.eval."]}}, "limit": 50}, timeout=30)
    response.raise_for_status()
    return response.json()["events"]


@pytest.mark.system
@pytest.mark.timeout(900)
def test_a_worse_run_emits_regressed_the_automation_notifies_and_the_baseline_stays(pg_api, openai_server, tmp_path,
                                                                                    webhook):
    url, received = webhook
    CustomWebhookNotificationBlock(name="regression-hook", url=url,
                                   json_data={"subject": "{{subject}}", "body": "{{body}}"}).save("regression-hook")
    created = CliRunner().invoke(app, ["alerts", "create", "--block", "custom-webhook/regression-hook"])
    assert created.exit_code == 0, created.output
    assert "created automation 'prefect-rollouts: eval alerts -> custom-webhook/regression-hook'" in created.output
    again = CliRunner().invoke(app, ["alerts", "create", "--block", "custom-webhook/regression-hook", "--on", "both"])
    assert "updated automation" in again.output, "one automation per block: --on changes it"
    CliRunner().invoke(app, ["alerts", "create", "--block", "custom-webhook/regression-hook"])   # back to regressed
    Secret(value="not a notifier").save("not-a-notifier")
    refused = CliRunner().invoke(app, ["alerts", "create", "--block", "secret/not-a-notifier"])
    assert refused.exit_code == 2 and "a secret block cannot send notifications" in refused.output

    first = run(tmp_path, openai_server, "regress-1", wrong_every=None)
    assert first.baseline is None and first.environments[0].mean_reward == 1.0
    assert first.baseline_note == "no baseline yet for series 'regress': this run becomes it if it completes"
    assert asyncio.run(Variable.aget(variable_name("regress"))) == "regress-1", "a Completed run becomes it"

    second = run(tmp_path, openai_server, "regress-2", wrong_every=3)             # 14 of 40 tasks now wrong
    assert second.baseline == "regress-1"
    (line,) = second.against_baseline
    assert line.startswith("tests.prefect.tasksets:numbered: regressed, difference -0.350 [")
    assert second.regressed == ["tests.prefect.tasksets:numbered"] and not second.baseline_moved
    assert second.baseline_note == ("the baseline stays regress-1: this run regressed "
                                    "(tests.prefect.tasksets:numbered); to compare the next runs with it all the "
                                    "same: prefect-rollouts traces baseline set regress-2")
    assert asyncio.run(Variable.aget(variable_name("regress"))) == "regress-1", "a regressed run does not replace it"

    feed = wait_until(lambda: events(pg_api), timeout_s=90)
    assert [e["event"] for e in feed] == [REGRESSED], "one environment, one event; nothing improved"
    payload, resource = feed[0]["payload"], feed[0]["resource"]
    assert (payload["run_id"], payload["baseline_run_id"]) == ("regress-2", "regress-1")
    assert payload["difference"] == pytest.approx(-0.35) and payload["ci_high"] < 0 and payload["ci_low"] < -0.35
    assert payload["p_value"] < 0.001 and payload["flipped_to_fail"][:3] == ["n0", "n12", "n15"]
    assert resource["prefect.resource.name"] == "tests.prefect.tasksets:numbered"
    assert any(r["prefect.resource.role"] == "flow-run" for r in feed[0]["related"]), "the eval flow run is named"
    assert payload["n_flipped_to_fail"] == 14 and len(payload["flipped_to_fail"]) == 14

    notified = wait_until(lambda: received, timeout_s=90, what="the automation's message to the webhook block")
    assert "tests.prefect.tasksets:numbered regressed in regress" in notified[0]["subject"]
    body = notified[0]["body"]
    assert "mean reward 1.000 -> 0.650, difference -0.350 (95% interval [" in body, body
    assert "Run regress-2 against baseline regress-1." in body and "Pass -> fail (14): n0, n12, n15" in body
    assert "Fail -> pass" not in body and "/runs/flow-run/" in body, "a link to the eval flow run"

    async def artifact() -> Any:
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["eval-comparison-regress"])))
    (markdown,) = asyncio.run(artifact())
    assert markdown.type == "markdown" and "# Run regress-2 against baseline regress-1" in markdown.data
    assert "- tests.prefect.tasksets:numbered: regressed, difference -0.350" in markdown.data

    pinned = CliRunner().invoke(app, ["traces", "baseline", "set", "regress-2"])  # on purpose: the regressed one
    assert pinned.exit_code == 0 and "baseline of series 'regress': regress-2" in pinned.output, pinned.output
    third = run(tmp_path, openai_server, "regress-3", wrong_every=None)           # back to right: improved
    assert third.baseline == "regress-2" and "improved" in third.against_baseline[0]
    assert third.baseline_moved and third.baseline_note == "this run is now the baseline (it was regress-2)"
    assert wait_until(lambda: IMPROVED in [e["event"] for e in events(pg_api)], timeout_s=90)
    assert stays_false(lambda: len(received) > 1, for_s=3), "the automation is on regressions only"

    toml = tmp_path / "eval.toml"                                                 # the CLI, for a cron job
    openai_server.default = answers(2)
    toml.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, run_name="regress", baseline="last",
                              rollout_granularity="batch", taskset={"id": "tests.prefect.tasksets:numbered",
                                                                    "count": TASKS}))
    cli = CliRunner().invoke(app, ["eval", str(toml), "--run-id", "regress-4", "--fail-on-regression"])
    assert cli.exit_code == 3, cli.output
    assert "regressed, difference -0.500" in cli.output and "regressed: tests.prefect.tasksets:numbered" in cli.output
    assert "baseline: the baseline stays regress-3: this run regressed" in cli.output

    small = run(tmp_path, openai_server, "regress-5", wrong_every=None, num_tasks=3)   # a quick run
    assert "(3 rollouts paired; 0 only in this run, 37 only in the baseline)" in small.against_baseline[0]
    assert small.baseline_note.startswith("the baseline stays regress-3: this run did not score every rollout")
    assert asyncio.run(Variable.aget(variable_name("regress"))) == "regress-3", "a smaller run does not replace it"


@pytest.mark.system
@pytest.mark.timeout(900)
def test_the_baseline_command_finds_the_series_of_a_run_and_lists_baselines(pg_api, openai_server, tmp_path):
    run(tmp_path, openai_server, "series-1", wrong_every=None, run_name="series-x")
    run(tmp_path, openai_server, "series-2", wrong_every=None, run_name="series-x")
    assert asyncio.run(Variable.aget(variable_name("series-x"))) == "series-2"
    pinned = CliRunner().invoke(app, ["traces", "baseline", "set", "series-1"])
    assert pinned.exit_code == 0, pinned.output
    assert "baseline of series 'series-x': series-1" in pinned.output
    assert asyncio.run(Variable.aget(variable_name("series-x"))) == "series-1"
    shown = CliRunner().invoke(app, ["traces", "baseline", "show"])
    assert "series-x  series-1" in shown.output
    unknown = CliRunner().invoke(app, ["traces", "baseline", "set", "no-such-run"])
    assert unknown.exit_code == 2 and "RUN = 'no-such-run': this Prefect server has no eval flow run" in unknown.output


@pytest.mark.unit
def test_a_pinned_baseline_that_the_dataset_lacks_is_a_config_error_before_any_rollout(openai_server, tmp_path):
    toml = tmp_path / "eval.toml"
    toml.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, baseline="nightly-0"))
    result = CliRunner().invoke(app, ["eval", str(toml)])
    assert result.exit_code == 2, result.output
    assert "baseline = 'nightly-0': no rollouts of this run in the trace dataset" in result.output
    assert openai_server.requests == []


@pytest.mark.unit
def test_events_only_where_the_interval_excludes_zero():
    import pandas as pd

    from prefect_rollouts.evals.baseline import comparison_events
    from prefect_rollouts.traces.compare import compare

    def rows(rewards: list[float], env: str = "e") -> pd.DataFrame:
        return pd.DataFrame({"environment": env, "task_id": [f"t{i}" for i in range(len(rewards))],
                             "rollout_index": 0, "reward": rewards, "is_error": False, "scoring_skipped": None})
    same = [1.0, 0.0] * 20
    assert comparison_events(compare(rows(same), rows(same), run_a="a", run_b="b"), "s") == []
    worse = compare(rows([1.0] * 40), rows([1.0] * 20 + [0.0] * 20), run_a="a", run_b="b")
    better = compare(rows([1.0] * 20 + [0.0] * 20), rows([1.0] * 40), run_a="a", run_b="b")
    (regressed,), (improved,) = comparison_events(worse, "s"), comparison_events(better, "s")
    assert (regressed["event"], improved["event"]) == (REGRESSED, IMPROVED)
    assert regressed["payload"]["difference"] == -0.5 and regressed["payload"]["baseline_run_id"] == "a"
    assert regressed["resource"] == {"prefect.resource.id": "prefect-rollouts.environment.e",
                                     "prefect.resource.name": "e", "prefect-rollouts.series": "s"}
    assert len(regressed["payload"]["flipped_to_fail"]) == 20


@pytest.mark.unit
def test_series_names_map_to_distinct_valid_variable_and_artifact_names():
    from prefect.client.schemas.actions import VariableCreate
    from prefect.types.names import ArtifactKey
    from pydantic import TypeAdapter

    from prefect_rollouts.flows.services.keys import comparison_key

    names = ["nightly-eval", "Nightly Eval", "nightly/eval", "中文", "日本", "L" * 300, "L" * 300 + "-other"]
    variables = [variable_name(name) for name in names]
    keys = [comparison_key(name) for name in names]
    assert len(set(variables)) == len(set(keys)) == len(names), "no two series share a Variable or an artifact"
    assert variables[0] == "prefect-rollouts-baseline-nightly-eval", "a name that is valid as it is stays readable"
    for variable, key in zip(variables, keys, strict=True):
        VariableCreate(name=variable, value="r")
        TypeAdapter(ArtifactKey).validate_python(key)
        assert len(variable) <= 255 and len(key) <= 100


@pytest.mark.unit
def test_a_run_that_did_not_score_every_rollout_of_the_baseline_does_not_replace_it():
    import pandas as pd

    from prefect_rollouts.evals.baseline import replaces_baseline
    from prefect_rollouts.traces.compare import compare

    def rows(rewards: list[float | None]) -> pd.DataFrame:
        return pd.DataFrame({"environment": "e", "task_id": [f"t{i}" for i in range(len(rewards))],
                             "rollout_index": 0, "reward": rewards,
                             "is_error": [r is None for r in rewards], "scoring_skipped": None})
    baseline = rows([1.0] * 10)
    assert replaces_baseline(compare(baseline, rows([0.0] * 10 + [1.0] * 2)))        # all of it, and more
    assert not replaces_baseline(compare(baseline, rows([1.0] * 3)))                 # a quick run
    assert not replaces_baseline(compare(baseline, rows([None] * 10)))               # every rollout errored
    assert not replaces_baseline(compare(baseline, rows([1.0] * 9 + [None])))        # one errored


@pytest.mark.unit
async def test_a_comparison_that_fails_is_a_note_not_the_run_s_failure(tmp_path):
    from prefect_rollouts.evals.baseline import Baseline
    from prefect_rollouts.flows.services.baseline import finish_with_baseline
    from prefect_rollouts.traces import EvalSummary, dataset_root

    config = load_eval_config(eval_toml(tmp_path, "http://127.0.0.1:9/v1", baseline="last"))
    summary = EvalSummary(run_id="r2", environments=[], rollouts=0, errored=0, total_tokens=0)
    key = await finish_with_baseline(summary, Baseline("gone"), config, dataset_root(tmp_path), "s",
                                     completed=True, ran=True)
    assert key is None and summary.baseline is None
    assert summary.baseline_note.startswith("no comparison with gone: ")


@pytest.mark.prefect
async def test_a_regressed_or_failed_run_does_not_replace_the_baseline_and_the_summary_says_so(tmp_path):
    from prefect_rollouts.evals.baseline import Baseline
    from prefect_rollouts.flows.services.baseline import finish_with_baseline
    from prefect_rollouts.traces import TraceWriter, dataset_root, summarize_run

    def write(run_id: str, rewards: list[float]) -> EvalSummary:
        writer = TraceWriter(tmp_path, run_id)
        for i, reward in enumerate(rewards):
            writer.add(vf.Trace(task_id=f"t{i}", model="m", reward=reward, stop_condition="agent_completed"),
                       rollout_index=0, environment="e", config_hash="h", elapsed_s=0.1)
        writer.flush()
        return summarize_run(tmp_path, run_id)
    config = load_eval_config(eval_toml(tmp_path, "http://127.0.0.1:9/v1", baseline="last"))
    series, root = "moves-or-not", dataset_root(tmp_path)
    await Variable.aset(variable_name(series), "good", overwrite=True)
    write("good", [1.0] * 40)

    bad = write("bad", [1.0] * 20 + [0.0] * 20)
    await finish_with_baseline(bad, Baseline("good"), config, root, series, completed=True, ran=True)
    assert bad.regressed == ["e"] and bad.baseline_moved is False
    assert bad.baseline_note == ("the baseline stays good: this run regressed (e); to compare the next runs with "
                                 "it all the same: prefect-rollouts traces baseline set bad")
    assert await Variable.aget(variable_name(series)) == "good"

    failed = write("failed", [1.0] * 40)
    await finish_with_baseline(failed, Baseline("good"), config, root, series, completed=False, ran=True)
    assert failed.baseline_moved is False
    assert failed.baseline_note.startswith("the baseline stays good: this run failed")
    assert await Variable.aget(variable_name(series)) == "good"

    better = write("better", [1.0] * 40)
    await finish_with_baseline(better, Baseline("good"), config, root, series, completed=True, ran=True)
    assert better.baseline_moved is True and better.baseline_note == "this run is now the baseline (it was good)"
    assert await Variable.aget(variable_name(series)) == "better"
