"""What a rollout's sandboxes and flow runs say about their owner, for the janitor flow.

Sandboxes carry the owning process (``runtimes.owner``, added by the runtime itself) and, from
this layer, the Prefect API they report to and their flow runs. Flow runs carry the owning
process as a tag, ``prefect-rollouts.owner:<host>_<boot>_<pid>_<start>``, which every flow run
created inside ``owner_tags()`` inherits at no API call; task runs are kept untagged
(``untagged_tasks``), since Prefect asks the API for a concurrency slot per tagged task run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prefect import tags
from prefect.context import FlowRunContext, TagsContext

from prefect_rollouts.runtimes.owner import Owner, current_owner

OWNER_TAG = "prefect-rollouts.owner:"
"""Prefix of the flow-run tag naming the owning process."""


def api_url() -> str:
    """The Prefect API this process reports to (no trailing slash), or ``""`` outside a flow run."""
    context = FlowRunContext.get()
    if context is None or context.client is None:
        return ""
    return str(context.client.api_url).rstrip("/")


def sandbox_labels() -> dict[str, str]:
    """Labels for the sandboxes of rollouts started in the current flow run: the API and the flow run."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return {}
    return {"api_url": api_url(), "flow_run_id": str(context.flow_run.id)}


def owner_tag() -> str:
    """The tag naming this process as the owner of a flow run."""
    return f"{OWNER_TAG}{current_owner()}"


def tag_owner(tag_list: list[str] | None) -> Owner | None:
    """The owner named by a flow run's tags, or None."""
    for tag in tag_list or ():
        if tag.startswith(OWNER_TAG):
            return Owner.parse(tag[len(OWNER_TAG):])
    return None


@contextlib.contextmanager
def owner_tags() -> Iterator[None]:
    """Flow runs created inside carry this process's owner tag. Enter ``untagged_tasks()`` in
    the flow's body so that its task runs do not: Prefect asks the API for a concurrency slot
    per tag before every tagged task run (a call per stage, and one that fails while the API
    is away)."""
    with tags(owner_tag()):
        yield


@contextlib.contextmanager
def untagged_tasks() -> Iterator[None]:
    """Inside a flow body: task runs created here do not inherit the owner tag (see ``owner_tags``)."""
    current = TagsContext.get().current_tags
    with TagsContext(current_tags={tag for tag in current if not tag.startswith(OWNER_TAG)}):
        yield


async def tag_flow_run(*extra: str, name: str | None = None) -> None:
    """Add the owner tag, and the ``extra`` tags, to the current flow run, and rename it to ``name``
    if given (one API call, none when it has them already). Flow runs it then creates get the
    owner tag from ``owner_tags``; task runs never do."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    current = list(context.flow_run.tags or [])
    missing = [tag for tag in (owner_tag(), *extra) if tag not in current]
    if missing or (name and name != context.flow_run.name):
        await context.client.update_flow_run(context.flow_run.id, tags=[*current, *missing],  # type: ignore[misc]
                                             name=name)   # None leaves the name as it is
        context.flow_run.tags = [*current, *missing]
