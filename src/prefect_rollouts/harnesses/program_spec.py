"""What a program harness runs (``ProgramSpec``), made from its ``[env.agent.harness]`` config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect_rollouts.config.env import resolve_env
from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.harnesses import mini_swe_agent, npm_agents


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    """What a program harness runs.

    Attributes:
        command: The argv, run in the workspace; ``{scripts}`` in an entry is replaced by the
            directory of the package's in-runtime scripts (``bash_agent.py``), ``{python}`` by the
            runtime's Python (``python3``; on the local runtime this process's interpreter),
            ``{site}`` by mini-swe-agent's install or the npm agent's binary as the runtime sees it.
        files: Runtime path -> host path, uploaded before ``setup``.
        setup: Shell commands run once at setup, before the network policy applies.
        env: Environment of the program (resolved, literal values).
        needs_model: False for programs that may finish without a model call (Harbor's oracle, nop).
        report: ``(stdout tail, stderr tail) -> dict`` of what the program said about its run,
            merged into its ``trace.info["program"]`` entry (mini-swe-agent's exit status and submission).
    """

    command: list[str]
    files: dict[str, Path] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    needs_model: bool = True
    report: Callable[[str, str], dict[str, Any]] | None = None


def program_spec(config: HarnessConfig) -> ProgramSpec:
    """The ``ProgramSpec`` of a program harness config (``program``, ``bash``, ``mini-swe-agent``,
    ``codex``, ``claude-code``)."""
    env = resolve_env(dict(config.env), table="[env.agent.harness] env", place="where the rollout runs") \
        if config.env else {}
    if config.id == "bash":
        base = ProgramSpec(["{python}", "-I", "{scripts}/bash_agent.py"])
    elif config.id == "mini-swe-agent":
        base = ProgramSpec(["{python}", "-I", "{scripts}/mini_swe_agent.py", "{site}", config.action_format],
                           report=mini_swe_agent.report)
    elif config.id in npm_agents.AGENTS:
        base = ProgramSpec(["{python}", "-I", "{scripts}/npm_agent.py", config.id, "{site}"])
    else:
        assert config.command is not None   # the config validator requires it
        base = ProgramSpec(list(config.command))
    return ProgramSpec(base.command, {**base.files, **config.files}, [*base.setup, *config.setup],
                       {**base.env, **env}, base.needs_model, base.report)
