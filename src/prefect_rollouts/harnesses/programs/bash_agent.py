"""The reference agent program of the ``bash`` program harness: a tool loop with one ``bash`` tool.

Runs inside the runtime on Python >= 3.8, standard library only. Environment (set by the harness):

    OPENAI_BASE_URL          http://HOST:PORT/v1; requests go to {base}/chat/completions (http only)
    OPENAI_API_KEY           bearer token for it (never printed)
    OPENAI_MODEL             the model name to send
    PROMPT_FILE              UTF-8 file holding this turn's user message
    SYSTEM_PROMPT_FILE       optional UTF-8 file holding a system message (skipped if unset or missing)
    BASH_AGENT_TIMEOUT_S     seconds a command may run (default 120); then its process group is killed
    BASH_AGENT_OUTPUT_CHARS  characters of a tool result kept (default 16384); the rest is cut with a note

Loop: POST {model, messages, tools} (no sampling keys: the endpoint imposes them); each ``bash``
call runs ``bash -c COMMAND`` in the working directory (stdin /dev/null) and is answered with a tool
message "exit_code: N\\nstdout:\\n...\\nstderr:\\n..." (a bad call: an error text). When the box's
limits acted while it ran (its cgroup's counters, read before and after: ``limits``), the exit code
line says so, e.g. "exit_code: -9 (killed: out of memory (memory_mb = 128))"; a command that hit the
process limit (a fork bomb) has its process group killed, as nothing could run after it, this
program's model requests included. A reply without
tool calls is printed to stdout: exit 0. Exit 3: HTTP 400 "rollout stopped: <condition>" (printed on
stderr). Exit 2: any other HTTP error, no connection, a malformed reply or a bad setting (stderr).
No retries here: the endpoint retries upstream.
"""

import json
import os
import subprocess
import sys
import time

# http.client imports ssl for HTTPS only, which this program never speaks: skipping it saves ~5 ms of start
sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
import http.client  # noqa: E402
import selectors  # noqa: E402  (selectors and signal: already loaded by subprocess)
import signal  # noqa: E402
import urllib.parse  # noqa: E402  (already loaded by http.client)

BASH_TOOL = {"type": "function", "function": {
    "name": "bash",
    "description": "Run a shell command in the working directory and return its exit code, stdout and stderr",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
DRAIN_S = 0.5  # after bash exits (or is killed), how long a background job may hold its pipes open


def stop(code, message):
    """Write ``message`` to stderr; the SystemExit(``code``) to raise."""
    sys.stderr.write(message + "\n")
    return SystemExit(code)


def setting(name, default=None, kind=str):
    """The environment variable ``name`` as ``kind``: required without a default; a number must be positive."""
    raw = os.environ.get(name) or default
    if raw is None:
        raise stop(2, f"bash_agent: {name} is not set; the bash harness sets it before starting this program.")
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if kind is not str and not 0 < value < 1e9:
        raise stop(2, f"bash_agent: {name} = {raw!r}: must be a positive number (below 1e9).")
    return value


def read_text(name, path):
    """The UTF-8 text of the file ``path`` (named by the environment variable ``name``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, ValueError) as exc:
        raise stop(2, f"bash_agent: {name} = {path!r} cannot be read: {exc}") from None


def post(url, key, body):
    """POST ``body`` as JSON to ``url`` (http://); a 2xx answer's decoded JSON (its text if not JSON)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "localhost", parts.port)
    try:
        connection.request("POST", parts.path, json.dumps(body).encode("utf-8"), {
            "Content-Type": "application/json", "Authorization": "Bearer " + key})
        response = connection.getresponse()
        status, data = response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise stop(2, f"bash_agent: POST {url} failed: {exc}") from None
    finally:
        connection.close()
    text = data.decode("utf-8", "replace").replace(key, "[redacted]")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = text
    if 200 <= status < 300:
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    message = str(error.get("message") if isinstance(error, dict) else error or text)
    if status == 400 and message.startswith("rollout stopped"):
        raise stop(3, message)
    raise stop(2, f"bash_agent: POST {url} returned {status}: {message[:500]}")


def run_bash(command, timeout_s, keep_bytes, env, before=None):
    """Run ``bash -c command``: (exit code, stdout, stderr, timed out); each stream keeps ``keep_bytes``.
    The command ends when bash exits; at the timeout its process group is killed (exit code -9), and
    also when the process limit refused a fork since ``before`` (``counters()``): a fork bomb left
    running would leave no process, nor thread, for anything else in the box."""
    proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    streams = (proc.stdout, proc.stderr)
    kept = {stream.fileno(): bytearray() for stream in streams}
    selector = selectors.DefaultSelector()
    for fd in kept:
        selector.register(fd, selectors.EVENT_READ)
    deadline, timed_out, exited = time.monotonic() + timeout_s, False, False
    while selector.get_map() or not exited:
        if not exited and proc.poll() is not None:  # bash is done: the rest of its output must come soon
            exited, deadline = True, min(deadline, time.monotonic() + DRAIN_S)
        left = deadline - time.monotonic()
        if left <= 0 and exited:
            break  # a background job, or a process that left the group, holds a pipe open
        if left <= 0:
            timed_out, exited, deadline = True, True, time.monotonic() + DRAIN_S
            os.killpg(proc.pid, signal.SIGKILL)  # bash leads the group until it is reaped: the group exists
            continue
        for ready, _ in selector.select(min(left, 0.05)):  # wakes every 50 ms to see whether bash exited
            data = os.read(ready.fd, 65536)
            if not data:
                selector.unregister(ready.fd)
            buffer = kept[ready.fd]
            buffer += data[:max(keep_bytes - len(buffer), 0)]
    held = [key.fd for key in selector.get_map().values()]
    selector.close()
    out, err = (kept[stream.fileno()].decode("utf-8", "replace") for stream in streams)
    if held:
        keep_draining(held)
    for stream in streams:
        stream.close()
    code = proc.wait()
    if before is not None and counters().get("max", 0) > before.get("max", 0):
        kill_group(proc.pid)
    return -9 if timed_out else code, out, err, timed_out


def keep_draining(fds):
    """Hand the read ends of pipes a background job still holds (a server the command started with ``&``) to
    a ``cat`` of their own, in a session of its own, that reads them until the job closes them: closing them
    here instead would make the job's next write fail (SIGPIPE, or EPIPE: a server that logs each request
    stops answering), where a terminal, and ``nohup``, let it run on. The ``cat`` ends with the job, or with
    the box's other leftovers."""
    for fd in fds:
        try:
            subprocess.Popen(["cat"], stdin=fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        except OSError:
            pass


def kill_group(pgid):
    """SIGKILL process group ``pgid`` until it is gone (a fork in flight can add a member); at most 50 times."""
    for _ in range(50):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:   # ProcessLookupError: no member left
            return
        time.sleep(0.02)


# The box's cgroup counters (v2, then v1) and limits: what ``docker/limits.py`` reads from outside.
COUNTERS = {"oom_kill": ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"),
            "max": ("/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids/pids.events")}
LIMITS = {"memory_mb": ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
          "pids_limit": ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max")}


def counters():
    """``{"oom_kill": N, "max": N}``: processes the OOM killer ended and forks the process limit refused,
    in this box's cgroup (a key is missing where there is no such file, as outside a container)."""
    found: dict = {}
    for key, paths in COUNTERS.items():
        for path in paths:
            try:
                with open(path) as handle:
                    for line in handle:
                        name, _, value = line.partition(" ")
                        if name == key and value.strip().isdigit():
                            found[key] = max(found.get(key, 0), int(value))
            except OSError:
                continue
    return found


def limit(name):
    """The box's ``memory_mb`` (MiB) or ``pids_limit`` as text; "?" when unknown."""
    for path in LIMITS[name]:
        try:
            with open(path) as handle:
                value = handle.read().strip()
        except OSError:
            continue
        if value.isdigit():
            return str(int(value) // 2**20) if name == "memory_mb" else value
    return "?"


def limits(before, after, code):
    """What the box's limits did while a command ran (counters ``before`` and ``after``; ``code``: its
    exit code), as a note for its exit code line; "" when nothing."""
    notes = []
    killed = after.get("oom_kill", 0) - before.get("oom_kill", 0)
    if killed > 0:
        what = "killed" if code in (-9, 137) else f"{killed} of its processes killed"
        notes.append(f"{what}: out of memory (memory_mb = {limit('memory_mb')})")
    refused = after.get("max", 0) - before.get("max", 0)
    if refused > 0:
        notes.append(f"the process limit was hit: {refused} fork(s) refused (pids_limit = {limit('pids_limit')}); "
                     "its processes were killed")
    return "; ".join(notes)


def tool_result(call, timeout_s, cap, key, env):
    """The content of the tool message answering one tool call (an error text for a bad call)."""
    function = call.get("function") or {}
    name, raw = function.get("name"), function.get("arguments") or "{}"
    if name != "bash":
        return f"Error: unknown tool {name!r}. Available tools: bash."
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        return f"Error: the arguments of 'bash' are not a valid JSON object ({exc})."
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if not isinstance(command, str):
        return 'Error: invalid arguments for \'bash\': expected {"command": "<shell command>"}.'
    before = counters()
    try:
        code, out, err, timed_out = run_bash(command, timeout_s, 4 * cap, env, before)
    except OSError as exc:
        return f"Error: cannot run bash: {exc}"
    acted = limits(before, counters(), code)
    note = " (killed: timeout)" if timed_out else f" ({acted})" if acted else ""
    output = f"exit_code: {code}{note}\nstdout:\n{out}\nstderr:\n{err}".replace(key, "[redacted]")
    if len(output) > cap:
        output = output[:cap] + f"\n[output cut at {cap} characters]"
    return output


def main():
    """Run the loop; the exit status (0 answered, 2 error, 3 rollout stopped)."""
    base, key, model = setting("OPENAI_BASE_URL"), setting("OPENAI_API_KEY"), setting("OPENAI_MODEL")
    if not base.startswith("http://"):
        raise stop(2, f"bash_agent: OPENAI_BASE_URL = {base!r}: only http:// URLs are supported.")
    timeout_s = setting("BASH_AGENT_TIMEOUT_S", "120", float)
    cap = setting("BASH_AGENT_OUTPUT_CHARS", "16384", int)
    messages = []
    system_file = os.environ.get("SYSTEM_PROMPT_FILE")
    if system_file and os.path.isfile(system_file):
        messages.append({"role": "system", "content": read_text("SYSTEM_PROMPT_FILE", system_file)})
    messages.append({"role": "user", "content": read_text("PROMPT_FILE", setting("PROMPT_FILE"))})
    env = {name: value for name, value in os.environ.items() if name != "OPENAI_API_KEY"}
    url = base.rstrip("/") + "/chat/completions"
    while True:
        answer = post(url, key, {"model": model, "messages": messages, "tools": [BASH_TOOL]})
        try:
            message = answer["choices"][0]["message"]
            calls = message.get("tool_calls") or []
        except (KeyError, IndexError, TypeError, AttributeError):
            raise stop(2, f"bash_agent: POST {url} returned no choices[0].message: {str(answer)[:500]}") from None
        messages.append({field: message[field] for field in ("role", "content", "tool_calls") if field in message})
        if not calls:
            sys.stdout.buffer.write(((message.get("content") or "") + "\n").encode("utf-8"))
            return 0
        for call in calls:
            content = tool_result(call, timeout_s, cap, key, env)
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})


if __name__ == "__main__":
    sys.exit(main())
