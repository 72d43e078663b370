"""``[env.agent.harness]``: which harness drives the model (``HarnessConfig``), and the harness ids."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from prefect_rollouts.bounds import MAX_DEADLINE_S
from prefect_rollouts.config.base import ConfigModel, EnvTable

HarnessId = Literal["chat", "tools", "program", "bash", "mini-swe-agent", "codex", "claude-code", "oracle", "nop"]
"""The built-in harness ids (``HarnessConfig.id``)."""

MODEL_FREE_HARNESSES = ("oracle", "nop")
"""Harness ids that never call a model (``harnesses/oracle.py``): an agent with one opens no model
client and starts no local model server, whatever ``model`` says."""

PROGRAM_HARNESSES = ("program", "bash", "mini-swe-agent", "codex", "claude-code")
"""Harness ids that run an agent program in the runtime (``harnesses/program.py``): ``program``
runs ``command``; ``bash`` (our reference program), ``mini-swe-agent``, ``codex`` and ``claude-code``
are built in."""

NPM_HARNESSES = ("codex", "claude-code")
"""Built-in program harnesses installed from the npm registry (``harnesses/npm_agents.py``)."""

_VERSION = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?")


class HarnessConfig(ConfigModel):
    """Which harness drives the model. TOML and Python also accept the id alone as a string (``"tools"``).

    ``chat`` and ``tools`` are loops in this process. ``program``, ``bash``, ``mini-swe-agent``, ``codex``
    and ``claude-code`` run an agent program *in the runtime*, whose model calls go through the agent's
    interception endpoint into the trace (docs/agents.md); the keys from ``command`` on apply to them.
    """

    id: HarnessId = "tools"
    """``chat``: one model response per segment. ``tools``: the tool-calling loop (can steer).
    ``program``: ``command`` run in the runtime. ``bash``: the package's own small agent program (a
    ``bash`` tool loop, ``harnesses/programs/bash_agent.py``). ``mini-swe-agent``: mini-swe-agent
    from PyPI, pinned (``harnesses/mini_swe_agent.py``). ``codex`` (Codex CLI) and ``claude-code``
    (Claude Code): the npm packages, pinned (``harnesses/npm_agents.py``, docs/agents.md). ``oracle``:
    the task's reference solution (``Task.solve``; a Harbor task's ``solution/solve.sh``), no model.
    ``nop``: does nothing, no model (a task's tests must fail on the untouched box)."""
    runtime_tools: list[Literal["bash", "read_file", "write_file"]] = ["bash", "read_file", "write_file"]
    """Runtime tools the ``tools`` harness offers besides the task's own tools."""
    tool_timeout_s: float = Field(600.0, gt=0, le=MAX_DEADLINE_S)
    """A tool call that runs longer returns an error to the model (``bash`` is also bounded by
    ``runtime.exec_timeout_s``)."""
    tool_output_cap_chars: int = Field(64 * 1024, ge=256)
    """A tool result longer than this is cut (with a note) before it reaches the model and the trace."""
    command: list[str] | None = None
    """``program``: the argv of the agent program, run in the runtime's workspace (required there;
    the built-in programs bring their own)."""
    files: dict[str, Path] = {}
    """Runtime path -> host path (a file or directory; absolute, or relative to the config file),
    copied into the runtime before ``setup``. On the ``local`` runtime a runtime path is relative to
    the workspace (it has no filesystem of its own)."""
    setup: list[str] = []
    """Shell commands run once in the runtime when the rollout starts, after ``files`` and before
    the network policy applies (so an install may reach a package index); a failure ends the rollout."""
    setup_timeout_s: float = Field(600.0, gt=0, le=MAX_DEADLINE_S)
    """Deadline of each ``setup`` command, in seconds."""
    env: EnvTable = {}
    """Environment variables of the program; ``${VAR}`` templates resolve where the rollout runs.
    Literal values count as secrets (``"***"`` in every JSON dump), as in ``[env.agent.runtime] env``."""
    forward_env: list[str] = []
    """Host environment variables passed to the program by name (their values are scrubbed from
    traces like keys). A name that is unset where the rollout runs is an error of that rollout."""
    resume: bool = True
    """A later ``turn()`` relaunches the program with the conversation carried at the endpoint;
    False: a second turn is refused with an error."""
    timeout_s: float = Field(3600.0, gt=0, le=MAX_DEADLINE_S)
    """Most seconds one launch of the program may run (the agent deadline, when set, also holds); past it
    the program is killed and the run stops as ``program_timeout``, scored by the task (``is_timeout``)."""
    stop_grace_s: float = Field(10.0, ge=0, le=MAX_DEADLINE_S)
    """After the endpoint stopped the rollout (``max_turns``, ``max_turn_tokens``), how long the
    program may take to exit before it is killed, in seconds."""
    output_tail_chars: int = Field(4000, ge=0)
    """Characters of the end of the program's stdout and of its stderr kept on the trace."""
    version: str | None = None
    """``codex`` and ``claude-code``: the npm release to run instead of the pinned one
    (``npm_agents.AGENTS``: ``@openai/codex`` 0.169.0, ``@anthropic-ai/claude-code`` 2.1.328), e.g.
    ``"0.170.0"``. Installed on first use like the pinned one."""
    action_format: Literal["tool_calls", "text"] = "tool_calls"
    """``mini-swe-agent``: how the model gives each command: a ``bash`` tool call (its ``mini.yaml``),
    or ``text``, a fenced ``mswea_bash_command`` block in the reply (its ``mini_textbased.yaml``), for
    models without tool calls."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"id": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _program_keys(self, info: ValidationInfo) -> HarnessConfig:
        if self.id == "program" and not self.command:
            raise ValueError('id = "program" needs command = ["argv", ...]: the agent program to run in the runtime')
        if self.command is not None and self.id != "program":
            raise ValueError(f'command is set but id = "{self.id}": set id = "program" to run your own program')
        if self.action_format != "tool_calls" and self.id != "mini-swe-agent":
            raise ValueError(f'action_format applies to id = "mini-swe-agent" only (id = "{self.id}"): remove it '
                             "(a --set of a key inside the table keeps the others; replace the whole table instead, "
                             f"e.g. --set 'env.agent.harness={{id=\"{self.id}\"}}')")
        if self.version is not None:
            if self.id not in NPM_HARNESSES:
                raise ValueError(f'version applies to id = "codex" or "claude-code" only (id = "{self.id}"): remove it')
            if not _VERSION.fullmatch(self.version):
                raise ValueError(f"version = {self.version!r}: not an npm release number. Write it as "
                                 '"MAJOR.MINOR.PATCH" (e.g. "0.169.0"), or remove the key for the pinned one')
        if self.command is not None and not all(self.command):
            raise ValueError(f"command = {self.command!r}: every argv entry must be a non-empty string")
        if self.id not in PROGRAM_HARNESSES:
            set_keys = [key for key in ("command", "files", "setup", "env", "forward_env")
                        if getattr(self, key)] + ([] if self.resume else ["resume"])
            if set_keys:
                raise ValueError(f"{', '.join(set_keys)}: only program harnesses (id = \"program\", \"bash\", "
                                 '"mini-swe-agent", "codex" or "claude-code") take these keys; '
                                 f'id = "{self.id}" runs in this process')
        base = (info.context or {}).get("config_dir")
        for target, source in list(self.files.items()):
            if not target:
                raise ValueError('files: a runtime path is empty; write { "/tmp/my-agent" = "agents/my-agent" }')
            if not source.is_absolute():
                source = Path(base) / source if base is not None else source.resolve()
                self.files[target] = source
            if not source.exists():
                raise ValueError(f'files "{target}" = "{source}": no such file or directory on this machine. '
                                 "Give an absolute host path, or one relative to the config file")
        for name in self.forward_env:
            if not name or not name.replace("_", "A").isalnum() or name[0].isdigit():
                raise ValueError(f"forward_env: {name!r} is not an environment variable name")
        return self

    @property
    def is_program(self) -> bool:
        """Whether this harness runs an agent program in the runtime."""
        return self.id in PROGRAM_HARNESSES

    @property
    def uses_model(self) -> bool:
        """False for ``oracle`` and ``nop``, which never call a model."""
        return self.id not in MODEL_FREE_HARNESSES


