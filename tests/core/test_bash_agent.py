"""The bash harness's reference agent program (harnesses/programs/bash_agent.py), run as a subprocess
against the scripted OpenAI server: the request shape, the tool loop, errors and exit codes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from tests.fakes.openai_server import echo_header, reply, secret_fragments, status, tool_call, tool_calls
from tests.support.ports import free_port
from tests.support.processes import is_running
from tests.support.waiting import wait_until

pytestmark = pytest.mark.unit

SCRIPT = resources.files("prefect_rollouts.harnesses") / "programs" / "bash_agent.py"
KEY = "sk-QzX9wV7uPp3LmN8k"


def run_agent(base_url: str, tmp_path: Path, prompt: str = "What is 2+2?", **env: str) -> subprocess.CompletedProcess:
    """Run the program in ``tmp_path / "work"`` with a clean environment (plus ``env``)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt, encoding="utf-8")
    environment = {"PATH": os.environ["PATH"], "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": KEY,
                   "OPENAI_MODEL": "model-under-test", "PROMPT_FILE": str(prompt_file), **env}
    return subprocess.run([sys.executable, str(SCRIPT)], cwd=work, env=environment, capture_output=True,
                          text=True, timeout=30)


def tool_messages(request) -> list[dict]:
    return [m for m in request.messages if m["role"] == "tool"]


def test_a_reply_without_tool_calls_is_printed_and_ends_the_program(openai_server, tmp_path):
    openai_server.play([reply("4")])
    done = run_agent(openai_server.base_url, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "4\n", "")
    [request] = openai_server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert sorted(request.body) == ["messages", "model", "tools"]
    assert request.body["model"] == "model-under-test"
    assert request.messages == [{"role": "user", "content": "What is 2+2?"}]
    [tool] = request.body["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == "bash"
    assert tool["function"]["description"] == (
        "Run a shell command in the working directory and return its exit code, stdout and stderr")
    assert tool["function"]["parameters"]["properties"] == {"command": {"type": "string"}}
    assert tool["function"]["parameters"]["required"] == ["command"]


def test_a_bash_call_runs_in_the_working_directory_and_its_result_goes_back(openai_server, tmp_path):
    openai_server.play([tool_call("bash", command="echo hi > f.txt; cat f.txt; echo oops >&2"), reply("done")])
    done = run_agent(openai_server.base_url, tmp_path)
    assert (done.returncode, done.stdout) == (0, "done\n")
    assert (tmp_path / "work" / "f.txt").read_text() == "hi\n"
    first, second = openai_server.requests
    user, assistant, tool = second.messages
    assert user == first.messages[0]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    [call] = assistant["tool_calls"]
    assert call["function"] == {"name": "bash", "arguments": '{"command": "echo hi > f.txt; cat f.txt; echo oops >&2"}'}
    assert tool == {"role": "tool", "tool_call_id": call["id"],
                    "content": "exit_code: 0\nstdout:\nhi\n\nstderr:\noops\n"}


def test_a_failing_command_reports_its_exit_code(openai_server, tmp_path):
    openai_server.play([tool_call("bash", command="exit 7"), reply("noted")])
    assert run_agent(openai_server.base_url, tmp_path).returncode == 0
    [tool] = tool_messages(openai_server.requests[1])
    assert tool["content"] == "exit_code: 7\nstdout:\n\nstderr:\n"


@pytest.mark.parametrize(("raw", "error"), [
    ("{not json", "Error: the arguments of 'bash' are not a valid JSON object ("),
    ('["ls"]', "Error: invalid arguments for 'bash': expected {\"command\": \"<shell command>\"}."),
    ('{"cmd": "ls"}', "Error: invalid arguments for 'bash': expected {\"command\": \"<shell command>\"}."),
])
def test_bad_arguments_become_an_error_tool_message_and_the_loop_goes_on(openai_server, tmp_path, raw, error):
    openai_server.play([tool_call("bash", raw_arguments=raw), reply("sorry")])
    done = run_agent(openai_server.base_url, tmp_path)
    assert (done.returncode, done.stdout) == (0, "sorry\n")
    [tool] = tool_messages(openai_server.requests[1])
    assert tool["content"].startswith(error)


def test_an_unknown_tool_is_an_error_and_the_other_calls_still_run(openai_server, tmp_path):
    openai_server.play([tool_calls(("python", {"code": "1"}), ("bash", {"command": "echo ok"})), reply("fine")])
    assert run_agent(openai_server.base_url, tmp_path).returncode == 0
    unknown, known = tool_messages(openai_server.requests[1])
    assert unknown["content"] == "Error: unknown tool 'python'. Available tools: bash."
    assert known["content"] == "exit_code: 0\nstdout:\nok\n\nstderr:\n"


def test_a_command_past_its_timeout_is_killed_with_its_process_group(openai_server, tmp_path):
    openai_server.play([tool_call("bash", command="sleep 30 & echo $! > bg.pid; echo started; sleep 30"),
                        reply("gave up")])
    done = run_agent(openai_server.base_url, tmp_path, BASH_AGENT_TIMEOUT_S="1")  # returns within its 30 s
    assert (done.returncode, done.stdout) == (0, "gave up\n")
    [tool] = tool_messages(openai_server.requests[1])
    assert tool["content"] == "exit_code: -9 (killed: timeout)\nstdout:\nstarted\n\nstderr:\n"
    background = int((tmp_path / "work" / "bg.pid").read_text())
    assert not is_running(background)   # gone, or a zombie


def test_a_long_result_is_cut_at_the_cap_with_a_note(openai_server, tmp_path):
    openai_server.play([tool_call("bash", command="head -c 5000 /dev/zero | tr '\\0' a"), reply("long")])
    run_agent(openai_server.base_url, tmp_path, BASH_AGENT_OUTPUT_CHARS="100")
    [tool] = tool_messages(openai_server.requests[1])
    head = "exit_code: 0\nstdout:\n"
    assert tool["content"] == head + "a" * (100 - len(head)) + "\n[output cut at 100 characters]"


def test_a_rollout_stopped_refusal_exits_3_with_the_message(openai_server, tmp_path):
    openai_server.play([tool_call("bash", command="true"),
                        status(400, {"error": {"message": "rollout stopped: max_turns"}})])
    done = run_agent(openai_server.base_url, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, "", "rollout stopped: max_turns\n")


def test_a_server_error_exits_2_with_status_and_message(openai_server, tmp_path):
    openai_server.play([status(500, {"error": {"message": "upstream exploded"}})])
    done = run_agent(openai_server.base_url, tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    url = f"{openai_server.base_url}/chat/completions"
    assert done.stderr == f"bash_agent: POST {url} returned 500: upstream exploded\n"
    assert len(openai_server.requests) == 1  # no retries of its own


def test_a_refused_connection_exits_2_naming_the_url(tmp_path):
    base_url = f"http://127.0.0.1:{free_port()}/v1"   # a port nothing listens on
    done = run_agent(base_url, tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"bash_agent: POST {base_url}/chat/completions failed: ")


@pytest.mark.parametrize(("setting", "error"), [
    ({"OPENAI_BASE_URL": "https://127.0.0.1:1/v1"}, "only http:// URLs are supported"),
    ({"OPENAI_MODEL": ""}, "bash_agent: OPENAI_MODEL is not set;"),
    ({"BASH_AGENT_TIMEOUT_S": "soon"}, "bash_agent: BASH_AGENT_TIMEOUT_S = 'soon': must be a positive number"),
    ({"BASH_AGENT_OUTPUT_CHARS": "0"}, "bash_agent: BASH_AGENT_OUTPUT_CHARS = '0': must be a positive number"),
    ({"PROMPT_FILE": "/nonexistent/prompt.txt"}, "bash_agent: PROMPT_FILE = '/nonexistent/prompt.txt' cannot be read"),
])
def test_a_bad_setting_exits_2_naming_it_before_any_request(openai_server, tmp_path, setting, error):
    done = run_agent(openai_server.base_url, tmp_path, **setting)
    assert done.returncode == 2 and error in done.stderr
    assert openai_server.requests == []


def test_the_program_parses_as_python_3_8():
    ast.parse(SCRIPT.read_text(encoding="utf-8"), feature_version=(3, 8))


@pytest.mark.parametrize("system", ["present", "missing", "unset"])
def test_the_system_prompt_file_is_sent_first_when_it_exists(openai_server, tmp_path, system):
    openai_server.play([reply("ok")])
    path = tmp_path / "system.txt"
    if system == "present":
        path.write_text("You are terse.", encoding="utf-8")
    env = {} if system == "unset" else {"SYSTEM_PROMPT_FILE": str(path)}
    assert run_agent(openai_server.base_url, tmp_path, prompt="héllo", **env).returncode == 0
    user = {"role": "user", "content": "héllo"}
    expected = [{"role": "system", "content": "You are terse."}, user] if system == "present" else [user]
    assert openai_server.requests[0].messages == expected


def test_the_api_key_never_reaches_output_or_commands(openai_server, tmp_path):
    openai_server.play([tool_call("bash", command='echo "key=[$OPENAI_API_KEY]"; env'), echo_header(500, at=10)])
    done = run_agent(openai_server.base_url, tmp_path)
    assert done.returncode == 2
    assert "returned 500: xxxxxxxxxxBearer [redacted]x" in done.stderr  # the server echoed the header
    assert secret_fragments(done.stdout + done.stderr, KEY) == []
    [tool] = tool_messages(openai_server.requests[1])
    assert tool["content"].startswith("exit_code: 0\nstdout:\nkey=[]\n")
    assert secret_fragments(tool["content"], KEY) == []


def test_a_job_left_in_the_background_can_still_write_its_output_after_the_command(openai_server, tmp_path):
    """Issue 34 (a new user's pass): ``python3 server.py &`` started by the bash tool stopped answering once the
    tool call returned, because its stdout, a pipe of the tool, was closed under it (a broken pipe at its next
    log line), while the oracle's, written to a file, kept going: the pipes a job still holds are drained on."""
    openai_server.play([tool_call("bash", command="(sleep 1; echo late; echo late >&2; touch wrote) & echo started"),
                        reply("done")])
    done = run_agent(openai_server.base_url, tmp_path)
    assert (done.returncode, done.stdout) == (0, "done\n")
    [tool] = tool_messages(openai_server.requests[1])
    assert tool["content"].startswith("exit_code: 0\nstdout:\nstarted\n")
    assert wait_until(lambda: (tmp_path / "work" / "wrote").exists(), timeout_s=10)   # its writes did not fail
