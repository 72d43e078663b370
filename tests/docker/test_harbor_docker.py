"""Harbor tasks on a real Docker engine: oracle and nop, the failures that must not read as 0 (a
Dockerfile that fails, no reward, ``nan``, a test that exits before writing, one past its deadline),
per-phase network, separate scoring, /logs/artifacts on the trace, the image cache, and the bash
program harness solving a task against scripted replies."""

from __future__ import annotations

from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.runtimes.docker import images
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client
from tests.environments.test_harbor import make_task
from tests.fakes.openai_server import reply, tool_call

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(300)]

PASS_IF_HELLO = ('if grep -qx hello /app/out.txt 2>/dev/null; then echo 1 > /logs/verifier/reward.txt; '
                 'else echo 0 > /logs/verifier/reward.txt; fi\n')


def task_dir(root: Path, name: str, *, toml: str | None = None, test_sh: str = PASS_IF_HELLO,
             solve_sh: str = "echo hello > /app/out.txt\n") -> Path:
    directory = make_task(root, name, **({"toml": toml} if toml is not None else {}), test_sh=test_sh)
    (directory / "solution").mkdir()
    (directory / "solution" / "solve.sh").write_text(solve_sh)
    return directory


def harbor_config(agent_config, harness: str) -> vf.AgentConfig:
    return agent_config(harness=harness, runtime=vf.RuntimeConfig(type="docker", exec_timeout_s=30))


async def run_all(config: vf.AgentConfig, root: Path, **options) -> dict[str, vf.Trace]:
    tasks = load_taskset("harbor", {"path": str(root), **options})
    async with vf.make_agent(config) as agent:
        return {task.id: await agent.run(task) for task in tasks}


def containers_of(image: str) -> list:
    return docker_client().containers.list(all=True, sparse=True, filters={"label": f"{LABEL}=1", "ancestor": image})


async def test_oracle_scores_1_and_nop_0_with_no_model_client(tmp_path, agent_config, openai_server):
    task_dir(tmp_path, "hello")
    oracle = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["hello"]
    nop = (await run_all(harbor_config(agent_config, "nop"), tmp_path))["hello"]
    assert (oracle.errors, oracle.reward, oracle.rewards, oracle.stop_condition) == \
        ([], 1.0, {"tests": 1.0}, "agent_completed")
    assert (nop.errors, nop.reward) == ([], 0.0)
    assert openai_server.requests == [] and oracle.model_calls == []   # no model, no client
    harbor = oracle.info["harbor"]
    assert harbor["image"].startswith("prefect-rollouts-task/hello:") and harbor["workdir"] == "/app"
    assert harbor["solution"]["exit_code"] == 0 and harbor["verifier"]["exit_code"] == 0
    assert oracle.info["task"]["category"] == "demo"
    assert containers_of(harbor["image"]) == []


async def test_links_that_stay_inside_the_task_directory_reach_the_box(tmp_path, agent_config):
    directory = make_task(tmp_path, "linked", instruction=None, test_sh=None)   # issue 32, item 8
    (directory / "docs").mkdir()
    (directory / "docs" / "prompt.md").write_text("Write hello to /app/out.txt.")
    (directory / "instruction.md").symlink_to("docs/prompt.md")
    (directory / "checks").mkdir()
    (directory / "checks" / "test.sh").write_text(PASS_IF_HELLO)
    (directory / "tests").symlink_to("checks")
    (directory / "scripts").mkdir()
    (directory / "scripts" / "run.sh").write_text("echo hello > /app/out.txt\n")
    (directory / "scripts" / "solve.sh").symlink_to("run.sh")
    (directory / "solution").symlink_to("scripts")
    (directory / "environment" / "same").symlink_to("Dockerfile")
    oracle = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["linked"]
    assert (oracle.errors, oracle.reward, oracle.messages[0]["content"]) == ([], 1.0, "Write hello to /app/out.txt.")


@pytest.mark.parametrize(("test_sh", "why"), [
    ("echo checked\n", "wrote no reward"),
    ("echo nan > /logs/verifier/reward.txt\n", "finite"),
    ("echo > /logs/verifier/reward.txt\n", "is empty"),
    ("echo '{\"reward\": NaN}' > /logs/verifier/reward.json\n", "finite"),
    ("echo boom >&2; exit 3\n", "exited with code 3 before writing a reward: boom"),
    ("d=$(head -c 20000 /dev/zero | tr '\\0' '['); e=$(head -c 20000 /dev/zero | tr '\\0' ']')\n"
     'echo "{\\"reward\\": 1, \\"detail\\": $d$e}" > /logs/verifier/reward.json\n',
     "reward.json nests deeper than 128 levels (MAX_JSON_DEPTH)"),   # was a RecursionError
])
async def test_a_test_that_writes_no_usable_reward_is_an_error_not_0(tmp_path, agent_config, test_sh, why):
    task_dir(tmp_path, "broken-tests", test_sh=test_sh)
    task_dir(tmp_path, "fine")
    traces = await run_all(harbor_config(agent_config, "oracle"), tmp_path)
    broken = traces["broken-tests"]
    assert broken.reward is None and [e.type for e in broken.errors] == ["TaskError"]
    assert why in broken.errors[0].message and broken.errors[0].stage == "scoring"
    assert traces["fine"].reward == 1.0 and traces["fine"].errors == []   # the other task is unaffected


async def test_a_test_past_its_deadline_is_killed_and_is_an_error(tmp_path, agent_config):
    toml = 'version = "1.0"\n[verifier]\ntimeout_sec = 2.0\n'
    task_dir(tmp_path, "slow", toml=toml, test_sh="sleep 30; echo 1 > /logs/verifier/reward.txt\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["slow"]
    assert trace.reward is None and "ran longer than [verifier] timeout_sec = 2 s" in trace.errors[0].message
    assert trace.info["harbor"]["verifier"]["timed_out"] is True


async def test_a_dockerfile_that_fails_is_an_infrastructure_error_of_that_task_only(tmp_path, agent_config):
    bad = task_dir(tmp_path, "unbuildable")
    (bad / "environment" / "Dockerfile").write_text("FROM prefect-rollouts-sandbox:latest\nRUN echo nope >&2; "
                                                    "exit 7\n")
    task_dir(tmp_path, "fine")
    traces = await run_all(harbor_config(agent_config, "oracle"), tmp_path)
    failed = traces["unbuildable"]
    assert failed.reward is None and [e.type for e in failed.errors] == ["InfrastructureError"]
    assert failed.errors[0].stage == "setup" and "building environment/ failed" in failed.errors[0].message
    assert "returned a non-zero code: 7" in failed.errors[0].message and "nope" in failed.errors[0].message
    assert traces["fine"].reward == 1.0


async def test_network_per_phase_and_artifacts_kept_on_the_trace(tmp_path, agent_config):
    toml = 'version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n'
    probe = ("n=$(ls /sys/class/net | grep -vc '^lo$'); echo \"$n\" > /logs/artifacts/{phase}-interfaces.txt; "
             "cp /logs/artifacts/{phase}-interfaces.txt /app/{phase}.txt\n")
    task_dir(tmp_path, "phases", toml=toml,
             solve_sh=probe.format(phase="agent") + "echo hello > /app/out.txt\n",
             test_sh=probe.format(phase="verifier").replace("/logs/artifacts", "/tmp") + PASS_IF_HELLO)
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["phases"]
    assert trace.errors == [] and trace.reward == 1.0
    assert trace.info["harbor"]["network"] == {"agent": "none", "verifier": "open"}
    assert trace.info["harbor"]["artifacts"] == {"agent-interfaces.txt": "0\n"}   # no interface but lo


async def test_separate_scoring_sees_the_agents_workdir_in_a_fresh_box(tmp_path, agent_config):
    toml = 'version = "1.0"\n[verifier]\nenvironment_mode = "separate"\n'
    test_sh = ('if grep -qx hello /app/out.txt && [ ! -e /tmp/agent-was-here ]; then echo 1; else echo 0; fi '
               '> /logs/verifier/reward.txt\n')
    task_dir(tmp_path, "apart", toml=toml, test_sh=test_sh,
             solve_sh="echo hello > /app/out.txt; mkdir -p /app/sub; echo x > /app/sub/f; touch /tmp/agent-was-here\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["apart"]
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert trace.info.get("scoring_attempts") == 1   # isolated: a fresh container scored it


async def test_the_image_is_built_once_and_again_only_for_the_changed_task(tmp_path, agent_config):
    first, second = task_dir(tmp_path, "first"), task_dir(tmp_path, "second")
    for directory in (first, second):   # a build of its own, not a tag another test made
        (directory / "environment" / "Dockerfile").write_text(
            f"FROM prefect-rollouts-sandbox:latest\nWORKDIR /app\nRUN echo {tmp_path.name}-{directory.name} > /id\n")
    tags = {}
    for directory in (first, second):
        tags[directory.name] = images.image_tag(directory.name, directory / "environment")
    config = harbor_config(agent_config, "nop")
    try:
        built = [task.image.build_s for task in await prepared(config, tmp_path)]
        assert all(seconds > 0 for seconds in built)
        again = await prepared(config, tmp_path)
        assert [task.image.build_s for task in again] == [0.0, 0.0]   # a second eval builds nothing
        (second / "environment" / "data.txt").write_text("changed\n")
        changed = {task.id: task.image.build_s for task in await prepared(config, tmp_path)}
        assert changed["first"] == 0.0 and changed["second"] > 0
        assert images.image_tag("second", second / "environment") != tags["second"]
    finally:
        for tag in [*tags.values(), images.image_tag("second", second / "environment")]:
            try:
                docker_client().images.remove(tag, force=True)
            except Exception:
                pass


async def prepared(config: vf.AgentConfig, root: Path) -> list:
    tasks = load_taskset("harbor", {"path": str(root)})
    for task in tasks:
        await task.prepare(config)
    return tasks


async def test_the_bash_program_harness_solves_a_task_against_scripted_replies(tmp_path, agent_config,
                                                                              openai_server):
    task_dir(tmp_path, "hello")
    openai_server.play([tool_call("bash", command="cd /app && echo hello > out.txt && pwd"), reply("done")])
    trace = (await run_all(harbor_config(agent_config, "bash"), tmp_path))["hello"]
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert len(trace.model_calls) == 2 and trace.messages[0]["content"] == "Write hello to /app/out.txt."
    assert trace.messages[2]["content"].startswith("exit_code: 0\nstdout:\n/app\n")   # it ran in the task's workdir


# What an agent (here the oracle's solve.sh) may do to the box to fake its score, and must not get from it.
SPOOF_DAEMON = r'''mkdir -p /tmp/x
cat > /tmp/x/d <<'EOS'
while :; do
  for p in /proc/[0-9]*; do   # pose as a child of the sweep's shell: its stat's comm field names that PID
    IFS= read -r -d "" a < $p/cmdline 2>/dev/null
    if [ "$a" = sh ]; then printf "x x %s x" "${p#/proc/}" > /proc/self/comm; fi
  done
  if [ -f /tests/test.sh ]; then echo 1 > /logs/verifier/reward.txt; fi
  sleep 0.05
done
EOS
(setsid bash /tmp/x/d </dev/null >/dev/null 2>&1 &)
sleep 0.3
'''


@pytest.mark.parametrize(("tamper", "checks"), [
    ("mkdir -p /tmp/fake; echo 1 > /tmp/fake/reward.json; rm -rf /logs/verifier; ln -s /tmp/fake /logs/verifier\n",
     ""),
    ("mkdir -p /tests; printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /tests/zz-extra.sh\n",
     'for f in /tests/*; do [ "$f" = /tests/test.sh ] || exit 0; done\n'),
    (SPOOF_DAEMON, "sleep 1\n"),
    ("rm -rf /logs && echo no > /logs\n", ""),   # adversarial pass: the rollout became an error, not 0
], ids=["symlinked-verifier-dir", "extra-file-in-tests", "daemon-rewriting-the-reward", "a-file-for-logs"])
async def test_an_agent_cannot_fake_its_reward(tmp_path, agent_config, tamper, checks):
    task_dir(tmp_path, "tamper", solve_sh=tamper, test_sh=checks + "echo 0 > /logs/verifier/reward.txt\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["tamper"]
    assert (trace.errors, trace.reward) == ([], 0.0)


async def test_separate_scoring_sees_the_agents_deletions_and_renames(tmp_path, agent_config):
    toml = 'version = "1.0"\n[verifier]\nenvironment_mode = "separate"\n'
    directory = task_dir(tmp_path, "renames", toml=toml, solve_sh="rm /app/secret.txt; mv /app/old.txt /app/new.txt\n",
                         test_sh='if [ ! -e /app/secret.txt ] && [ ! -e /app/old.txt ] && [ -f /app/new.txt ]; '
                                 'then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n')
    (directory / "environment" / "Dockerfile").write_text(
        "FROM prefect-rollouts-sandbox:latest\nWORKDIR /app\nRUN echo s > secret.txt && echo o > old.txt\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["renames"]
    assert (trace.errors, trace.reward) == ([], 1.0)


async def test_verifier_env_templates_resolve_here_and_their_values_stay_off_the_trace(tmp_path, agent_config,
                                                                                      monkeypatch):
    monkeypatch.setenv("HARBOR_JUDGE_KEY", "sk-judge-9f8e7d6c5b4a3921")
    toml = 'version = "1.0"\n[verifier.env]\nJUDGE_KEY = "${HARBOR_JUDGE_KEY}"\nMODE = "${HARBOR_MODE:-strict}"\n'
    task_dir(tmp_path, "env", toml=toml, test_sh='echo "key=$JUDGE_KEY mode=$MODE"\n'
             '[ "$JUDGE_KEY" = sk-judge-9f8e7d6c5b4a3921 ] && [ "$MODE" = strict ] && '
             'echo 1 > /logs/verifier/reward.txt\n')
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["env"]
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert trace.info["harbor"]["verifier"]["output_tail"] == "key=*** mode=strict\n"
    assert trace.info["harbor"]["logs"]["verifier/test-stdout.txt"] == "key=*** mode=strict\n"


async def test_a_silent_build_past_its_timeout_is_an_error_naming_the_key(tmp_path, agent_config):
    directory = task_dir(tmp_path, "quiet", toml='version = "1.0"\n[environment]\nbuild_timeout_sec = 3.0\n')
    (directory / "environment" / "Dockerfile").write_text(
        f"FROM prefect-rollouts-sandbox:latest\nRUN echo {tmp_path.name} && sleep 12\n")   # the engine goes on
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["quiet"]
    assert trace.reward is None and [e.type for e in trace.errors] == ["InfrastructureError"]
    assert "ran past [environment] build_timeout_sec = 3 s" in trace.errors[0].message
    assert str(tmp_path) not in trace.errors[0].message   # no host path on the trace


async def test_the_agent_and_the_tests_run_as_the_users_task_toml_names(tmp_path, agent_config):
    """``[agent] user`` runs solve.sh (and every command of the agent), ``[verifier] user`` runs test.sh; the
    log directories are made by root and open to both, as Harbor makes them."""
    directory = task_dir(tmp_path, "users", toml='version = "1.0"\n[agent]\nuser = "agent"\n[verifier]\nuser = 1501\n',
                         solve_sh="id -un > /app/out.txt && id -un > /logs/agent/who.txt\n",
                         test_sh='who=$(id -un); echo "agent=$(cat /app/out.txt) owner=$(stat -c %U /app/out.txt) '
                                 'tests=$who"\n[ "$(cat /app/out.txt)/$(stat -c %U /app/out.txt)/$who" = '
                                 'agent/agent/grader ] && echo 1 > /logs/verifier/reward.txt\n')
    (directory / "environment" / "Dockerfile").write_text(
        "FROM prefect-rollouts-sandbox:latest\nRUN useradd -m -u 1500 agent && useradd -m -u 1501 grader && "
        "mkdir /app && chown agent /app\nWORKDIR /app\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["users"]
    assert (trace.errors, trace.reward) == ([], 1.0), trace.info["harbor"].get("verifier")
    assert trace.info["harbor"]["verifier"]["output_tail"] == "agent=agent owner=agent tests=grader\n"


async def test_a_harbor_box_has_dockers_default_capabilities_but_mknod(tmp_path, agent_config):
    """Issue 34: Harbor's box is Docker's default one, where root can chown, drop to another user and
    ``setgroups`` (``apt-get`` does: with every capability dropped it failed "Failed to setgroups"). MKNOD
    stays out so the tests, which run with the whole default set, keep a capability the agent lacks."""
    solve = ("cd /app && touch owned && chown nobody:nogroup owned && stat -c %U owned > report.txt && "
             "setpriv --reuid=nobody --regid=nogroup --clear-groups id -un >> report.txt && "
             "(mknod node c 1 3 2>/dev/null && echo mknod >> report.txt || echo no-mknod >> report.txt)\n")
    task_dir(tmp_path, "caps", solve_sh=solve,
             test_sh='[ "$(cat /app/report.txt | tr "\\n" " ")" = "nobody nobody no-mknod " ] && '
                     "echo 1 > /logs/verifier/reward.txt || { cat /app/report.txt; "
                     "echo 0 > /logs/verifier/reward.txt; }\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["caps"]
    assert (trace.errors, trace.reward) == ([], 1.0), trace.info["harbor"]


@pytest.mark.parametrize(("toml", "key"), [
    ('[agent]\nuser = "nosuch"\n', "[agent] user = 'nosuch'"),
    ('[verifier]\nuser = "grader:nogroup2"\n', "[verifier] user = 'grader:nogroup2'")])
async def test_a_user_the_image_does_not_have_is_a_setup_error_naming_the_key(tmp_path, agent_config, toml, key):
    """A new user's pass: an unknown [agent] user failed as "cannot create / in the container: " and an unknown
    [verifier] user as "tests/test.sh exited with code 127 before writing a reward"."""
    directory = task_dir(tmp_path, "who", toml='version = "1.0"\n' + toml)
    (directory / "environment" / "Dockerfile").write_text(
        "FROM prefect-rollouts-sandbox:latest\nRUN useradd -m grader && mkdir /app\nWORKDIR /app\n")
    trace = (await run_all(harbor_config(agent_config, "oracle"), tmp_path))["who"]
    assert trace.reward is None and [(e.type, e.stage) for e in trace.errors] == [("TaskError", "setup")]
    assert trace.errors[0].message.startswith(f"Harbor task 'who': {key}: the image has no such user or group")
