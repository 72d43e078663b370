"""The shared test plumbing in tests/support/: durable rows counted from the rollouts table only,
processes as psutil sees them (zombies are not running), an eval's environment, and ``finish``,
whose bound ends the process and what it started."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from prefect_rollouts.traces import TraceWriter
from tests.support.cli import eval_env, finish
from tests.support.datasets import durable_rows
from tests.support.docker import docker_config
from tests.support.processes import alive, descendants, is_running, kill
from tests.support.waiting import wait_until
from tests.traces.test_dataset import add, make_trace

pytestmark = pytest.mark.unit


def test_durable_rows_counts_the_rollouts_table_only_and_0_before_the_first_file(tmp_path):
    assert durable_rows(tmp_path / "traces") == 0
    writer = TraceWriter(tmp_path / "traces", "r1")
    for name in "abc":
        add(writer, make_trace(name, 1.0, calls=2))   # and 6 rows of model_calls, not counted
    writer.flush()
    assert durable_rows(tmp_path / "traces") == 3
    add(writer, make_trace("d", 1.0))
    writer.flush()
    assert durable_rows(tmp_path / "traces") == 4


def test_descendants_leave_out_a_zombie_and_kill_ends_the_live_ones():
    # the first child exits and stays a zombie: the exec'd sleep never reaps it
    process = subprocess.Popen(["sh", "-c", "sleep 0 & sleep 30 & exec sleep 30"])
    try:
        def one_live_one_zombie() -> bool:
            return len(psutil.Process(process.pid).children()) == 2 and len(descendants(process.pid)) == 1
        assert wait_until(one_live_one_zombie, timeout_s=5, interval_s=0.02)
        [live] = descendants(process.pid)
        [zombie] = [child for child in psutil.Process(process.pid).children() if child != live]
        assert live.cmdline() == ["sleep", "30"] and not is_running(zombie.pid) and is_running(live.pid)
        kill([live])
        assert wait_until(lambda: not alive([live]), timeout_s=5, interval_s=0.02)
        assert descendants(process.pid) == []
    finally:
        process.kill()
        process.wait()
    assert not is_running(process.pid) and descendants(process.pid) == []


def test_finish_returns_the_output_and_past_its_bound_kills_the_process_and_what_it_started():
    done = subprocess.Popen(["echo", "hi"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert finish(done, 10) == "hi\n" and done.returncode == 0
    stuck = subprocess.Popen(["sh", "-c", "sleep 60 & echo started; sleep 60"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    assert wait_until(lambda: len(descendants(stuck.pid)) == 2, timeout_s=5, interval_s=0.02)
    started = descendants(stuck.pid)
    with pytest.raises(AssertionError, match=r"(?s)ran past 0.5 s and was killed; its output ends:\nstarted\n"):
        finish(stuck, 0.5)
    assert stuck.returncode == -9
    assert wait_until(lambda: not alive(started), timeout_s=5, interval_s=0.02)


def test_eval_env_sets_or_removes_the_api_url_and_sets_the_variables_last(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    assert "PREFECT_API_URL" not in eval_env(None)   # the CLI starts its temporary server
    env = eval_env("http://127.0.0.1:2/api", DO_NOT_TRACK="0", PREFECT_HOME="/h")
    assert (env["PREFECT_API_URL"], env["DO_NOT_TRACK"], env["PREFECT_HOME"]) == ("http://127.0.0.1:2/api", "0", "/h")
    assert env["PYTHONPATH"].split(":")[0].endswith("/src")   # this checkout's package


def test_docker_config_takes_any_field_its_default_timeout_included():
    assert (docker_config().type, docker_config().exec_timeout_s) == ("docker", 20)
    config = docker_config(exec_timeout_s=30, image="x:1")
    assert (config.exec_timeout_s, config.image) == (30, "x:1")
