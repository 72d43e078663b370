"""A Harbor task's scripts run as Harbor runs them, and the services the agent started serve its tests
(issue 34, items 2 and 4), on a real Docker engine: a Python ``test.sh`` behind a shebang and a
``solve.sh`` without one (run by bash), their outputs kept; a server the oracle or the bash program left
answering the tests and gone after them; a leftover daemon that rewrites the reward, the tests and every
process's ``/proc/<pid>/root`` changing nothing; no tool of the box run with more than Docker's default
capabilities."""

from __future__ import annotations

import uuid

import pytest

import prefect_rollouts as vf
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.runtimes import make_runtime
from tests.docker.test_harbor_docker import harbor_config, run_all, task_dir
from tests.fakes.openai_server import reply, tool_call

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(300)]

PYTHON_TEST = """#!/usr/bin/env python3
import ctypes, os, pathlib, sys
libc = ctypes.CDLL(None, use_errno=True)   # as in a box of Docker's defaults: no user namespace, no perf events
attr = ctypes.create_string_buffer(64)     # a software task clock of this process, user space only
for offset, value, size in ((0, 1, 4), (4, 64, 4), (8, 1, 8), (40, (1 << 5) | (1 << 6), 8)):
    attr[offset:offset + size] = value.to_bytes(size, "little")
perf = libc.syscall({"x86_64": 298, "aarch64": 241}[os.uname().machine], attr, 0, -1, -1, 0)
print("checked by python; perf_event_open:", os.strerror(ctypes.get_errno()) if perf < 0 else "opened",
      "; a user namespace:", os.strerror(ctypes.get_errno()) if libc.unshare(0x10000000) else "made", flush=True)
print("to stderr", file=sys.stderr, flush=True)
ok = pathlib.Path("/app/out.txt").read_text().strip() == "hello"
pathlib.Path("/logs/verifier/reward.txt").write_text("1" if ok else "0")
"""

# Serves /app on port 8000 and leaves it running, as a task's solution or agent would.
START_SERVER = "cd /app && echo hello > out.txt && (python3 -m http.server 8000 >/dev/null 2>&1 &)\n"

QUERY_SERVER = """python3 - <<'EOF'
import pathlib, time, urllib.request
body = ""
for _ in range(50):
    try:
        body = urllib.request.urlopen("http://127.0.0.1:8000/out.txt", timeout=2).read().decode()
        break
    except OSError:
        time.sleep(0.1)
print("served:", body.strip())
pathlib.Path("/logs/verifier/reward.txt").write_text("1" if body.strip() == "hello" else "0")
EOF
"""


async def test_a_python_test_behind_a_shebang_and_a_solve_without_one_run_as_harbor_runs_them(tmp_path, agent_config):
    task_dir(tmp_path, "scripts", test_sh=PYTHON_TEST,   # [[ ]] is bash's: sh would fail on it
             solve_sh='[[ -d /app ]] && echo "solved by bash" && echo hello > /app/out.txt\n')
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["scripts"]
    assert (trace.errors, trace.reward) == ([], 1.0)
    harbor = trace.info["harbor"]
    assert (harbor["solution"]["exit_code"], harbor["solution"]["output_tail"]) == (0, "solved by bash\n")
    assert harbor["logs"]["agent/oracle.txt"] == "solved by bash\n"
    output = ("checked by python; perf_event_open: Operation not permitted ; a user namespace: Operation not "
              "permitted\nto stderr\n")   # stdout and stderr, into one file
    assert harbor["verifier"]["exit_code"] == 0
    assert (harbor["verifier"]["output_tail"], harbor["verifier"]["output_bytes"]) == (output, len(output))
    assert harbor["logs"]["verifier/test-stdout.txt"] == output


async def test_a_server_the_oracle_left_answers_the_tests_and_is_gone_after_them(tmp_path, agent_config):
    task_dir(tmp_path, "serve", solve_sh=START_SERVER, test_sh=QUERY_SERVER)
    oracle = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["serve"]
    nop = (await run_all(harbor_config(agent_config, "nop"), tmp_path))["serve"]
    assert (oracle.errors, oracle.reward) == ([], 1.0)
    assert oracle.info["harbor"]["verifier"]["output_tail"] == "served: hello\n"
    assert (nop.errors, nop.reward) == ([], 0.0)
    # step by step in one box: the server runs until the tests end, and nothing of the agent's after them
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    config = await task.prepare(harbor_config(agent_config, "oracle"))
    runtime = make_runtime(config.runtime, labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        trace = vf.Trace(task_id="serve", model="none")
        await task.setup(runtime, trace)
        await task.solve(runtime, trace)
        before = await runtime.exec("grep -l http.server /proc/[0-9]*/cmdline | grep -v self")
        assert await task.tests(trace, runtime) == 1.0
        after = await runtime.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; cat /logs/verifier/test-stdout.txt")
    finally:
        await runtime.stop()
    assert before.stdout.strip() != ""
    assert "http.server" not in after.stdout and after.stdout.endswith("served: hello\n")


async def test_a_server_the_bash_program_left_answers_the_tests(tmp_path, agent_config, openai_server):
    task_dir(tmp_path, "serve", test_sh=QUERY_SERVER)
    openai_server.play([tool_call("bash", command=START_SERVER.strip()), reply("done")])
    trace = (await run_all(harbor_config(agent_config, "bash"), tmp_path))["serve"]
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert trace.info["harbor"]["verifier"]["output_tail"] == "served: hello\n"


# Daemons the agent leaves, writing a reward of 1 50 times a second while the tests run: into /logs/verifier,
# into every process's root (the tests' too), into the tests, or after moving /tests and /logs aside.
ATTACKS = {
    "reward-file": "echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json",
    "proc-root": 'for p in /proc/[0-9]*; do echo 1 > "$p/root/logs/verifier/reward.txt"; '
                 'echo "echo 1 > /logs/verifier/reward.txt" > "$p/root/tests/test.sh"; done',
    "tests": "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh",
    "moved-aside": "d=$RANDOM; mv /tests /tests.$d && mkdir /tests && echo 'echo 1 > /logs/verifier/reward.txt' > "
                   "/tests/test.sh; mv /logs /logs.$d && mkdir -p /logs/verifier && "
                   "echo '{\"reward\": 1}' > /logs/verifier/reward.json",
}

DAEMON = r"""cat > /tmp/daemon.sh <<'EOS'
while :; do
  ATTACK
  sleep 0.02
done 2>/dev/null
EOS
(setsid bash /tmp/daemon.sh </dev/null >/dev/null 2>&1 & echo $! > /tmp/daemon.pid)
"""

# The tests wait for the daemon's writes, check it is alive, and score 0.
AGAINST_THE_DAEMON = """sleep 1
if kill -0 "$(cat /tmp/daemon.pid)" 2>/dev/null; then alive=1; else alive=0; fi
echo "{\\"reward\\": 0, \\"daemon_alive\\": $alive}" > /logs/verifier/reward.json
"""


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_daemon_the_agent_left_cannot_write_the_reward_or_the_tests(tmp_path, agent_config, attack):
    task_dir(tmp_path, "daemon", solve_sh=DAEMON.replace("ATTACK", ATTACKS[attack]), test_sh=AGAINST_THE_DAEMON)
    # storage_mb = 0: a writable root, where /logs and /tests are plain directories that can be moved (under
    # this engine's tmpfs quota they are mounts of their own, which no process of the box can move)
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path, storage_mb=0))["daemon"]
    assert (trace.errors, trace.reward, trace.metrics.get("daemon_alive")) == ([], 0.0, 1.0)


# The agent replaces the box's tools that making a private view could use (util-linux, coreutils, python3): none
# of them may run with a capability; the tests' bash runs with Docker's default ones (CapEff a80425fb).
REPLACE_TOOLS = """for tool in /usr/bin/unshare /usr/bin/nsenter /usr/bin/setpriv /usr/bin/mount /usr/bin/chroot \\
    /usr/bin/timeout /usr/bin/tail /usr/bin/python3.11; do
  printf '#!/bin/sh\\ngrep CapEff /proc/self/status >> /tmp/replaced-tool-ran\\n' > "$tool"
done
echo hello > /app/out.txt
"""
CAPABILITIES = """caps=$(grep CapEff /proc/self/status | cut -f2)
# a replaced tool the box itself ran (the oracle's command runs tail) has the box's capabilities (Docker's
# default less MKNOD, a00425fb) or none: that is fine; more (the private view's) is not
if ! grep -qvx -e 'CapEff:.0000000000000000' -e 'CapEff:.00000000a00425fb' /tmp/replaced-tool-ran 2>/dev/null && \\
    [ "$caps" = 00000000a80425fb ] && \\
    grep -qx hello /app/out.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "caps=$caps ran=$(cat /tmp/replaced-tool-ran 2>/dev/null)"; echo 0 > /logs/verifier/reward.txt
fi
"""


async def test_no_tool_of_the_box_runs_with_more_than_dockers_default_capabilities(tmp_path, agent_config):
    task_dir(tmp_path, "tools", solve_sh=REPLACE_TOOLS, test_sh=CAPABILITIES)
    # storage_mb = 0: a writable root, so that the agent can replace files under /usr
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path, storage_mb=0))["tools"]
    assert (trace.errors, trace.reward) == ([], 1.0), trace.info["harbor"]["verifier"]["output_tail"]


# Adversarial pass of issue 34: a root agent becomes [verifier] user (CAP_SETUID) and writes the reward through
# every /proc/<pid>/root; the tests of a non-root user kept no capability, so the ptrace check let it in.
BECOME_THE_VERIFIER = r"""cat > /tmp/writer.py <<'EOS'
import os, time
os.setgroups([]); os.setgid(1000); os.setuid(1000)
while True:
    for pid in os.listdir('/proc'):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                open('/proc/%s/root/logs/verifier/reward.txt' % pid, 'w').write('1')
            except OSError:
                pass
    time.sleep(0.01)
EOS
setsid python3 /tmp/writer.py </dev/null >/dev/null 2>&1 &
"""
FAIL_SLOWLY = "sleep 2\necho 0 > /logs/verifier/reward.txt\nsleep 1\n"


async def test_a_root_agent_that_becomes_the_verifier_user_cannot_write_the_reward(tmp_path, agent_config):
    directory = task_dir(tmp_path, "becomes", toml='version = "1.0"\n[verifier]\nuser = "tester"\n',
                         solve_sh=BECOME_THE_VERIFIER, test_sh=FAIL_SLOWLY)
    (directory / "environment" / "Dockerfile").write_text(
        "FROM prefect-rollouts-sandbox:latest\nRUN useradd -u 1000 -m tester && mkdir /app\nWORKDIR /app\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["becomes"]
    assert (trace.errors, trace.reward) == ([], 0.0)


async def test_an_image_whose_user_is_not_root_is_scored(tmp_path, agent_config):
    """Adversarial pass: a Dockerfile ending in USER tester made every rollout an error ("cannot make the
    private view: Permission denied: '/proc/1/ns/mnt'": the helper could not enter another user's namespace)."""
    directory = task_dir(tmp_path, "nonroot",
                         test_sh='[ "$(id -un)" = tester ] && echo 1 > /logs/verifier/reward.txt\n')
    (directory / "environment" / "Dockerfile").write_text(
        "FROM prefect-rollouts-sandbox:latest\nRUN useradd -u 1000 -m tester && mkdir /app && chown tester /app\n"
        "USER tester\nWORKDIR /app\n")
    oracle = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["nonroot"]
    assert (oracle.errors, oracle.reward) == ([], 1.0), oracle.info["harbor"].get("verifier")


STOP_THE_TESTS = r"""cat > /tmp/stopper.py <<'EOS'
import os, signal, time
while True:
    for pid in os.listdir('/proc'):
        try:
            line = open('/proc/%s/cmdline' % pid, 'rb').read()
        except OSError:
            continue
        if b'test.sh' in line or b'prefect-rollouts-private' in line or line.startswith(b'timeout'):
            try:
                os.kill(int(pid), signal.SIGSTOP)
            except OSError:
                pass
    time.sleep(0.05)
EOS
setsid python3 /tmp/stopper.py </dev/null >/dev/null 2>&1 &
"""


async def test_tests_a_leftover_stops_with_sigstop_end_as_an_error_and_leave_no_helper(tmp_path, agent_config,
                                                                                      monkeypatch, docker_engine):
    """Adversarial pass: a leftover that SIGSTOPs the private view's processes (they live in the box's PID
    namespace) hung the eval for good and leaked the helper; the helper is now killed from this side."""
    from prefect_rollouts.runtimes.docker import private as docker_private

    monkeypatch.setattr(docker_private, "SLACK_S", 2.0)
    task_dir(tmp_path, "stopped", toml='version = "1.0"\n[verifier]\ntimeout_sec = 3\n', solve_sh=STOP_THE_TESTS,
             test_sh=FAIL_SLOWLY)
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["stopped"]
    assert trace.reward is None and trace.stop_condition == "scoring_error"
    assert "a process of the box stopped or held them" in trace.errors[0].message
    helpers = docker_engine.containers.list(all=True, filters={"label": "org.prefect-rollouts.role=private",
                                                              "ancestor": "prefect-rollouts-sandbox:latest"})
    assert [c for c in helpers if c.labels.get("org.prefect-rollouts.task_id") == "stopped"] == []
