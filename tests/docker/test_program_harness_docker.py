"""Program harnesses on a real Docker engine: the bash program under both network policies, the
provider key kept out of the container, only the endpoint reachable under ``none``, the deadline
kill leaving nothing behind, and ``files`` + ``setup`` under the default disk quota."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import textwrap
import uuid

import pytest

import prefect_rollouts as vf
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client
from tests.fakes.openai_server import reply, tool_call
from tests.support.docker import docker_config

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(120)]

KEY = f"sk-provider-KEY-{secrets.token_hex(6)}"   # per run: a probe of /proc must not find another run's
KEY_HEAD, KEY_TAIL = KEY[:16], KEY[16:]   # a command names the key in two pieces, so its own argv holds neither whole


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


def containers_of(run_id: str) -> list:
    return docker_client().containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.run_id={run_id}"})


class WroteHello(vf.Task):
    @vf.reward
    async def wrote_hello(self, runtime):
        try:
            return float(await runtime.read_file("out.txt") == b"hello\n")
        except FileNotFoundError:
            return 0.0


class Said(vf.Task):
    @vf.reward
    def said_done(self, trace):
        return float(trace.last_reply == "done")


@pytest.mark.parametrize("network", ["open", "none"])
async def test_the_bash_program_runs_in_the_container_and_is_recorded(openai_server, agent_config, network):
    openai_server.play([tool_call("bash", command="echo hello > out.txt && cat out.txt && hostname"), reply("done")])
    config = agent_config(harness="bash", runtime=docker_config(network=network))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(WroteHello(vf.TaskData(prompt="write hello to out.txt")))
    assert (trace.errors, trace.stop_condition, trace.reward) == ([], "agent_completed", 1.0)
    assert trace.last_reply == "done"
    assert [m["role"] for m in trace.messages] == ["user", "assistant", "tool", "assistant"]
    assert trace.messages[0]["content"] == "write hello to out.txt"
    assert trace.messages[2]["content"].startswith("exit_code: 0\nstdout:\nhello\n")
    host = trace.messages[2]["content"].split("\n")[3]
    assert host and host != socket.gethostname()   # it ran in the container (named by its id)
    # the scripted server's usage: 10 prompt tokens per request message, 1 completion token here
    assert [(c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in trace.model_calls] == \
        [(10, 1, "tool_calls"), (30, 1, "stop")]
    assert [r.body["model"] for r in openai_server.requests] == ["scripted", "scripted"]
    launch = trace.info["program"][0]
    assert (launch["exit_code"], launch["model_calls"], launch["stdout_tail"]) == (0, 2, "done\n")


# Writes the key (built from its two pieces by printf, a builtin: no argv holds it) to a pattern
# file outside the workspace, then counts the /proc files and workspace files holding it.
KEY_PROBE = (f"printf '%s%s' '{KEY_HEAD}' '{KEY_TAIL}' > /tmp/needle; "
             "echo proc=$(grep -l -F -f /tmp/needle /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | wc -l); "
             "echo workspace=$(grep -r -l -F -f /tmp/needle . 2>/dev/null | wc -l); "
             "echo endpoint=$(grep -r -l -F -f /tmp/needle /run/prefect-rollouts 2>/dev/null | wc -l); "
             "echo procs=$(ls -d /proc/[0-9]* | wc -l); "
             "rm /tmp/needle")


async def test_the_provider_key_is_nowhere_in_the_container(openai_server, agent_config):
    openai_server.play([tool_call("bash", command=KEY_PROBE), reply("done")])
    async with vf.make_agent(agent_config(harness="bash", runtime=docker_config())) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="look for the key")))
    assert (trace.errors, trace.reward) == ([], 1.0)
    out = trace.messages[2]["content"]
    counts = dict(line.split("=") for line in out.split("stdout:\n")[1].split("\n\nstderr:")[0].split())
    assert (counts["proc"], counts["workspace"], counts["endpoint"]) == ("0", "0", "0"), out
    assert int(counts["procs"]) >= 5   # the probe saw the program's processes (init, launcher, agent, bash, grep)
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in openai_server.requests)
    assert len(openai_server.requests) == 2
    assert KEY not in json.dumps(trace.model_dump(mode="json"))


# Each attempt prints "<target> ok" or "<target> <errno name>"; 3 s timeouts, so a drop would show as "timeout".
REACH_PROBE = """python3 - <<'EOF'
import errno, socket
for host, port in [("172.17.0.1", PORT), ("1.1.1.1", 53)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        print(host, "ok")
    except socket.timeout:
        print(host, "timeout")
    except OSError as exc:
        print(host, errno.errorcode.get(exc.errno, exc.errno))
    finally:
        s.close()
EOF"""


async def test_under_network_none_only_the_endpoint_is_reachable(openai_server, agent_config):
    port = int(openai_server.base_url.rsplit(":", 1)[1].split("/")[0])
    openai_server.play([tool_call("bash", command=REACH_PROBE.replace("PORT", str(port))), reply("done")])
    async with vf.make_agent(agent_config(harness="bash", runtime=docker_config(network="none"))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="reach out")))
    assert (trace.errors, trace.reward, len(trace.model_calls)) == ([], 1.0, 2)   # the model calls went through
    out = trace.messages[2]["content"].split("stdout:\n")[1].split("\n\nstderr:")[0]
    assert out.splitlines() == ["172.17.0.1 ENETUNREACH", "1.1.1.1 ENETUNREACH"]   # no route: loopback only
    assert len(openai_server.requests) == 2


class Observed(Said):
    """Records the container's processes (``docker top``, from the host: nothing added to the
    container) in ``trace.info["processes"]`` at finalize, before teardown."""

    async def finalize(self, trace, runtime):
        top = await asyncio.to_thread(docker_client().containers.get(runtime.id).top, ps_args="-o pid,args")
        trace.info["processes"] = [row[-1] for row in top["Processes"]]


async def test_the_agent_deadline_kills_the_program_and_leaves_only_the_keep_alive(openai_server, agent_config):
    harness = vf.HarnessConfig(id="program", command=["bash", "-c", "setsid sleep 1000 & sleep 1000"])
    config = agent_config(harness=harness, runtime=docker_config(), timeouts=vf.TimeoutConfig(agent=3))
    run_id = uuid.uuid4().hex
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.rollout(Observed(vf.TaskData(prompt="go")), {"run_id": run_id}).run(), 60)
    assert trace.stop_condition == "agent_timeout" and trace.is_timeout
    assert sorted(trace.info["processes"]) == ["/sbin/docker-init -- sleep infinity", "sleep infinity"]
    assert openai_server.requests == []
    assert containers_of(run_id) == []


AGENT_SH = r"""#!/bin/sh
# A user's agent: one chat-completions call with the turn's prompt, then print the reply.
set -e
if command -v curl >/dev/null 2>&1; then
  body=$(python3 -c 'import json, os; prompt = open(os.environ["PROMPT_FILE"]).read()
print(json.dumps({"model": "mine", "messages": [{"role": "user", "content": prompt}]}))')
  curl -sf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \
       -H "Content-Type: application/json" -d "$body" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
else
  python3 - <<'EOF'
import json, os, urllib.request
prompt = open(os.environ["PROMPT_FILE"]).read()
body = {"model": "mine", "messages": [{"role": "user", "content": prompt}]}
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                 {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                  "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"])
EOF
fi
"""


def my_agent(tmp_path, **fields) -> vf.HarnessConfig:
    folder = tmp_path / "my-agent"
    folder.mkdir(exist_ok=True)
    (folder / "agent.sh").write_text(textwrap.dedent(AGENT_SH))
    fields.setdefault("setup", ["chmod +x /tmp/my-agent/agent.sh"])
    return vf.HarnessConfig(id="program", command=["/tmp/my-agent/agent.sh"], files={"/tmp/my-agent": folder},
                            **fields)


async def test_files_and_setup_install_a_program_under_the_default_quota(openai_server, agent_config, tmp_path):
    openai_server.play([reply("done")])
    config = agent_config(harness=my_agent(tmp_path), runtime=docker_config())
    assert config.runtime.storage_mb > 0   # the default quota
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="hello from the task")))
    assert (trace.errors, trace.stop_condition, trace.reward) == ([], "agent_completed", 1.0)
    assert trace.messages == [{"role": "user", "content": "hello from the task"},
                              {"role": "assistant", "content": "done"}]
    assert len(trace.model_calls) == 1 and trace.info["program"][0]["stdout_tail"] == "done\n"
    sent = openai_server.requests[0]
    assert sent.body["model"] == "scripted" and sent.headers["authorization"] == f"Bearer {KEY}"
    assert trace.info["program_rewrites"][0]["imposed"]["model"] == {"program": "mine", "sent": "scripted"}


async def test_a_failing_setup_command_is_an_error_naming_it(openai_server, agent_config, tmp_path):
    config = agent_config(harness=my_agent(tmp_path, setup=["chmod +x /tmp/my-agent/agent.sh", "false"]),
                          runtime=docker_config())
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert trace.reward is None and len(trace.errors) == 1
    assert "[env.agent.harness] setup command 'false' exited with code 1" in trace.errors[0].message
    assert openai_server.requests == []


async def test_upload_reaches_any_place_of_the_writable_root_and_leaves_nothing_in_the_workspace(tmp_path):
    from prefect_rollouts.runtimes import make_runtime

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "run.sh").write_text("echo ran\n")
    (tree / "sub" / "run.sh").chmod(0o750)
    (tmp_path / "tool.toml").write_text("x = 1\n")
    runtime = make_runtime(docker_config())
    await runtime.start()
    try:
        await runtime.upload(tree, "/tmp/tree")
        await runtime.upload(tree, "/tmp/tree")          # again: merged over the first copy
        home = (await runtime.exec("echo $HOME")).stdout.strip()
        await runtime.upload(tmp_path / "tool.toml", f"{home}/.config/tool.toml")
        await runtime.upload(tmp_path / "tool.toml", "conf/tool.toml")   # in the workspace
        await runtime.upload(tree, "/usr/local/tree")    # issue 34: the root is writable under the quota
        seen = await runtime.exec("stat -c '%a %n' /tmp/tree/sub/run.sh; /tmp/tree/sub/run.sh; "
                                  "cat ~/.config/tool.toml conf/tool.toml; /usr/local/tree/sub/run.sh; ls -A")
        assert seen.stdout.splitlines() == ["750 /tmp/tree/sub/run.sh", "ran", "x = 1", "x = 1", "ran", "conf"]
    finally:
        await runtime.stop()
