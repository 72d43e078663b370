"""The CLI's temporary Prefect server (no PREFECT_API_URL) ends with the eval, also after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.cli import eval_env, start_eval
from tests.support.datasets import durable_rows
from tests.support.processes import alive, descendants, kill
from tests.support.waiting import wait_until

pytestmark = pytest.mark.prefect


def eval_config(tmp_path: Path, base_url: str, count: int) -> Path:
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", base_url, taskset={"id": "arithmetic", "count": count},
                                retries=True, max_concurrent=2))
    return config


def start_cli(tmp_path: Path, config: Path) -> subprocess.Popen[str]:
    env = eval_env(None, PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_LOGGING_LEVEL="WARNING")
    return start_eval(config, env=env)


def test_kill_9_of_the_eval_ends_its_temporary_prefect_server(tmp_path, openai_server):
    openai_server.default = delayed(0.5, reply("0"))
    process = start_cli(tmp_path, eval_config(tmp_path, openai_server.base_url, count=400))
    server: set[psutil.Process] = set()
    try:
        def two_rows() -> bool:   # the server is up and rollouts run
            assert process.poll() is None, process.stdout.read()
            return durable_rows(tmp_path / "traces") >= 2
        wait_until(two_rows, timeout_s=180, what="two durable rows")
        server = set(descendants(process.pid))
        assert server, "the eval has no child process: where is its Prefect server?"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        assert_gone_within(server, 30)
    finally:
        kill_all(process, server)


def test_a_finished_eval_stops_its_temporary_prefect_server(tmp_path, openai_server):
    openai_server.default = reply("0")
    process = start_cli(tmp_path, eval_config(tmp_path, openai_server.base_url, count=3))
    server: set[psutil.Process] = set()
    try:
        def ended() -> bool:   # every process the eval starts, until it exits
            server.update(descendants(process.pid))
            return process.poll() is not None
        wait_until(ended, timeout_s=180, interval_s=0.1, what="the eval to finish")
        output = process.stdout.read()
        assert process.returncode == 0, output
        assert "starting a temporary Prefect server" in output and durable_rows(tmp_path / "traces") == 3
        assert server, "the eval started no process: where was its Prefect server?"
        assert_gone_within(server, 5)
    finally:
        kill_all(process, server)


def assert_gone_within(server: set[psutil.Process], seconds: float) -> None:
    wait_until(lambda: not alive(server), timeout_s=seconds, interval_s=0.1, what=lambda: (
        f"the temporary server's processes to exit with the eval (alive: {alive(server)})"))


def kill_all(process: subprocess.Popen[str], server: set[psutil.Process]) -> None:
    kill(alive(server))
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def test_the_temporary_server_takes_the_port_its_variable_names_and_refuses_a_taken_one(tmp_path, monkeypatch):
    import pytest

    from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError
    from prefect_rollouts.servers.postgres import healthy
    from prefect_rollouts.servers.temporary import PORT_ENV, TemporaryServer
    from tests.support.ports import free_port

    port = free_port()
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setenv(PORT_ENV, str(port))
    with TemporaryServer(180) as server:
        assert server.api_url == f"http://127.0.0.1:{port}/api" and healthy(server.api_url)
        taken = f"port {port} on 127.0.0.1 is taken. Choose another {PORT_ENV}"
        with pytest.raises(RuntimeUnavailableError, match=taken):
            TemporaryServer(180).start()
    monkeypatch.setenv(PORT_ENV, "http")
    with pytest.raises(ConfigError, match=f"{PORT_ENV} = 'http': not a port number"):
        TemporaryServer().start()


def test_the_servers_output_goes_to_its_log_in_prefect_home_not_to_the_console(tmp_path):
    home = tmp_path / "fresh-home"        # a fresh PREFECT_HOME: the server creates and migrates its database
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_LOGGING_LEVEL="DEBUG", DO_NOT_TRACK="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    code = ("from prefect_rollouts.servers.temporary import TemporaryServer\n"
            "with TemporaryServer(120) as s: print(s.api_url)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("http://127.0.0.1:") and done.stderr == ""
    log = (home / "temporary-server.log").read_text()
    assert log.startswith("--- ") and "temporary server on port" in log
    assert "DEBUG" in log          # the server's own lines (here its debug logging) are in the log
