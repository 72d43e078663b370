"""``agent_exits.box_broken`` against the real engine: after the agent deletes the shell every command of
the runtime needs (or the workdir), the runtime's next command cannot start, and that answer is what
``box_broken`` recognizes (the engine's text is not ours, so it is checked here, not only as a string)."""

from __future__ import annotations

import uuid

import pytest

import prefect_rollouts as vf
from prefect_rollouts.agent_exits import box_broken
from prefect_rollouts.runtimes import make_runtime

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(120)]


@pytest.mark.parametrize("breaking", ["rm -f /usr/bin/bash /bin/bash", "chmod -x /usr/bin/bash",
                                      "cd / && rm -rf /work"])
async def test_a_box_whose_shell_or_workdir_the_agent_removed_is_broken(breaking):
    # storage_mb = 0: a writable root on every engine (under a quota it may be read-only: runtimes/docker_storage.py)
    runtime = make_runtime(vf.RuntimeConfig(type="docker", exec_timeout_s=20, workdir="/work", storage_mb=0),
                           labels={"run_id": f"box-broken-{uuid.uuid4().hex[:8]}"})
    await runtime.start()
    try:
        before = await runtime.exec("true")
        assert before.exit_code == 0 and box_broken(before, "true") is None
        broke = await runtime.exec(breaking)
        assert broke.exit_code == 0, broke
        after = await runtime.exec("echo 1 > /logs/verifier/reward.txt")
        failure = box_broken(after, "tests/test.sh")
        assert failure is not None, after
        assert (failure.stop_condition, failure.scored) == ("box_broken", False)
    finally:
        await runtime.stop()
