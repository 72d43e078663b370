"""How fast the scripted OpenAI server the tests run against answers (``tests/fakes/openai_server.py``):
the figures its unit tests used to assert as wall-clock bounds (the tests now assert what happens: the
connection is reused, requests overlap, a delayed step is late).

- ``50 calls, one kept-alive connection``: 50 chat calls in a row on one httpx connection, with the
  server's ``TCP_NODELAY`` (as the tests run it) and without (``--nagle`` adds that row: the delayed-ACK
  stall, about 40 ms a call, that the option avoids; the old test's bound was 1.5 s);
- ``20 calls of a 50 ms step at once``: 20 threads, a connection each; the server handles them in
  parallel (about 0.05 s) rather than one after another (1 s; the old bound);
- ``delayed(0.3)``: how late a 0.3 s delayed step answers (the old test's bound was 5 s).

    .venv/bin/python benchmarks/scripted_server.py [--runs 5] [--nagle]

Prints each case's median and largest wall seconds over ``--runs``, and the load average around them.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.fakes import openai_server
from tests.fakes.openai_server import ScriptedOpenAIServer, delayed, reply

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def kept_alive(server: ScriptedOpenAIServer) -> float:
    server.reset()
    server.default = reply("ok")
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        client.post("/chat/completions", json=BODY)   # the connection is open before the clock starts
        return timed(lambda: [client.post("/chat/completions", json=BODY) for _ in range(50)])


def at_once(server: ScriptedOpenAIServer, n: int = 20) -> float:
    server.reset()
    server.play([delayed(0.05, reply(f"step {i}")) for i in range(n)])
    with httpx.Client(base_url=server.base_url, timeout=10, limits=httpx.Limits(max_connections=n)) as client, \
            ThreadPoolExecutor(n) as pool:
        return timed(lambda: list(pool.map(lambda _: client.post("/chat/completions", json=BODY), range(n))))


def late(server: ScriptedOpenAIServer) -> float:
    server.reset()
    server.play([delayed(0.3, reply("late"))])
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        return timed(lambda: client.post("/chat/completions", json=BODY))


def without_nodelay() -> Callable[[], None]:
    """Make the server's handler leave Nagle's algorithm on; return the undo."""
    handler = openai_server._Handler
    original = handler.setup

    def setup(self: openai_server._Handler) -> None:
        original(self)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    handler.setup = setup   # type: ignore[method-assign]
    return lambda: setattr(handler, "setup", original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nagle", action="store_true", help="also time the kept-alive calls without TCP_NODELAY")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    seen: dict[str, list[float]] = {}
    with ScriptedOpenAIServer() as server:
        for _ in range(args.runs):
            seen.setdefault("50 calls, one kept-alive connection", []).append(kept_alive(server))
            seen.setdefault("20 calls of a 50 ms step at once", []).append(at_once(server))
            seen.setdefault("delayed(0.3)", []).append(late(server))
    if args.nagle:
        undo = without_nodelay()
        try:
            with ScriptedOpenAIServer() as server:
                seen["50 calls, without TCP_NODELAY"] = [kept_alive(server) for _ in range(args.runs)]
        finally:
            undo()
    print(f"{'case':36} {'median s':>9} {'max s':>7}   ({args.runs} runs)")
    for name, seconds in seen.items():
        print(f"{name:36} {statistics.median(seconds):9.3f} {max(seconds):7.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
