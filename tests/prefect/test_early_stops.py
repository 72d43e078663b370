"""An eval that stops early says why in one line, how many rollouts are durable and how to resume, and
runs no rollout twice: a full traces disk (issue 19, item 5c) and SIGTERM (item 6)."""

from __future__ import annotations

import errno
import re
from collections import Counter

from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.traces import read_rollouts, store
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply


def disk_full_after(rollout_files: int, monkeypatch) -> None:
    """The file system takes ``rollout_files`` rollouts files, then every write fails with ENOSPC."""
    real, landed = store._write_local, []

    def write(target, data):
        if len(landed) >= rollout_files:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(target, data)
        if "/rollouts/" in target.as_posix():
            landed.append(target)
    monkeypatch.setattr(store, "_write_local", write)


def test_a_full_traces_disk_stops_the_eval_at_once_with_the_true_count_and_runs_nothing_twice(
        tmp_path, openai_server, monkeypatch):
    openai_server.default = delayed(0.05, reply("0"))
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="batch",
                                batch_size=10, max_concurrent=4, taskset={"id": "tests.prefect.tasksets:numbered",
                                                                          "count": 30}))
    disk_full_after(2, monkeypatch)

    result = CliRunner().invoke(app, ["eval", str(config), "--run-id", "disk-full"])
    monkeypatch.undo()
    output = " ".join(result.output.split())

    durable = len(read_rollouts(tmp_path / "traces", run_id="disk-full"))
    assert result.exit_code == 1, output
    assert durable == 8                                   # two flushes of 4 (the writer's batch) landed
    prompts = Counter(request.messages[-1]["content"] for request in openai_server.requests)
    assert max(prompts.values()) == 1, prompts            # no rollout ran twice (the batch was not retried)
    assert len(prompts) < 30                              # and the eval stopped instead of running them all
    stopped = re.search(r"eval stopped: (.*?) \d+ of 30 rollouts durable", output)
    assert stopped and "No space left on device" in stopped.group(1), output
    assert f"{30 - durable} of 30 rollouts of run disk-full have no row" in stopped.group(1)
    assert f"{durable} of 30 rollouts durable; resume with: prefect-rollouts eval {config} --resume disk-full" \
        in output
