"""The eval engine without Prefect (evals/): prepare, run inline, resume, stop."""

from __future__ import annotations

import re

import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.engine import inline_runner, progress_listener, run_rollouts
from prefect_rollouts.evals.prepare import load_eval, prepare_eval
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit


def says_its_number(request):
    return reply(re.search(r"say (\d+)", request.messages[-1]["content"]).group(1))


async def run(prepared, concurrency=3, **options):
    return await run_rollouts(prepared.config, prepared.root, prepared.run_id, prepared.todo,
                              inline_runner(concurrency), total=prepared.total, durable=prepared.durable, **options)


async def test_an_eval_runs_inline_writes_every_row_and_resumes_none_twice(tmp_path, openai_server):
    openai_server.default = says_its_number
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=3))
    prepared = prepare_eval(config, run_id="inline-1", resume=False)
    assert (prepared.total, len(prepared.todo)) == (10, 10)
    seen = []
    progress_listener.set(lambda durable, total: seen.append((durable, total)))
    run_state, complete = await run(prepared)
    rows = read_rollouts(tmp_path / "traces", run_id="inline-1")
    assert complete and len(run_state.writer.durable) == 10 and seen[-1] == (10, 10)
    assert sorted(rows["task_id"]) == sorted(f"n{i}" for i in range(10)) and set(rows["reward"]) == {1.0}
    assert 1 <= openai_server.max_in_flight <= 3
    resumed = prepare_eval(config, run_id="inline-1", resume=True)
    assert resumed.todo == [] and len(resumed.durable) == 10
    with pytest.raises(ConfigError, match="a run with this id already exists"):
        prepare_eval(config, run_id="inline-1", resume=False)


async def test_a_stop_from_beside_ends_the_work_and_keeps_the_finished_rows(tmp_path, openai_server):
    openai_server.default = delayed(0.2, reply("x"))
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=2))
    prepared = prepare_eval(config, run_id="stopped", resume=False)

    async def stop_after_two(run_state, stop):   # the Prefect layer's outage watch stops the work this way
        assert await wait_for(lambda: len(run_state.writer.durable) + run_state.writer.pending >= 2,
                              timeout_s=8, interval_s=0.01)
        stop()
    run_state, complete = await run(prepared, concurrency=2, beside=stop_after_two)
    assert not complete
    durable = len(read_rollouts(tmp_path / "traces", run_id="stopped"))
    assert 2 <= durable < 10 and durable == len(run_state.writer.durable)


def test_a_dry_run_checks_everything_and_writes_nothing(tmp_path):
    toml = tmp_path / "eval.toml"
    toml.write_text(eval_toml(tmp_path / "traces", "http://127.0.0.1:9/v1"))
    config = load_eval(toml, ["num_tasks=4"], resume=None)
    prepared = prepare_eval(config, run_id="dry", resume=False, dry_run=True)
    assert prepared.total == 4 and list((tmp_path / "traces").rglob("*")) == []
    with pytest.raises(ConfigError, match="run id 'a/b'"):
        prepare_eval(config, run_id="a/b", resume=False, dry_run=True)
    with pytest.raises(ConfigError, match="--resume gone: the run has no stored config"):
        load_eval(None, [f"traces.path={str(tmp_path / 'traces')!r}".replace("'", '"')], resume="gone")
    with pytest.raises(ConfigError, match="no config given"):
        load_eval(None, [], resume=None)
