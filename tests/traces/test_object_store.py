"""The trace dataset on an object store (moto's S3 server on loopback): many writers, readers, the CLI."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.traces import (
    TraceWriter,
    durable_keys,
    read_model_calls,
    read_rollouts,
    read_traces,
    summarize_run,
)
from prefect_rollouts.traces.store import dataset_root
from tests.traces.test_dataset import add, make_trace

pytestmark = pytest.mark.unit


def test_writers_of_one_run_on_two_machines_write_their_own_files_and_readers_see_all_rows(s3_dataset):
    first, second = TraceWriter(s3_dataset, "shared"), TraceWriter(s3_dataset, "shared")   # e.g. two workers
    add(first, make_trace("a", 1.0, calls=2), 0)
    add(first, make_trace("b", 0.0), 0)
    add(second, make_trace("c", None), 0)                        # an errored rollout
    add(second, make_trace("a", 1.0), 1)
    assert first.flush() == 2 and second.flush() == 2
    add(second, make_trace("d", 1.0), 0)
    assert second.flush() == 1

    store = dataset_root(s3_dataset)
    files = store.list_files("")
    assert len(files) == 6 and len(set(name.rsplit("/", 1)[1] for name in files)) == 3   # a name per batch
    assert {name.split("/")[0] for name in files} == {"model_calls", "rollouts"}
    assert all("/run_id=shared/part-" in name for name in files)
    listed = store.filesystem.get_file_info(pafs.FileSelector(store.path, recursive=True))
    assert not [info.path for info in listed if info.base_name.startswith(".")]   # no temporary objects

    rows = read_rollouts(s3_dataset, run_id="shared").sort_values(["task_id", "rollout_index"])
    assert list(zip(rows["task_id"], rows["rollout_index"], strict=True)) == [("a", 0), ("a", 1), ("b", 0), ("c", 0),
                                                                               ("d", 0)]
    assert durable_keys(s3_dataset, "shared") == {("arith", t, i) for t, i in [("a", 0), ("a", 1), ("b", 0), ("c", 0),
                                                                            ("d", 0)]}
    assert len(read_model_calls(s3_dataset, run_id="shared")) == 6
    assert {trace.task_id for trace in read_traces(s3_dataset, task_id="a")} == {"a"}
    summary = summarize_run(s3_dataset, "shared")
    env = summary.environments[0]
    assert (summary.rollouts, env.scored, summary.errored, env.mean_reward) == (5, 4, 1, 0.75)


def test_traces_summary_reads_an_object_store_uri(s3_dataset):
    writer = TraceWriter(s3_dataset, "on-s3")
    add(writer, make_trace("a", 1.0), 0)
    add(writer, make_trace("b", 0.0), 0)
    writer.flush()
    result = CliRunner().invoke(app, ["traces", "summary", s3_dataset, "--run-id", "on-s3"])
    assert result.exit_code == 0, result.output
    assert "run on-s3" in result.output and "0.5" in result.output
    empty = CliRunner().invoke(app, ["traces", "summary", s3_dataset, "--run-id", "nothing"])
    assert empty.exit_code == 1 and "no rollouts in s3://" in empty.output


def test_an_empty_prefix_reads_as_no_rows(s3_dataset):
    assert read_rollouts(s3_dataset).empty and durable_keys(s3_dataset, "r") == set()


def test_credentials_in_a_dataset_uri_are_refused_without_repeating_them():
    for uri in ("s3://AKIAXXXX:sup3rsecret@bucket/traces", "s3://bucket/traces?secret_key=sup3rsecret"):
        with pytest.raises(ConfigError, match="must not hold credentials") as caught:
            TraceWriter(uri, "r")
        assert "sup3rsecret" not in str(caught.value)


def test_a_bucket_that_does_not_exist_is_a_config_error_before_a_run_starts(s3_dataset, tmp_path):
    missing = s3_dataset.replace("s3://traces-", "s3://missing-")
    config = tmp_path / "eval.toml"
    config.write_text(f'[traces]\npath = "{missing}"\n[env.taskset]\nid = "arithmetic"\ncount = 2\n'
                      '[env.agent]\nmodel = "m"\n')
    result = CliRunner().invoke(app, ["eval", str(config)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and text.startswith(f"config error: [traces] path = '{missing}'"), text
    assert "Starting temporary server" not in text and "Traceback" not in text
