"""Resource limits of docker containers on a real engine: capped logs (rollout, isolated scoring and
the network guard helper), deaths by memory or the process limit named as such, and an image's
``VOLUME`` paths under ``storage_mb``."""

from __future__ import annotations

import asyncio
import io
import re
import uuid
from pathlib import Path

import docker.errors
import pytest
from docker.models.containers import ContainerCollection

import prefect_rollouts as vf
from prefect_rollouts.errors import AgentFailure
from prefect_rollouts.runtimes import make_runtime
from prefect_rollouts.runtimes.docker import limits as docker_limits
from prefect_rollouts.runtimes.docker import storage as docker_storage
from prefect_rollouts.runtimes.docker.engine import LABEL
from tests.fakes.openai_server import reply, tool_call
from tests.support.docker import docker_config

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(120)]

CAP = {"Type": "json-file", "Config": {"max-size": docker_limits.LOG_MAX_SIZE, "max-file": docker_limits.LOG_MAX_FILES}}


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test-resource-limits")


class Scored(vf.Task):
    @vf.reward
    def scored(self):
        return 1.0


async def test_rollout_scoring_and_guard_containers_have_capped_logs(openai_server, agent_config, monkeypatch):
    """Every container the rollout creates, as the engine recorded it at creation (the guard helper
    lives about 0.25 s)."""
    run_id, seen, create = uuid.uuid4().hex, {}, ContainerCollection.create

    def recorded(self, *args, **kwargs):
        container = create(self, *args, **kwargs)
        if container.labels.get(f"{LABEL}.run_id") == run_id:
            seen[container.labels.get(f"{LABEL}.role", "rollout")] = container.attrs["HostConfig"]["LogConfig"]
        return container
    monkeypatch.setattr(ContainerCollection, "create", recorded)
    openai_server.play([reply("done")])
    rules = vf.NetworkPolicy(mode="rules", allow=["example.invalid"])
    config = agent_config(harness="chat", runtime=docker_config(network=rules))
    async with vf.make_agent(config) as agent:
        task = Scored(vf.TaskData(prompt="hi", scoring=vf.ScoringConfig(mode="isolated")))
        trace = await agent.rollout(task, {"run_id": run_id}).run()
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert seen == {"rollout": CAP, "scoring": CAP, "network-guard": CAP}


def log_bytes(path: str) -> int:
    """Bytes of a container's json log ``path`` and its rotated files (``path.1``, ...)."""
    log = Path(path)
    return sum(file.stat().st_size for file in log.parent.iterdir() if file.name.startswith(log.name))


async def test_a_flood_to_the_init_s_stdout_leaves_a_log_under_the_cap(docker_engine):
    """50 MB to ``/proc/1/fd/1`` (the container's own output, which the engine keeps on the host's disk)."""
    runtime = make_runtime(docker_config(), labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        flood = await runtime.exec("head -c 50000000 /dev/zero | tr '\\0' x | fold -w 1000 > /proc/1/fd/1", timeout=60)
        assert flood.exit_code == 0
        path = docker_engine.api.inspect_container(runtime.id)["LogPath"]
        cap = int(docker_limits.LOG_MAX_SIZE.removesuffix("m")) * 2**20
        assert 0 < log_bytes(path) <= int(docker_limits.LOG_MAX_FILES) * cap + 64 * 1024   # + one message's slack
    finally:
        await runtime.stop()


# Grows a bytearray by 8 MiB steps until the kernel ends it (the container's limit is 64 MiB).
HOG = "b = []\nwhile True:\n    b.append(bytearray(8 * 2**20))"
# A fork bomb that keeps its first process alive: every fork that fails is tried again.
BOMB = ("import os, sys\nprint('forking now', flush=True)\nprint('no way back', file=sys.stderr, flush=True)\n"
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass")


async def test_a_program_killed_for_memory_says_memory_mb(openai_server, agent_config, docker_engine):
    harness = vf.HarnessConfig(id="program", command=["python3", "-c", HOG])
    config = agent_config(harness=harness, runtime=docker_config(memory_mb=64, storage_mb=16),
                          retries=vf.StageRetryConfig(segment=0))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="go")))
    # it started, then its own memory use killed it: the agent's failure, scored (agent_exits)
    assert (trace.errors, trace.stop_condition) == ([], "program_failed")
    message = trace.info["agent_failure"]["message"]
    assert "out of memory" in message and "memory_mb = 64" in message, message
    assert "storage_mb" not in message   # no VOLUME in the image: no tmpfs of the quota counts against memory_mb
    launch = trace.info["program"][0]
    assert (launch["exit_code"], set(launch["limits_hit"])) == (137, {"memory"})


async def test_a_program_writing_past_storage_mb_is_stopped_by_the_watch_and_scored_0(openai_server, agent_config,
                                                                                     docker_engine):
    """Issue 34 item 1: the watch ends a program harness's segment too (its launch is killed, exec raises)."""
    if docker_storage.quota_mode(docker_engine.info()) != "watch":
        pytest.skip("this engine caps the layer itself (storage_opt size): the write fails with ENOSPC")
    harness = vf.HarnessConfig(id="program", command=["sh", "-c", "head -c 3G /dev/zero > /usr/big; echo finished"])
    config = agent_config(harness=harness, runtime=docker_config(storage_mb=64),
                          retries=vf.StageRetryConfig(segment=0))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="go")))
    assert (trace.stop_condition, trace.reward, trace.errors) == ("storage_quota", 0.0, []), trace.errors
    assert "storage_mb = 64: the rollout wrote" in trace.info["agent_failure"]["message"]
    assert "finished" not in trace.info["program"][0].get("stdout_tail", "")


class Afterwards(vf.Task):
    """Records, when the rollout finalizes, whether a command still runs in its container."""

    async def finalize(self, trace, runtime):
        result = await runtime.exec("echo alive; ls -d /proc/[0-9]* | wc -l")
        trace.info["afterwards"] = (result.exit_code, result.stdout.split())


async def test_a_fork_bomb_at_the_agent_deadline_records_the_process_limit_and_is_killed(openai_server, agent_config):
    harness = vf.HarnessConfig(id="program", command=["python3", "-c", BOMB])
    config = agent_config(harness=harness, runtime=docker_config(pids_limit=32), timeouts=vf.TimeoutConfig(agent=4))
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.run(Afterwards(vf.TaskData(prompt="go"))), 90)
    assert trace.stop_condition == "agent_timeout", (trace.errors, trace.info)
    [launch] = trace.info["program"]
    assert (launch["exit_code"], launch["killed"]) == (None, "the agent deadline or a cancellation")
    assert "pids" in launch["limits_hit"] and "pids_limit = 32 processes" in launch["limits_hit"]["pids"], launch
    # what it printed before the bomb: the launcher kept it in its file, read once kill_all ended the bomb
    assert (launch["stdout_tail"], launch["stderr_tail"]) == ("forking now\n", "no way back\n"), launch
    # kill_all ended the bomb: a command runs, and beside init and the keep-alive only its own processes
    # (the runtime's wrapper and watchdog with its sleep, bash, ls and wc: up to 6) are left
    code, words = trace.info["afterwards"]
    assert code == 0 and words[0] == "alive" and int(words[1]) <= 8, trace.info["afterwards"]


# A file at /data in the image, and two VOLUME lines: /data (a service's data directory, as postgres's) and /tmp
_VOLUME_IMAGE = f"""FROM {vf.RuntimeConfig().image}
USER root
RUN mkdir -p /data && echo seeded > /data/seed.txt
VOLUME /data /tmp
"""


@pytest.fixture(scope="module")
def volume_image(docker_engine):
    """A small image of the sandbox with ``VOLUME /data /tmp``, removed after the module."""
    tag = f"pr-volume-test-{uuid.uuid4().hex[:8]}:latest"
    docker_engine.images.build(fileobj=io.BytesIO(_VOLUME_IMAGE.encode()), tag=tag, rm=True,
                               labels={f"{LABEL}.test": "1"})
    yield tag
    docker_engine.images.remove(tag, force=True)


async def test_an_image_s_volume_is_a_tmpfs_within_storage_mb_seeded_with_its_files(docker_engine, volume_image):
    """Issue 32 (adversarial pass, e4): with storage_mb = 64, dd wrote 300 MiB to an image's VOLUME /data, an
    anonymous volume on the engine's disk outside the quota."""
    runtime = make_runtime(docker_config(image=volume_image, storage_mb=32, memory_mb=512),
                           labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        shown = (await runtime.exec("cat /data/seed.txt; head -c 48m /dev/zero > /data/big; echo written=$?; "
                                    "du -k /data/big | cut -f1; df -P -k /data /tmp | tail -2")).stdout.split()
        mounts = {mount["Destination"]: mount for mount in docker_engine.api.inspect_container(runtime.id)["Mounts"]}
        volume = docker_engine.volumes.get(mounts["/data"]["Name"]).attrs
        with pytest.raises(AgentFailure, match="storage_mb = 32: the rollout filled its disk quota") as failed:
            await runtime.check_storage()
    finally:
        await runtime.stop()
    assert (failed.value.stop_condition, failed.value.scored) == ("storage_quota", False)
    assert shown[:2] == ["seeded", "written=1"] and int(shown[2]) <= 32 * 1024     # ENOSPC at the quota
    assert (shown[3], shown[4], shown[8], shown[9], shown[14]) == ("tmpfs", str(32 * 1024), "/data", "tmpfs", "/tmp")
    assert shown[10] == str(32 * 1024)   # /tmp, a VOLUME too: a tmpfs of the quota
    assert volume["Options"] == {"type": "tmpfs", "device": "tmpfs", "o": "size=32m"}   # memory, not the disk
    with pytest.raises(docker.errors.NotFound):   # removed with the container
        docker_engine.volumes.get(mounts["/data"]["Name"])


def test_reading_an_image_s_volume_files_leaves_no_volume_on_the_engine(docker_engine, volume_image):
    """The container that reads a VOLUME's seed files is created, never started, and removed with its anonymous
    volumes: removed without them, each rollout in such an image left one on the engine's disk (143 found
    here after a day of test runs)."""
    from prefect_rollouts.runtimes.docker.volumes import image_files

    image_id = docker_engine.images.get(volume_image).id
    before = {volume.name for volume in docker_engine.volumes.list(filters={"dangling": True})}
    files = image_files.__wrapped__(docker_engine, image_id, "/data")
    left = {volume.name for volume in docker_engine.volumes.list(filters={"dangling": True})} - before
    assert files is not None and left == set()


ALLOC = "python3 -c 'x = bytearray(400 * 2**20)'"   # past memory_mb = 128: the OOM killer ends python
ALLOC_IN_CHILD = "python3 -c 'import subprocess; subprocess.run([\"python3\", \"-c\", \"x = bytearray(400 * 2**20)\"])'"


class Said(vf.Task):
    @vf.reward
    def said_done(self, trace):
        return float(trace.last_reply == "done")


def tool_results(trace) -> list[str]:
    return [message["content"] for message in trace.messages if message.get("role") == "tool"]


async def test_a_tools_harness_bash_command_killed_for_memory_tells_the_model_and_the_trace(
        openai_server, agent_config):
    openai_server.play([tool_call("bash", command=ALLOC), reply("done")])
    config = agent_config(runtime=docker_config(memory_mb=128))   # the tools harness, its runtime bash tool
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert (trace.errors, trace.reward) == ([], 1.0)
    [result] = tool_results(trace)
    assert result.startswith("exit_code: 137 (killed: out of memory (memory_mb = 128))\n"), result
    [entry] = trace.info["limits_hit"]
    assert (entry["tool"], entry["command"], entry["exit_code"]) == ("bash", ALLOC, 137)
    assert set(entry["limits_hit"]) == {"memory"} and "memory_mb = 128" in entry["limits_hit"]["memory"]


@pytest.mark.parametrize(("command", "note"), [
    (ALLOC, "exit_code: -9 (killed: out of memory (memory_mb = 128))"),
    (ALLOC_IN_CHILD, "exit_code: 0 (1 of its processes killed: out of memory (memory_mb = 128))"),
])
async def test_a_bash_program_command_killed_for_memory_tells_the_model_and_the_trace(
        openai_server, agent_config, command, note):
    openai_server.play([tool_call("bash", command=command), reply("done")])
    config = agent_config(harness="bash", runtime=docker_config(memory_mb=128))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert (trace.errors, trace.reward) == ([], 1.0)
    [result] = tool_results(trace)
    assert result.startswith(note + "\n"), result
    [launch] = trace.info["program"]   # the program exited 0: the launch's limits are read all the same
    assert launch["exit_code"] == 0 and set(launch["limits_hit"]) == {"memory"}, launch


async def test_a_fork_bomb_in_a_bash_program_command_is_killed_and_the_rollout_goes_on(openai_server, agent_config):
    openai_server.play([tool_call("bash", command=":(){ :|:& };:; sleep 2; echo after"),
                        tool_call("bash", command="echo still here"), reply("done")])
    config = agent_config(harness="bash", runtime=docker_config(pids_limit=64))
    async with vf.make_agent(config) as agent:
        trace = await asyncio.wait_for(agent.run(Said(vf.TaskData(prompt="go"))), 90)
    assert (trace.errors, trace.reward, trace.stop_condition) == ([], 1.0, "agent_completed"), trace.info
    bomb, after = tool_results(trace)
    assert re.match(r"exit_code: \d+ \(the process limit was hit: \d+ fork\(s\) refused \(pids_limit = 64\); "
                    r"its processes were killed\)\n", bomb), bomb   # 0, or 254 when sleep could not start
    assert after == "exit_code: 0\nstdout:\nstill here\n\nstderr:\n"
    [launch] = trace.info["program"]
    assert set(launch["limits_hit"]) == {"pids"} and "Traceback" not in launch["stderr_tail"], launch


async def test_a_program_that_exits_0_without_the_model_after_a_death_by_memory_says_so(openai_server, agent_config):
    harness = vf.HarnessConfig(id="program", command=["bash", "-c", ALLOC_IN_CHILD + "; echo survived"])
    config = agent_config(harness=harness, runtime=docker_config(memory_mb=128), retries=vf.StageRetryConfig(segment=0))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="go")))
    [error] = trace.errors
    assert error.message.startswith('harness "program": the program exited (code 0) without calling the model '
                                    "(out of memory: the kernel's OOM killer ended 1 process(es)"), error.message
    assert "memory_mb = 128" in error.message
    assert set(trace.info["program"][0]["limits_hit"]) == {"memory"}
