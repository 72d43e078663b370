"""The ``tools`` harness: the standard tool-calling loop, with steering.

Per segment: model -> execute its tool calls -> model ... until a reply without tool calls
(and no steer waiting) or a stop. Before each model call (the safe point) pending steer
messages are appended as user messages. A tool that raises, an unknown tool, or arguments
that are not valid JSON become a tool message with the error; the loop goes on. A tool's output
is scrubbed of registered secrets (``errors.scrub``), then cut to ``tool_output_cap_chars``. A
``bash`` command the runtime's limits killed says which (``runtime_tools``), and is listed in
``trace.info["limits_hit"]``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.errors import AgentFailure, scrub
from prefect_rollouts.harnesses.base import SegmentContext, request_template, sample
from prefect_rollouts.harnesses.schema import ToolSpec, tool_spec
from prefect_rollouts.nesting import loads
from prefect_rollouts.threads import note_in, run_sync
from prefect_rollouts.trace import ToolCall

if TYPE_CHECKING:
    from prefect_rollouts.runtimes import Runtime


class ToolsHarness:
    """Tool-calling loop over the task's tools plus ``HarnessConfig.runtime_tools``."""

    id = "tools"
    can_steer = True
    binds: dict[str, str] = {}

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.tools: dict[str, ToolSpec] = {}
        self.template: dict[str, Any] = {}

    async def open(self, ctx: SegmentContext) -> None:
        """Build the tool table and the request template (tools, ``tool_choice``)."""
        specs = [fn if isinstance(fn, ToolSpec) else tool_spec(fn) for fn in ctx.task.tools()]
        specs += [tool_spec(fn) for fn in runtime_tools(
            ctx.runtime, self.config.runtime_tools,
            lambda entry: ctx.trace.info.setdefault("limits_hit", []).append(entry))]
        self.tools = {}
        for spec in specs:
            if spec.name in self.tools:
                raise ValueError(f"tool name {spec.name!r} is offered twice; rename the task's tool "
                                 "or drop it from [env.agent.harness] runtime_tools")
            self.tools[spec.name] = spec
        self.template = request_template(ctx.config)
        if self.tools:
            self.template["tools"] = [spec.schema for spec in self.tools.values()]
            tool_choice = ctx.task.data.tool_choice or ctx.config.sampling.tool_choice
            if tool_choice is not None:
                self.template["tool_choice"] = tool_choice

    async def run_segment(self, ctx: SegmentContext) -> None:
        """Loop model and tool calls until a reply without tool calls, or a stop."""
        while True:
            deliver_steers(ctx)
            message = await sample(ctx, self.template)
            if message is None or ctx.stopped:
                return
            calls = message.get("tool_calls")
            if not calls:
                if ctx.steer_inbox:
                    continue
                return
            for call in calls:
                await self._execute(ctx, call)
            if all(self._is_answer(call) for call in calls):
                return  # the calls are the answer: nothing runs them, the segment is over

    async def _execute(self, ctx: SegmentContext, call: dict[str, Any]) -> None:
        function = call.get("function") or {}
        name, raw = str(function.get("name", "")), function.get("arguments") or "{}"
        raw = raw if isinstance(raw, str) else json.dumps(raw)
        if not call.get("id"):  # the assistant message and its tool result must agree on the id
            call["id"] = f"call_{ctx.segment_index}_{len(ctx.trace.tool_calls)}"
        call_id = str(call["id"])
        started, ended = time.perf_counter(), None
        try:
            async with asyncio.timeout(self.config.tool_timeout_s):
                output, is_error = await self._invoke(name, raw, note_in(ctx.trace.info))
        except TimeoutError:
            output, is_error = (f"Error: {name} did not finish within {self.config.tool_timeout_s:g} s "
                                "([env.agent.harness] tool_timeout_s)."), True
        except AgentFailure as failure:   # the agent broke its box (its disk quota): the call's result, then
            output, is_error, ended = f"Error: {failure}", True, failure   # the segment ends
        output = scrub(output)   # before the cut, which could otherwise leave a prefix of a key
        cap = self.config.tool_output_cap_chars
        if len(output) > cap:
            output = output[:cap] + f"\n[output cut at {cap} characters]"
        ctx.trace.tool_calls.append(ToolCall(
            segment=ctx.segment_index, id=call_id, name=name, arguments=raw, output=output,
            is_error=is_error, latency_ms=(time.perf_counter() - started) * 1e3))
        ctx.trace.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        if ended is not None:
            raise ended

    def _is_answer(self, call: dict[str, Any]) -> bool:
        spec = self.tools.get(str((call.get("function") or {}).get("name", "")))
        return spec is not None and spec.fn is None

    async def _invoke(self, name: str, raw: str, on_abandon: Callable[[str], None]) -> tuple[str, bool]:
        spec = self.tools.get(name)
        if spec is not None and spec.fn is None:
            return "recorded", False
        if spec is None:
            return f"Error: unknown tool {name!r}. Available tools: {', '.join(sorted(self.tools)) or 'none'}.", True
        try:
            arguments = loads(raw, "the text")   # a model's arguments nested 100,000 deep: not a RecursionError
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return f"Error: the arguments of {name!r} are not a valid JSON object ({exc}).", True
        assert spec.arguments is not None and spec.fn is not None
        try:
            validated = spec.arguments.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in exc.errors())
            return f"Error: invalid arguments for {name!r}: {problems}.", True
        arguments = {key: getattr(validated, key) for key in type(validated).model_fields}
        try:
            if inspect.iscoroutinefunction(spec.fn):
                result = await spec.fn(**arguments)
            else:  # a blocking tool must not stall the event loop (and the other rollouts), nor the exit
                result = await run_sync(functools.partial(spec.fn, **arguments), f"tool {name!r}", on_abandon)
                if inspect.isawaitable(result):
                    result = await result
        except AgentFailure:   # the agent broke its box: not a tool error (``_execute``)
            raise
        except Exception as exc:
            return f"Error: {name} raised {type(exc).__name__}: {exc}", True
        return (result if isinstance(result, str) else json.dumps(result, default=str)), False


_KILLED: dict[str, Callable[[Any], str]] = {
    "memory": lambda config: f"killed: out of memory (memory_mb = {config.memory_mb})",
    "pids": lambda config: f"the process limit was hit (pids_limit = {config.pids_limit})",
}
"""What a bash tool result says of each limit ``Runtime.limits_hit`` names, given the runtime's config."""


def deliver_steers(ctx: SegmentContext) -> None:
    """Append waiting steer messages as user messages, in arrival order; mark them delivered."""
    inbox = ctx.steer_inbox
    if not inbox:
        return
    for record in inbox:
        ctx.trace.messages.append({"role": "user", "content": record.text})
        record.status, record.delivered_segment = "delivered", ctx.segment_index
    inbox.clear()


def runtime_tools(runtime: Runtime | None, names: Sequence[str],
                  on_limits: Callable[[dict[str, Any]], None] | None = None) -> list[Any]:
    """The runtime tools ``names`` (``bash``, ``read_file``, ``write_file``) bound to ``runtime``.

    A ``bash`` command killed (SIGKILL, exit code 137 or -9) before its timeout has the runtime's
    limits read (``Runtime.limits_hit``): its result tells the model which one ("killed: out of memory
    (memory_mb = 128)"), and ``on_limits`` gets ``{"tool": "bash", "command", "exit_code",
    "limits_hit": {kind: sentence}}`` (the tools harness appends it to ``trace.info["limits_hit"]``).
    """
    if runtime is None:
        return []

    async def bash(command: str, timeout: float | None = None) -> str:
        """Run a shell command in the workspace and return its exit code, stdout and stderr.

        Args:
            command: The command line, run with bash -c in the workspace directory.
            timeout: Seconds before the command is killed; at most (and by default) the runtime's limit.
        """
        limit = runtime.config.exec_timeout_s
        result = await runtime.exec(command, timeout=min(timeout, limit) if timeout and timeout > 0 else limit)
        note = " (killed: timeout)" if result.timed_out else ""
        if result.exit_code in (137, -9) and not result.timed_out:   # SIGKILL: the OOM killer's, or a kill -9
            hit = await runtime.limits_hit()
            if hit and on_limits is not None:
                on_limits({"tool": "bash", "command": scrub(command)[:200], "exit_code": result.exit_code,
                           "limits_hit": hit})
            note = "".join(f" ({_KILLED[kind](runtime.config)})" for kind in hit if kind in _KILLED)
        return f"exit_code: {result.exit_code}{note}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    async def read_file(path: str) -> str:
        """Read a text file from the workspace.

        Args:
            path: Path relative to the workspace.
        """
        return (await runtime.read_file(path)).decode("utf-8", errors="replace")

    async def write_file(path: str, content: str) -> str:
        """Create or overwrite a text file in the workspace.

        Args:
            path: Path relative to the workspace; parent directories are created.
            content: The full new content of the file.
        """
        await runtime.write_file(path, content)
        return f"wrote {len(content.encode())} bytes to {path}"

    table = {"bash": bash, "read_file": read_file, "write_file": write_file}
    return [table[name] for name in names]
