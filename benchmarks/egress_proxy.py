"""What the egress proxy adds: latency per request and CPU per MB, against a direct connection.

On loopback, 32 connections at once from one client process, against an asyncio echo server in
a process of its own:

- **per request in a tunnel**: 32 clients each hold one connection (direct, or a ``CONNECT`` tunnel
  through the proxy) and do 200 round trips of 512 bytes; median and p95 of a round trip, and what
  the proxy adds to each (and the same for one connection alone);
- **per new connection**: 32 clients each open 50 connections one after another and do one round
  trip on each (direct: ``connect``; proxied: ``connect`` + ``CONNECT`` + credential check + the
  proxy's own resolve and connect upstream), and the proxy's CPU per connection;
- **CPU per MB**: 32 tunnels push 16 MiB each to a sink; the proxy's process CPU (user + system,
  from ``/proc``) per MiB relayed.

The proxy runs in its own process (the agent's event loop in real use), so its CPU is its own.
The target of issue 23: under 1 ms added per request on this machine.

Usage: ``.venv/bin/python benchmarks/egress_proxy.py``
"""

from __future__ import annotations

import asyncio
import base64
import multiprocessing
import os
import statistics
import time
from typing import Any

CONNECTIONS = 32
ROUND_TRIPS = 200
NEW_CONNECTIONS = 50
MESSAGE = b"x" * 512
PUSH_BYTES = 16 * 1024 * 1024


def _serve_proxy(port: int, ready: Any, route: Any) -> None:
    from prefect_rollouts.config.network import NetworkPolicy
    from prefect_rollouts.runtimes.egress.proxy import EgressProxy

    async def main() -> None:
        proxy = EgressProxy()
        listening = await proxy.listen("127.0.0.1")
        made = proxy.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{port}"]}), phase="agent")
        route.put((listening, made.id, made.credential))
        ready.set()
        await asyncio.Event().wait()
    asyncio.run(main())


def _serve_upstream(ready: Any, ports: Any) -> None:
    async def main() -> None:
        echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
        sink = await asyncio.start_server(_sink, "127.0.0.1", 0)
        ports.put((echo.sockets[0].getsockname()[1], sink.sockets[0].getsockname()[1]))
        ready.set()
        await asyncio.Event().wait()
    asyncio.run(main())


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    total = 0
    while data := await reader.read(262144):
        total += len(data)
    writer.write(str(total).encode())
    await writer.drain()
    writer.close()


class Target:
    def __init__(self, port: int, proxy: tuple[int, str, str] | None) -> None:
        self.port, self.proxy = port, proxy

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.proxy is None:
            return await asyncio.open_connection("127.0.0.1", self.port)
        proxy_port, user, credential = self.proxy
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        auth = base64.b64encode(f"{user}:{credential}".encode()).decode()
        writer.write(f"CONNECT 127.0.0.1:{self.port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        return reader, writer


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    started = time.perf_counter()
    writer.write(MESSAGE)
    await writer.drain()
    await reader.readexactly(len(MESSAGE))
    return time.perf_counter() - started


async def in_tunnel(target: Target, connections: int = CONNECTIONS) -> list[float]:
    async def client() -> list[float]:
        reader, writer = await target.open()
        await round_trip(reader, writer)   # warm
        times = [await round_trip(reader, writer) for _ in range(ROUND_TRIPS)]
        writer.close()
        return times
    return [t for times in await asyncio.gather(*(client() for _ in range(connections))) for t in times]


async def new_connections(target: Target) -> list[float]:
    async def client() -> list[float]:
        times = []
        for _ in range(NEW_CONNECTIONS):
            started = time.perf_counter()
            reader, writer = await target.open()
            await round_trip(reader, writer)
            times.append(time.perf_counter() - started)
            writer.close()
        return times
    return [t for times in await asyncio.gather(*(client() for _ in range(CONNECTIONS))) for t in times]


async def push(target: Target) -> None:
    async def client() -> None:
        reader, writer = await target.open()
        chunk = b"y" * 262144
        for _ in range(PUSH_BYTES // len(chunk)):
            writer.write(chunk)
            await writer.drain()
        writer.write_eof()
        assert int(await reader.read()) == PUSH_BYTES
        writer.close()
    await asyncio.gather(*(client() for _ in range(CONNECTIONS)))


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ms(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000 if q < 100 else max(values) * 1000


async def main() -> None:
    context = multiprocessing.get_context("spawn")
    ready, routes = context.Event(), context.Queue()
    upstream = context.Process(target=_serve_upstream, args=(ready, routes), daemon=True)
    upstream.start()
    await asyncio.to_thread(ready.wait, 60)
    ready.clear()
    echo_port, sink_port = routes.get()
    proxies = []
    for port in (echo_port, sink_port):
        process = context.Process(target=_serve_proxy, args=(port, ready, routes), daemon=True)
        process.start()
        await asyncio.to_thread(ready.wait, 60)
        ready.clear()
        proxies.append((process, routes.get()))
    (echo_proxy, echo_route), (sink_proxy, sink_route) = proxies
    print(f"egress proxy on loopback, {CONNECTIONS} connections at once, {os.cpu_count()} cores")
    direct, proxied = await in_tunnel(Target(echo_port, None)), await in_tunnel(Target(echo_port, echo_route))
    print(f"round trip in a held connection ({ROUND_TRIPS} x {len(MESSAGE)} B each):")
    for name, values in (("direct", direct), ("proxied", proxied)):
        print(f"  {name:8} median {ms(values, 50):6.3f} ms   p95 {ms(values, 95):6.3f} ms")
    print(f"  added    median {ms(proxied, 50) - ms(direct, 50):6.3f} ms   p95 {ms(proxied, 95) - ms(direct, 95):6.3f} ms")
    alone, alone_proxied = await in_tunnel(Target(echo_port, None), 1), await in_tunnel(Target(echo_port, echo_route), 1)
    print(f"  one connection alone: added median {ms(alone_proxied, 50) - ms(alone, 50):6.3f} ms   "
          f"p95 {ms(alone_proxied, 95) - ms(alone, 95):6.3f} ms")
    direct = await new_connections(Target(echo_port, None))
    before = cpu_s(echo_proxy.pid)
    proxied = await new_connections(Target(echo_port, echo_route))
    per_connection = (cpu_s(echo_proxy.pid) - before) / (CONNECTIONS * NEW_CONNECTIONS)
    print(f"a new connection and one round trip ({NEW_CONNECTIONS} per client):")
    for name, values in (("direct", direct), ("proxied", proxied)):
        print(f"  {name:8} median {ms(values, 50):6.3f} ms   p95 {ms(values, 95):6.3f} ms")
    print(f"  added    median {ms(proxied, 50) - ms(direct, 50):6.3f} ms   p95 {ms(proxied, 95) - ms(direct, 95):6.3f} ms")
    print(f"  proxy CPU per new connection {per_connection * 1000:.2f} ms (at {CONNECTIONS} at once the"
          " connections queue for it)")
    before, started = cpu_s(sink_proxy.pid), time.perf_counter()
    await push(Target(sink_port, sink_route))
    used, wall = cpu_s(sink_proxy.pid) - before, time.perf_counter() - started
    mib = CONNECTIONS * PUSH_BYTES / 2**20
    print(f"relaying {mib:.0f} MiB: proxy CPU {used * 1000 / mib:.2f} ms per MiB, {mib / wall:.0f} MiB/s")
    for process in (echo_proxy, sink_proxy, upstream):
        process.kill()


if __name__ == "__main__":
    asyncio.run(main())
