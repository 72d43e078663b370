"""``janitor_flow``: remove sandbox containers that rollouts left behind.

A rollout removes its containers on every path it controls; a process that is killed cannot.
The janitor removes containers labelled by this project whose rollout flow run has finished
(or no longer exists), and any older than ``max_age_minutes``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from prefect_rollouts.runtimes.docker import LABEL, docker_client


@flow(name="janitor", log_prints=False, persist_result=False)
async def janitor_flow(max_age_minutes: float = 180.0, dry_run: bool = False) -> list[str]:
    """Remove leftover sandbox containers.

    Args:
        max_age_minutes: Remove any labelled container started longer ago than this.
        dry_run: Only report what would be removed.

    Returns:
        Ids (12 hex digits) of the containers removed (or that would be, with ``dry_run``).
    """
    logger = get_run_logger()
    containers = await asyncio.to_thread(docker_client().containers.list, all=True, filters={"label": LABEL})
    removed = []
    async with get_client() as client:
        for container in containers:
            reason = await _reason_to_remove(client, container.labels, max_age_minutes)
            if reason is None:
                continue
            removed.append(container.short_id)
            logger.info("%s container %s (%s)", "would remove" if dry_run else "removing", container.short_id, reason)
            if not dry_run:
                await asyncio.to_thread(container.remove, force=True)
    return removed


async def _reason_to_remove(client: Any, labels: dict[str, str], max_age_minutes: float) -> str | None:
    started = float(labels.get(f"{LABEL}.started_at", "0") or 0)
    age_min = (time.time() - started) / 60
    if age_min > max_age_minutes:
        return f"started {age_min:.0f} min ago"
    flow_run_id = labels.get(f"{LABEL}.flow_run_id")
    if not flow_run_id:
        return None
    try:
        flow_run = await client.read_flow_run(uuid.UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return f"flow run {flow_run_id} does not exist"
    if flow_run.state is not None and flow_run.state.is_final():
        return f"flow run {flow_run_id} is {flow_run.state.name}"
    return None
