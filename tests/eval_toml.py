"""The eval config the tests run: TOML text for the scripted OpenAI server on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def eval_toml(traces: Path | str, base_url: str, *, taskset: dict[str, Any] | None = None,
              retries: bool = False, **top: Any) -> str:
    """An eval config whose agent is the ``chat`` harness on the scripted server at ``base_url``.

    Args:
        traces: ``[traces] path``.
        base_url: The scripted server's base URL.
        taskset: ``[env.taskset]`` keys; default the ``numbered`` taskset of 10 tasks.
        retries: Keep the client's and the segment's default retries; by default both are 0,
            so a scripted failure is an error at once.
        top: Top-level keys (``num_tasks``, ``max_concurrent``...). ``rollout_granularity``
            defaults to ``task`` (the cheapest with a task run per rollout): most tests are not
            about granularity.
    """
    top.setdefault("rollout_granularity", "task")
    taskset = taskset or {"id": "tests.prefect.tasksets:numbered", "count": 10}
    text = "\n".join(f"{key} = {_toml(value)}" for key, value in top.items())
    text += f'\n[traces]\npath = "{traces}"\n[env.taskset]\n'
    text += "".join(f"{key} = {_toml(value)}\n" for key, value in taskset.items())
    text += f'[env.agent]\nmodel = "scripted"\nharness = "chat"\n[env.agent.client]\nbase_url = "{base_url}"\n'
    text += 'api_key_env = ""\n'
    if not retries:
        text += "[env.agent.client.retries]\nmax_retries = 0\n[env.agent.retries]\nsegment = 0\n"
    return text


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (str, Path)):
        return f'"{value}"'
    return str(value)
