"""Through the real CLI and eval flow: the run's stored config on --resume, and a dataset on an object store."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from prefect_rollouts.blocks import TraceStore, resolve_trace_root
from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.evals.identity import prepare_run
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import TraceWriter, read_rollouts
from prefect_rollouts.traces.store import dataset_root
from tests.eval_toml import eval_toml
from tests.fakes.object_store import CREDENTIALS
from tests.fakes.openai_server import reply
from tests.traces.test_dataset import add, make_trace

pytestmark = pytest.mark.prefect


def invoke(*args):
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    return result.exit_code, " ".join(result.output.split())   # rich wraps long lines


def test_a_run_of_12_resumed_without_its_set_num_tasks_does_not_grow_to_50(tmp_path, openai_server):
    openai_server.default = reply("0")
    traces = tmp_path / "traces"
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(traces, openai_server.base_url, taskset={"id": "tests.prefect.tasksets:numbered",
                                                                         "count": 50}))
    code, output = invoke("eval", config, "--set", "num_tasks=12", "--run-id", "twelve")
    assert code == 0, output
    assert len(read_rollouts(traces, run_id="twelve")) == 12 and len(openai_server.requests) == 12

    openai_server.reset()
    openai_server.default = reply("0")
    code, output = invoke("eval", config, "--resume", "twelve")           # the case: no --set num_tasks=12
    assert code == 2 and output.startswith("config error: --resume twelve: the config differs"), output
    assert "num_tasks (stored 12, given unset)" in output and "--force-config" in output
    assert len(read_rollouts(traces, run_id="twelve")) == 12 and not openai_server.requests

    code, output = invoke("eval", "--resume", "twelve", "--set", f"traces.path={traces}", "--set", "max_concurrent=2")
    assert code == 0, output                                              # the stored config, how-keys may change
    assert len(read_rollouts(traces, run_id="twelve")) == 12 and not openai_server.requests
    assert "run twelve" in output

    code, output = invoke("eval", config, "--run-id", "twelve")
    assert code == 2 and "--run-id twelve: a run with this id already exists" in output

    code, output = invoke("eval", config, "--resume", "twelve", "--force-config")   # told to: the run grows
    assert code == 0, output
    assert len(read_rollouts(traces, run_id="twelve")) == 50 and len(openai_server.requests) == 38


def test_an_eval_on_an_object_store_resumes_rows_another_writer_made_durable(s3_dataset, tmp_path, openai_server):
    openai_server.default = reply("0")
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(s3_dataset, openai_server.base_url, taskset={"id": "tests.prefect.tasksets:numbered",
                                                                             "count": 6}, max_concurrent=2))
    store = dataset_root(s3_dataset)
    prepare_run(store, "on-s3", load_eval_config(config), resume=False)   # as the run's start stores it
    elsewhere = TraceWriter(s3_dataset, "on-s3")                          # a worker on another machine, then killed
    for task_id in ("n0", "n1", "n2", "n3"):
        add(elsewhere, make_trace(task_id, 1.0), 0, env="tests.prefect.tasksets:numbered")
    elsewhere.flush()

    code, output = invoke("eval", "--resume", "on-s3", "--set", f"traces.path={s3_dataset}")
    assert code == 0, output
    assert sorted(r.messages[-1]["content"] for r in openai_server.requests) == ["task 4: say 4", "task 5: say 5"]
    rows = read_rollouts(s3_dataset, run_id="on-s3")
    assert sorted(rows["task_id"]) == ["n0", "n1", "n2", "n3", "n4", "n5"]
    assert len(store.list_files("rollouts")) == 2   # one file per writer: too few to compact (flows/eval.py)
    assert store.list_files("runs") == ["runs/run_id=on-s3/config.json"]

    code, output = invoke("traces", "summary", s3_dataset, "--run-id", "on-s3")
    assert code == 0 and "run on-s3" in output and re.search(r"\s6 +6 +0\.6667\s", output), output


async def test_a_run_ends_with_one_file_per_table_however_often_it_flushed(tmp_path, openai_server):
    openai_server.default = reply("0")
    config = load_eval_config(eval_toml(tmp_path, openai_server.base_url, rollout_granularity="batch",
                                        taskset={"id": "tests.prefect.tasksets:numbered", "count": 100},
                                        rollouts_per_task=3, batch_size=50, max_concurrent=32))
    summary = await eval_flow(config, run_id="many")       # rollouts_per_task > 1: a file per rollout while it runs
    assert summary.rollouts == 300
    root = dataset_root(tmp_path)
    assert len(root.list_files("rollouts")) == len(root.list_files("model_calls")) == 1
    assert len(read_rollouts(tmp_path, run_id="many")) == 300


async def test_a_trace_store_block_holds_the_location_and_credentials(s3_dataset, _moto_endpoint, tmp_path,
                                                                      openai_server, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)                             # only the block says where and who
    openai_server.default = reply("0")
    await TraceStore(path=s3_dataset, endpoint_url=_moto_endpoint, region="us-east-1",
                     access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"]).save("s3-traces", overwrite=True)
    config = load_eval_config(eval_toml(tmp_path / "unused", openai_server.base_url, num_tasks=3),
                              ['traces.store="s3-traces"'])
    summary = await eval_flow(config, run_id="via-block")
    root = await resolve_trace_root("s3-traces")
    assert summary.rollouts == 3 and len(read_rollouts(root, run_id="via-block")) == 3
    stored = root.read_file("runs/run_id=via-block/config.json").decode()
    assert '"store": "s3-traces"' in stored and CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in stored
    assert not (tmp_path / "unused").exists()


async def test_an_eval_compacts_many_sparse_files_at_its_end_and_leaves_full_ones(tmp_path, openai_server):
    """A row per file (a slow model: every 2 s flush holds a few rows) is compacted at the end; an
    eval whose files are full is not rewritten (COMPACT_MIN_FILES, COMPACT_ROWS_PER_FILE)."""
    openai_server.default = reply("0")
    sparse = load_eval_config(eval_toml(tmp_path / "sparse", openai_server.base_url, flush_each_rollout=True,
                                        max_concurrent=1, taskset={"id": "tests.prefect.tasksets:numbered",
                                                                   "count": 40}))
    await eval_flow(sparse, run_id="sparse")   # 40 files of a row or two each (under load flushes may merge)
    store = dataset_root(tmp_path / "sparse")
    assert len(store.list_files("rollouts")) == len(store.list_files("model_calls")) == 1
    assert len(read_rollouts(tmp_path / "sparse", run_id="sparse")) == 40

    full = load_eval_config(eval_toml(tmp_path / "full", openai_server.base_url, max_concurrent=4,
                                      taskset={"id": "tests.prefect.tasksets:numbered", "count": 20}))
    await eval_flow(full, run_id="full")
    files = dataset_root(tmp_path / "full").list_files("rollouts")
    assert 1 < len(files) < 16 and len(read_rollouts(tmp_path / "full", run_id="full")) == 20
