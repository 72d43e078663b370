"""The launch flow (the deployment form's flow) ends in the state of the eval it runs."""

from __future__ import annotations

import pytest

from prefect_rollouts.evals.launch_form import AdvancedSettings, LaunchForm
from prefect_rollouts.evals.launch_tasksets import ArithmeticTaskset
from prefect_rollouts.flows.launch import launch_flow
from tests.support.ports import free_port

pytestmark = pytest.mark.prefect


def refused_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"   # a port nothing listens on


async def test_a_launch_whose_rollouts_all_error_is_failed_with_the_evals_message(tmp_path):
    form = LaunchForm(taskset=ArithmeticTaskset(count=2), model="down-model", endpoint=refused_url(),
                      advanced=AdvancedSettings(harness="chat", traces_path=str(tmp_path), overrides={
                          "env.agent.client.retries.max_retries": 0, "env.agent.retries.segment": 0}))
    final = await launch_flow(form, return_state=True)
    assert final.is_failed()
    assert final.message.startswith("2 of 2 rollouts errored (")
