"""``prefect`` CLI commands and ``prefect worker`` processes against a test's server (system tier)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import descendants, kill

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))


def prefect_env(api_url: str) -> dict[str, str]:
    """Environment of a ``prefect`` CLI or worker process on this server: this checkout's package
    (not another one's editable install) and the tests' tasksets importable, the worker polling
    every second (its default is 10 s)."""
    return {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "INFO",   # Worker.ran reads the INFO lines
            "PREFECT_WORKER_PREFETCH_SECONDS": "1"}


def run_prefect(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``prefect ARGS`` in this checkout, its output captured."""
    return subprocess.run([sys.executable, "-m", "prefect", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def prefect(*args: str, env: dict[str, str], timeout: float = 300) -> str:
    """``prefect ARGS``, which must succeed (e.g. ``worker start --pool local --run-once``); its stdout."""
    result = run_prefect(*args, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


class Worker:
    """A ``prefect worker start --pool POOL`` process (its own process group), its output in ``log``.
    ``env`` replaces ``prefect_env(api_url)`` as a whole (a test of what a worker is given)."""

    def __init__(self, api_url: str, pool: str, name: str, limit: int | None, log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        self.process = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pool, "--name", name,
             *(["--limit", str(limit)] if limit is not None else [])],
            env=env if env is not None else prefect_env(api_url), cwd=REPO, stdout=log.open("ab"),
            stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """``kill -9`` the worker and every process it started (a lost machine): the worker first, so that
        it cannot report its flow runs' processes dying (killed after them, it set a shard Crashed with
        "Process exited with status code: -9" before the test's own crash path ran, on a clean-clone run)."""
        started = descendants(self.process.pid)
        self.process.kill()
        kill(started)
        self.process.wait(timeout=10)

    def ran(self, flow_run_ids: set[str]) -> set[str]:
        """Which of ``flow_run_ids`` this worker's log says it submitted."""
        text = self.log.read_text(errors="replace")
        return {flow_run_id for flow_run_id in flow_run_ids if flow_run_id in text}

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill()


def worker_names(api_url: str, pool: str, status: str | None = "ONLINE", headers: dict[str, str] | None = None,
                 ) -> list[str]:
    """The names of the workers of ``pool`` that the server sees (polling, for ``status="ONLINE"``);
    a worker takes seconds to start: a test that submits before both poll may see one take every shard."""
    import httpx

    response = httpx.post(f"{api_url}/work_pools/{pool}/workers/filter", json={}, headers=headers, timeout=30)
    response.raise_for_status()
    return [worker["name"] for worker in response.json() if status is None or worker.get("status") == status]
