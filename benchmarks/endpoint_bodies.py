"""What many large request bodies at once cost the interception endpoint: peak memory, with its budget.

40 requests of 31 MB each (the issue-32 flood), sent at once over 10 rollouts' sockets to an
endpoint in a process of its own, whose sessions answer each after 0.3 s without a model. Prints
every status, the endpoint process's peak RSS, and the most body bytes the endpoint held at once
by its own accounting (``EndpointLimits.held_peak``, bounded by ``MAX_BODIES_BYTES``). Before the
budget (b8932ee) every body was read at once: 1,846 MB peak RSS here, against 442 MB with it
(118 MiB held at most; all 40 answered 200 after waiting their turn).

Usage: ``.venv/bin/python benchmarks/endpoint_bodies.py``
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import resource
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

REQUESTS, ROLLOUTS, BODY_BYTES = 40, 10, 31 * 1000 * 1000


class Session:
    """A stand-in ``ProgramSession`` that answers after 0.3 s."""

    def __init__(self, index: int) -> None:
        self.secret, self.prompt, self.system_prompt = f"sk-rollout-bench-{index}", "p", None
        self.ctx = SimpleNamespace(trace=SimpleNamespace(info={}), config=SimpleNamespace(model="m"))

    async def exchange(self, body: Any, raw: bytes, headers: Any) -> tuple[int, dict[str, Any]]:
        await asyncio.sleep(0.3)
        return 200, {"choices": [{"message": {"role": "assistant", "content": str(len(raw))}}]}


def serve(pipe: Connection) -> None:
    from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint

    async def main() -> None:
        endpoint = InterceptionEndpoint()
        await endpoint.start()
        doors = []
        for index in range(ROLLOUTS):
            session, door = Session(index), endpoint.new_door()
            endpoint.open_session(session, door)   # type: ignore[arg-type]
            doors.append((session.secret, str(door / "s")))
        pipe.send(doors)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
        pipe.send((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, endpoint.limits.held_peak,
                   dict(endpoint.limits.refused)))
        await endpoint.stop()
    asyncio.run(main())


async def ask(secret: str, path: str, body: bytes) -> int:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer {secret}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    return int(head.split()[1])


async def main() -> None:
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(theirs,))
    server.start()
    doors = ours.recv()
    body = json.dumps({"messages": [{"role": "user", "content": "x" * BODY_BYTES}]}).encode()
    statuses = await asyncio.gather(*(ask(*doors[index % ROLLOUTS], body) for index in range(REQUESTS)))
    ours.send("done")
    rss_mb, held_peak, refused = ours.recv()
    server.join()
    print(f"{REQUESTS} requests of {len(body) / 1e6:.0f} MB over {ROLLOUTS} rollouts: statuses "
          f"{dict(sorted((s, statuses.count(s)) for s in set(statuses)))}, refused {refused}")
    print(f"endpoint process peak RSS {rss_mb} MB; body bytes held at most {held_peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
