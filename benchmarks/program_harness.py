"""Program-harness throughput and CPU: the ``bash`` program harness beside the in-process ``tools`` harness,
and the real Codex CLI and Claude Code beside ``bash`` on the docker runtime.

Setup: 200 rollouts that answer in one model call (no tool call), 32 at once, the scripted server
answering after 50 ms (in its own process, so it does not share this one's GIL), orchestrator
``inline``, local runtime. The same tasks run under ``[env.agent.harness] id = "tools"`` (the loop in
this process) and ``id = "bash"`` (``bash_agent.py`` launched in the runtime per rollout through
``launch.py``, its model call going through the interception endpoint).

    .venv/bin/python benchmarks/program_harness.py [--rollouts 200] [--concurrency 32] [--runtime local]
    .venv/bin/python benchmarks/program_harness.py --harnesses bash@docker codex claude-code --agent-rollouts 12
    .venv/bin/python benchmarks/program_harness.py --runtime docker      # 40 rollouts, 8 at once
    .venv/bin/python benchmarks/program_harness.py --path /usr/local/bin:/usr/bin:/bin   # which python3

On the local runtime the launcher and ``bash_agent.py`` run as ``python3`` from the runtime's PATH
(inherited): where that is a pyenv shim (a bash script running ``pyenv exec``), each of the two
interpreter starts per rollout costs about 65 ms more CPU; ``--path`` shows the figures without it.

The docker cases (``bash@docker``, ``codex``, ``claude-code``; ``network = "none"``, ``max_turns = 4``)
run ``--agent-rollouts`` (default 6) rollouts, ``--agent-concurrency`` (default 2) at once, in the same
run: the same one-call task, the agent's own dialect at the endpoint (Codex: Responses, streamed;
Claude Code: Messages, streamed), so the difference from ``bash@docker`` is what an agent adds outside
the model (its launch, the install check at setup, its transcript read back at finalize). Their
first warm-up rollout installs the agent into the host's cache if it is not there yet (npm, network).

Prints, per harness: rollouts/s and CPU ms per rollout, split into

- program start: CPU of the child processes (``resource.getrusage(RUSAGE_CHILDREN)`` user + sys
  deltas over the timed run). A child's CPU is added when it is reaped, and a reaped process carries
  its own reaped children, so this is ``unshare`` + ``bash -c`` + ``launch.py`` + ``bash_agent.py``.
  On the docker runtime the program runs under dockerd, not under this process: it is not counted.
- endpoint: CPU of this process spent serving the interception endpoint. Measured by patching, before
  the agent starts its endpoint, (1) ``Starlette.__call__`` (the endpoint is the only Starlette app
  in this process) so each step of the ASGI app's coroutine -- routing, reading the body,
  ``json.loads``, ``ProgramSession.exchange``, rendering and sending the response -- is timed with
  ``time.thread_time``; (2) the uvicorn h11 protocol's ``connection_made``, ``data_received``,
  ``connection_lost`` (HTTP parsing, in event-loop callbacks outside the app's task); and subtracting
  (3) the steps of ``harnesses.session.sample`` (the upstream model call through the agent's client,
  which ``exchange`` awaits inside its own steps). Step timing drives a coroutine by ``send``/``throw``
  and times each resumption on the event-loop thread, so CPU spent by other coroutines while the
  exchange waits is not counted. It covers both requests of a launch (``launch.py``'s session fetch
  and the chat call); ``exchange`` alone (minus upstream) is printed too.
- rest: this process's CPU (``time.process_time``, all threads) minus the endpoint.

Targets (issue, printed beside the figures, not asserted): >= 10 rollouts/s for the bash harness;
endpoint overhead <= 3 ms CPU per model call. Also printed: where a rollout's wall time goes
(``trace.timings`` setup / agent / finalize / scoring / teardown, averaged) and the wall time of the
runtime's ``exec`` and ``kill_all`` calls per rollout (a docker exec is a round trip to dockerd). The machine is shared: the load average is
printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.inline_throughput import Echo, serve  # the same 50 ms server and one-call task

import prefect_rollouts as vf
from prefect_rollouts.harnesses import session as session_module

TARGET_RATE = 10.0
"""rollouts/s the bash harness should reach on this setup (issue)."""
TARGET_ENDPOINT_MS = 3.0
"""Endpoint CPU per model call, ms, at most (issue)."""


class Meter:
    """CPU seconds, on the event-loop thread, of the steps of the coroutines it wraps, by bucket."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.walls: dict[str, float] = {}

    def reset(self) -> None:
        self.walls.clear()
        self.seconds.clear()
        self.counts.clear()

    def add(self, bucket: str, seconds: float) -> None:
        self.seconds[bucket] = self.seconds.get(bucket, 0.0) + seconds

    def steps(self, bucket: str, coro: Awaitable[Any]) -> Awaitable[Any]:
        """``coro`` with each of its resumptions timed into ``bucket``."""
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        return _Timed(self, bucket, coro)

    def callback(self, bucket: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a plain callback) with each call timed into ``bucket``."""
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(bucket, time.thread_time() - started)
        return timed


class _Timed:
    def __init__(self, meter: Meter, bucket: str, coro: Any) -> None:
        self.meter, self.bucket, self.coro = meter, bucket, coro.__await__()

    def __await__(self) -> Generator[Any, Any, Any]:
        inner, value, error = self.coro, None, None
        while True:
            started = time.thread_time()
            try:
                yielded = inner.throw(error) if error is not None else inner.send(value)
            except StopIteration as stop:
                self.meter.add(self.bucket, time.thread_time() - started)
                return stop.value
            except BaseException:
                self.meter.add(self.bucket, time.thread_time() - started)
                raise
            self.meter.add(self.bucket, time.thread_time() - started)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:   # cancellation reaches the inner coroutine
                value, error = None, exc


def instrument(meter: Meter) -> None:
    """Patch the endpoint's ASGI app, its HTTP protocol and the upstream call (see the docstring)."""
    from starlette.applications import Starlette
    from uvicorn.protocols.http.h11_impl import H11Protocol

    app_call = Starlette.__call__

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:   # async def: uvicorn sees ASGI 3
        await meter.steps("app", app_call(self, scope, receive, send))
    Starlette.__call__ = call  # type: ignore[method-assign]

    for name in ("connection_made", "data_received", "connection_lost", "eof_received"):
        setattr(H11Protocol, name, meter.callback("http", getattr(H11Protocol, name)))

    sample = session_module.sample
    session_module.sample = lambda ctx, request: meter.steps("upstream", sample(ctx, request))

    exchange = session_module.ProgramSession.exchange

    async def timed_exchange(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await meter.steps("exchange", exchange(self, *args, **kwargs))
    session_module.ProgramSession.exchange = timed_exchange  # type: ignore[method-assign]


def which(args: argparse.Namespace) -> str:
    if args.runtime == "docker":
        return "the image's"
    found = shutil.which("python3", path=args.path or os.environ.get("PATH"))
    return f"{found} (a pyenv shim: a bash script running `pyenv exec`)" if found and "/shims/" in found else str(found)


def time_runtime(meter: Meter) -> None:
    """Add the wall time of the runtimes' ``exec`` and ``kill_all`` calls to ``meter.walls``."""
    from prefect_rollouts.runtimes.docker.runtime import DockerRuntime
    from prefect_rollouts.runtimes.local import LocalRuntime

    for cls in (DockerRuntime, LocalRuntime):
        for name in ("exec", "kill_all"):
            method = getattr(cls, name)

            async def timed(self: Any, *args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await _method(self, *args, **kwargs)
                finally:
                    meter.walls[_name] = meter.walls.get(_name, 0.0) + time.perf_counter() - started
                    meter.counts[_name] = meter.counts.get(_name, 0) + 1
            setattr(cls, name, timed)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


AGENTS = ("codex", "claude-code")
"""The npm agents: always on the docker runtime (where they run), ``network = "none"``."""


def case(args: argparse.Namespace, harness: str) -> tuple[str, str, int, int]:
    """``(harness, runtime, rollouts, concurrency)`` of one case: ``bash@docker`` is the bash harness
    on the docker runtime beside the agents, which run ``--agent-rollouts``, ``--agent-concurrency``."""
    name, _, runtime = harness.partition("@")
    if name in AGENTS or runtime == "docker":
        if args.runtime == "docker":
            return name, "docker", args.rollouts, args.concurrency
        return name, "docker", args.agent_rollouts, args.agent_concurrency
    return name, args.runtime, args.rollouts, args.concurrency


def config(args: argparse.Namespace, base_url: str, harness: str, runtime: str, concurrency: int) -> vf.AgentConfig:
    env = {"PATH": args.path} if args.path and runtime == "local" else {}
    return vf.AgentConfig(model="bench", orchestrator="inline", harness=vf.HarnessConfig(id=harness),
                          max_turns=4 if harness in AGENTS else None,   # Claude Code's side requests count too
                          client=vf.ClientConfig(base_url=base_url, api_key_env=None, max_connections=concurrency),
                          runtime=vf.RuntimeConfig(type=runtime, env=env,
                                                   **({"network": "none"} if runtime == "docker" else {})))


async def run(args: argparse.Namespace, base_url: str, label: str, meter: Meter) -> dict[str, Any]:
    """Time the rollouts of case ``label`` after a warm-up round (which also installs an npm agent
    into the host's cache the first time): the figures as a dict."""
    harness, runtime, rollouts, concurrency = case(args, label)
    gate = asyncio.Semaphore(concurrency)
    walls: list[float] = []

    async def one(agent: vf.Agent, i: int) -> vf.Trace:
        async with gate:
            started = time.perf_counter()
            trace = await agent.run(Echo(vf.TaskData(prompt=f"say ok {i}")))
            walls.append(time.perf_counter() - started)
            return trace

    async with vf.make_agent(config(args, base_url, harness, runtime, concurrency)) as agent:
        await asyncio.gather(*(one(agent, i) for i in range(min(concurrency, rollouts))))  # warm up
        walls.clear()
        meter.reset()
        cpu, children, started = time.process_time(), children_cpu(), time.perf_counter()
        traces = await asyncio.gather(*(one(agent, i) for i in range(rollouts)))
        elapsed = time.perf_counter() - started
        cpu, children = time.process_time() - cpu, children_cpu() - children
    bad = [t for t in traces if t.errors or not t.model_calls or (harness not in AGENTS and t.reward != 1.0)]
    if bad:   # an agent may phrase its last reply otherwise; it must reach the model and end without error
        raise SystemExit(f"{label}: {len(bad)} rollouts failed: {bad[0].errors or bad[0].last_reply!r}")
    calls = sum(len(t.model_calls) for t in traces)
    seconds = meter.seconds
    endpoint = seconds.get("app", 0.0) + seconds.get("http", 0.0) - seconds.get("upstream", 0.0)
    exchange = seconds.get("exchange", 0.0) - seconds.get("upstream", 0.0)
    parts = {"h11 parsing": seconds.get("http", 0.0),
             "app minus exchange": seconds.get("app", 0.0) - seconds.get("exchange", 0.0), "exchange": exchange}
    timings = {stage: statistics.fmean(t.timings.get(stage, 0.0) for t in traces)
               for stage in ("setup", "agent", "finalize", "scoring", "teardown")}
    walls.sort()
    return {"harness": label, "runtime": runtime, "rollouts": rollouts, "rate": rollouts / elapsed,
            "wall": statistics.fmean(walls), "elapsed": elapsed, "calls": calls,
            "cpu": cpu, "children": children, "endpoint": endpoint, "exchange": exchange, "parts": parts,
            "requests": meter.counts.get("app", 0), "timings": timings,
            "runtime_calls": {name: (meter.walls.get(name, 0.0), meter.counts.get(name, 0)) for name in ("exec", "kill_all")},
            "p50": statistics.median(walls), "p95": walls[int(0.95 * (len(walls) - 1))]}


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    n, calls = result["rollouts"], max(result["calls"], 1)
    per = lambda seconds: seconds / n * 1e3  # noqa: E731
    program = result["harness"] != "tools"
    print(f"\n[{result['harness']}]  {result['runtime']} runtime, {n} rollouts, {calls} model calls, {result['requests']} endpoint requests")
    target = f"   (target >= {TARGET_RATE:g}/s)" if program and result["runtime"] == "local" else ""
    print(f"  throughput        {result['rate']:7.1f} rollouts/s  (wall {result['elapsed']:.2f} s){target}")
    print(f"  rollout wall      p50 {result['p50'] * 1e3:.0f} ms  p95 {result['p95'] * 1e3:.0f} ms")
    timings = "  ".join(f"{stage} {seconds * 1e3:.0f}" for stage, seconds in result["timings"].items())
    print(f"  trace.timings     {timings}  (ms, mean per rollout)")
    calls_made = "  ".join(f"{name} {seconds / n * 1e3:.0f} ms ({count / n:g} calls)"
                           for name, (seconds, count) in result["runtime_calls"].items())
    print(f"  runtime wall      {calls_made}  (per rollout)")
    total = result["cpu"] + result["children"]
    print(f"  CPU per rollout   {per(total):7.2f} ms total")
    print(f"    program start   {per(result['children']):7.2f} ms  (children: unshare, bash, launch.py, bash_agent.py)")
    if program:
        print(f"    endpoint        {per(result['endpoint']):7.2f} ms  = {result['endpoint'] / calls * 1e3:.2f} ms per "
              f"model call (target <= {TARGET_ENDPOINT_MS:g} ms); exchange alone "
              f"{result['exchange'] / calls * 1e3:.2f} ms per call")
        parts = "  ".join(f"{name} {seconds / n * 1e3:.2f}" for name, seconds in result["parts"].items())
        print(f"      of which      {parts}  (ms per rollout)")
    print(f"    rest            {per(result['cpu'] - result['endpoint']):7.2f} ms  (this process, minus endpoint)")


def table(results: list[dict[str, Any]]) -> None:
    """One line per case: what a rollout of each harness costs outside the model (the model answers
    after ``--latency`` in its own process, so the difference between cases is the harness's)."""
    print(f"\n{'harness':<14}{'runtime':<9}{'rollouts':>9}{'calls/rollout':>15}{'wall/rollout':>14}"
          f"{'host CPU/rollout':>18}{'endpoint CPU/call':>19}")
    for r in results:
        n, calls = r["rollouts"], max(r["calls"], 1)
        endpoint = f"{r['endpoint'] / calls * 1e3:.2f} ms" if r["harness"] != "tools" else "-"
        print(f"{r['harness']:<14}{r['runtime']:<9}{n:>9}{r['calls'] / n:>15.1f}{r['wall'] * 1e3:>11.0f} ms"
              f"{r['cpu'] / n * 1e3:>15.1f} ms{endpoint:>19}")
    print("(wall: mean per rollout; host CPU: this process, all threads, endpoint included; a docker "
          "program's own CPU is dockerd's, not counted)")


async def main(args: argparse.Namespace, base_url: str) -> None:
    meter = Meter()
    instrument(meter)
    time_runtime(meter)
    load = os.getloadavg()
    print(f"rollouts: {args.rollouts}  concurrency: {args.concurrency}  runtime: {args.runtime}  "
          f"docker cases: {args.agent_rollouts} rollouts, {args.agent_concurrency} at once  "
          f"server latency: {args.latency * 1e3:.0f} ms  cores: {os.cpu_count()}")
    print(f"runtime PATH: {args.path or '(inherited)'}; python3 there: {which(args)}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    results = [await run(args, base_url, harness, meter) for harness in args.harnesses]
    for result in results:
        report(args, result)
    table(results)
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=["local", "docker"], default="local")
    parser.add_argument("--rollouts", type=int, help="default 200 (local), 40 (docker)")
    parser.add_argument("--concurrency", type=int, help="default 32 (local), 8 (docker)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the server waits per reply")
    parser.add_argument("--path", help="PATH of the runtime's commands (which python3 the launcher runs); "
                        "default: inherited (local), the image's (docker)")
    parser.add_argument("--harnesses", nargs="+", choices=["tools", "bash", "bash@docker", *AGENTS],
                        default=["tools", "bash", "bash@docker", *AGENTS],
                        help="bash@docker, codex, claude-code run on the docker runtime (network none)")
    parser.add_argument("--agent-rollouts", type=int, default=6, help="rollouts of each docker case (local runs)")
    parser.add_argument("--agent-concurrency", type=int, default=2, help="of each docker case at once (local runs)")
    arguments = parser.parse_args()
    docker = arguments.runtime == "docker"
    arguments.rollouts = arguments.rollouts or (40 if docker else 200)
    arguments.concurrency = arguments.concurrency or (8 if docker else 32)
    queue: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=serve, args=(arguments.latency, queue), daemon=True)
    process.start()
    try:
        asyncio.run(main(arguments, queue.get(timeout=30)))
    finally:
        process.terminate()
