"""janitor_flow removes sandboxes only on evidence that their owner is gone, and marks the flow
runs of a dead eval process Crashed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.states import Running

import prefect_rollouts as vf
from prefect_rollouts.flows.janitor import janitor_flow
from prefect_rollouts.flows.services.ownership import OWNER_TAG
from prefect_rollouts.runtimes.docker.engine import LABEL
from prefect_rollouts.runtimes.owner import Owner, boot_id, current_owner, process_start
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.cli import eval_env, start_eval
from tests.support.waiting import wait_for


@flow
async def finished_flow() -> str:
    from prefect.runtime import flow_run
    return str(flow_run.get_id())


def dead_owner() -> Owner:
    """The identity of a process of this host that has exited."""
    process = subprocess.Popen(["sleep", "60"])
    start = process_start(process.pid)
    process.kill()
    process.wait(timeout=10)
    return Owner(current_owner().host, boot_id(), process.pid, start)


async def api_url() -> str:
    async with get_client() as client:
        return str(client.api_url).rstrip("/")


@pytest.mark.system
@pytest.mark.serial   # the janitor sweeps every container and workspace of this machine
@pytest.mark.usefixtures("prefect_harness")
async def test_containers_go_on_a_dead_owner_a_final_run_on_this_api_or_age_only(docker_engine):
    image = vf.RuntimeConfig().image
    finished_id, api, now = await finished_flow(), await api_url(), int(time.time())
    alive = str(current_owner())

    def sandbox(**labels):
        labels = {"started_at": str(now), "owner": alive, **labels}
        return docker_engine.containers.run(image, ["sleep", "infinity"], detach=True, labels={
            LABEL: "1", **{f"{LABEL}.{k}": v for k, v in labels.items() if v is not None}})

    of_finished = sandbox(flow_run_id=finished_id, api_url=api)
    of_dead_owner = sandbox(flow_run_id=str(uuid.uuid4()), api_url="http://elsewhere:4200/api",
                            owner=str(dead_owner()))
    old = sandbox(started_at=str(now - 5 * 3600))
    keep = {
        "unknown to this server": sandbox(flow_run_id=str(uuid.uuid4()), api_url=api),
        "finished on another server": sandbox(flow_run_id=finished_id, api_url="http://elsewhere:4200/api"),
        "a live owner, no flow run": sandbox(rollout_id="still-running"),
        "an owner on another host": sandbox(owner=f"other-host_{boot_id()}_1_1"),
        "a malformed start time": sandbox(started_at="notanumber"),
        "no start time": sandbox(started_at=None),
        "not ours": docker_engine.containers.run(image, ["sleep", "infinity"], detach=True),
    }
    try:
        assert set(await janitor_flow(max_age_minutes=180, dry_run=True)) >= {of_finished.short_id, old.short_id}
        assert docker_engine.containers.get(old.id)                       # a dry run removes nothing
        removed = set(await janitor_flow(max_age_minutes=180))
        assert {of_finished.short_id, of_dead_owner.short_id, old.short_id} <= removed
        remaining = {c.id for c in docker_engine.containers.list(all=True, sparse=True)}
        assert {why: c.id in remaining for why, c in keep.items()} == {why: True for why in keep}
        assert old.id not in remaining and of_dead_owner.id not in remaining
    finally:
        for container in (of_finished, of_dead_owner, old, *keep.values()):
            try:
                container.remove(force=True)
            except Exception:
                pass


@pytest.mark.prefect
async def test_workspaces_go_on_a_dead_owner_or_age_only(tmp_path):
    dead = tmp_path / f"rollout-{dead_owner()}-abc123"
    live = tmp_path / f"rollout-{current_owner()}-def456"
    old_unnamed, fresh_unnamed = tmp_path / "rollout-oldname1", tmp_path / "rollout-newname"
    for workspace in (dead, live, old_unnamed, fresh_unnamed):
        workspace.mkdir()
        (workspace / "file.txt").write_text("x")
    os.utime(old_unnamed, (time.time() - 4 * 3600,) * 2)
    removed = await janitor_flow(max_age_minutes=180, workspace_dir=str(tmp_path))
    assert sorted(p for p in removed if p.startswith(str(tmp_path))) == sorted([str(dead), str(old_unnamed)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, fresh_unnamed.name])


@pytest.mark.prefect
async def test_running_flow_runs_of_a_dead_process_are_marked_crashed():
    async with get_client() as client:
        flow_id = await client.create_flow(finished_flow)
        of_dead = await client.create_flow_run(finished_flow, state=Running(), tags=[f"{OWNER_TAG}{dead_owner()}"])
        of_live = await client.create_flow_run(finished_flow, state=Running(), tags=[f"{OWNER_TAG}{current_owner()}"])
        untagged = await client.create_flow_run(finished_flow, state=Running())
        assert flow_id
        acted = await janitor_flow(max_age_minutes=180)
        assert f"flow-run:{of_dead.id}" in acted
        states = {name: (await client.read_flow_run(run.id)).state.type.value
                  for name, run in (("dead", of_dead), ("live", of_live), ("untagged", untagged))}
    assert states == {"dead": "CRASHED", "live": "RUNNING", "untagged": "RUNNING"}


@pytest.mark.system
@pytest.mark.serial   # the janitor sweeps every container and workspace of this machine
@pytest.mark.usefixtures("prefect_harness")
async def test_after_kill_9_of_an_eval_the_janitor_reaps_its_containers_and_crashes_its_flow_runs(
        tmp_path, openai_server, docker_engine):
    openai_server.default = delayed(60, reply("0"))
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=3,
                                rollout_granularity="flow", run_name="killed")
                      + '[env.agent.runtime]\ntype = "docker"\n')
    process = start_eval(config, "--run-id", f"killed-{uuid.uuid4().hex[:6]}",
                         env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"), stdout=subprocess.DEVNULL)
    owner_label = f"{LABEL}.owner"

    def of_process() -> list:
        return [c for c in docker_engine.containers.list(all=True, sparse=True, filters={"label": LABEL})
                if (Owner.parse(c.attrs["Labels"].get(owner_label)) or Owner("", "", 0, 0)).pid == process.pid]

    def started() -> bool:
        assert process.poll() is None, "the eval exited before it started its containers"
        return len(of_process()) >= 3
    try:
        assert await wait_for(started, timeout_s=90, what="the eval to start its 3 containers")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    containers = of_process()
    assert len(containers) == 3                                    # killed: nothing removed them
    owner_tag = OWNER_TAG + containers[0].attrs["Labels"][owner_label]
    await janitor_flow(max_age_minutes=180)
    assert of_process() == []

    async def states_of_its_flow_runs() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[owner_tag])))
        return sorted(run.state.type.value for run in runs)
    assert await wait_for(states_of_its_flow_runs, timeout_s=60) == ["CRASHED"] * 4   # the eval run and 3 rollouts



@pytest.mark.prefect
async def test_a_rollout_flow_run_names_its_owner_and_its_task_runs_carry_no_tag(openai_server, agent_config):
    from tests.prefect.test_rollout_flow import task_runs_of

    openai_server.play([reply("done")])
    async with vf.make_agent(agent_config(orchestrator="prefect", harness="chat")) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="hi")))
    async with get_client() as client:
        flow_run = await client.read_flow_run(uuid.UUID(trace.info["flow_run_id"]))
    assert f"{OWNER_TAG}{current_owner()}" in flow_run.tags
    runs = await task_runs_of(trace.info["flow_run_id"], 4)
    assert len(runs) == 4 and [r.tags for r in runs] == [[]] * 4   # a tag costs an API call per task run


@pytest.mark.system
@pytest.mark.serial   # the janitor sweeps every container and workspace of this machine
@pytest.mark.usefixtures("prefect_harness")
async def test_after_kill_9_of_an_eval_of_a_program_no_program_runs_on_and_the_janitor_leaves_nothing(
        tmp_path, openai_server, docker_engine):
    import glob
    import tempfile

    from tests.fakes.openai_server import tool_call

    openai_server.default = tool_call("bash", command="sleep 600")   # each program then runs a long command
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=2, run_name="killed-bash")
                      .replace('harness = "chat"', 'harness = "bash"')
                      + '[env.agent.runtime]\ntype = "docker"\nnetwork = "none"\n')
    process = start_eval(config, "--run-id", f"killed-{uuid.uuid4().hex[:6]}",
                         env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"), stdout=subprocess.DEVNULL)
    owner_label = f"{LABEL}.owner"

    def of_process() -> list:
        return [c for c in docker_engine.containers.list(all=True, sparse=True, filters={"label": LABEL})
                if (Owner.parse(c.attrs["Labels"].get(owner_label)) or Owner("", "", 0, 0)).pid == process.pid]

    def running(container) -> int:
        """Processes of the program in ``container``: the bash agent and the command it runs."""
        probe = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done "
                 "| grep -c -e '^python3 -I [^ ]*/bash_agent.py' -e '^sleep 600'")
        return int(container.exec_run(["sh", "-c", probe]).output.decode().strip() or 0)
    def launched() -> bool:
        assert process.poll() is None, "the eval exited before it launched its programs"
        return len(of_process()) >= 2 and all(running(c) == 2 for c in of_process())
    try:
        assert await wait_for(launched, timeout_s=90, interval_s=0.3, what="the eval to launch its 2 programs")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    containers = of_process()
    owner = containers[0].attrs["Labels"][owner_label]
    endpoints = glob.glob(os.path.join(tempfile.gettempdir(), f"rollout-{owner}-*.endpoint"))
    assert len(containers) == 2 and len(endpoints) == 1   # left behind by the kill
    # the launchers see their endpoint gone and kill the programs (two misses, 2 s apart)
    assert await wait_for(lambda: not any(running(c) for c in containers), timeout_s=20, interval_s=0.5,
                          what="the programs to end with their killed agent")
    await janitor_flow(max_age_minutes=180)
    assert of_process() == [] and not any(os.path.exists(path) for path in endpoints)   # noqa: ASYNC240 (stats)
