"""Issue 12: an eval dispatched as shard flow runs to a process work pool with two real workers."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, gathered, reply
from tests.scaleout.conftest import raw_keys
from tests.support.cli import run_eval, start_eval
from tests.support.processes import descendants
from tests.support.waiting import wait_until
from tests.support.workers import PREFECT, Worker, prefect_env

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


def answer(delay_s: float):
    """Task i asks for i; tasks divisible by 3 get a wrong answer (mean reward 2/3 of them)."""
    def step(request: Any) -> Any:
        number = int(re.search(r"say (\d+)", request.messages[-1]["content"]).group(1))
        return delayed(delay_s, reply(str(number + (number % 3 == 0))))
    return step


def config(traces: Path, base_url: str, pool: str | None, *, count: int = 40, **top: Any):
    text = eval_toml(traces, base_url, taskset={"id": "tests.prefect.tasksets:numbered", "count": count},
                     rollout_granularity=top.pop("rollout_granularity", "flow"),
                     max_concurrent=top.pop("max_concurrent", 4), **top)
    if pool:
        text += f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 10\nmax_shards_in_flight = 4\n'
        text += "heartbeat_s = 30\ncrash_after_s = 60\n"
    return load_eval_config(text)


async def flow_runs(flow_name: str, **filters: Any) -> list[Any]:
    async with get_client() as client:
        return await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                           limit=200, **filters)


async def parent_flow_run_ids(runs: list[Any]) -> set[Any]:
    """The flow runs that hold the tracking task runs of ``runs`` (their subflow parents)."""
    async with get_client() as client:
        return {(await client.read_task_run(run.parent_task_run_id)).flow_run_id for run in runs}


def test_shards_run_on_both_workers_as_subflows_and_match_the_in_process_eval(work_pool, openai_server, tmp_path):
    pool, workers = work_pool
    openai_server.default = answer(1.0)   # a shard lasts seconds: the second worker polls (every 1 s) meanwhile
    summary = asyncio.run(eval_flow(config(tmp_path / "traces", openai_server.base_url, pool), run_id="two-workers"))

    rows = read_rollouts(tmp_path / "traces", run_id=summary.run_id)
    written = raw_keys(tmp_path / "traces", summary.run_id)
    assert len(rows) == 40 and len(written) == len(set(written)) == 40, "every row once, in the files too"
    assert rows["shard_flow_run_id"].nunique() == 4 and rows["worker_pid"].nunique() == 4, "a process per shard"
    assert rows["worker_host"].notna().all()

    evals = asyncio.run(flow_runs("eval"))
    eval_run = next(run for run in evals if run.name == summary.run_id)
    shards = [run for run in asyncio.run(flow_runs("shard")) if run.name.startswith(summary.run_id)]
    assert len(shards) == 4 and all(run.state_type.value == "COMPLETED" for run in shards)
    assert all(run.work_pool_name == pool for run in shards)
    assert asyncio.run(parent_flow_run_ids(shards)) == {eval_run.id}, "shard flow runs are subflows of the eval"
    ids = sorted(set(rows["flow_run_id"]))   # the module's server holds other tests' rollout runs too
    rollout_runs = wait_until(lambda: len(found := asyncio.run(flow_runs(
        "rollout", flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids))))) == 40 and found, timeout_s=30)
    assert rollout_runs and len(rollout_runs) == 40, "the server recorded each rollout's flow run"
    assert asyncio.run(parent_flow_run_ids(rollout_runs)) == {run.id for run in shards}
    assert set(rows["shard_flow_run_id"]) == {str(run.id) for run in shards}
    shard_ids = {str(run.id) for run in shards}
    assert all(worker.ran(shard_ids) for worker in workers), "both workers ran shards"
    assert set.union(*(worker.ran(shard_ids) for worker in workers)) == shard_ids

    local = asyncio.run(eval_flow(config(tmp_path / "traces", openai_server.base_url, None)))
    assert [(e.environment, e.rollouts, e.mean_reward, e.errored) for e in summary.environments] == \
        [(e.environment, e.rollouts, e.mean_reward, e.errored) for e in local.environments]
    assert summary.environments[0].mean_reward == pytest.approx(26 / 40)


def test_a_killed_worker_s_shard_is_crashed_and_run_again_on_the_other(work_pool, openai_server, tmp_path):
    """``kill -9`` of a worker (and the flow run process it started) in the middle of a shard: the
    zombie automation marks the shard Crashed, the eval submits its rollouts without a row again,
    the other worker runs them, and the run ends with exactly its 40 rows."""
    pool, workers = work_pool
    openai_server.default = answer(1.0)
    traces = tmp_path / "traces"
    cfg = config(traces, openai_server.base_url, pool, rollout_granularity="task", max_concurrent=2)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = asyncio.run(eval_flow(cfg, run_id="killed-worker"))
        except BaseException as exc:   # reported by the assertion below
            result["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def running_shard() -> Any:
        runs = asyncio.run(flow_runs("shard"))
        return next((r for r in runs if r.name.startswith("killed-worker") and r.state_type.value == "RUNNING"
                     and r.infrastructure_pid), None)
    shard = wait_until(running_shard, timeout_s=120, what="a shard of killed-worker to run")
    # until it wrote a row or two, so only some of its rollouts run again
    assert wait_until(lambda: shard_rows(traces, "killed-worker", shard.id) >= 2, timeout_s=120,
                      what="the shard's first 2 rows")
    pid = int(str(shard.infrastructure_pid).rsplit(":", 1)[-1])   # "PID" or "HOST:PID"
    victim = next(w for w in workers if pid in [p.pid for p in descendants(w.process.pid)])
    victim.kill()
    thread.join(timeout=480)
    workers[workers.index(victim)] = Worker(*victim_args(victim, pool))   # the next test gets two workers again

    assert "error" not in result, result.get("error")
    rows = read_rollouts(traces, run_id="killed-worker")
    assert len(rows) == 40 and not rows.duplicated(["task_id", "rollout_index"]).any()
    crashed = asyncio.run(flow_runs("shard", flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[shard.id]))))
    assert crashed[0].state_type.value == "CRASHED"
    retried = [r for r in asyncio.run(flow_runs("shard")) if r.name.startswith("killed-worker")
               and "attempt 2" in r.name]
    assert retried and all(r.state_type.value == "COMPLETED" for r in retried)
    rerun_rows = rows[rows["shard_flow_run_id"].isin({str(r.id) for r in retried})]
    assert len(rerun_rows) > 0 and pid not in set(rerun_rows["worker_pid"])


def shard_rows(traces: Path, run_id: str, shard_id: object) -> int:
    """How many rows of ``run_id`` the shard flow run ``shard_id`` has made durable so far."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    try:
        table = ds.dataset(traces / "rollouts", format="parquet", partitioning="hive", exclude_invalid_files=True
                           ).to_table(columns=["shard_flow_run_id"], filter=ds.field("run_id") == run_id)
    except (OSError, pa.ArrowInvalid):   # no file yet
        return 0
    return table["shard_flow_run_id"].to_pylist().count(str(shard_id))


def victim_args(worker: Worker, pool: str) -> tuple[str, str, str, int, Path]:
    import os
    return os.environ["PREFECT_API_URL"], pool, worker.name + "-again", 2, worker.log


def test_cli_dispatches_to_the_pool_and_prints_the_eval_flow_run_url(work_pool, pg_api, openai_server, tmp_path):
    import json
    import urllib.request


    pool, _ = work_pool
    openai_server.default = answer(0.0)
    toml = tmp_path / "eval.toml"
    toml.write_text(eval_toml(tmp_path / "traces", openai_server.base_url,
                              taskset={"id": "tests.prefect.tasksets:numbered", "count": 6}))
    done = run_eval(toml, "--work-pool", pool, "--shard-size", "3", "--run-id", "from-cli", env=prefect_env(pg_api))
    assert done.returncode == 0, done.stdout + done.stderr
    url = re.search(r"eval flow run: (http\S+/runs/flow-run/([0-9a-f-]{36}))", done.stdout)
    assert url, done.stdout
    with urllib.request.urlopen(f"{pg_api}/flow_runs/{url.group(2)}") as response:
        assert json.load(response)["name"] == "from-cli"
    rows = read_rollouts(tmp_path / "traces", run_id="from-cli")
    assert len(rows) == 6 and rows["shard_flow_run_id"].nunique() == 2

    bad = run_eval(toml, "--work-pool", "nope", env=prefect_env(pg_api))
    assert bad.returncode == 2 and "work-pool create nope" in bad.stdout + bad.stderr


def test_a_resume_after_the_eval_died_cancels_its_live_shards_first(work_pool, pg_api, openai_server, tmp_path):
    """``kill -9`` of the eval's own process while its shards run on workers, then ``--resume``: the
    resumed eval cancels the shard flow runs still live and waits for them before it plans, so no
    rollout runs twice; the run ends with its 40 rows."""
    import os
    import signal
    import subprocess


    pool, _ = work_pool
    openai_server.default = answer(2.0)   # a shard of 10 takes ~20 s: still running when the eval is resumed
    toml = tmp_path / "eval.toml"
    toml.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=1,
                              taskset={"id": "tests.prefect.tasksets:numbered", "count": 40})
                    + f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 10\nmax_shards_in_flight = 2\n')
    eval_process = start_eval(toml, "--run-id", "died", env=prefect_env(pg_api), stdout=subprocess.DEVNULL,
                              new_session=True)

    def shards_running() -> bool:
        runs = asyncio.run(flow_runs("shard"))
        return sum(r.name.startswith("died") and r.state_type.value == "RUNNING" for r in runs) >= 2
    # 2 shards in flight leave 2 of the workers' 4 slots free: the resumed eval's shards could run beside them
    assert wait_until(shards_running, timeout_s=120, what="2 shards of the eval to run")
    os.killpg(eval_process.pid, signal.SIGKILL)
    eval_process.wait(timeout=10)

    resumed = run_eval(toml, "--resume", "died", env=prefect_env(pg_api), timeout_s=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = read_rollouts(tmp_path / "traces", run_id="died")
    assert len(rows) == 40 and not rows.duplicated(["task_id", "rollout_index"]).any()
    requests = [r.messages[-1]["content"] for r in openai_server.requests]
    assert len(requests) <= 40 + 2, "only the 2 rollouts in flight when their shards were cancelled ran again"
    first = [r for r in asyncio.run(flow_runs("shard")) if r.name.startswith("died")
             and str(r.id) not in set(rows["shard_flow_run_id"])]
    assert all(r.state_type.value in {"CANCELLED", "COMPLETED", "CRASHED"} for r in first)


def test_the_endpoint_limit_holds_across_the_workers(work_pool, openai_server, tmp_path):
    """``[limits] model_requests = 2``: 4 shards on two workers, 4 rollouts in flight in each, and
    the scripted server never sees more than 2 requests at once."""
    pool, _ = work_pool
    openai_server.default = gathered(2, answer(0.3))
    text = eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="task", max_concurrent=4,
                     taskset={"id": "tests.prefect.tasksets:numbered", "count": 24})
    text += f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 6\nmax_shards_in_flight = 4\n'
    text += '[limits]\nmodel_requests = 2\nmodel_requests_name = "scaleout-endpoint"\n'
    summary = asyncio.run(eval_flow(load_eval_config(text), run_id="limited"))
    assert summary.rollouts == 24 and summary.errored == 0
    assert openai_server.max_in_flight == 2


def test_shards_waiting_on_a_pool_no_worker_polls_are_reported(pg_api, openai_server, tmp_path):
    """No worker on the pool: after 30 s the eval warns and names the command that starts one;
    once a worker starts, the eval finishes."""
    import logging
    import subprocess


    subprocess.run([PREFECT, "work-pool", "create", "idle", "--type", "process"], env=prefect_env(pg_api),
                   check=True, capture_output=True, timeout=120)
    openai_server.default = answer(0.0)
    text = eval_toml(tmp_path / "traces", openai_server.base_url,
                     taskset={"id": "tests.prefect.tasksets:numbered", "count": 4})
    text += '[dispatch]\nwork_pool = "idle"\nshard_size = 4\n'
    warnings: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())
    handler = Catch()
    logging.getLogger("prefect.flow_runs").addHandler(handler)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(
        summary=asyncio.run(eval_flow(load_eval_config(text), run_id="idle-pool"))), daemon=True)
    try:
        thread.start()
        assert wait_until(lambda: any("no worker is polling it" in w for w in warnings), timeout_s=120,
                          what=lambda: f"the warning that no worker polls the pool (warnings: {warnings})")
        assert any(".venv/bin/prefect worker start --pool idle" in w for w in warnings)
        worker = Worker(pg_api, "idle", "late-worker", 1, tmp_path / "late-worker.log")
        thread.join(timeout=240)
        worker.stop()
    finally:
        logging.getLogger("prefect.flow_runs").removeHandler(handler)
    assert result["summary"].rollouts == 4


def test_a_shard_on_a_worker_runs_a_program_harness_like_the_eval_process(work_pool, openai_server, tmp_path):
    """The ``bash`` program harness in shards on the workers: each worker's agents open their own
    interception endpoint, and the rows are those of the same eval run in this process."""
    from prefect_rollouts.traces import read_traces

    pool, _ = work_pool
    openai_server.default = answer(0.2)

    def bash_config(use_pool: str | None, traces: Path):
        text = eval_toml(traces, openai_server.base_url, taskset={"id": "tests.prefect.tasksets:numbered",
                                                                  "count": 12},
                         rollout_granularity="task", max_concurrent=3).replace('harness = "chat"', 'harness = "bash"')
        if use_pool:
            text += f'[dispatch]\nwork_pool = "{use_pool}"\nshard_size = 6\nmax_shards_in_flight = 2\n'
        return load_eval_config(text)
    summary = asyncio.run(eval_flow(bash_config(pool, tmp_path / "pool"), run_id="program-shards"))
    rows = read_rollouts(tmp_path / "pool", run_id="program-shards")
    assert len(rows) == 12 and rows["shard_flow_run_id"].nunique() == 2 and rows["error_type"].isna().all()
    traces = read_traces(tmp_path / "pool", run_id="program-shards")
    assert all(t.info["program"][0]["exit_code"] == 0 and t.info["program"][0]["model_calls"] == 1 for t in traces)
    local = asyncio.run(eval_flow(bash_config(None, tmp_path / "local"), run_id="program-local"))
    assert [(e.rollouts, e.mean_reward, e.errored) for e in summary.environments] == \
        [(e.rollouts, e.mean_reward, e.errored) for e in local.environments]
    assert summary.environments[0].mean_reward == pytest.approx(8 / 12)


@pytest.mark.usefixtures("docker_engine")
def test_workers_build_the_harbor_images_their_shards_need(work_pool, tmp_path):
    """Harbor tasks dispatched to the pool: the workers (not the eval process) build the images, once per
    tag on their Docker engine, and score the oracle 1 on each task."""
    from prefect_rollouts.runtimes.docker.engine import docker_client
    from prefect_rollouts.traces import read_traces
    from tests.docker.test_harbor_docker import task_dir
    from tests.prefect.test_harbor_eval import harbor_toml

    pool, _ = work_pool
    tasks = tmp_path / "tasks"
    for name in ("one", "two", "three"):
        directory = task_dir(tasks, name)
        (directory / "environment" / "Dockerfile").write_text(   # an image no other test built
            f"FROM prefect-rollouts-sandbox:latest\nWORKDIR /app\nRUN echo {tmp_path.name}-{name} > /id\n")
    text = harbor_toml(tmp_path / "traces", tasks, "oracle")
    text += f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 2\nmax_shards_in_flight = 2\n'
    summary = asyncio.run(eval_flow(load_eval_config(text), run_id="harbor-shards"))
    rows = read_rollouts(tmp_path / "traces", run_id="harbor-shards")
    assert len(rows) == 3 and rows["error_type"].isna().all() and (rows["reward"] == 1.0).all()
    assert rows["shard_flow_run_id"].nunique() == 2 and summary.environments[0].mean_reward == 1.0
    traces = read_traces(tmp_path / "traces", run_id="harbor-shards")
    assert all(trace.info["harbor"]["build_s"] > 0 for trace in traces)   # each built where its shard ran
    for trace in traces:
        docker_client().images.remove(trace.info["harbor"]["image"], force=True)


def test_shards_on_both_workers_share_one_token_budget_and_a_larger_one_finishes_the_run(work_pool, openai_server,
                                                                                         tmp_path):
    """``token_budget`` across 4 shards in flight on two workers (2 rollouts in flight in each): one counter
    (a global concurrency limit) for all; rollouts in flight stop as ``budget``, none starts after, the
    overshoot stays within one call per rollout in flight, and a resume with a larger budget finishes it."""
    from prefect_rollouts.flows.services.budget import counter_name

    pool, workers = work_pool

    def says_its_number(request: Any) -> Any:   # 100 tokens a call, slow enough that shards overlap
        number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
        return delayed(0.2, reply(number, usage={"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100}))
    openai_server.default = says_its_number

    def budgeted(budget: int):
        text = eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="task", max_concurrent=2,
                         token_budget=budget, taskset={"id": "tests.core.budget_tasks:chatty", "count": 16, "turns": 5})
        return load_eval_config(text + f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 4\nmax_shards_in_flight = 4\n')

    # not a multiple of a rollout's 500 tokens: had the first shard's 4 rollouts ended at exactly 2,000 before a
    # second shard started (one CI run), none would have been in flight to stop; past them, the next in flight stop
    final = asyncio.run(eval_flow(budgeted(2_050), run_id="shared-budget", return_state=True))
    assert (final.type.value, final.name) == ("FAILED", "BudgetReached") and "budget reached" in final.message
    rows = read_rollouts(tmp_path / "traces", run_id="shared-budget", attempts="all")
    stopped = rows[rows["stop_condition"] == "budget"]
    assert len(stopped) >= 2 and stopped["reward"].isna().all() and len(rows) < 16   # 16 x 500 tokens would finish
    assert rows["shard_flow_run_id"].nunique() >= 2
    shard_ids = set(rows["shard_flow_run_id"])
    assert all(worker.ran(shard_ids) for worker in workers), "both workers ran shards of the budget"
    spent = int(rows["total_tokens"].sum())
    assert 2_050 <= spent <= 2_050 + 4 * 2 * 100, spent   # measured overshoot: one call per rollout in flight
    counter = asyncio.run(_limit(counter_name("shared-budget", "tokens")))
    assert counter.active_slots == spent == 100 * len(openai_server.requests)   # every call counted once, by all

    done = asyncio.run(eval_flow(budgeted(20_000), resume="shared-budget"))
    latest = read_rollouts(tmp_path / "traces", run_id="shared-budget")
    assert done.rollouts == 16 and set(latest["stop_condition"]) == {"agent_completed"}
    assert (read_rollouts(tmp_path / "traces", run_id="shared-budget", attempts="all")["stop_condition"]
            == "budget").sum() == len(stopped)


async def _limit(name: str) -> Any:
    async with get_client() as client:
        return await client.read_global_concurrency_limit_by_name(name)
