"""The CLI's temporary Prefect server (no PREFECT_API_URL) ends with the eval, also after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.waiting import wait_until

pytestmark = pytest.mark.prefect


def eval_config(tmp_path: Path, base_url: str, count: int) -> Path:
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", base_url, taskset={"id": "arithmetic", "count": count},
                                retries=True, max_concurrent=2))
    return config


def start_cli(tmp_path: Path, config: Path) -> subprocess.Popen[bytes]:
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING")
    return subprocess.Popen([sys.executable, "-m", "prefect_rollouts.cli", "eval", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def descendants(pid: int) -> set[tuple[int, str]]:
    """``(pid, start time)`` of every live process below ``pid`` (start time guards against pid reuse)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))):
            children.setdefault(int(stat[3]), []).append(int(entry))
    found, todo = set(), list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if (stat := _stat(child)) and stat[2] != "Z":
            found.add((child, stat[21]))
        todo.extend(children.get(child, []))
    return found


def alive(processes: set[tuple[int, str]]) -> set[tuple[int, str]]:
    return {(pid, start) for pid, start in processes if (stat := _stat(pid)) and stat[21] == start and stat[2] != "Z"}


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, tail = text.rsplit(")", 1)
    return [str(pid), head, *tail.split()]   # fields from the third on, numbered as in proc(5) minus one


def durable_rows(root: Path) -> int:
    return sum(pq.read_metadata(p).num_rows for p in root.rglob("part-*.parquet")) if root.exists() else 0


def test_kill_9_of_the_eval_ends_its_temporary_prefect_server(tmp_path, openai_server):
    openai_server.default = delayed(0.5, reply("0"))
    process = start_cli(tmp_path, eval_config(tmp_path, openai_server.base_url, count=400))
    server: set[tuple[int, str]] = set()
    try:
        def two_rows() -> bool:   # the server is up and rollouts run
            assert process.poll() is None, process.stdout.read().decode()
            return durable_rows(tmp_path / "traces" / "rollouts") >= 2
        wait_until(two_rows, timeout_s=180, what="two durable rows")
        server = descendants(process.pid)
        assert server, "the eval has no child process: where is its Prefect server?"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        assert_gone_within(server, 30)
    finally:
        kill_all(process, server)


def test_a_finished_eval_stops_its_temporary_prefect_server(tmp_path, openai_server):
    openai_server.default = reply("0")
    process = start_cli(tmp_path, eval_config(tmp_path, openai_server.base_url, count=3))
    server: set[tuple[int, str]] = set()
    try:
        def ended() -> bool:   # every process the eval starts, until it exits
            server.update(descendants(process.pid))
            return process.poll() is not None
        wait_until(ended, timeout_s=180, interval_s=0.1, what="the eval to finish")
        output = process.stdout.read().decode()
        assert process.returncode == 0, output
        assert "starting a temporary Prefect server" in output and durable_rows(tmp_path / "traces" / "rollouts") == 3
        assert server, "the eval started no process: where was its Prefect server?"
        assert_gone_within(server, 5)
    finally:
        kill_all(process, server)


def assert_gone_within(server: set[tuple[int, str]], seconds: float) -> None:
    wait_until(lambda: not alive(server), timeout_s=seconds, interval_s=0.1, what=lambda: (
        f"the temporary server's processes to exit with the eval (alive: {sorted(alive(server))})"))


def kill_all(process: subprocess.Popen[bytes], server: set[tuple[int, str]]) -> None:
    for pid, _ in alive(server):
        os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def test_the_temporary_server_takes_the_port_its_variable_names_and_refuses_a_taken_one(tmp_path, monkeypatch):
    import pytest

    from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError
    from prefect_rollouts.pgserver import healthy
    from prefect_rollouts.tempserver import PORT_ENV, TemporaryServer
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
    code = "from prefect_rollouts.tempserver import TemporaryServer\nwith TemporaryServer(120) as s: print(s.api_url)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("http://127.0.0.1:") and done.stderr == ""
    log = (home / "temporary-server.log").read_text()
    assert log.startswith("--- ") and "temporary server on port" in log
    assert "DEBUG" in log          # the server's own lines (here its debug logging) are in the log
