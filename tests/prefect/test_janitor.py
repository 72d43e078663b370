"""janitor_flow removes labelled containers of finished rollouts and old ones, and nothing else."""

from __future__ import annotations

import time
import uuid

import pytest
from prefect import flow

import prefect_rollouts as vf
from prefect_rollouts.flows.janitor import janitor_flow
from prefect_rollouts.runtimes.docker import LABEL

pytestmark = pytest.mark.usefixtures("docker_engine")


@flow
async def finished_flow() -> str:
    from prefect.runtime import flow_run
    return str(flow_run.get_id())


async def test_the_janitor_removes_finished_and_old_sandboxes_only(docker_engine):
    image = vf.RuntimeConfig().image
    finished_id = await finished_flow()
    now = int(time.time())

    def sandbox(**labels):
        return docker_engine.containers.run(image, ["sleep", "infinity"], detach=True, labels={
            LABEL: "1", f"{LABEL}.started_at": str(now), **{f"{LABEL}.{k}": v for k, v in labels.items()}})

    of_finished = sandbox(flow_run_id=finished_id)
    of_unknown = sandbox(flow_run_id=str(uuid.uuid4()))
    old = sandbox(started_at=str(now - 5 * 3600))
    fresh = sandbox(rollout_id="still-running")
    unrelated = docker_engine.containers.run(image, ["sleep", "infinity"], detach=True)
    try:
        assert set(await janitor_flow(max_age_minutes=180, dry_run=True)) >= {of_finished.short_id, old.short_id}
        assert docker_engine.containers.get(old.id)                       # a dry run removes nothing
        removed = set(await janitor_flow(max_age_minutes=180))
        assert {of_finished.short_id, of_unknown.short_id, old.short_id} <= removed
        assert fresh.short_id not in removed and unrelated.short_id not in removed
        remaining = {c.id for c in docker_engine.containers.list(all=True)}
        assert fresh.id in remaining and unrelated.id in remaining and old.id not in remaining
    finally:
        for container in (of_finished, of_unknown, old, fresh, unrelated):
            try:
                container.remove(force=True)
            except Exception:
                pass
