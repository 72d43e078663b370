"""The ``codex`` and ``claude-code`` harnesses without their binaries: the generated Codex config and the
command lines, the in-runtime driver around a stand-in binary, the install and run-time checks, the
transcript's way onto the trace, and the environment contract every program gets."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import TaskError
from prefect_rollouts.harnesses import npm_agents
from prefect_rollouts.harnesses.program import program_spec
from prefect_rollouts.harnesses.programs import npm_agent
from prefect_rollouts.runtimes.base import ExecResult
from tests.fakes.openai_server import reply

pytestmark = pytest.mark.unit

DRIVER = Path(npm_agent.__file__)


def test_the_codex_config_points_a_responses_provider_at_the_endpoint_with_retries_off():
    instructions = 'Say "5".\nThen stop: \\ é'
    config = tomllib.loads(npm_agent.codex_config("http://127.0.0.1:4242/v1", "my-model", instructions))
    assert (config["model"], config["model_provider"]) == ("my-model", "prefect-rollouts")
    assert config["model_providers"]["prefect-rollouts"] == {
        "name": "prefect-rollouts", "base_url": "http://127.0.0.1:4242/v1", "env_key": "OPENAI_API_KEY",
        "wire_api": "responses", "request_max_retries": 0, "stream_max_retries": 0,
        "stream_idle_timeout_ms": 1_800_000}   # the rollout's deadlines govern, not Codex's 5-minute watchdog
    assert (config["approval_policy"], config["sandbox_mode"], config["web_search"]) == \
        ("never", "danger-full-access", "disabled")
    assert config["developer_instructions"] == instructions
    assert config["check_for_update_on_startup"] is False
    assert [config[table]["enabled"] for table in ("analytics", "feedback")] == [False, False]
    assert "developer_instructions" not in tomllib.loads(npm_agent.codex_config("http://h/v1", "m"))


def test_the_command_lines_run_each_agent_non_interactively_without_its_own_sandbox():
    assert npm_agent.codex_argv("/b/codex") == [
        "/b/codex", "exec", "--strict-config", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
        "--color", "never", "-"]
    assert npm_agent.claude_argv("/b/claude", "m") == [
        "/b/claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
        "--model", "m"]
    assert npm_agent.claude_argv("/b/claude", "m", "/tmp/s.txt")[-2:] == ["--append-system-prompt-file", "/tmp/s.txt"]
    env = npm_agent.claude_env("/tmp/c")
    assert {name: env[name] for name in ("CLAUDE_CONFIG_DIR", "IS_SANDBOX", "CLAUDE_CODE_MAX_RETRIES",
                                         "DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING",
                                         "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC")} == {
        "CLAUDE_CONFIG_DIR": "/tmp/c", "IS_SANDBOX": "1", "CLAUDE_CODE_MAX_RETRIES": "0", "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    watchdogs = ("CLAUDE_STREAM_IDLE_TIMEOUT_MS", "CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS", "API_TIMEOUT_MS")
    assert [env[name] for name in watchdogs] == ["1800000"] * 3   # a slow model is the rollout deadline's to cut


@pytest.mark.parametrize("harness", ["codex", "claude-code"])
def test_the_program_spec_runs_the_driver_on_the_binary(harness):
    spec = program_spec(vf.HarnessConfig(id=harness))
    assert spec.command == ["{python}", "-I", "{scripts}/npm_agent.py", harness, "{site}"]
    assert spec.needs_model


@pytest.mark.parametrize("harness", ["codex", "claude-code"])
def test_the_host_installs_are_mounted_read_only(harness, tmp_path, monkeypatch):
    from prefect_rollouts.harnesses.program import ProgramHarness

    monkeypatch.setenv("PREFECT_ROLLOUTS_CACHE", str(tmp_path))
    endpoint = type("Endpoint", (), {"directory": tmp_path / "endpoint", "new_door": lambda self: tmp_path / "door"})()
    binds = ProgramHarness(vf.HarnessConfig(id=harness), endpoint).binds   # type: ignore[arg-type]
    assert binds[str(tmp_path / harness)] == f"/usr/local/prefect-rollouts/{harness}:ro"


def test_version_overrides_the_pin_and_belongs_to_the_npm_agents():
    assert vf.HarnessConfig(id="codex").version is None
    assert vf.HarnessConfig(id="claude-code", version="2.1.329").version == "2.1.329"
    with pytest.raises(ValueError, match='version applies to id = "codex" or "claude-code" only'):
        vf.HarnessConfig(id="bash", version="1.0.0")
    with pytest.raises(ValueError, match=r"version = '0.169; rm -rf /': not an npm release number"):
        vf.HarnessConfig(id="codex", version="0.169; rm -rf /")


FAKE_AGENT = """\
#!{python}
import json, os, sys
home = os.environ.get("CODEX_HOME")
seen = {{"argv": sys.argv[1:], "stdin": sys.stdin.read(), "config_dir": home or os.environ.get("CLAUDE_CONFIG_DIR"),
        "is_sandbox": os.environ.get("IS_SANDBOX")}}
if home:
    seen["config"] = open(os.path.join(home, "config.toml")).read()
    os.makedirs(os.path.join(home, "sessions", "2026", "12", "05"))
    with open(os.path.join(home, "sessions", "2026", "12", "05", "rollout-x.jsonl"), "w") as session:
        session.write(json.dumps({{"type": "session_meta"}}) + "\\n")
else:
    print(json.dumps({{"type": "system", "subtype": "init"}}))
    print(json.dumps({{"type": "result", "is_error": True}}))
with open("seen.json", "w") as out:
    json.dump(seen, out)
sys.exit(3)
"""


@pytest.mark.parametrize("harness", ["codex", "claude-code"])
def test_the_driver_configures_the_agent_feeds_it_the_prompt_and_leaves_its_transcript(tmp_path, harness):
    fake = tmp_path / "agent"
    fake.write_text(FAKE_AGENT.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "prompt.txt").write_text("What is 2 + 3?")
    (tmp_path / "system.txt").write_text("Be brief.")
    env = {"PATH": os.environ["PATH"], "PROMPT_FILE": str(tmp_path / "prompt.txt"),
           "SYSTEM_PROMPT_FILE": str(tmp_path / "system.txt"), "OPENAI_MODEL": "m",
           "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    result = subprocess.run([sys.executable, "-I", str(DRIVER), harness, str(fake)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 3, result.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["stdin"] == "What is 2 + 3?"
    transcript = (tmp_path / npm_agents.TRANSCRIPT).read_text().splitlines()
    if harness == "codex":
        assert seen["argv"] == npm_agent.codex_argv(str(fake))[1:]
        config = tomllib.loads(seen["config"])
        assert config["model_providers"]["prefect-rollouts"]["base_url"] == "http://127.0.0.1:9/v1"
        assert config["developer_instructions"] == "Be brief."
        assert [json.loads(line)["type"] for line in transcript] == ["session_meta"]
    else:
        assert seen["argv"] == npm_agent.claude_argv(str(fake), "m", str(tmp_path / "system.txt"))[1:]
        assert seen["is_sandbox"] == "1"
        assert [json.loads(line)["type"] for line in transcript] == ["system", "result"]
        assert result.stdout.splitlines() == transcript   # its end is echoed for the launcher's tail
    assert Path(seen["config_dir"]).parent.parent == tmp_path / "tmp"   # a private directory in TMPDIR,
    assert list((tmp_path / "tmp").iterdir()) == []                     # removed after the run


class StubRuntime:
    """Answers the probe, ``--version`` and ``rm``; holds one workspace file."""

    def __init__(self, version_result: ExecResult, files: dict[str, bytes] | None = None) -> None:
        self.version_result = version_result
        self.files = files or {}
        self.commands: list[str] = []

    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None) -> ExecResult:
        self.commands.append(cmd)
        if cmd.startswith("uname -m"):
            return ExecResult(0, f"{platform.machine()}\nbaked\n", "")
        if cmd.endswith("--version"):
            return self.version_result
        return ExecResult(0, "", "")

    async def read_file(self, path: str) -> bytes:
        try:
            return self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None


async def test_an_image_that_cannot_run_claude_code_fails_at_setup_naming_why():
    runtime = StubRuntime(ExecResult(127, "", "exec: /usr/local/claude-code/2.1.328/...: not found"))
    with pytest.raises(TaskError) as caught:
        await npm_agents.binary_in(runtime, npm_agents.AGENTS["claude-code"], None, local=False, timeout_s=60)
    message = str(caught.value)
    assert message.startswith('harness "claude-code": @anthropic-ai/claude-code@2.1.328 does not run in this runtime')
    assert "exited 127: exec: /usr/local/claude-code/2.1.328/...: not found" in message
    assert "glibc 2.26 or newer" in message


async def test_a_baked_install_of_the_version_asked_for_is_used_after_it_answers_version():
    runtime = StubRuntime(ExecResult(0, "codex-cli 0.170.0\n", ""))
    binary, said = await npm_agents.binary_in(runtime, npm_agents.AGENTS["codex"], "0.170.0", local=False,
                                              timeout_s=60)
    assert binary.startswith("/usr/local/codex/0.170.0/node_modules/@openai/codex-linux-")
    assert said == "codex-cli 0.170.0"
    assert "test -d /usr/local/codex/0.170.0" in runtime.commands[0]


def test_an_install_for_another_architecture_is_refused_before_npm_runs(tmp_path):
    other = "aarch64" if platform.machine() == "x86_64" else "x86_64"
    with pytest.raises(TaskError, match=f"the runtime is {other} but this host is"):
        npm_agents.install(npm_agents.AGENTS["codex"], machine=other, root=tmp_path)
    with pytest.raises(TaskError, match="has no build for riscv64"):
        npm_agents.install(npm_agents.AGENTS["codex"], machine="riscv64", root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_host_without_npm_is_told_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no npm on it
    with pytest.raises(TaskError) as caught:
        npm_agents.install(npm_agents.AGENTS["claude-code"], root=tmp_path)
    assert str(caught.value).startswith('harness "claude-code": npm install @anthropic-ai/claude-code@2.1.328: npm is '
                                        "not on this machine's PATH. It needs Node and npm (Debian: apt-get install "
                                        "nodejs npm)")
    assert [path.name for path in tmp_path.iterdir()] == [f"2.1.328-{platform.machine()}.lock"]   # no install left


async def test_the_transcript_is_taken_scrubbed_and_removed_from_the_workspace():
    secret = "sk-launch-key-0123456789abcdef"
    lines = [json.dumps({"type": "x", "i": i, "key": secret}) for i in range(100)]
    runtime = StubRuntime(ExecResult(0, "", ""), {npm_agents.TRANSCRIPT: "\n".join(lines).encode()})
    info: dict = {}
    text = await npm_agents.keep_transcript(runtime, info, (secret,), tail_chars=200)
    assert text is not None and secret not in text and text.count('"type": "x"') == 100
    assert info["transcript_bytes"] == len("\n".join(lines)) and text.endswith(info["transcript_tail"])
    assert len(info["transcript_tail"]) == 200
    assert runtime.commands == [f"rm -f {npm_agents.TRANSCRIPT}"]
    assert await npm_agents.keep_transcript(StubRuntime(ExecResult(0, "", "")), {}, (), 200) is None


ENV_PROBE = """
    import json, os, urllib.request
    env = os.environ
    print(json.dumps({"anthropic_base_url": env["OPENAI_BASE_URL"] == env["ANTHROPIC_BASE_URL"] + "/v1",
                      "keys": env["ANTHROPIC_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == env["OPENAI_API_KEY"],
                      "root": env["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:")}))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(env["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                     {"Authorization": "Bearer " + env["OPENAI_API_KEY"],
                                      "Content-Type": "application/json"})
    urllib.request.urlopen(request).read()
"""


async def test_every_program_gets_the_anthropic_variables_beside_the_openai_ones(openai_server, agent_config,
                                                                                 tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-provider-key-not-for-programs")
    agent_dir = tmp_path / "probe"
    agent_dir.mkdir()
    (agent_dir / "agent.py").write_text(textwrap.dedent(ENV_PROBE))
    harness = vf.HarnessConfig(id="program", command=[sys.executable, ".agent/agent.py"], files={".agent": agent_dir})
    openai_server.play([reply("done")])
    async with vf.make_agent(agent_config(harness=harness)) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="hi")))
    assert trace.errors == []
    said = json.loads(trace.info["program"][0]["stdout_tail"])
    assert said == {"anthropic_base_url": True, "keys": True, "root": True}
