"""``janitor_flow``: remove the sandboxes that killed rollouts left behind, and mark their flow runs Crashed.

A rollout removes its containers and workspaces on every path it controls; a process that is
killed cannot, and its flow runs stay Running. The janitor acts only on positive evidence that
the owner is gone, never because its own Prefect server does not know a flow run (the sandbox
may belong to an eval on another server, or on the CLI's temporary one):

- the owner process is dead: the sandbox names it (host, boot id, pid, start time; see
  ``runtimes.owner``) and this host, on this boot, has no such process;
- its flow run is final (Completed, Failed, Cancelled, Crashed) on the same Prefect API that the
  sandbox names; a sandbox naming another API is left alone unless its owner is dead;
- it is older than ``max_age_minutes``.

It removes labelled Docker containers (when an engine answers) and local-runtime workspaces
(``rollout-*`` directories under the temporary directory), and sets non-final flow runs whose
owner tag names a dead process to Crashed, so the UI stops showing them running.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed

from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.flows.services.ownership import tag_owner
from prefect_rollouts.runtimes.local import WORKSPACE_PREFIX, workspace_owner
from prefect_rollouts.runtimes.owner import Owner

_LIVE_STATES = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED, StateType.PAUSED, StateType.CANCELLING]


@flow(name="janitor", log_prints=False, persist_result=False)
async def janitor_flow(max_age_minutes: float = 180.0, dry_run: bool = False,
                       workspace_dir: str | None = None) -> list[str]:
    """Remove leftover sandboxes and mark the flow runs of dead eval processes Crashed.

    Args:
        max_age_minutes: Remove any sandbox started longer ago than this (minutes).
        dry_run: Only report what would be removed or marked.
        workspace_dir: Where local-runtime workspaces live; default the temporary directory
            (``TMPDIR``), as the local runtime uses.

    Returns:
        What was removed (or would be): container ids (12 hex digits), workspace paths, and
        ``flow-run:<id>`` for each flow run marked Crashed.
    """
    logger = get_run_logger()
    acted: list[str] = []
    async with get_client() as client:
        api = str(client.api_url).rstrip("/")
        for container in await _containers():
            reason = await _container_reason(client, api, container.labels, max_age_minutes)
            if reason is not None:
                acted.append(container.short_id)
                logger.info("%s container %s (%s)", "would remove" if dry_run else "removing", container.short_id,
                            reason)
                if not dry_run:
                    await asyncio.to_thread(container.remove, force=True, v=True)   # and its tmpfs workspace volume
        for workspace in _workspaces(Path(workspace_dir or tempfile.gettempdir())):
            reason = _workspace_reason(workspace, max_age_minutes)
            if reason is not None:
                acted.append(str(workspace))
                logger.info("%s workspace %s (%s)", "would remove" if dry_run else "removing", workspace, reason)
                if not dry_run:
                    await asyncio.to_thread(shutil.rmtree, workspace, True)
        for flow_run, owner in await _orphaned_flow_runs(client):
            acted.append(f"flow-run:{flow_run.id}")
            message = f"its process {owner} is gone (found by the janitor)"
            logger.info("%s flow run %s (%s) Crashed: %s", "would mark" if dry_run else "marking", flow_run.name,
                        flow_run.id, message)
            if not dry_run:
                await client.set_flow_run_state(flow_run.id, Crashed(message=message), force=True)
    return acted


async def _containers() -> list[Any]:
    """The containers this project labelled, or none when no Docker engine answers here."""
    try:
        from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client

        return await asyncio.to_thread(docker_client().containers.list, all=True, filters={"label": LABEL})
    except (ImportError, RuntimeUnavailableError):
        return []


async def _container_reason(client: Any, api: str, labels: dict[str, str], max_age_minutes: float) -> str | None:
    """Why the container labelled ``labels`` may go, or None to keep it."""
    from prefect_rollouts.runtimes.docker.engine import LABEL

    try:
        started: float | None = float(labels[f"{LABEL}.started_at"])
    except (KeyError, ValueError):
        started = None   # a missing or malformed label is no evidence of age
    age_min = (time.time() - started) / 60 if started is not None else 0.0
    if age_min > max_age_minutes:
        return f"started {age_min:.0f} min ago"
    owner = Owner.parse(labels.get(f"{LABEL}.owner"))
    if owner is not None and owner.is_alive() is False:
        return f"its process {owner} is gone"
    flow_run_id = labels.get(f"{LABEL}.flow_run_id")
    if not flow_run_id or labels.get(f"{LABEL}.api_url") != api:
        return None   # another server's sandbox: its flow runs are not ours to judge
    try:
        flow_run = await client.read_flow_run(uuid.UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return None   # not evidence: the run may live on a server this one does not know
    if flow_run.state is not None and flow_run.state.is_final():
        return f"flow run {flow_run_id} is {flow_run.state.name}"
    return None


def _workspaces(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.glob(f"{WORKSPACE_PREFIX}*") if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _workspace_reason(workspace: Path, max_age_minutes: float) -> str | None:
    """Why a local-runtime workspace may go, or None to keep it."""
    owner = workspace_owner(workspace)
    if owner is not None and owner.is_alive() is False:
        return f"its process {owner} is gone"
    try:
        age_min = (time.time() - workspace.stat().st_mtime) / 60   # Linux keeps no creation time here
    except OSError:
        return None
    if age_min > max_age_minutes:
        return f"unchanged for {age_min:.0f} min"
    return None


async def _orphaned_flow_runs(client: Any) -> list[tuple[Any, Owner]]:
    """Non-final flow runs whose owner tag names a process that is gone from this host."""
    found, offset, page_size = [], 0, 200
    live = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=_LIVE_STATES)))
    while True:
        page = await client.read_flow_runs(flow_run_filter=live, limit=page_size, offset=offset)
        for flow_run in page:
            owner = tag_owner(flow_run.tags)
            if owner is not None and owner.is_alive() is False:
                found.append((flow_run, owner))
        if len(page) < page_size:
            return found
        offset += page_size
