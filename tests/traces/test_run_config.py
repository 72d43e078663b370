"""The run's config stored in the dataset, and what --resume may change (evals.identity)."""

from __future__ import annotations

import json
import re

import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError, TraceStoreError
from prefect_rollouts.evals.identity import HOW_KEYS, prepare_run
from prefect_rollouts.traces.run_config import RUN_CONFIG_VERSION, read_run_config, run_config_path
from prefect_rollouts.traces.store import dataset_root
from tests.eval_toml import eval_toml

pytestmark = pytest.mark.unit


def config(tmp_path, *overrides: str, **top):
    top.setdefault("num_tasks", 12)
    if top["num_tasks"] is None:
        del top["num_tasks"]
    return load_eval_config(eval_toml(tmp_path, "http://127.0.0.1:9/v1", taskset={"id": "arithmetic", "count": 50},
                                      **top), list(overrides))


def test_a_new_run_stores_its_config_once_with_secrets_removed(tmp_path):
    root = dataset_root(tmp_path)
    given = config(tmp_path, 'env.agent.client.headers.X-Token="tok-s3cret"', 'env.agent.runtime.env.PASS="pw-s3cret"',
                   'env.agent.runtime.env.HOME_DIR="${HOME}"')
    assert prepare_run(root, "r1", given, resume=False) is given
    text = (tmp_path / run_config_path("r1")).read_text()
    assert "s3cret" not in text
    stored = read_run_config(tmp_path, "r1")
    assert stored is not None and stored.version == RUN_CONFIG_VERSION and stored.run_id == "r1"
    assert stored.config["num_tasks"] == 12 and stored.config["env"]["taskset"] == {"id": "arithmetic", "count": 50}
    assert stored.config["env"]["agent"]["runtime"]["env"] == {"PASS": "***", "HOME_DIR": "${HOME}"}
    assert sorted(stored.redacted) == ["env.agent.client.headers.X-Token", "env.agent.runtime.env.PASS"]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    with pytest.raises(ConfigError, match="--run-id r1: a run with this id already exists"):
        prepare_run(root, "r1", given, resume=False)


def test_resume_refuses_a_config_that_changes_what_the_run_is_and_names_every_key(tmp_path):
    root = dataset_root(tmp_path)
    prepare_run(root, "r1", config(tmp_path), resume=False)
    changed = config(tmp_path, "rollouts_per_task=2", 'env.agent.model="other"', "env.taskset.count=40",
                     num_tasks=None)
    with pytest.raises(ConfigError) as caught:
        prepare_run(root, "r1", changed, resume=True)
    message = str(caught.value)
    assert message.startswith("--resume r1: the config differs from the one the run started with")
    for part in ("num_tasks (stored 12, given unset)", "rollouts_per_task (stored 1, given 2)",
                 'env.agent.model (stored "scripted", given "other")', "env.taskset.count (stored 50, given 40)",
                 "--force-config"):
        assert part in message, message
    assert prepare_run(root, "r1", changed, resume=True, force=True) is changed
    assert read_run_config(root, "r1").config["num_tasks"] == 12          # the run's own config stays


def test_resume_accepts_keys_that_only_change_how_the_run_runs(tmp_path):
    root = dataset_root(tmp_path)
    prepare_run(root, "r1", config(tmp_path), resume=False)
    how = config(tmp_path, "max_concurrent=3", "batch_size=7", "flush_each_rollout=true", "api_outage_limit_s=30",
                 'run_name="again"', 'env.agent.client.base_url="http://10.0.0.1:8000/v1"',
                 "env.agent.client.timeout=5",
                 "env.agent.client.retries.max_retries=9", "env.agent.retries.segment=3",
                 'env.agent.client.headers.X-Token="tok-s3cret"')
    assert prepare_run(root, "r1", how, resume=True) is how
    assert {"max_concurrent", "traces", "env.agent.client"} <= set(HOW_KEYS)


def test_resume_without_a_config_runs_the_stored_one_with_set_overrides(tmp_path):
    root = dataset_root(tmp_path)
    prepare_run(root, "r1", config(tmp_path), resume=False)
    resumed = prepare_run(root, "r1", None, resume=True, overrides=["max_concurrent=2"])
    assert (resumed.num_tasks, resumed.max_concurrent, resumed.env.taskset.options) == (12, 2, {"count": 50})
    with pytest.raises(ConfigError, match=r"num_tasks \(stored 12, given 20\)"):
        prepare_run(root, "r1", None, resume=True, overrides=["num_tasks=20"])
    with pytest.raises(ConfigError, match="--resume r2: the run has no stored config"):
        prepare_run(root, "r2", None, resume=True)


def test_resume_without_a_config_needs_the_file_when_secrets_were_removed(tmp_path):
    root = dataset_root(tmp_path)
    prepare_run(root, "r1", config(tmp_path, 'env.agent.client.headers.X-Token="tok"'), resume=False)
    with pytest.raises(ConfigError,
                       match=re.escape("had secret values, which are not stored: env.agent.client.headers.X-Token")):
        prepare_run(root, "r1", None, resume=True)


def test_a_run_without_a_stored_config_stores_the_one_it_resumes_with(tmp_path):
    root = dataset_root(tmp_path)
    assert read_run_config(root, "old") is None
    prepare_run(root, "old", config(tmp_path), resume=True)
    assert read_run_config(root, "old").config["num_tasks"] == 12


def test_a_run_config_from_a_newer_version_is_refused(tmp_path):
    root = dataset_root(tmp_path)
    prepare_run(root, "r1", config(tmp_path), resume=False)
    path = tmp_path / run_config_path("r1")
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": RUN_CONFIG_VERSION + 1}))
    with pytest.raises(TraceStoreError, match=f"version {RUN_CONFIG_VERSION + 1} is newer"):
        prepare_run(root, "r1", config(tmp_path), resume=True)


def test_the_run_config_lives_in_the_object_store_too(s3_dataset):
    root = dataset_root(s3_dataset)
    prepare_run(root, "r1", config("/unused"), resume=False)
    assert root.list_files("runs") == ["runs/run_id=r1/config.json"]
    with pytest.raises(ConfigError, match=r"num_tasks \(stored 12, given 3\)"):
        prepare_run(root, "r1", config("/unused", num_tasks=3), resume=True)
