"""A sync reward that blocks does not freeze an eval: its rollout records ``scoring_timeout`` at the
deadline, the other rollouts of its batch (or its flow run's siblings) run and write their rows,
and the eval ends though the blocked thread is still running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply
from tests.prefect import tasksets

pytestmark = pytest.mark.prefect


@pytest.fixture(autouse=True)
def gate(monkeypatch) -> Iterator[tasksets.Gate]:
    """This test's gate of the blocked reward, released when the test ends."""
    gate = tasksets.Gate()
    monkeypatch.setattr(tasksets, "BLOCKING_GATE", gate)
    yield gate
    gate.release.set()


@pytest.mark.timeout(180)   # the session's Prefect harness may start within it (~60 s on a busy machine)
@pytest.mark.parametrize("granularity", ["batch", "flow"])
async def test_a_blocking_reward_times_out_and_the_other_rollouts_write_their_rows(tmp_path, openai_server,
                                                                                   granularity, gate):
    openai_server.default = lambda request: reply(request.messages[-1]["content"].rsplit(" ", 1)[-1])
    text = eval_toml(tmp_path, openai_server.base_url, taskset={"id": "tests.prefect.tasksets:blocking", "count": 6},
                     rollout_granularity=granularity, batch_size=6, max_concurrent=6, max_error_fraction=0.5)
    config = load_eval_config(text + "[env.agent.timeouts]\nscoring = 1\n")
    await eval_flow(config, run_id=f"blocking-{granularity}")
    assert not gate.returned.is_set(), "the eval waited for the blocked reward (it blocks for 120 s)"
    rows = read_rollouts(tmp_path, run_id=f"blocking-{granularity}").set_index("task_id").sort_index()
    assert list(rows.index) == ["n0", "n1", "n2", "n3", "n4", "n5"]
    assert rows.loc["n0", "stop_condition"] == "scoring_timeout" and rows["reward"].isna()["n0"]
    assert "abandoned" in rows.loc["n0", "info"]
    assert set(rows.loc["n1":, "stop_condition"]) == {"agent_completed"} and set(rows.loc["n1":, "reward"]) == {1.0}
