"""Run Codex CLI or Claude Code non-interactively in the runtime (stdlib, Python >= 3.8).

    python3 npm_agent.py codex|claude-code BINARY

Started by ``launch.py``, so ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and ``ANTHROPIC_BASE_URL``/
``ANTHROPIC_API_KEY``/``ANTHROPIC_AUTH_TOKEN`` lead to the interception endpoint with the launch's
key, ``OPENAI_MODEL`` names the rollout's model and ``PROMPT_FILE`` (``SYSTEM_PROMPT_FILE``) holds
the turn's prompt. The agent gets a private config directory (``CODEX_HOME`` or
``CLAUDE_CONFIG_DIR`` in a temporary directory, removed after; HOME is left alone), reads the
prompt from stdin, and runs as a user would run it in a sandbox: no approvals, no sandbox of its
own (the runtime is the sandbox), its retries off (the endpoint's refusal of a stopped rollout
ends it at once; the agent's model client retries upstream), no telemetry, update checks or other
traffic. Its transcript is copied to ``TRANSCRIPT`` in the workspace for the harness to take.
Exits with the agent's exit code.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

TRANSCRIPT = ".prefect-rollouts-transcript.jsonl"
"""Workspace file the transcript is copied to (``npm_agents.TRANSCRIPT``)."""

PROVIDER = "prefect-rollouts"


def toml_string(text):
    """A TOML basic string (JSON's escapes are TOML's, ``\\uXXXX`` included)."""
    return json.dumps(text)


def codex_config(base_url, model, instructions=None):
    """Codex CLI's ``config.toml`` for a run through the endpoint at ``base_url`` (``.../v1``).

    Keys as Codex 0.169.0 reads them (``codex exec --strict-config`` accepts every one; their
    meaning: developers.openai.com/codex/config-sample): ``model_providers.<id>`` with ``base_url``,
    ``env_key`` (the variable holding the key, sent as ``Authorization: Bearer``),
    ``wire_api = "responses"`` (the only value 0.169 accepts: openai/codex PR #10157 removed "chat"),
    ``request_max_retries`` and ``stream_max_retries`` at 0 (defaults 4 and 5:
    ``DEFAULT_REQUEST_MAX_RETRIES``, ``DEFAULT_STREAM_MAX_RETRIES`` in codex-rs/model-provider-info);
    ``stream_idle_timeout_ms`` at ``WATCHDOG_MS`` (default 300,000);
    ``approval_policy = "never"`` and ``sandbox_mode = "danger-full-access"`` (also what
    ``--dangerously-bypass-approvals-and-sandbox`` sets); ``web_search = "disabled"`` (a hosted tool
    the endpoint cannot serve); update check, analytics, feedback, OpenTelemetry and history off;
    ``developer_instructions`` carries the task's system prompt, when it has one.
    """
    lines = [
        f"model = {toml_string(model)}",
        f"model_provider = {toml_string(PROVIDER)}",
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        'web_search = "disabled"',
        "check_for_update_on_startup = false",
    ]
    if instructions:
        lines.append(f"developer_instructions = {toml_string(instructions)}")
    lines += [
        "", "[analytics]", "enabled = false",
        "", "[feedback]", "enabled = false",
        "", "[history]", 'persistence = "none"',
        "", "[otel]", 'exporter = "none"',
        "", f"[model_providers.{PROVIDER}]",
        f"name = {toml_string(PROVIDER)}",
        f"base_url = {toml_string(base_url)}",
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
        f"stream_idle_timeout_ms = {WATCHDOG_MS}",
    ]
    return "\n".join(lines) + "\n"


def codex_argv(binary):
    """``codex exec`` reading the prompt from stdin (``-``), outside a git repository, with no
    approvals and no sandbox of its own, refusing a config key this release does not know."""
    return [binary, "exec", "--strict-config", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", "--color", "never", "-"]


def claude_argv(binary, model, system_prompt_file=None):
    """``claude -p`` (the prompt on stdin) printing stream-json; permissions bypassed (as root this
    needs ``IS_SANDBOX=1``, ``claude_env``); the task's system prompt appended to Claude Code's.
    Flags from ``claude --help`` of 2.1.328."""
    argv = [binary, "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
            "--model", model]
    if system_prompt_file:
        argv += ["--append-system-prompt-file", system_prompt_file]
    return argv


WATCHDOG_MS = 1_800_000
"""The agents' own stream watchdogs, in ms: 30 minutes, the most Claude Code takes (it clamps
``CLAUDE_STREAM_IDLE_TIMEOUT_MS`` and ``CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS`` to 10 s..1,800 s; 2.1.328's
defaults are 180 s idle and no more than 300 s). The endpoint answers a streamed request once its
upstream call is done, so a slow model (SmolLM2 on a busy 2-core machine: an 8k-token prompt took over
300 s) sent no byte for minutes, and the agent gave up on a call the rollout's own deadlines allowed."""


def claude_env(config_dir):
    """Claude Code's variables (code.claude.com/docs/en/env-vars; each name checked among the strings
    of the 2.1.328 binary): a private config directory; ``IS_SANDBOX=1`` lets
    root bypass permissions; no retries (``CLAUDE_CODE_MAX_RETRIES``, default 10); the stream
    watchdogs and ``API_TIMEOUT_MS`` at ``WATCHDOG_MS`` (the rollout's deadlines govern); telemetry, error
    reporting, the auto-updater, feature flags and other non-model traffic off; the small fast
    model of its background calls is the rollout's model (the endpoint imposes it anyway)."""
    model = os.environ.get("OPENAI_MODEL", "")
    return {
        "CLAUDE_CONFIG_DIR": config_dir,
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(WATCHDOG_MS),
        "CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS": str(WATCHDOG_MS),
        "API_TIMEOUT_MS": str(WATCHDOG_MS),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_UPDATES": "1",
        "DISABLE_GROWTHBOOK": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
    }


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def main(argv):
    if len(argv) != 2 or argv[0] not in ("codex", "claude-code"):
        sys.exit("usage: npm_agent.py codex|claude-code BINARY")
    agent, binary = argv
    model = os.environ.get("OPENAI_MODEL", "")
    system_prompt_file = os.environ.get("SYSTEM_PROMPT_FILE")
    private = tempfile.mkdtemp(prefix="prefect-rollouts-agent-")
    env = dict(os.environ)
    try:
        if agent == "codex":
            env["CODEX_HOME"] = home = os.path.join(private, "codex")
            os.mkdir(home)
            instructions = read(system_prompt_file) if system_prompt_file else None
            with open(os.path.join(home, "config.toml"), "w", encoding="utf-8") as handle:
                handle.write(codex_config(os.environ["OPENAI_BASE_URL"], model, instructions))
            command, stdout = codex_argv(binary), None
        else:
            env.update(claude_env(os.path.join(private, "claude")))
            command = claude_argv(binary, model, system_prompt_file)
            stdout = os.path.join(private, "stream.jsonl")
        with open(os.environ["PROMPT_FILE"], "rb") as prompt:
            if stdout is None:
                code = subprocess.call(command, env=env, stdin=prompt)
            else:   # stream-json: kept whole for the trace, its end echoed for the launcher's tail
                with open(stdout, "wb") as sink:
                    code = subprocess.call(command, env=env, stdin=prompt, stdout=sink)
                with open(stdout, "rb") as written:
                    written.seek(max(0, os.path.getsize(stdout) - 65536))
                    sys.stdout.write(written.read().decode("utf-8", "replace"))
                    sys.stdout.flush()
        sessions = sorted(glob.glob(os.path.join(private, "codex", "sessions", "**", "*.jsonl"), recursive=True))
        transcript = stdout if stdout is not None else (sessions[-1] if sessions else None)
        if transcript:
            shutil.copyfile(transcript, TRANSCRIPT)
        return code if code >= 0 else 128 - code
    finally:
        shutil.rmtree(private, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
