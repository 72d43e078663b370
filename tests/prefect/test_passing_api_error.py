"""A passing Prefect API error while a rollout flow run is created is not an outage: the API's
health check passes, so the flow run is created once more, and the row keeps its flow run id
(the full suite once saw one rollout of six run inline, without a flow run, after a single
failed request to a loaded server)."""

from __future__ import annotations

import logging

import httpx
import pytest
from prefect.client.orchestration import get_client
from prefect.client.orchestration._flow_runs.client import FlowRunAsyncClient
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply


@pytest.mark.prefect
async def test_a_failed_flow_run_creation_while_the_api_answers_is_tried_again(tmp_path, openai_server, monkeypatch,
                                                                                caplog):
    openai_server.default = lambda request: reply("wrong")
    create = FlowRunAsyncClient.create_flow_run
    failed: list[str] = []

    async def fail_the_first_rollout(self, flow, *args, **kwargs):
        if flow.name == "rollout" and not failed:
            failed.append(kwargs.get("name") or "")
            raise httpx.ReadError("connection reset by peer")     # what a loaded server's dropped connection raises
        return await create(self, flow, *args, **kwargs)
    monkeypatch.setattr(FlowRunAsyncClient, "create_flow_run", fail_the_first_rollout)

    text = eval_toml(tmp_path, openai_server.base_url, num_tasks=3, rollout_granularity="flow")
    with caplog.at_level(logging.WARNING, logger="prefect_rollouts.outage"):
        summary = await eval_flow(load_eval_config(text), run_id="passing-error")

    assert failed, "the first rollout's flow run creation failed once"
    rows = read_rollouts(tmp_path, run_id="passing-error")
    assert len(rows) == 3 and rows["flow_run_id"].notna().all(), "every rollout ran as a flow run"
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(rows["flow_run_id"]))))
    assert sorted(run.state_type.value for run in runs) == ["COMPLETED"] * 3
    messages = [record.getMessage() for record in caplog.records]
    assert any("failed (ReadError: connection reset by peer) while the API answers; trying once more" in m
               for m in messages)
    assert not any("is unreachable" in m for m in messages), "not taken for an outage"
    assert summary.environments[0].rollouts == 3


@pytest.mark.unit
def test_prefect_s_log_of_a_lost_api_connection_marks_the_watch_down_instead_of_printing_a_traceback():
    import sys

    from prefect_rollouts.flows.services.outage import ApiWatch, QuietWhileDown

    watch = ApiWatch("http://127.0.0.1:9/api", limit_s=60)
    quiet = QuietWhileDown(watch)

    def record(error: BaseException) -> logging.LogRecord:
        try:
            raise RuntimeError("Failed to set the flow run's state") from error
        except RuntimeError:
            return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "Crash detected", None,
                                     sys.exc_info())
    model = httpx.ConnectError("refused", request=httpx.Request("POST", "http://127.0.0.1:8000/v1/chat/completions"))
    assert quiet.filter(record(model)) and watch.is_up, "a model endpoint's error is not the API's"
    api = httpx.ConnectError("All connection attempts failed",
                             request=httpx.Request("POST", "http://127.0.0.1:9/api/flow_runs/"))
    assert quiet.filter(record(api)) is False and not watch.is_up
