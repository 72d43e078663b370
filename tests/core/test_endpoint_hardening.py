"""The interception endpoint against hostile programs: scripts a program replaces (the local runtime reads
them in place), and the endpoint's connection, request and body-memory limits."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses import endpoint_accept, endpoint_limits
from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
from prefect_rollouts.harnesses.programs import launch
from tests.core.test_program_harness import KEY, Said, program
from tests.fakes.openai_server import reply, tool_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


async def test_a_program_that_replaces_the_scripts_does_not_change_what_the_next_rollout_runs(
        openai_server, agent_config):
    async with vf.make_agent(agent_config(harness="bash")) as agent:
        directory = agent._services.endpoint.directory
        plant = (f"cd {directory}; chmod u+w . *.py; printf 'print(\"planted\")\\n' > bash_agent.py; "
                 "echo 'import sys; sys.exit(3)' > launch.py; ln -sf /etc/hostname mini_swe_agent.py")
        openai_server.play([tool_call("bash", command=plant), reply("first"), reply("done")])
        first = await agent.run(Said(vf.TaskData(prompt="plant")))
        second = await agent.run(Said(vf.TaskData(prompt="say done")))
    assert first.errors == [] and first.last_reply == "first"
    assert (second.errors, second.last_reply, second.reward) == ([], "done", 1.0)
    assert second.info["program"][0]["model_calls"] == 1 and second.info["program"][0]["stdout_tail"] == "done\n"


class Gate:
    """A stand-in ``ProgramSession``: ``exchange`` answers once ``opened`` is set, counting what it got."""

    def __init__(self, name: str) -> None:
        self.secret = f"sk-rollout-test-{name}"
        self.upstream_api = "chat"
        self.prompt, self.system_prompt = "p", None
        self.ctx = SimpleNamespace(trace=SimpleNamespace(info={}), config=SimpleNamespace(model="m"))
        self.opened = asyncio.Event()
        self.exchanges = 0
        self.upstream_api = "chat"   # ProgramSession.upstream_api

    async def exchange(self, body, raw, headers, translated=None, alternates=False):
        self.exchanges += 1
        await self.opened.wait()
        return 200, {"choices": [{"message": {"role": "assistant", "content": str(len(raw))}}]}

    def refused(self, method, path, status, reason):
        self.ctx.trace.info.setdefault("endpoint", {}).setdefault("refused", []).append((method, path, status))

    @property
    def limited(self) -> dict[str, int]:
        return self.ctx.trace.info.get("endpoint", {}).get("limited", {})


@pytest.fixture
async def endpoint():
    endpoint = InterceptionEndpoint()
    await endpoint.start()
    yield endpoint
    await endpoint.stop()


def gates(endpoint, *names):
    opened = [Gate(name) for name in names]
    for gate in opened:
        endpoint.open_session(gate)
    return opened


def chat(gate, size: int = 0) -> bytes:
    """A whole chat request of ``gate`` whose body is ``size`` bytes or a little more."""
    body = json.dumps({"messages": [{"role": "user", "content": "x" * size}]}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer {gate.secret}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def connect(endpoint):
    return await asyncio.open_unix_connection(str(endpoint.socket_path), limit=1 << 20)


async def answer(reader) -> tuple[int, dict]:
    """The status and JSON body of one response (its head's Content-Length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), json.loads(await reader.readexactly(length))


async def ask(endpoint, request: bytes) -> tuple[int, dict]:
    reader, writer = await connect(endpoint)
    writer.write(request)
    try:
        return await answer(reader)
    finally:
        writer.close()


async def test_a_connection_past_the_cap_in_all_gets_a_503_and_a_freed_slot_serves_again(endpoint):
    endpoint.limits.max_connections = 6
    (gate,) = gates(endpoint, "a")
    gate.opened.set()
    idle = [await connect(endpoint) for _ in range(6)]
    await until(lambda: _open(endpoint) == 6)
    status, body = await ask(endpoint, b"")   # refused before it could send its request
    assert (status, body["error"]["code"], body["error"]["type"]) == (503, "too_many_connections", "api_error")
    idle[0][1].close()
    await until(lambda: _open(endpoint) == 5)
    assert (await ask(endpoint, chat(gate)))[0] == 200
    assert endpoint.limits.refused == {"connections": 1}


async def until(predicate) -> None:
    assert await wait_for(predicate, 5, 0.01)


def _open(endpoint) -> int:
    return endpoint.limits.open


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\n"])
async def test_a_connection_without_a_whole_head_in_time_gets_a_408_and_is_closed(endpoint, monkeypatch, sent):
    monkeypatch.setattr(endpoint_accept, "HEAD_TIMEOUT_S", 0.2)
    reader, writer = await connect(endpoint)
    writer.write(sent)
    status, body = await answer(reader)
    assert (status, body["error"]["code"]) == (408, "head_timeout")
    assert await asyncio.wait_for(reader.read(), 5) == b""   # closed
    writer.close()
    assert endpoint.limits.refused == {"head_timeout": 1}


async def test_a_rollout_past_its_connections_gets_429_and_another_rollout_is_served(endpoint, monkeypatch):
    monkeypatch.setattr(endpoint_limits, "MAX_CONNECTIONS_PER_ROLLOUT", 3)
    flood, other = gates(endpoint, "flood", "other")
    other.opened.set()
    held = []
    for _ in range(3):
        reader, writer = await connect(endpoint)
        writer.write(chat(flood))
        held.append((reader, writer))
    await until(lambda: flood.exchanges == 3)
    status, body = await ask(endpoint, chat(flood))
    assert (status, body["error"]["code"]) == (429, "too_many_connections")
    assert (await ask(endpoint, chat(other)))[0] == 200
    flood.opened.set()
    assert [(await answer(reader))[0] for reader, _ in held] == [200, 200, 200]
    assert (flood.limited, other.limited) == ({"connections": 1}, {})


async def test_a_rollout_past_its_requests_in_flight_gets_429(endpoint, monkeypatch):
    monkeypatch.setattr(endpoint_limits, "MAX_IN_FLIGHT_PER_ROLLOUT", 2)
    (gate,) = gates(endpoint, "a")
    first = [asyncio.ensure_future(ask(endpoint, chat(gate))) for _ in range(2)]
    await until(lambda: gate.exchanges == 2)
    status, body = await ask(endpoint, chat(gate))
    assert (status, body["error"]["code"], body["error"]["type"]) == (429, "too_many_requests", "invalid_request_error")
    gate.opened.set()
    assert [(await job)[0] for job in first] == [200, 200]
    assert (await ask(endpoint, chat(gate)))[0] == 200
    assert gate.limited == {"in_flight": 1}
    assert gate.ctx.trace.info["endpoint"]["refused"] == [("POST", "/v1/chat/completions", 429)]   # listed too


async def test_many_large_bodies_at_once_wait_for_room_and_at_most_the_budget_is_held(endpoint, monkeypatch):
    size = 1 << 20
    monkeypatch.setattr(endpoint_limits, "MAX_BODIES_BYTES", 4 * (size + 100))   # four bodies; two per rollout
    rollouts = gates(endpoint, *"abcdef")
    jobs = [asyncio.ensure_future(ask(endpoint, chat(gate, size))) for gate in rollouts for _ in range(2)]
    await until(lambda: sum(gate.exchanges for gate in rollouts) == 4)
    await asyncio.sleep(0.1)   # the other eight wait, holding nothing
    assert sum(gate.exchanges for gate in rollouts) == 4
    assert endpoint.limits.held_bytes == endpoint.limits.held_peak <= endpoint_limits.MAX_BODIES_BYTES
    for gate in rollouts:
        gate.opened.set()
    assert [(await job)[0] for job in jobs] == [200] * 12
    assert endpoint.limits.held_bytes == 0 and endpoint.limits.held_peak <= endpoint_limits.MAX_BODIES_BYTES
    assert endpoint.limits.refused == {}


async def test_a_body_that_finds_no_room_in_time_gets_a_503_and_one_past_its_rollouts_share_a_429(
        endpoint, monkeypatch):
    size = 1 << 20
    monkeypatch.setattr(endpoint_limits, "MAX_BODIES_BYTES", 4 * (size + 100))
    monkeypatch.setattr(endpoint_limits, "BODY_WAIT_S", 0.2)
    a, b, c = gates(endpoint, "a", "b", "c")
    held = [asyncio.ensure_future(ask(endpoint, chat(gate, size))) for gate in (a, a, b, b)]
    await until(lambda: a.exchanges + b.exchanges == 4)
    status, body = await ask(endpoint, chat(a, size))
    assert (status, body["error"]["code"]) == (429, "body_memory")
    status, body = await ask(endpoint, chat(c, size))
    assert (status, body["error"]["code"], body["error"]["type"]) == (503, "body_memory", "api_error")
    a.opened.set()
    b.opened.set()
    assert [(await job)[0] for job in held] == [200] * 4
    assert (a.limited, c.limited, endpoint.limits.held_bytes) == ({"body_memory": 1}, {"body_memory": 1}, 0)


async def test_a_body_that_trickles_past_its_deadline_gets_a_408(endpoint, monkeypatch):
    monkeypatch.setattr(endpoint_limits, "BODY_TIMEOUT_S", 0.3)
    (gate,) = gates(endpoint, "a")
    reader, writer = await connect(endpoint)
    writer.write(chat(gate, 1000)[:-500])
    status, body = await answer(reader)
    writer.close()
    assert (status, body["error"]["code"]) == (408, "body_timeout")
    assert gate.limited == {"body_timeout": 1} and gate.exchanges == 0 and endpoint.limits.held_bytes == 0


FLOOD_THE_RELAY = """
    import http.client, json, os, select, socket, time, urllib.error, urllib.request
    port = int(os.environ["OPENAI_BASE_URL"].rsplit(":", 1)[1].split("/")[0])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    closed, deadline = set(), time.monotonic() + 5
    while len(closed) < EXPECTED and time.monotonic() < deadline:   # the relay closes those past its cap
        readable, _, _ = select.select([conn for conn in held if conn not in closed], [], [], 0.1)
        closed.update(conn for conn in readable if conn.recv(1) == b"")
    print("closed", len(closed))
    for conn in held:
        conn.close()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
                                     {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    for attempt in range(50):   # the relay frees a closed connection's slot a moment later, as SDKs retry
        try:
            print(json.load(urllib.request.urlopen(request, timeout=10))["choices"][0]["message"]["content"])
            break
        except (ConnectionError, http.client.RemoteDisconnected, urllib.error.URLError):
            time.sleep(0.1)
"""


async def test_the_launchers_relay_closes_connections_past_its_cap_and_still_relays(
        openai_server, agent_config, tmp_path):
    openai_server.play([reply("done")])
    flood = FLOOD_THE_RELAY.replace("EXPECTED", str(40 - launch.MAX_RELAYED))
    async with vf.make_agent(agent_config(harness=program(tmp_path, flood))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="flood")))
    assert trace.errors == [] and trace.reward == 1.0
    assert trace.info["program"][0]["stdout_tail"] == f"closed {40 - launch.MAX_RELAYED}\ndone\n"


def door(endpoint, gate) -> str:
    """``gate`` opened on a door of its own; the path of its socket."""
    opened = endpoint.new_door()
    endpoint.open_session(gate, opened)
    return str(opened / "s")


async def test_a_rollout_holding_idle_connections_on_its_door_takes_none_from_another_rollout(endpoint, monkeypatch):
    monkeypatch.setattr(endpoint_limits, "MAX_CONNECTIONS_PER_ROLLOUT", 4)
    endpoint.limits.max_connections = 8   # a share of 4 for each of the two doors
    flood, other = Gate("flood"), Gate("other")
    flood_socket, other_socket = door(endpoint, flood), door(endpoint, other)
    other.opened.set()
    held = [await asyncio.open_unix_connection(flood_socket) for _ in range(10)]   # no request on any
    await until(lambda: flood.limited.get("connections") == 6)
    assert _open(endpoint) == 4
    refusals = [await answer(reader) for reader, _ in held[4:]]
    assert {(status, body["error"]["code"]) for status, body in refusals} == {(429, "too_many_connections")}
    reader, writer = await asyncio.open_unix_connection(other_socket)
    writer.write(chat(other))
    assert (await answer(reader))[0] == 200
    writer.close()
    for _, writer in held:
        writer.close()
    assert other.limited == {} and endpoint.limits.refused == {"connections": 6}


async def test_a_door_serves_its_own_launch_only_and_closes_with_it(endpoint):
    mine, theirs = Gate("mine"), Gate("theirs")
    socket_path = door(endpoint, mine)
    endpoint.open_session(theirs)
    status, body = await ask_at(socket_path, chat(theirs))
    assert (status, body["error"]["code"]) == (401, "invalid_api_key") and theirs.exchanges == 0
    endpoint.close_session(mine)
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(socket_path)


async def ask_at(path: str, request: bytes) -> tuple[int, dict]:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(request)
    try:
        return await answer(reader)
    finally:
        writer.close()


async def test_doors_that_fill_the_cap_in_all_leave_a_new_door_its_share_and_a_refusal_is_read_not_reset(
        endpoint):
    endpoint.limits.max_connections = 8
    flood = [Gate(f"flood{index}") for index in range(4)]
    sockets = [door(endpoint, gate) for gate in flood]   # a share of 2 each
    held = [await asyncio.open_unix_connection(path) for path in sockets for _ in range(2)]
    await until(lambda: _open(endpoint) == 8)
    reader, writer = await asyncio.open_unix_connection(sockets[0])   # past its share: refused at its door
    await until(lambda: flood[0].limited == {"connections": 1})
    writer.write(chat(flood[0]))   # the client writes after the refusal: it still reads it
    status, body = await answer(reader)
    writer.close()
    assert (status, body["error"]["code"]) == (429, "too_many_connections")
    late = Gate("late")
    late.opened.set()
    assert (await ask_at(door(endpoint, late), chat(late)))[0] == 200   # served past the cap, within its share
    reader, writer = await connect(endpoint)   # the host's socket: past the cap in all
    await until(lambda: endpoint.limits.refused["connections"] == 2)
    writer.write(chat(late))
    assert (await answer(reader))[0] == 503
    writer.close()
    for _, writer in held:
        writer.close()
    assert late.limited == {} and [gate.limited for gate in flood[1:]] == [{}, {}, {}]


async def test_the_descriptor_limit_is_raised_to_the_hard_one(monkeypatch):
    set_to = []
    monkeypatch.setattr(endpoint_limits.resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(endpoint_limits.resource, "setrlimit", lambda kind, limits: set_to.append(limits))
    endpoint_limits.EndpointLimits()
    assert set_to == [(4096, 4096)]


@pytest.mark.parametrize(("path", "key", "status"), [
    ("/v1/chat/completions", False, 401), ("/v1/embeddings", True, 404)])
async def test_a_refused_request_whose_body_trickles_is_answered_and_closed(endpoint, monkeypatch, path, key, status):
    monkeypatch.setattr(endpoint_limits, "DRAIN_S", 0.2)
    gate = Gate("a")
    reader, writer = await asyncio.open_unix_connection(door(endpoint, gate))
    authorization = f"Authorization: Bearer {gate.secret}\r\n" if key else ""
    writer.write(f"POST {path} HTTP/1.1\r\nHost: e\r\n{authorization}Transfer-Encoding: chunked\r\n\r\n1\r\n[\r\n"
                 .encode())   # and no more: a trickle
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode().lower()
    assert head.startswith(f"http/1.1 {status}") and "connection: close" in head
    await asyncio.wait_for(reader.read(), 5)   # then closed: read returns at its end
    assert reader.at_eof()
    writer.close()


async def test_a_request_without_a_key_has_the_body_deadline(endpoint, monkeypatch):
    monkeypatch.setattr(endpoint_limits, "BODY_TIMEOUT_S", 0.3)
    reader, writer = await connect(endpoint)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 100\r\n\r\n{")
    status, body = await answer(reader)
    writer.close()
    assert (status, body["error"]["code"]) == (408, "body_timeout") and endpoint.limits.refused == {"body_timeout": 1}
