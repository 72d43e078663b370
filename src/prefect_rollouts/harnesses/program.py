"""Program harnesses: an agent program run in the runtime, its model calls intercepted into the trace.

``open`` (in setup) copies ``[env.agent.harness] files`` into the runtime and runs ``setup`` commands
with the network open (trusted: it installs the harness), then the runtime's policy back. Each segment
launches the program through ``programs/launch.py`` (``SCRIPTS`` in the endpoint's directory, bound
read-only into the runtime and checked before each launch) with a fresh per-launch secret in
``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_AUTH_TOKEN`` beside ``OPENAI_BASE_URL`` and
``ANTHROPIC_BASE_URL`` (the launcher's docstring), and waits for it to exit; the interception endpoint
(``endpoint.py``, ``session.py``) records every model call and enforces the limits.
For a task that keeps the agent's processes (``Task.keeps_agent_processes``: Harbor's), the program runs
in a session of its own (``setsid``) and what it leaves running is not killed after a launch that ended
by itself: it serves the task's tests. Otherwise, and after every other end, ``Runtime.kill_all`` ends it all.

Outcome of a launch, in order (the rule: ``agent_exits``, docs/scoring-failed-agents.md):

- the endpoint stopped the rollout (``max_turns``, ``max_turn_tokens``): that stop wins over any exit
  code; a program still running ``stop_grace_s`` after the stop is killed (tails as below);
- the agent deadline, a cancellation or a lost runtime: the program's process tree is killed
  (``Runtime.kill_all``), its entry records what is known (``killed``, limits hit, the tails so far; a
  lost runtime's error names their last lines); the deadline ends the run as ``agent_timeout``, scored
  (``skip_on_timeout`` applies). The launcher keeps the tails in a file under ``/tmp`` (not the
  workspace: its ``git diff``), read with a command (docker's archive API misses a tmpfs ``/tmp``);
- its last model call failed upstream: that ``ProviderError`` whatever the exit code (the segment
  policy relaunches it on the same turn): a program that swallows an outage is not scored 0;
- exit 0 after a model call: the segment is over; without one (the spec needs a model) a ``TaskError``:
  it never reached the endpoint, so it is misconfigured (a wrong base URL, its own key) and scoring
  it would credit the rollout's model with work it never saw;
- ``timeout_s`` killed it: ``AgentFailure`` ``program_timeout`` (``is_timeout``); any other exit after
  it started (it called the model, or it ran and exited outside 126/127): ``program_failed``; both
  scored by the task, the message naming the exit code and its last lines (``last_lines``);
- a ``TaskError`` (reward None) when it could not start (the launcher failed, no python3, 126/127
  before any model call) or asked for a route the endpoint does not serve (named: missing here).

Every launch's exit code, output tails (scrubbed), byte counts and limits hit (``Runtime.limits_hit``,
e.g. a kill at ``memory_mb``, read after exit 0 too) are in ``trace.info["program"]``; ``codex`` and
``claude-code`` add their transcript (the whole, scrubbed, in ``trace.info["transcripts"]``). A later
turn relaunches the program on the new message; the endpoint carries the conversation (``resume = false`` refuses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shlex
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from prefect_rollouts.agent_exits import COULD_NOT_START, program_failure
from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError, TaskError, register_secret, scrub
from prefect_rollouts.harnesses import mini_swe_agent, npm_agents
from prefect_rollouts.harnesses.base import SegmentContext
from prefect_rollouts.harnesses.endpoint import DOOR_MOUNT, MOUNT, SOCKET_NAME, InterceptionEndpoint
from prefect_rollouts.harnesses.program_spec import ProgramSpec, program_spec
from prefect_rollouts.harnesses.session import ProgramSession

if TYPE_CHECKING:
    from prefect_rollouts.runtimes import Runtime

_LAUNCH_LINE = re.compile(r"\n?\[launch\] exit=(-?\d+) stdout_bytes=(\d+) stderr_bytes=(\d+)\n?$")
TAILS_READ_S = 10.0
"""Deadline of the command reading a killed launch's tails (it runs after ``kill_all``)."""


class ProgramHarness:
    """Runs an agent program per segment (see the module docstring); steers land at its next model request.

    Args:
        config: The ``[env.agent.harness]`` table.
        endpoint: The agent's started interception endpoint.
    """

    can_steer = True

    def __init__(self, config: HarnessConfig, endpoint: InterceptionEndpoint | None) -> None:
        if endpoint is None or endpoint.directory is None:
            raise ConfigError(f'[env.agent.harness] id = "{config.id}": a program harness needs the agent\'s '
                              "interception endpoint; run it through an open agent (async with make_agent(...))")
        self.id: str = config.id
        self.config = config
        self.endpoint = endpoint
        self.door = endpoint.new_door()   # this rollout's own socket, and no other's
        self.binds = {str(endpoint.directory): f"{MOUNT}:ro", str(self.door): f"{DOOR_MOUNT}:ro"}
        if config.id == "mini-swe-agent":   # the host's installs, for an image without one
            self.binds[str(mini_swe_agent.cache_root())] = f"{mini_swe_agent.MOUNTED}:ro"
        self.npm_agent = npm_agents.AGENTS.get(config.id)
        if self.npm_agent is not None:   # the host's installs, for an image without one
            self.binds[str(npm_agents.cache_root(self.npm_agent))] = f"{npm_agents.MOUNTED}/{config.id}:ro"
        self.spec: ProgramSpec | None = None
        self._site = ""
        self._prompts: dict[int, tuple[str, str | None]] = {}

    def close(self) -> None:
        """Remove this rollout's door (teardown: its runtime is stopped, no launch follows)."""
        self.endpoint.close_door(self.door)

    async def open(self, ctx: SegmentContext) -> None:
        """Upload ``files``, run ``setup`` (network open), check the forwarded variables; for
        ``mini-swe-agent``, find its install in the image or make it on the host (``mini_swe_agent.site_in``);
        for ``codex`` and ``claude-code`` likewise, and check that the binary runs (``npm_agents.binary_in``).

        Raises:
            TaskError: a ``setup`` command failed (its exit code and stderr), a file could not be
                copied, or the built-in agent could not be installed or does not run in the runtime.
            ConfigError: a ``forward_env`` variable is unset here.
        """
        runtime = _runtime(ctx)
        self.spec = spec = program_spec(self.config)
        missing = [name for name in self.config.forward_env if name not in os.environ]
        if missing:
            raise ConfigError(f"[env.agent.harness] forward_env: {', '.join(missing)} unset where the rollout "
                              "runs. Set them, or remove them from forward_env")
        for name in self.config.forward_env:   # scrubbed wherever the program's output is recorded
            register_secret(os.environ[name])
        if self.id == "mini-swe-agent":
            self._site = await mini_swe_agent.site_in(runtime, local=ctx.config.runtime.type == "local",
                                                      timeout_s=self.config.setup_timeout_s)
        elif self.npm_agent is not None:
            self._site, version = await npm_agents.binary_in(
                runtime, self.npm_agent, self.config.version, local=ctx.config.runtime.type == "local",
                timeout_s=self.config.setup_timeout_s)
            ctx.trace.info[self.id] = {"version": version, "binary": self._site}
        for target, source in spec.files.items():
            try:
                await runtime.upload(source, target)
            except (OSError, ValueError) as exc:
                raise TaskError(f'[env.agent.harness] files "{target}" = "{source}": cannot copy it into the '
                                f"runtime ({exc})") from exc
        if not spec.setup:
            return
        closed = runtime.network
        opened = await runtime.scoped(network=NetworkPolicy(mode="open")) if closed.mode != "open" else runtime
        try:
            for command in spec.setup:
                result = await opened.exec(command, timeout=self.config.setup_timeout_s)
                if result.exit_code != 0:
                    why = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
                    raise TaskError(f"[env.agent.harness] setup command {command!r} {why}: "
                                    f"{(result.stderr or result.stdout).strip()[-1500:]}")
        finally:
            if opened is not runtime:
                await runtime.scoped(network=closed)

    async def run_segment(self, ctx: SegmentContext) -> None:
        """Launch the program on this turn's message and wait for it (see the module docstring).

        Raises:
            AgentFailure: it failed on its own after it started (``program_failed``, ``program_timeout``).
            TaskError: a second turn with ``resume = false``; it could not start, or never called the model.
            ProviderError: the program failed after an upstream failure was relayed to it.
        """
        runtime, spec = _runtime(ctx), self.spec
        assert spec is not None, "open() runs first"
        index = ctx.segment_index
        if index > 0 and not self.config.resume:
            raise TaskError(f'[env.agent.harness] resume = false: harness "{self.id}" runs one turn; '
                            "a second turn() is refused. Set resume = true to relaunch it on the conversation")
        record = ctx.trace.segments[-1]   # a retried segment keeps its first prompt
        prompt, system_prompt = self._prompts.setdefault(index, _turn_prompt(ctx.trace.messages[record.start:]))
        session = ProgramSession(ctx, prompt, system_prompt, carried=list(ctx.trace.messages[:record.start]))
        env = {**spec.env, **{name: os.environ[name] for name in self.config.forward_env},
               "OPENAI_API_KEY": session.secret, "OPENAI_MODEL": ctx.config.model}
        scripts = runtime.binds[str(self.endpoint.directory)]
        # the local runtime runs this interpreter: a python3 on PATH may be a shim costing ~70 ms a start
        local = ctx.config.runtime.type == "local"
        python = sys.executable if local else "python3"
        argv = [part.replace("{scripts}", scripts).replace("{python}", python).replace("{site}", self._site)
                for part in spec.command]
        # the launcher's private directory, where it keeps the tails of the program's output so far
        state = f"{tempfile.gettempdir() if local else '/tmp'}/prefect-rollouts-launch-{secrets.token_hex(8)}"
        launch = " ".join(shlex.quote(part) for part in
                          [python, "-I", f"{scripts}/launch.py", f"{runtime.binds[str(self.door)]}/{SOCKET_NAME}",
                           str(self.config.output_tail_chars), *([] if local else ["--sweep"]),
                           "--state", state, "--", *argv])
        keeps = ctx.task.keeps_agent_processes   # Harbor: what the program starts serves the tests
        if keeps:   # its own session: the exec's end does not kill the program's background processes
            launch = f"if command -v setsid >/dev/null 2>&1; then exec setsid -w {launch}; else exec {launch}; fi"
        await asyncio.to_thread(self.endpoint.verify)   # the local runtime's programs can write the scripts
        self.endpoint.open_session(session, self.door)
        job = asyncio.ensure_future(runtime.exec(launch, timeout=self.config.timeout_s, env=env))
        killed, ended_by, hit, so_far, failure = False, "", dict[str, str](), dict[str, Any](), None
        try:
            stop = asyncio.ensure_future(session.stopped.wait())
            try:
                await asyncio.wait([job, stop], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not job.done():   # stopped at the endpoint: the program gets stop_grace_s to exit
                done, _ = await asyncio.wait([job], timeout=self.config.stop_grace_s)
                if not done:
                    killed = True
                    job.cancel()
                    with contextlib.suppress(BaseException):
                        await job
            result = None if killed else job.result()
        except BaseException as exc:   # the agent deadline, a cancellation, a lost runtime
            ended_by = "the agent deadline or a cancellation" if isinstance(exc, asyncio.CancelledError) else \
                f"{type(exc).__name__} in the runtime"
            failure = exc
            raise
        finally:
            self.endpoint.close_session(session)
            if not job.done():
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job
            if ended_by or killed or not keeps:   # nothing the program started outlives its launch
                await asyncio.shield(runtime.kill_all())
            if ended_by or killed:   # its launcher was killed too: its tails so far are in its file
                so_far = await asyncio.shield(self._tails_so_far(runtime, state, session))
            if ended_by:   # what is known of the program (a fork bomb ends here, at the deadline)
                hit = await asyncio.shield(runtime.limits_hit())
                self._record(ctx, session, {"exit_code": None, "killed": ended_by, **so_far}, hit)
                if isinstance(failure, RuntimeUnavailableError) and so_far:   # its message shows them too
                    stream, last = self._last_said(so_far)
                    raise RuntimeUnavailableError(f"{failure}. The program's {stream}: {last}",
                                                  retryable=failure.retryable) from failure
        extra = await self._keep_transcript(ctx, runtime, session) if self.npm_agent is not None else {}
        if killed:
            self._record(ctx, session, {"exit_code": None, **so_far, **extra,
                                        "killed": f"still running {self.config.stop_grace_s:g} s after the stop"}, hit)
            return
        if result is not None and not ctx.stopped:   # a command in the runtime; also after exit 0: a tool
            hit = await runtime.limits_hit()         # command of the program may have been killed for memory
        if result is not None and result.timed_out:   # timeout_s killed its launcher too: the tails are in its file
            extra.update(await self._tails_so_far(runtime, state, session))
        self._judge(ctx, session, result, spec, hit, extra)

    async def _keep_transcript(self, ctx: SegmentContext, runtime: Runtime, session: ProgramSession) -> dict[str, Any]:
        """Move the agent's transcript onto the trace, under ``trace.info["transcripts"]["<id>-launch-<n>.jsonl"]``
        (``n`` counts this rollout's launches from 0); returns what goes on this launch's ``program`` entry."""
        info: dict[str, Any] = {}
        text = await npm_agents.keep_transcript(runtime, info, (session.secret,), self.config.output_tail_chars)
        if text is not None:
            info["transcript"] = name = f"{self.id}-launch-{len(ctx.trace.info.get('program', []))}.jsonl"
            ctx.trace.info.setdefault("transcripts", {})[name] = text
        return info

    async def _tails_so_far(self, runtime: Runtime, state: str, session: ProgramSession) -> dict[str, Any]:
        """The tails a killed launcher kept in ``<state>/tails.json`` (``programs/launch.py``), as
        ``stdout_tail``, ``stderr_tail`` (scrubbed and cut as a finished launch's) and ``stdout_bytes``,
        ``stderr_bytes``; its directory is removed. The program may have rewritten the file: at most
        ``output_cap_bytes`` are read and only fields of the right type kept. Empty when it cannot be
        read (the runtime is lost, ``TAILS_READ_S`` passed). Never raises but a cancellation."""
        path, cap = shlex.quote(f"{state}/tails.json"), runtime.config.output_cap_bytes
        try:
            result = await asyncio.wait_for(runtime.exec(f"head -c {cap} {path}; rm -rf {shlex.quote(state)}",
                                                         timeout=TAILS_READ_S), TAILS_READ_S + 5)
            data = json.loads(result.stdout)
        except Exception:   # a lost runtime, a timeout, a file that is not JSON: nothing is known
            return {}
        found: dict[str, Any] = {}
        for stream in ("stdout", "stderr") if isinstance(data, dict) else ():
            text, count = data.get(f"{stream}_tail"), data.get(f"{stream}_bytes")
            if isinstance(text, str):
                found[f"{stream}_tail"] = self._tail(text, session)
            if type(count) is int and count >= 0:
                found[f"{stream}_bytes"] = count
        return found

    def _tail(self, text: str, session: ProgramSession) -> str:
        """``text`` scrubbed of secrets (the launch's key too), then cut to ``output_tail_chars``."""
        return scrub(text, (session.secret,))[-self.config.output_tail_chars:]

    def _last_said(self, info: dict[str, Any]) -> tuple[str, str]:
        """``(stream, its last whole lines)`` of an entry's tails: stderr, else stdout (``last_lines``)."""
        out, err = info.get("stdout_tail", ""), info.get("stderr_tail", "")
        stream = "stderr" if err.strip() or not out.strip() else "stdout"
        whole = info.get(f"{stream}_bytes", 0) <= self.config.output_tail_chars   # else the tail starts mid-line
        last = last_lines(info.get(f"{stream}_tail", ""), whole=whole) or "(no output)"
        return stream + (" (stderr empty)" if stream == "stdout" else ""), last

    def _record(self, ctx: SegmentContext, session: ProgramSession, info: dict[str, Any],
                hit: dict[str, str]) -> dict[str, Any]:
        """Append a launch's ``trace.info["program"]`` entry; ``hit``: ``Runtime.limits_hit`` -> ``limits_hit``."""
        entry = {"segment": ctx.segment_index, "model_calls": session.calls, **info}
        if hit:
            entry["limits_hit"] = dict(hit)
        ctx.trace.info.setdefault("program", []).append(entry)
        return entry

    def _judge(self, ctx: SegmentContext, session: ProgramSession, result: Any, spec: ProgramSpec,
               hit: dict[str, str], extra: dict[str, Any]) -> None:
        """Record the launch on the trace (with ``extra``) and raise if it failed (see the module docstring)."""
        info: dict[str, Any] = dict(extra)
        stderr, code = result.stderr, result.exit_code
        found = _LAUNCH_LINE.search(stderr)
        if found:
            stderr = stderr[:found.start()]
            info.update(stdout_bytes=int(found[2]), stderr_bytes=int(found[3]))
        info.update(exit_code=code, timed_out=result.timed_out)   # a timed-out launch's tails: from its file
        info.setdefault("stdout_tail", self._tail(result.stdout, session))
        info.setdefault("stderr_tail", self._tail(stderr, session))
        if spec.report is not None:
            info.update(spec.report(info["stdout_tail"], info["stderr_tail"]))
        info = self._record(ctx, session, info, hit)
        if ctx.stopped:   # the endpoint stopped the rollout (max_turns, max_turn_tokens): that stop wins
            return
        if session.provider_error is not None:   # its last model call failed: an outage, not a result
            raise session.provider_error
        limits = "".join(f" ({text})" for text in hit.values())
        if code == 0 and not result.timed_out:
            if session.calls == 0 and spec.needs_model:
                raise TaskError(f'harness "{self.id}": the program exited (code 0) without calling the model'
                                f"{limits}{_unserved(session)}. It must send its requests to OPENAI_BASE_URL "
                                "(chat completions, Responses) with OPENAI_API_KEY, or to ANTHROPIC_BASE_URL "
                                "(Messages)")
            return
        stream, last = self._last_said(info)
        if code == 127 and not found and "python3" in last and "not found" in last:
            raise TaskError(f'harness "{self.id}": the runtime has no python3, which the program launcher needs. '
                            f"Use an image with python3 (>= 3.8). {stream}: {last}")
        started = session.calls > 0 or (found is not None and code not in COULD_NOT_START)   # it ran
        why = (f"ran longer than [env.agent.harness] timeout_s = {self.config.timeout_s:g} and was killed"
               if result.timed_out else f"exited with code {code}" if started or session.unserved else
               f"could not start (exit code {code}, before any model call)")
        raise program_failure(f'harness "{self.id}": the program {why}{limits}{_unserved(session)}. {stream}: {last}',
                              timed_out=result.timed_out, started=started and not session.unserved)


MESSAGE_TAIL_BYTES = 800
"""Bytes of the program's output an error message keeps (whole lines; its last line is kept whole
whatever its length, up to what ``output_tail_chars`` captured)."""


def last_lines(text: str, *, whole: bool = True, max_bytes: int = MESSAGE_TAIL_BYTES) -> str:
    """The last whole lines of ``text`` within ``max_bytes`` (UTF-8), trailing blank lines dropped;
    the last line is never cut, and a tail is never started mid-line. ``whole``: ``text`` starts
    at a line boundary (False for a tail cut from longer output: its first line is partial and is
    kept only when it is the last one)."""
    lines = text.rstrip().splitlines()
    kept: list[str] = []
    size = 0
    for index in range(len(lines) - 1, -1, -1):
        size += len(lines[index].encode("utf-8", "replace")) + 1
        if kept and (size > max_bytes + 1 or (index == 0 and not whole)):
            break
        kept.append(lines[index])
    return "\n".join(reversed(kept)).strip("\n")


def _unserved(session: ProgramSession) -> str:
    """``"; it asked for POST /v1/responses, which the endpoint does not serve"`` or ``""``."""
    return f"; it asked for {session.unserved}, which the endpoint does not serve" if session.unserved else ""


def _runtime(ctx: SegmentContext) -> Runtime:
    if ctx.runtime is None:
        raise RuntimeError("a program harness needs the rollout's runtime (setup did not start it)")
    return ctx.runtime


def _turn_prompt(messages: list[dict[str, Any]]) -> tuple[str, str | None]:
    """``(user text, system text or None)`` of a turn's input messages (texts joined by blank lines)."""
    users: list[str] = []
    systems: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):   # content parts: keep the text ones
            content = "\n".join(str(part.get("text", "")) for part in content
                                if isinstance(part, dict) and part.get("type") == "text")
        text = content if isinstance(content, str) else ""
        (systems if message.get("role") == "system" else users).append(text)
    return "\n\n".join(users), ("\n\n".join(systems) or None)
