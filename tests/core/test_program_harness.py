"""Program harnesses on the local runtime: the bash program and a program of the user's, through the
interception endpoint (real processes, real sockets, the scripted server upstream)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import textwrap

import psutil
import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.local import LocalRuntime
from tests.fakes.openai_server import reply, status, tool_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit

KEY = f"sk-provider-KEY-{secrets.token_hex(6)}"   # per run: a probe of /proc must not find another run's


class Said(vf.Task):
    @vf.reward
    def said_done(self, trace):
        return float(trace.last_reply == "done")


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


def program(tmp_path, source: str, **fields):
    """A ``program`` harness running ``source`` (Python) copied into the workspace as agent.py."""
    agent_dir = tmp_path / "my-agent"
    agent_dir.mkdir(exist_ok=True)
    (agent_dir / "agent.py").write_text(textwrap.dedent(source))
    return vf.HarnessConfig(id="program", command=[sys.executable, ".agent/agent.py"],
                            files={".agent": agent_dir}, **fields)


CALL_ONCE = """
    import json, os, urllib.request
    prompt = open(os.environ["PROMPT_FILE"]).read()
    body = {"model": "their-model", "temperature": 1.7, "max_tokens": 99999,
            "messages": [{"role": "system", "content": "mine"}, {"role": "user", "content": prompt}]}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                     {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                      "Content-Type": "application/json"})
    print(json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"])
"""


async def test_the_bash_program_is_recorded_and_scored_like_the_tools_loop(openai_server, agent_config):
    traces = {}
    for harness in ("bash", "tools"):
        openai_server.reset()
        openai_server.play([tool_call("bash", command="echo hello > out.txt && cat out.txt"), reply("done")])
        async with vf.make_agent(agent_config(harness=harness)) as agent:
            traces[harness] = await agent.run(Said(vf.TaskData(prompt="write out.txt")))
    program, loop = traces["bash"], traces["tools"]
    assert program.errors == [] and program.stop_condition == "agent_completed" and program.reward == 1.0
    assert [m["role"] for m in program.messages] == [m["role"] for m in loop.messages] == \
        ["user", "assistant", "tool", "assistant"]
    assert program.messages[2]["content"].startswith("exit_code: 0\nstdout:\nhello")
    assert [c.finish_reason for c in program.model_calls] == [c.finish_reason for c in loop.model_calls]
    assert program.usage == loop.usage and program.last_reply == loop.last_reply == "done"
    launch = program.info["program"][0]
    assert launch["exit_code"] == 0 and launch["model_calls"] == 2 and launch["stdout_tail"] == "done\n"
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"   # upstream: the provider key


async def test_a_finished_rollout_leaves_no_door_behind(openai_server, agent_config):
    openai_server.play([reply("done")] * 3)
    async with vf.make_agent(agent_config(harness="bash")) as agent:
        sockets = agent._services.endpoint.sockets
        for _ in range(3):
            trace = await agent.run(Said(vf.TaskData(prompt="say done")))
            assert trace.reward == 1.0
        assert sorted(path.name for path in sockets.iterdir() if path.name.startswith("door-")) == []


async def test_model_and_sampling_are_imposed_and_recorded(openai_server, agent_config, tmp_path):
    openai_server.play([reply("done")])
    config = agent_config(harness=program(tmp_path, CALL_ONCE), max_turn_tokens=64,
                          sampling=vf.SamplingConfig(temperature=0.2))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="hi")))
    sent = openai_server.requests[0].body
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("scripted", 0.2, 64)
    assert trace.reward == 1.0 and trace.messages[0] == {"role": "system", "content": "mine"}
    imposed = trace.info["program_rewrites"][0]["imposed"]
    assert imposed["model"] == {"program": "their-model", "sent": "scripted"}
    assert imposed["temperature"] == {"program": 1.7, "sent": 0.2}
    assert imposed["max_tokens"] == {"program": 99999, "sent": 64}


async def test_the_provider_key_never_enters_the_program(openai_server, agent_config, tmp_path):
    (tmp_path / "needle").write_text(KEY)   # the local runtime shares the host's files: the probe reads it here
    probe = f"""
        import os, pathlib
        needle = open({str(tmp_path / "needle")!r}, "rb").read()
        seen = []
        for proc in pathlib.Path("/proc").glob("[0-9]*"):
            for name in ("environ", "cmdline"):
                try:
                    if needle in (proc / name).read_bytes():
                        seen.append(str(proc / name))
                except OSError:
                    pass
        files = [str(p) for p in pathlib.Path(".").rglob("*") if p.is_file() and needle in p.read_bytes()]
        print(len(seen), len(files))
    """
    openai_server.play([reply("done")])
    source = textwrap.dedent(probe) + textwrap.dedent(CALL_ONCE)
    async with vf.make_agent(agent_config(harness=program(tmp_path, source))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="hi")))
    assert trace.reward == 1.0, trace.errors
    assert trace.info["program"][0]["stdout_tail"].splitlines()[0] == "0 0"
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in json.dumps(trace.model_dump(mode="json"))


async def test_max_turns_refuses_the_next_request_and_the_program_ends(openai_server, agent_config):
    openai_server.default = tool_call("bash", command="true")
    async with vf.make_agent(agent_config(harness="bash", max_turns=2)) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="loop")))
    assert len(openai_server.requests) == 2 and trace.stop_condition == "max_turns"
    assert trace.errors == [] and trace.info["program"][0]["exit_code"] == 3   # refused: a clean end
    assert "agent_failure" not in trace.info   # the endpoint's stop wins over the exit code
    assert "rollout stopped: max_turns" in trace.info["program"][0]["stderr_tail"]


async def test_max_turn_tokens_stops_after_the_response_that_hit_it(openai_server, agent_config):
    openai_server.play([tool_call("bash", command="true"), reply("cut", finish_reason="length")])
    openai_server.default = reply("never")
    async with vf.make_agent(agent_config(harness="bash", max_turn_tokens=8)) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    # the length reply has no tool call, so the program prints it and exits: nothing refused, nothing more sent
    assert len(openai_server.requests) == 2 and trace.stop_condition == "max_turn_tokens" and trace.is_truncated


async def test_a_program_ignoring_the_stop_is_killed_after_the_grace(openai_server, agent_config, tmp_path):
    stubborn = textwrap.dedent(CALL_ONCE) + "\nimport sys, time\nsys.stdout.flush()\ntime.sleep(600)\n"
    openai_server.play([reply("x", finish_reason="length")])
    config = agent_config(harness=program(tmp_path, stubborn, stop_grace_s=0.5), max_turn_tokens=4)
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 30)
    assert trace.stop_condition == "max_turn_tokens" and trace.errors == []
    assert "killed" in trace.info["program"][0]
    assert trace.info["program"][0]["stdout_tail"] == "x\n"   # what it printed before the kill


async def test_the_agent_deadline_kills_a_program_that_sleeps_forever(openai_server, agent_config, tmp_path):
    marker = tmp_path / "pids"
    forever = f"""
        import os, subprocess, time
        child = subprocess.Popen(["setsid", "sleep", "1000"])
        open({str(marker)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(1000)
    """
    config = agent_config(harness=program(tmp_path, forever), timeouts=vf.TimeoutConfig(agent=2))
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 30)
    assert trace.stop_condition == "agent_timeout" and trace.is_timeout   # scored as any timeout (skip_on_timeout)
    for pid in marker.read_text().split():   # the program and its setsid child: gone
        assert "sleep" not in _cmdline(pid) and "agent.py" not in _cmdline(pid)


async def test_the_agent_deadline_records_the_tails_the_program_printed_so_far(openai_server, agent_config,
                                                                                tmp_path):
    talker = """
        import os, sys, time
        print(os.path.dirname(os.environ["PROMPT_FILE"]), flush=True)   # the launcher's private directory
        print("still thinking", file=sys.stderr, flush=True)
        time.sleep(1000)
    """
    config = agent_config(harness=program(tmp_path, talker), timeouts=vf.TimeoutConfig(agent=2))
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 30)
    assert trace.stop_condition == "agent_timeout"
    [launch] = trace.info["program"]
    assert (launch["exit_code"], launch["killed"]) == (None, "the agent deadline or a cancellation")
    private = launch["stdout_tail"].strip()
    assert "prefect-rollouts-launch-" in private and launch["stdout_bytes"] == len(private) + 1
    assert (launch["stderr_tail"], launch["stderr_bytes"]) == ("still thinking\n", 15)
    assert not await asyncio.to_thread(os.path.exists, private)   # read, then removed


async def test_a_runtime_lost_mid_launch_names_what_the_program_printed(openai_server, agent_config, tmp_path,
                                                                        monkeypatch):
    real_exec = LocalRuntime.exec

    async def failing(self, cmd, timeout=None, env=None):   # the engine fails a second into the launch
        if "launch.py" not in cmd:
            return await real_exec(self, cmd, timeout, env)
        job = asyncio.ensure_future(real_exec(self, cmd, timeout, env))
        await asyncio.sleep(1)
        job.cancel()
        raise RuntimeUnavailableError("the engine dropped the exec", retryable=False)
    monkeypatch.setattr(LocalRuntime, "exec", failing)
    talker = """
        import sys, time
        print("half way", file=sys.stderr, flush=True)
        time.sleep(1000)
    """
    async with vf.make_agent(agent_config(harness=program(tmp_path, talker))) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 30)
    [error] = trace.errors
    assert (error.type, error.message) == ("RuntimeUnavailableError",
                                           "the engine dropped the exec. The program's stderr: half way")
    [launch] = trace.info["program"]
    assert (launch["killed"], launch["stderr_tail"]) == ("RuntimeUnavailableError in the runtime", "half way\n")


async def test_a_finished_launch_leaves_no_private_directory(openai_server, agent_config, tmp_path):
    openai_server.play([reply("done")])
    source = textwrap.dedent(CALL_ONCE) + "\nprint(os.path.dirname(os.environ['PROMPT_FILE']))\n"
    async with vf.make_agent(agent_config(harness=program(tmp_path, source))) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 30)
    assert trace.errors == [] and trace.reward == 1.0
    said, private = trace.info["program"][0]["stdout_tail"].split()
    assert said == "done" and not await asyncio.to_thread(os.path.exists, private)   # gone with the launcher


@pytest.mark.parametrize("planted", [
    json.dumps({"stdout_tail": 5, "stderr_tail": "x" * 10_000, "stdout_bytes": "many", "stderr_bytes": -1}),
    "{" * 100_000, "y" * 10_000_000])
async def test_a_tails_file_the_program_rewrote_breaks_nothing(openai_server, agent_config, tmp_path, planted):
    (tmp_path / "planted").write_text(planted)
    tamper = f"""
        import os, shutil, time
        shutil.copy({str(tmp_path / "planted")!r}, os.path.join(os.path.dirname(os.environ["PROMPT_FILE"]),
                                                                "tails.json"))
        time.sleep(1000)
    """
    config = agent_config(harness=program(tmp_path, tamper, output_tail_chars=50), timeouts=vf.TimeoutConfig(agent=2))
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 30)
    assert trace.stop_condition == "agent_timeout" and trace.errors == []
    [launch] = trace.info["program"]
    kept = {key: value for key, value in launch.items() if key.endswith(("_tail", "_bytes"))}
    assert kept == ({"stderr_tail": "x" * 50} if planted.startswith("{\"") else {})


def _cmdline(pid: str) -> str:
    try:
        return " ".join(psutil.Process(int(pid)).cmdline())
    except psutil.Error:   # gone, or a zombie
        return ""


async def test_a_steer_lands_in_the_next_request_and_stays_in_every_later_one(openai_server, agent_config):
    openai_server.play([tool_call("bash", command="sleep 1"), tool_call("bash", command="true"), reply("done")])
    async with vf.make_agent(agent_config(harness="bash")) as agent:
        async with agent.interaction(Said(vf.TaskData(prompt="start"))) as interaction:
            turn = asyncio.create_task(interaction.turn())
            await wait_for(lambda: openai_server.requests, 5, 0.02, what="the program's first model request")
            receipt = await interaction.send("use the fast path", mode="steer", message_id="s1")
            segment = await turn
    assert receipt.accepted
    second, third = (r.messages for r in openai_server.requests[1:3])
    steer = {"role": "user", "content": "use the fast path"}
    assert second[-1] == steer and third[len(second) - 1] == steer and third.count(steer) == 1
    assert interaction.trace.sends[0].status == "delivered" and interaction.trace.sends[0].delivered_call == 1
    assert segment.last_reply == "done" and interaction.trace.info["program_rewrites"][0]["steers_delivered"] == ["s1"]


async def test_a_second_turn_carries_the_conversation_and_a_queued_message_starts_one(openai_server, agent_config):
    openai_server.play([reply("first"), reply("second"), reply("done")])
    async with vf.make_agent(agent_config(harness="bash")) as agent:
        async with agent.interaction(Said(vf.TaskData(prompt="one"))) as interaction:
            await interaction.turn()
            await interaction.turn("two")
            await interaction.send("three", mode="queue")
            await interaction.wait_idle()
    contents = [[m["content"] for m in r.messages] for r in openai_server.requests]
    assert contents == [["one"], ["one", "first", "two"], ["one", "first", "two", "second", "three"]]
    trace = interaction.trace
    assert len(trace.segments) == 3 and trace.reward == 1.0 and len(trace.info["program"]) == 3


async def test_resume_false_refuses_a_second_turn(openai_server, agent_config):
    openai_server.default = reply("ok")
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(id="bash", resume=False))) as agent:
        async with agent.interaction(Said(vf.TaskData(prompt="one"))) as interaction:
            await interaction.turn()
            await interaction.turn("two")
    assert "resume = false" in interaction.trace.errors[0].message and interaction.trace.reward is None


async def test_an_upstream_failure_is_relayed_and_the_segment_retried(openai_server, agent_config):
    openai_server.play([status(500), status(500), status(500), reply("done")])
    config = agent_config(harness="bash", retries=vf.StageRetryConfig(segment=1, backoff_s=0.01))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    # the client tried 3 times (2 retries), the program got a 500 and exited 2, the segment relaunched it
    assert trace.reward == 1.0 and trace.errors == [] and len(trace.info["program"]) == 2
    assert trace.model_calls[0].status_code == 500 and trace.model_calls[1].finish_reason == "stop"


async def test_a_retried_exchange_is_answered_from_the_record(openai_server, agent_config, tmp_path):
    twice = """
        import json, os, urllib.request
        body = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
        answers = []
        for retry in ("0", "1"):
            request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
                                             {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                              "x-stainless-retry-count": retry, "Idempotency-Key": "k1"})
            answers.append(json.load(urllib.request.urlopen(request))["id"])
        print(answers[0] == answers[1])
    """
    openai_server.play([reply("done"), reply("again")])
    async with vf.make_agent(agent_config(harness=program(tmp_path, twice))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert len(openai_server.requests) == 1 and len(trace.model_calls) == 1
    assert trace.info["program"][0]["stdout_tail"] == "True\n"


async def test_a_request_without_messages_is_a_400_naming_it(openai_server, agent_config, tmp_path):
    bad = """
        import json, os, urllib.request, urllib.error
        request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", b'{"model": "m"}',
                                         {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        try:
            urllib.request.urlopen(request)
        except urllib.error.HTTPError as exc:
            print(exc.code, json.load(exc)["error"]["message"])
    """
    async with vf.make_agent(agent_config(harness=program(tmp_path, bad))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert trace.info["program"][0]["stdout_tail"].startswith("400 messages: Field required")
    assert openai_server.requests == [] and "without calling the model" in trace.errors[0].message


@pytest.mark.parametrize(("body", "expected"), [
    ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": "100"}',
     "400 max_tokens: Input should be a valid integer"),
    ('{"messages": {"role": "user", "content": "x"}}', "400 messages: Input should be a valid list"),
    ('{"messages": [{"role": "user", "content": {"text": "x"}}]}',
     "400 messages.0.content.str: Input should be a valid string"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "400 messages.0.role: Input should be"),
    ('{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
     "400 stream: Input should be a valid boolean"),
    ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "400 max_tokens: Input should be greater"),
    ("[1, 2]", "400 the request body must be a JSON object"),
    ("not json", "400 the request body is not JSON"),
    ("BIG", "413 the request body is 33554433 bytes; this endpoint takes at most 33554432"),
])
async def test_a_malformed_request_is_refused_naming_the_field_and_never_sent_upstream(
        openai_server, agent_config, tmp_path, body, expected):
    bad = f"""
        import json, os, urllib.request, urllib.error
        body = {body!r}
        data = b"x" * (32 * 1024 * 1024 + 1) if body == "BIG" else body.encode()
        request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data,
                                         {{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
        try:
            urllib.request.urlopen(request)
        except urllib.error.HTTPError as exc:
            print(exc.code, json.load(exc)["error"]["message"])
    """
    async with vf.make_agent(agent_config(harness=program(tmp_path, bad))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert trace.info["program"][0]["stdout_tail"].startswith(expected), trace.info["program"][0]["stdout_tail"]
    assert openai_server.requests == [] and trace.model_calls == []


# one that fails after it started is scored: test_program_harness_failures.py
@pytest.mark.parametrize(("fields", "expected"), [
    ({"command": ["/no/such/agent"]}, "could not start (exit code 127"),
    ({"command": ["bash", "-c", "exit 0"]}, "without calling the model"),
    ({"command": ["bash", "-c", "echo broken >&2; exit 126"]}, "code 126, before any model call). stderr: broken"),
    ({"command": ["true"], "setup": ["echo no-such-package >&2; false"]}, "setup command"),
])
async def test_bad_programs_are_errors_on_the_trace_never_reward_zero(openai_server, agent_config, fields, expected):
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(id="program", **fields))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert trace.reward is None and trace.errors
    assert expected in trace.errors[0].message


async def test_a_program_printing_100_mb_keeps_only_its_tail(openai_server, agent_config, tmp_path):
    loud = textwrap.dedent(CALL_ONCE) + "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\n"
    loud += "print('END')\n"
    openai_server.play([reply("done")])
    async with vf.make_agent(agent_config(harness=program(tmp_path, loud, output_tail_chars=100))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    launch = trace.info["program"][0]
    assert trace.reward == 1.0 and launch["stdout_bytes"] > 100 * (1 << 20)
    assert len(launch["stdout_tail"]) == 100 and launch["stdout_tail"].endswith("END\n")


def test_config_errors_name_the_key_before_any_rollout(tmp_path):
    with pytest.raises(vf.ConfigError, match=r'\[env.agent\] harness: id = "program" needs command'):
        vf.load_config('[env.agent]\nharness = { id = "program" }')
    with pytest.raises(vf.ConfigError, match="no such file or directory"):
        vf.load_config('[env.agent.harness]\nid = "bash"\nfiles = { "x" = "/no/such/dir" }')
    with pytest.raises(vf.ConfigError, match="only program harnesses"):
        vf.load_config('[env.agent.harness]\nid = "tools"\nsetup = ["true"]')
    with pytest.raises(vf.ConfigError, match="local runtime has no filesystem"):
        vf.load_config(f'[env.agent.harness]\nid = "bash"\nfiles = {{ "/srv-not/a" = "{tmp_path}" }}')
    config = tmp_path / "eval.toml"
    (tmp_path / "agents").mkdir()
    config.write_text('[env.agent.harness]\nid = "bash"\nfiles = { "a" = "agents" }\nenv = { MODE = "fast" }')
    loaded = vf.load_config(config)
    assert loaded.harness.files == {"a": tmp_path / "agents"}
    assert loaded.model_dump(mode="json")["harness"]["env"] == {"MODE": "***"}   # a literal may be a secret


async def test_secrets_in_the_programs_messages_are_scrubbed_before_upstream_and_the_trace(
        openai_server, agent_config, monkeypatch):
    monkeypatch.setenv("MY_TOOL_TOKEN", "tok-forwarded-3b7e9a1c")
    openai_server.play([tool_call("bash", command='echo "$MY_TOOL_TOKEN $OPENAI_API_KEY"'), reply("done")])
    config = agent_config(harness=vf.HarnessConfig(id="bash", forward_env=["MY_TOOL_TOKEN"]))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="leak")))
    tool_result = openai_server.requests[1].messages[-1]["content"]
    assert trace.reward == 1.0 and "tok-forwarded" not in tool_result and "sk-rollout-" not in tool_result
    assert "stdout:\n*** \n" in tool_result and "tok-forwarded" not in json.dumps(trace.model_dump(mode="json"))


async def test_secrets_in_tool_call_arguments_the_program_sends_back_are_scrubbed(
        openai_server, agent_config, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_TOOL_TOKEN", "tok-forwarded-3b7e9a1c")
    echo_back = """
        import json, os, urllib.request
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(
            {"token": os.environ["MY_TOOL_TOKEN"], "key": os.environ["OPENAI_API_KEY"]})}}
        body = {"messages": [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": "", "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
        request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                         {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        print(json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"])
    """
    openai_server.play([reply("done")])
    config = agent_config(harness=program(tmp_path, echo_back, forward_env=["MY_TOOL_TOKEN"]))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    sent = openai_server.requests[0].messages[1]["tool_calls"][0]["function"]["arguments"]
    assert trace.reward == 1.0 and json.loads(sent) == {"token": "***", "key": "***"}
    dumped = json.dumps(trace.model_dump(mode="json"))
    assert "tok-forwarded" not in dumped and "sk-rollout-" not in dumped
