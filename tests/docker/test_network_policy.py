"""Issue 23 on a real Docker engine: ``{ allow, block }`` enforced by the egress proxy and the guard.

The "allowed" and "blocked" servers are containers on a Docker network the test makes; the egress proxies
of this process resolve their names through the resolver the module sets (``egress_address.use_resolver``),
not through /etc/hosts, which no test edits. No traffic leaves the machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from functools import partial
from pathlib import Path

import httpx
import pytest

import prefect_rollouts as vf
from prefect_rollouts.runtimes import make_runtime
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client
from prefect_rollouts.runtimes.egress.address import hosts_resolver, use_resolver
from prefect_rollouts.runtimes.egress.proxy import EgressProxy
from prefect_rollouts.traces import TraceWriter, read_network
from tests.fakes.openai_server import reply, tool_call
from tests.support.docker import docker_config as runtime_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]

# An HTTP server on 8080 and an HTTPS one (a self-signed certificate for its name) on 8443, each
# answering "<name> <path>".
_SERVE = textwrap.dedent("""\
    import http.server, ssl, subprocess, sys, threading
    name = sys.argv[1]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "/tmp/k", "-out",
                    "/tmp/c", "-days", "1", "-subj", "/CN=" + name], check=True, capture_output=True)
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"{name} {self.path}".encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    plain = http.server.ThreadingHTTPServer(("", 8080), Answer)
    secure = http.server.ThreadingHTTPServer(("", 8443), Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); context.load_cert_chain("/tmp/c", "/tmp/k")
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    threading.Thread(target=secure.serve_forever, daemon=True).start()
    plain.serve_forever()
""")

# Prints "<status> <body>" of a GET through the proxy variables, or "error <reason>".
_GET = textwrap.dedent("""\
    import ssl, sys, urllib.error, urllib.request
    try:
        answer = urllib.request.urlopen(sys.argv[1], timeout=10, context=ssl._create_unverified_context())
        print(answer.status, answer.read().decode())
    except urllib.error.HTTPError as exc:
        print(exc.code, exc.read().decode().strip())
    except Exception as exc:
        print("error", exc)
""")

# Connects straight to an address, past the proxy: prints "connected" or "refused <reason>".
_DIRECT = textwrap.dedent("""\
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        print("connected")
    except OSError as exc:
        print("refused", exc)
""")


docker_config = partial(runtime_config, exec_timeout_s=30)


@pytest.fixture(scope="module")
def servers():
    """``{"allowed.test": address, "blocked.test": address, "network": its name}``: two server
    containers on a network of the test's own, their names resolved by every egress proxy of this
    process while the module runs (``use_resolver``)."""
    client = docker_client()
    tag = uuid.uuid4().hex[:8]
    network = client.networks.create(f"pr-net-{tag}", driver="bridge", labels={f"{LABEL}.test": "1"})
    made, addresses = [], {}
    try:
        for name in ("allowed.test", "blocked.test"):
            made.append(server := client.containers.run(
                vf.RuntimeConfig().image, ["python3", "-c", _SERVE, name], detach=True, network=network.name,
                labels={f"{LABEL}.test": "1"}, name=f"pr-{name.split('.')[0]}-{tag}"))
            server.reload()
            addresses[name] = server.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        for name, address in addresses.items():   # each answers from this machine before a test relies on it
            assert wait_until(lambda name=name, address=address: answers(address, name),
                              timeout_s=60, interval_s=0.5, what=f"{name} to answer")
        with use_resolver(hosts_resolver(addresses)):
            yield {**addresses, "network": network.name}
    finally:
        for server in made:
            server.remove(force=True)
        network.remove()


def answers(address: str, name: str) -> bool:
    """True when the server at ``address`` answers ``GET /ready`` as ``name`` (straight, no proxy)."""
    try:
        return httpx.get(f"http://{address}:8080/ready", timeout=5, trust_env=False).text == f"{name} /ready"
    except httpx.HTTPError:
        return False


def python(script: str, *args: str) -> str:
    """A shell command running ``script`` with ``args`` (``script`` holds no single quote)."""
    assert "'" not in script
    return " ".join(["python3", "-c", f"'{script}'", *args])


async def out(runtime, command: str) -> str:
    result = await runtime.exec(command, timeout=40)
    return (result.stdout.strip() or result.stderr.strip()[-300:])


async def test_the_allowed_server_answers_and_everything_else_is_refused(servers):
    egress = EgressProxy()
    policy = {"allow": ["allowed.test:8080", "https://allowed.test:8443"], "block": ["blocked.test"]}
    runtime = make_runtime(docker_config(network=policy), egress=egress)
    await runtime.start()
    try:
        get = _GET.replace("'", '"')
        assert await out(runtime, python(get, "http://allowed.test:8080/simple")) == "200 allowed.test /simple"
        assert await out(runtime, python(get, "https://allowed.test:8443/x")) == "200 allowed.test /x"
        refused = await out(runtime, python(get, "http://blocked.test:8080/"))
        assert refused.startswith("403 prefect-rollouts egress proxy: GET blocked.test:8080 denied: blocked by rule "
                                  "'blocked.test'"), refused
        assert (await out(runtime, python(get, "https://blocked.test:8443/"))).startswith("error")   # CONNECT refused
        assert (await out(runtime, python(get, "http://allowed.test:9999/"))).startswith("403")      # not that port
        direct = _DIRECT.replace("'", '"')
        for address in (servers["allowed.test"], servers["blocked.test"]):   # past the proxy: no route
            assert (await out(runtime, python(direct, address, "8080"))).startswith("refused")
        gateway, port = runtime._net["proxy"]
        assert (await out(runtime, python(direct, gateway, "22"))).startswith("refused")    # the host: the proxy only
        assert (await out(runtime, python(direct, gateway, str(port)))) == "connected"
        resolve = ('import socket\ntry:\n    print(socket.getaddrinfo("blocked.test", 80))\n'
                   'except OSError as e:\n    print("no", e)')
        assert (await out(runtime, python(resolve))).startswith("no")   # DNS gives nothing
        undo = await runtime.exec("iptables -F OUTPUT && ip link set eth0 down", timeout=30)
        assert undo.exit_code != 0                                           # NET_ADMIN is dropped
        assert (await out(runtime, python(direct, servers["blocked.test"], "8080"))).startswith("refused")
        ipv6 = await out(runtime, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
        assert ipv6 == "1"
        log = [(r.method, r.host, r.port, r.allowed, r.sni) for r in runtime.egress_route.records]
    finally:
        await runtime.stop()
        await egress.stop()
    assert ("GET", "allowed.test", 8080, True, None) in log
    assert ("CONNECT", "allowed.test", 8443, True, "allowed.test") in log
    assert ("GET", "blocked.test", 8080, False, None) in log and ("CONNECT", "blocked.test", 8443, False, None) in log
    assert sum(not allowed for _, _, _, allowed, _ in log) == 3


async def test_star_does_not_reach_a_container_of_this_machine_but_a_rule_naming_it_does(servers):
    """Issue 32 (adversarial pass, e5): ``allow = ["*"]`` fetched a page from a container beside the box
    (another box under ``open``, a service's container), by its address and by its decimal form."""
    egress = EgressProxy()
    address = servers["allowed.test"]
    decimal = str(int.from_bytes(bytes(int(part) for part in address.split(".")), "big"))
    star = make_runtime(docker_config(network={"allow": ["*"]}), egress=egress)
    exact = make_runtime(docker_config(network={"allow": [f"{address}:8080"]}), egress=egress)
    await star.start()
    await exact.start()
    try:
        get = _GET.replace("'", '"')
        refused = [await out(star, python(get, f"http://{host}:8080/")) for host in (address, decimal, "allowed.test")]
        named = await out(exact, python(get, f"http://{address}:8080/named"))
    finally:
        await star.stop()
        await exact.stop()
        await egress.stop()
    for host, answer in zip((address, decimal, "allowed.test"), refused, strict=True):
        assert answer.startswith(f"403 prefect-rollouts egress proxy: {host}:8080 denied: {host} resolves to "
                                 f"{address}, an address on one of this machine's bridges"), answer
    assert named == "200 allowed.test /named"


async def test_on_the_servers_own_network_neither_their_addresses_nor_dockers_dns_are_reachable(servers):
    """A user-defined ``docker_network``: its peers are on the container's own link, and Docker's DNS
    server on the container's loopback (127.0.0.11) would answer names, or forward them outside."""
    egress = EgressProxy()
    runtime = make_runtime(docker_config(network={"allow": ["allowed.test:8080"]}, docker_network=servers["network"]),
                           egress=egress)
    await runtime.start()
    try:
        peer = f"pr-allowed-{servers['network'].rsplit('-', 1)[1]}"
        resolved = await runtime.exec(f"cat /etc/resolv.conf; getent hosts {peer}", timeout=30)
        direct = await out(runtime, python(_DIRECT.replace("'", '"'), servers["blocked.test"], "8080"))
        through = await out(runtime, python(_GET.replace("'", '"'), "http://allowed.test:8080/peer"))
    finally:
        await runtime.stop()
        await egress.stop()
    assert "127.0.0.11" in resolved.stdout and resolved.exit_code != 0, resolved   # Docker's DNS, refused
    assert direct.startswith("refused") and through == "200 allowed.test /peer"


async def test_a_tunnel_to_an_allowed_host_cannot_carry_a_blocked_server_name(servers):
    egress = EgressProxy()
    runtime = make_runtime(docker_config(network={"allow": ["allowed.test:8443"], "block": ["blocked.test"]}),
                           egress=egress)
    await runtime.start()
    try:   # the tunnel goes to allowed.test, the TLS handshake names blocked.test (domain fronting)
        fronting = ('import os, socket, ssl, urllib.parse\n'
                    'proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])\n'
                    'import base64\n'
                    'auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()\n'
                    's = socket.create_connection((proxy.hostname, proxy.port), timeout=10)\n'
                    's.sendall(f"CONNECT allowed.test:8443 HTTP/1.1\\r\\nProxy-Authorization: Basic {auth}\\r\\n\\r\\n"'
                    '.encode())\n'
                    'print(s.recv(100).split(b"\\r\\n")[0].decode())\n'
                    'tls = ssl._create_unverified_context()\n'
                    'try:\n    tls.wrap_socket(s, server_hostname="blocked.test"); print("handshake")\n'
                    'except (OSError, ssl.SSLError) as e:\n    print("closed")')
        result = await out(runtime, python(fronting))
        records = list(runtime.egress_route.records)
    finally:
        await runtime.stop()
        await egress.stop()
    assert result.splitlines() == ["HTTP/1.1 200 Connection established", "closed"]
    (record,) = records
    assert (record.host, record.sni, record.allowed) == ("allowed.test", "blocked.test", False)
    assert "TLS server name 'blocked.test'" in record.reason


class Reached(vf.Task):
    """Scores whether the scoring phase reaches the allowed server (under ``none`` it must not)."""

    @vf.metric
    async def scoring_reached(self, runtime):
        answer = await out(runtime, python(_GET.replace("'", '"'), "http://allowed.test:8080/from-scoring"))
        return float(answer.startswith("200"))

    @vf.reward
    def ran(self, trace):
        return 1.0


async def test_the_agent_reaches_the_allowed_host_scoring_under_none_reaches_nothing_and_the_log_is_in_parquet(
        servers, openai_server, agent_config, tmp_path):
    get = _GET.replace("'", '"')
    openai_server.play([tool_call("bash", command=python(get, "http://allowed.test:8080/agent") + "; " +
                                  python(get, "http://blocked.test:8080/agent")), reply("done")])
    config = agent_config(runtime=docker_config(network={"allow": ["allowed.test:8080"]}),
                          scoring={"network": "none"})
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Reached(vf.TaskData(prompt="probe")))
        proxy = agent._services.egress
        assert proxy._servers   # it listened
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert "200 allowed.test /agent" in trace.tool_calls[0].output and "403" in trace.tool_calls[0].output
    assert trace.metrics["scoring_reached"] == 0.0
    assert [(r.phase, r.host, r.allowed) for r in trace.network] == [("agent", "allowed.test", True),
                                                                     ("agent", "blocked.test", False)]
    assert "rollout-egress-" not in trace.model_dump_json()   # the credential is scrubbed from tool output
    left = docker_client().containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.rollout_id={trace.id}"})
    assert left == []   # the rollout's container and its guard helpers are gone, the proxy stopped with the agent
    assert proxy._servers == {} and proxy._routes == {}   # stopped with the agent
    writer = TraceWriter(tmp_path, run_id="net")
    writer.add(trace, rollout_index=0, environment="probe", config_hash="h", elapsed_s=1.0)
    writer.flush()
    log = read_network(tmp_path, run_id="net")
    assert log[["task_id", "phase", "host", "port", "allowed"]].values.tolist() == [
        [trace.task_id, "agent", "allowed.test", 8080, True], [trace.task_id, "agent", "blocked.test", 8080, False]]
    assert log.loc[0, "bytes_received"] > 0 and str(log["started_at"].dt.tz) == "UTC"


async def test_the_program_harness_endpoint_works_under_allow_nothing(openai_server, agent_config):
    """The program reaches the model through the endpoint (two calls) while its own request out is refused."""
    probe = python(_GET.replace("'", '"'), "http://allowed.test:8080/program")
    openai_server.play([tool_call("bash", command=probe), reply("done")])
    config = agent_config(harness="bash", runtime=docker_config(network={"allow": []}))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="fetch it")))
    assert (trace.errors, trace.stop_condition, trace.last_reply) == ([], "agent_completed", "done")
    assert len(trace.model_calls) == 2   # the endpoint is on loopback, never proxied
    assert [(r.phase, r.host, r.allowed, r.reason) for r in trace.network] == [
        ("agent", "allowed.test", False, "allow = [] lets nothing through")]
    assert "403 prefect-rollouts egress proxy" in json.dumps(trace.messages)   # what the program saw


_HOLD = textwrap.dedent("""\
    import asyncio, sys
    import prefect_rollouts as vf
    from prefect_rollouts.runtimes import make_runtime
    from prefect_rollouts.runtimes.egress.proxy import EgressProxy
    async def main():
        runtime = make_runtime(vf.RuntimeConfig(type="docker", network={"allow": []}), egress=EgressProxy(),
                               labels={"run_id": sys.argv[1]})
        await runtime.start()
        print("started", flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
""")


@pytest.mark.serial   # the janitor sweeps every container and workspace of this machine
@pytest.mark.usefixtures("prefect_harness")
async def test_a_killed_owner_leaves_nothing_the_janitor_does_not_remove():
    from prefect_rollouts.flows.janitor import janitor_flow

    run_id = f"net-{uuid.uuid4().hex[:8]}"
    owner = await asyncio.create_subprocess_exec(sys.executable, "-c", _HOLD, run_id, stdout=subprocess.PIPE,
                                                 env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert owner.stdout is not None and (await asyncio.wait_for(owner.stdout.readline(), 120)).strip() == b"started"
    os.kill(owner.pid, signal.SIGKILL)   # with its container guarded and its proxy listening
    await owner.wait()
    client = docker_client()

    def left() -> list:
        return client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.run_id={run_id}"})
    assert len(left()) == 1   # the rollout's container; its guard helper was gone before
    removed = await janitor_flow(max_age_minutes=180)
    assert left() == [] and len(removed) >= 1


async def test_a_harbor_allowlist_holds_per_phase(servers, agent_config, tmp_path):
    """Issue 23, part 5: ``allowlist`` for the agent phase, ``no-network`` for the verifier."""
    from tests.docker.test_harbor_docker import harbor_config, run_all, task_dir

    get = _GET.replace("'", '"')
    fetch = python(get, "http://allowed.test:8080/solve") + " > /app/allowed.txt; " + \
        python(get, "http://blocked.test:8080/solve") + " > /app/blocked.txt\n"
    check = ('grep -q "^200 allowed.test /solve" /app/allowed.txt && grep -q "^403" /app/blocked.txt && '
             f'! {python(get, "http://allowed.test:8080/verifier")} | grep -q "^200" && '
             'echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
    toml = ('version = "1.0"\n[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["allowed.test:8080"]\n'
            '[verifier]\nnetwork_mode = "no-network"\n')
    task_dir(tmp_path, "listed", toml=toml, solve_sh=fetch, test_sh=check)
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["listed"]
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert trace.info["harbor"]["network"] == {"agent": {"allow": ["allowed.test:8080"], "block": []},
                                               "verifier": "none"}
    assert [(r.phase, r.host, r.allowed) for r in trace.network] == [("agent", "allowed.test", True),
                                                                     ("agent", "blocked.test", False)]
