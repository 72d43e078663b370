"""Real parts for scale-out tests: a PostgreSQL-backed Prefect server, a process work pool and
``prefect worker`` processes, started here; the scripted OpenAI server on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_api import pg_api_server

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))


@pytest.fixture(scope="module")
def pg_api() -> Iterator[str]:
    """A Prefect server on PostgreSQL (``pgserver``), for this module; yields its API URL and
    points this process's Prefect settings at it."""
    with pg_api_server() as api_url:
        yield api_url


def prefect_env(api_url: str) -> dict[str, str]:
    """Environment of a ``prefect`` CLI or worker process on this server: this checkout's package
    (not another one's editable install) and the tests' tasksets importable, the worker polling
    every second (its default is 10 s)."""
    return {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "INFO",   # Worker.ran reads the INFO lines
            "PREFECT_WORKER_PREFETCH_SECONDS": "1"}


class Worker:
    """A ``prefect worker start --pool POOL`` process (its own process group)."""

    def __init__(self, api_url: str, pool: str, name: str, limit: int, log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        self.process = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pool, "--name", name, "--limit", str(limit)],
            env={**prefect_env(api_url), **(env or {})}, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True)

    def kill(self) -> None:
        """``kill -9`` the worker and every process it started (a lost machine)."""
        for pid in [*descendants(self.process.pid), self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)

    def ran(self, flow_run_ids: set[str]) -> set[str]:
        """Which of ``flow_run_ids`` this worker's log says it submitted."""
        text = self.log.read_text(errors="replace")
        return {flow_run_id for flow_run_id in flow_run_ids if flow_run_id in text}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill()


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@pytest.fixture(scope="module")
def work_pool(pg_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Worker]]]:
    """A process work pool ``rollouts`` with two workers (at most 2 flow runs each)."""
    pool = "rollouts"
    subprocess.run([PREFECT, "work-pool", "create", pool, "--type", "process"], env=prefect_env(pg_api),
                   check=True, capture_output=True, timeout=120)
    logs = tmp_path_factory.mktemp("workers")
    workers = [Worker(pg_api, pool, f"worker-{i}", 2, logs / f"worker-{i}.log") for i in range(2)]
    assert wait_until(lambda: online_workers(pg_api, pool) >= 2, timeout_s=180), "the workers did not start polling"
    try:
        yield pool, workers
    finally:
        for worker in workers:
            worker.stop()


def raw_keys(traces: Path, run_id: str) -> list[tuple[str, int]]:
    """``(task id, rollout index)`` of every row file of ``run_id`` as written: the readers drop
    duplicate rows, so a test of "no duplicates" must look beneath them."""
    import pyarrow.dataset as ds

    table = ds.dataset(Path(traces) / "rollouts", format="parquet", partitioning="hive").to_table(
        columns=["task_id", "rollout_index"], filter=ds.field("run_id") == run_id)
    return list(zip(table["task_id"].to_pylist(), table["rollout_index"].to_pylist(), strict=True))


def online_workers(api_url: str, pool: str) -> int:
    """How many workers of ``pool`` the server sees polling (a worker takes seconds to start: a test
    that submits before both poll may see one worker take every shard)."""
    import httpx

    response = httpx.post(f"{api_url}/work_pools/{pool}/workers/filter", json={}, timeout=30)
    return sum(worker.get("status") == "ONLINE" for worker in response.json())


def wait_until(predicate, timeout_s: float, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)
