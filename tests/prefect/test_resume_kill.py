"""kill -9 of a real eval process at any moment, then --resume: every rollout exactly once."""

from __future__ import annotations

import os
import signal
import time

import pyarrow.parquet as pq
import pytest

from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.cli import eval_env, finish, start_eval
from tests.support.datasets import durable_rows
from tests.support.waiting import wait_until

pytestmark = pytest.mark.prefect

ROLLOUTS = 24


def test_kill_9_then_resume_gives_every_rollout_exactly_once(tmp_path, openai_server):
    openai_server.default = delayed(0.05, reply("0"))
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, rollouts_per_task=3, max_concurrent=3,
                                rollout_granularity="task").replace("count = 10", "count = 8"))
    env = eval_env(PREFECT_LOGGING_LEVEL="WARNING")
    for kill_at in (("seconds", 3.0), ("rows", 6), ("rows", 15)):   # during start-up, then mid-run twice
        process = start_eval(config, "--resume", "killed-run", env=env)
        started = time.monotonic()

        def at_kill_point(process=process, started=started, kill_at=kill_at) -> bool:
            if process.poll() is not None:
                return True
            if kill_at[0] == "seconds":
                return time.monotonic() - started >= kill_at[1]
            return durable_rows(tmp_path / "traces") > kill_at[1]
        wait_until(at_kill_point, timeout_s=120, interval_s=0.05, what=f"the eval to reach its kill point {kill_at}")
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finished = start_eval(config, "--resume", "killed-run", env=env)
    output = finish(finished, 300)
    assert finished.returncode == 0, output
    rows = read_rollouts(tmp_path / "traces", run_id="killed-run")
    assert len(rows) == ROLLOUTS
    files = list((tmp_path / "traces").rglob("part-*.parquet"))
    tables = {p: pq.read_table(p) for p in files}                        # every visible file reads whole
    assert sum(t.num_rows for p, t in tables.items() if "/rollouts/" in p.as_posix()) == ROLLOUTS   # no duplicates
    assert "killed-run" in output
