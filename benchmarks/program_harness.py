"""Program-harness throughput and CPU: the ``bash`` program harness beside the in-process ``tools`` harness.

Setup: 200 rollouts that answer in one model call (no tool call), 32 at once, the scripted server
answering after 50 ms (in its own process, so it does not share this one's GIL), orchestrator
``inline``, local runtime. The same tasks run under ``[env.agent.harness] id = "tools"`` (the loop in
this process) and ``id = "bash"`` (``bash_agent.py`` launched in the runtime per rollout through
``launch.py``, its model call going through the interception endpoint).

    .venv/bin/python benchmarks/program_harness.py [--rollouts 200] [--concurrency 32] [--runtime local]
    .venv/bin/python benchmarks/program_harness.py --runtime docker      # 40 rollouts, 8 at once
    .venv/bin/python benchmarks/program_harness.py --path /usr/local/bin:/usr/bin:/bin   # which python3

On the local runtime the launcher and ``bash_agent.py`` run as ``python3`` from the runtime's PATH
(inherited): where that is a pyenv shim (a bash script running ``pyenv exec``), each of the two
interpreter starts per rollout costs about 65 ms more CPU; ``--path`` shows the figures without it.

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

    async def timed_exchange(self: Any, body: Any, raw: bytes, headers: Any) -> Any:
        return await meter.steps("exchange", exchange(self, body, raw, headers))
    session_module.ProgramSession.exchange = timed_exchange  # type: ignore[method-assign]


def which(args: argparse.Namespace) -> str:
    if args.runtime == "docker":
        return "the image's"
    found = shutil.which("python3", path=args.path or os.environ.get("PATH"))
    return f"{found} (a pyenv shim: a bash script running `pyenv exec`)" if found and "/shims/" in found else str(found)


def time_runtime(meter: Meter, runtime: str) -> None:
    """Add the wall time of the runtime's ``exec`` and ``kill_all`` calls to ``meter.walls``."""
    if runtime == "docker":
        from prefect_rollouts.runtimes.docker import DockerRuntime as cls
    else:
        from prefect_rollouts.runtimes.local import LocalRuntime as cls
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


def config(args: argparse.Namespace, base_url: str, harness: str) -> vf.AgentConfig:
    return vf.AgentConfig(model="bench", orchestrator="inline", harness=vf.HarnessConfig(id=harness),
                          client=vf.ClientConfig(base_url=base_url, api_key_env=None,
                                                 max_connections=args.concurrency),
                          runtime=vf.RuntimeConfig(type=args.runtime, env={"PATH": args.path} if args.path else {}))


async def run(args: argparse.Namespace, base_url: str, harness: str, meter: Meter) -> dict[str, Any]:
    """Time ``args.rollouts`` rollouts of ``harness`` after a warm-up round: the figures as a dict."""
    gate = asyncio.Semaphore(args.concurrency)
    walls: list[float] = []

    async def one(agent: vf.Agent, i: int) -> vf.Trace:
        async with gate:
            started = time.perf_counter()
            trace = await agent.run(Echo(vf.TaskData(prompt=f"say ok {i}")))
            walls.append(time.perf_counter() - started)
            return trace

    async with vf.make_agent(config(args, base_url, harness)) as agent:
        await asyncio.gather(*(one(agent, i) for i in range(min(args.concurrency, args.rollouts))))  # warm up
        walls.clear()
        meter.reset()
        cpu, children, started = time.process_time(), children_cpu(), time.perf_counter()
        traces = await asyncio.gather(*(one(agent, i) for i in range(args.rollouts)))
        elapsed = time.perf_counter() - started
        cpu, children = time.process_time() - cpu, children_cpu() - children
    bad = [t for t in traces if t.reward != 1.0]
    if bad:
        raise SystemExit(f"{harness}: {len(bad)} rollouts did not answer ok: {bad[0].errors or bad[0].last_reply!r}")
    calls = sum(len(t.model_calls) for t in traces)
    seconds = meter.seconds
    endpoint = seconds.get("app", 0.0) + seconds.get("http", 0.0) - seconds.get("upstream", 0.0)
    exchange = seconds.get("exchange", 0.0) - seconds.get("upstream", 0.0)
    parts = {"h11 parsing": seconds.get("http", 0.0),
             "app minus exchange": seconds.get("app", 0.0) - seconds.get("exchange", 0.0), "exchange": exchange}
    timings = {stage: statistics.fmean(t.timings.get(stage, 0.0) for t in traces)
               for stage in ("setup", "agent", "finalize", "scoring", "teardown")}
    walls.sort()
    return {"harness": harness, "rate": args.rollouts / elapsed, "elapsed": elapsed, "calls": calls,
            "cpu": cpu, "children": children, "endpoint": endpoint, "exchange": exchange, "parts": parts,
            "requests": meter.counts.get("app", 0), "timings": timings,
            "runtime": {name: (meter.walls.get(name, 0.0), meter.counts.get(name, 0)) for name in ("exec", "kill_all")},
            "p50": statistics.median(walls), "p95": walls[int(0.95 * (len(walls) - 1))]}


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    n, calls = args.rollouts, max(result["calls"], 1)
    per = lambda seconds: seconds / n * 1e3  # noqa: E731
    program = result["harness"] != "tools"
    print(f"\n[{result['harness']}]  {n} rollouts, {calls} model calls, {result['requests']} endpoint requests")
    target = f"   (target >= {TARGET_RATE:g}/s)" if program else ""
    print(f"  throughput        {result['rate']:7.1f} rollouts/s  (wall {result['elapsed']:.2f} s){target}")
    print(f"  rollout wall      p50 {result['p50'] * 1e3:.0f} ms  p95 {result['p95'] * 1e3:.0f} ms")
    timings = "  ".join(f"{stage} {seconds * 1e3:.0f}" for stage, seconds in result["timings"].items())
    print(f"  trace.timings     {timings}  (ms, mean per rollout)")
    calls_made = "  ".join(f"{name} {seconds / n * 1e3:.0f} ms ({count / n:g} calls)"
                           for name, (seconds, count) in result["runtime"].items())
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


async def main(args: argparse.Namespace, base_url: str) -> None:
    meter = Meter()
    instrument(meter)
    time_runtime(meter, args.runtime)
    load = os.getloadavg()
    print(f"rollouts: {args.rollouts}  concurrency: {args.concurrency}  runtime: {args.runtime}  "
          f"server latency: {args.latency * 1e3:.0f} ms  cores: {os.cpu_count()}")
    print(f"runtime PATH: {args.path or '(inherited)'}; python3 there: {which(args)}")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    results = [await run(args, base_url, harness, meter) for harness in args.harnesses]
    for result in results:
        report(args, result)
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
    parser.add_argument("--harnesses", nargs="+", choices=["tools", "bash"], default=["tools", "bash"])
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
