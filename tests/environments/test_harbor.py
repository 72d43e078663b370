"""The harbor taskset without Docker: loading task directories (Harbor's task.toml schema, unknown keys,
wrong types, missing files, subsets, refused features) and reading reward files."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.agent import with_task_network
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.environments.harbor.config import TaskToml
from prefect_rollouts.environments.harbor.reward import read_reward
from prefect_rollouts.environments.harbor.taskset import HarborTask
from prefect_rollouts.errors import ConfigError, TaskError

pytestmark = pytest.mark.unit

SHIPPED = Path(__file__).parent.parent.parent / "examples" / "harbor-tasks"

TOML = """\
version = "1.0"
[metadata]
category = "demo"
difficulty = "easy"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 30.0
[environment]
cpus = 1
memory_mb = 512
"""


def make_task(root: Path, name: str, toml: str = TOML, *, instruction: str | None = "Write hello to /app/out.txt.",
              test_sh: str | None = "echo 1 > /logs/verifier/reward.txt\n") -> Path:
    directory = root / name
    (directory / "environment").mkdir(parents=True)
    (directory / "environment" / "Dockerfile").write_text("FROM prefect-rollouts-sandbox:latest\nWORKDIR /app\n")
    (directory / "task.toml").write_text(toml)
    if instruction is not None:
        (directory / "instruction.md").write_text(instruction)
    if test_sh is not None:
        (directory / "tests").mkdir()
        (directory / "tests" / "test.sh").write_text(test_sh)
    return directory


def test_a_directory_of_tasks_loads_each_as_a_task_named_by_its_directory(tmp_path):
    make_task(tmp_path, "b-task")
    make_task(tmp_path, "a-task", TOML.replace('category = "demo"', 'category = "text"'))
    (tmp_path / "not-a-task").mkdir()   # no task.toml, no instruction.md: skipped
    tasks = load_taskset("harbor", {"path": str(tmp_path)})
    assert [task.id for task in tasks] == ["a-task", "b-task"]
    first = tasks[0]
    assert isinstance(first, HarborTask) and first.data.prompt == "Write hello to /app/out.txt."
    assert first.data.info["category"] == "text" and first.data.info["difficulty"] == "easy"
    assert first.toml.agent.timeout_sec == 120.0 and first.toml.verifier.timeout_sec == 30.0
    assert first.data.scoring is not None and first.data.scoring.mode == "shared"
    # one task directory works too, and a subset by name keeps its order
    assert [t.id for t in load_taskset("harbor", {"path": str(tmp_path / "b-task")})] == ["b-task"]
    assert [t.id for t in load_taskset("harbor", {"path": str(tmp_path), "tasks": ["b-task", "a-task"]})] == \
        ["b-task", "a-task"]


def test_harbor_defaults_and_the_renamed_and_deprecated_keys(tmp_path):
    make_task(tmp_path, "t", 'schema_version = "1.1"\n[environment]\nmemory = "1G"\nstorage = "512M"\n')
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    assert task.toml.verifier.timeout_sec == 600.0 and task.toml.agent.timeout_sec is None
    assert (task.toml.environment.memory_mb, task.toml.environment.storage_mb) == (1024, 512)
    assert task.toml.environment.build_timeout_sec == 600.0


def test_unknown_keys_are_accepted_with_one_warning_each(tmp_path, caplog):
    toml = "brand_new = true\n" + TOML.replace("[agent]", "[agent]\nfancy = 1")
    make_task(tmp_path, "one", toml)
    make_task(tmp_path, "two", toml)
    with caplog.at_level(logging.WARNING, logger="prefect_rollouts.harbor"):
        tasks = load_taskset("harbor", {"path": str(tmp_path)})
    assert len(tasks) == 2
    warned = [record.getMessage() for record in caplog.records]
    assert sum("'brand_new'" in line for line in warned) == 1   # once, not once per task
    assert sum("'agent.fancy'" in line for line in warned) == 1


@pytest.mark.parametrize(("toml", "named"), [
    (TOML.replace("timeout_sec = 30.0", 'timeout_sec = "soon"'), "verifier.timeout_sec"),
    (TOML.replace("cpus = 1", "cpus = [1]"), "environment.cpus"),
    (TOML.replace("[verifier]", '[verifier]\nenvironment_mode = "elsewhere"'), "verifier.environment_mode"),
    (TOML + "[verifier.env]\nX = 1\n", "verifier.env.X"),
])
def test_a_wrong_type_is_a_config_error_naming_the_task_and_the_key(tmp_path, toml, named):
    make_task(tmp_path, "typo-task", toml)
    with pytest.raises(ConfigError) as raised:
        load_taskset("harbor", {"path": str(tmp_path)})
    assert "'typo-task'" in str(raised.value) and named in str(raised.value)


def test_toml_that_does_not_parse_is_a_config_error(tmp_path):
    make_task(tmp_path, "bad", "version = \n")
    with pytest.raises(ConfigError, match=r"'bad'.*task.toml is not valid TOML"):
        load_taskset("harbor", {"path": str(tmp_path)})


@pytest.mark.parametrize(("missing", "named"), [("instruction", "instruction.md is missing"),
                                                ("test_sh", "tests/test.sh is missing")])
def test_a_missing_file_is_a_config_error_naming_the_task(tmp_path, missing, named):
    make_task(tmp_path, "good")
    make_task(tmp_path, "holey", **{missing: None})
    with pytest.raises(ConfigError, match=rf"'holey'.*{named}"):
        load_taskset("harbor", {"path": str(tmp_path)})


def test_a_task_without_an_image_is_a_config_error(tmp_path):
    directory = make_task(tmp_path, "imageless")
    (directory / "environment" / "Dockerfile").unlink()
    with pytest.raises(ConfigError, match=r"environment/Dockerfile is missing and \[environment\] docker_image"):
        load_taskset("harbor", {"path": str(tmp_path)})


@pytest.mark.parametrize(("extra", "named"), [
    ("[environment]\ngpus = 1\n", "gpus = 1 (this system runs no GPU boxes; run the task in Harbor on a GPU host"),
    ('[environment.tpu]\ntype = "v6e"\ntopology = "2x4"\n', "[environment] tpu (this system runs no TPU boxes"),
    ('[environment]\nos = "Windows"\n', '[environment] os = "windows" (only Linux boxes run here)'),
    ('[[environment.mcp_servers]]\nname = "docs"\nurl = "http://docs:8000/sse"\n',
     "[environment] mcp_servers (MCP servers are not run for the agent; remove them"),
    ('[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n', "[[steps]] (2 steps: multi-step tasks are not run here"),
    ('[verifier.environment]\ndocker_image = "grader:1"\n', "[verifier.environment] (a separate verifier image"),
    ('[[verifier.collect]]\ncommand = "pg_dump > /logs/artifacts/db.sql"\nservice = "db"\n',
     "[[verifier.collect]] (collect hooks run in Docker Compose services"),
    ('artifacts = [{ source = "/data", service = "db" }]\n', "artifacts from a compose service"),
    ('artifacts = ["/app/out"]\n[verifier]\nenvironment_mode = "separate"\n',
     'artifacts with environment_mode = "separate"'),
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org/simple"]\n', "not a path"),
    ('[verifier]\nallowed_hosts = ["pypi.org"]\n', "[verifier] allowed_hosts = ['pypi.org'] without network_mode"),
    # Harbor 0.26: a phase's hosts need that phase's own allowlist, even under an environment allowlist
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org"]\n[agent]\nallowed_hosts = ["b.org"]\n',
     "[agent] allowed_hosts = ['b.org'] without network_mode = \"allowlist\" in [agent] (set it there"),
])
def test_what_this_system_does_not_run_is_refused_naming_the_task_and_the_fix(tmp_path, extra, named):
    make_task(tmp_path, "asks-much", 'version = "1.0"\n' + extra)
    with pytest.raises(ConfigError) as raised:
        load_taskset("harbor", {"path": str(tmp_path)})
    assert "'asks-much'" in str(raised.value) and named in str(raised.value)


def test_a_docker_compose_task_is_refused_not_built_from_its_dockerfile_alone(tmp_path):
    directory = make_task(tmp_path, "composed")
    (directory / "environment" / "docker-compose.yaml").write_text("services:\n  db:\n    image: postgres:16\n")
    with pytest.raises(ConfigError, match=r"'composed'.*environment/docker-compose.yaml \(Docker Compose services "
                                          r"are not run here"):
        load_taskset("harbor", {"path": str(tmp_path)})


def test_harbor_026_defaults_and_derived_values(tmp_path):
    """Harbor 0.26 (``schema_version`` 1.4): resources unset (the runtime config's), fractional CPUs, a verifier
    mode derived from ``[verifier.environment]``, users read as given, ``steps`` and ``artifacts`` known."""
    make_task(tmp_path, "t", 'artifacts = ["/logs/artifacts", { source = "/app/out.txt", destination = "out.txt" }]\n'
              'multi_step_reward_strategy = "final"\n[agent]\nuser = "agent"\n[verifier]\nuser = 1000\n'
              '[environment]\ncpus = 0.5\n')
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    toml = task.toml
    assert toml.schema_version == "1.4" and toml.unknown_keys() == []
    assert (toml.agent.user, toml.verifier.user) == ("agent", 1000)
    assert (toml.environment.cpus, toml.environment.memory_mb, toml.environment.storage_mb) == (0.5, None, None)
    assert toml.verifier.environment_mode == "shared" and toml.environment.os == "linux"
    assert TaskToml.model_validate({"verifier": {"environment": {"docker_image": "g"}}}).verifier.environment_mode \
        == "separate"
    with pytest.raises(ValueError, match=r"incompatible with \[verifier.environment\]"):
        TaskToml.model_validate({"verifier": {"environment_mode": "shared", "environment": {}}})
    with pytest.raises(ValueError, match=r"memory = '1G' \(1024 MB\) conflicts with memory_mb = 512"):
        TaskToml.model_validate({"environment": {"memory": "1G", "memory_mb": 512}})


def test_bad_paths_and_subsets_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_taskset("harbor", {"path": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match="no Harbor task"):
        load_taskset("harbor", {"path": str(tmp_path)})
    make_task(tmp_path, "real")
    with pytest.raises(ConfigError, match=r"'ghost' not in .*Its tasks are: real"):
        load_taskset("harbor", {"path": str(tmp_path), "tasks": ["ghost"]})
    with pytest.raises(ConfigError, match="timeout_multiplier"):
        load_taskset("harbor", {"path": str(tmp_path), "timeout_multiplier": 0.0})


def test_network_and_scoring_placement_come_from_the_phases(tmp_path):
    make_task(tmp_path, "offline", 'version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n'
                                   '[verifier]\nnetwork_mode = "public"\nenvironment_mode = "separate"\n')
    make_task(tmp_path, "legacy", 'version = "1.0"\n[environment]\nallow_internet = false\n')
    offline, legacy = sorted(load_taskset("harbor", {"path": str(tmp_path)}), key=lambda t: t.id, reverse=True)
    assert (offline.network("agent").mode, offline.network("verifier").mode) == ("none", "open")
    assert offline.data.scoring.mode == "isolated" and offline.data.scoring.network.mode == "open"
    assert offline.data.artifacts == ["."]   # the whole workdir goes to the fresh box
    assert (legacy.network("agent").mode, legacy.network("verifier").mode) == ("none", "none")


def test_an_allowlist_maps_onto_rules_per_phase(tmp_path):
    """Issue 23, part 5: ``allowlist`` with ``allowed_hosts``; a phase's own hosts replace the environment's."""
    make_task(tmp_path, "listed", 'version = "1.0"\n[environment]\nnetwork_mode = "allowlist"\n'
                                  'allowed_hosts = ["pypi.org", "*.pythonhosted.org"]\n'
                                  '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://grader.example"]\n'
                                  '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = []\n')
    make_task(tmp_path, "graded-offline", 'version = "1.0"\n[agent]\nnetwork_mode = "allowlist"\n'
                                          'allowed_hosts = ["api.example.com:8443"]\n')
    offline, listed = sorted(load_taskset("harbor", {"path": str(tmp_path)}), key=lambda t: t.id)
    # the agent's own allowlist, though empty, replaces the environment's (Harbor's explicit phase policy)
    assert listed.data.network == vf.NetworkPolicy.model_validate({"allow": []})
    assert listed.toml.phase_hosts("verifier") == ["https://grader.example"]
    assert listed.data.scoring.network.allow == ["https://grader.example"]
    assert offline.data.network.allow == ["api.example.com:8443"] and offline.data.scoring.network.mode == "open"
    composed = with_task_network(vf.AgentConfig(model="m", runtime={"type": "docker"}), listed.data.network,
                                 listed.id).runtime.network
    assert composed == listed.data.network   # the agent left its network open: the task's rules
    closed = vf.AgentConfig(model="m", runtime={"type": "docker", "network": "none"})
    assert with_task_network(closed, listed.data.network, listed.id).runtime.network.mode == "none"


async def test_a_harbor_task_needs_the_docker_runtime(tmp_path):
    make_task(tmp_path, "t")
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    with pytest.raises(ConfigError, match='type = "docker"'):
        await task.prepare(vf.AgentConfig())


@pytest.mark.parametrize(("kind", "text", "expected"), [
    ("txt", "1\n", (1.0, {})),
    ("txt", " 0.25 ", (0.25, {})),
    ("json", "0.5", (0.5, {})),
    ("json", '{"reward": 0.75, "rows_correct": 3, "rows_total": 4}', (0.75, {"rows_correct": 3.0, "rows_total": 4.0})),
    ("json", '{"a": 1, "b": 0}', (0.5, {"a": 1.0, "b": 0.0})),   # no reward key: every key a reward, the mean
])
def test_reward_files_are_read_as_harbor_writes_them(kind, text, expected):
    assert read_reward(kind, text, "t") == expected


@pytest.mark.parametrize(("kind", "text", "why"), [
    ("txt", "", "is empty"), ("txt", "  \n", "is empty"), ("txt", "nan", "finite"), ("txt", "inf", "finite"),
    ("txt", "passed", "not a number"), ("json", "NaN", "finite"), ("json", '{"reward": NaN}', "finite"),
    ("json", "{}", "empty object"), ("json", '{"reward": "high"}', "not a number"), ("json", "[1]", "not a number"),
    ("json", "true", "not a number"), ("json", "{oops", "not JSON"),
])
def test_an_unusable_reward_file_is_a_scoring_error_not_zero(kind, text, why):
    with pytest.raises(TaskError, match=why):
        read_reward(kind, text, "t")


@pytest.mark.parametrize("levels", [300, 100_000])
@pytest.mark.parametrize("shape", ["array", "reward detail"])
def test_a_reward_file_nested_too_deep_is_refused_naming_the_bound(levels, shape):
    nested = "[" * levels + "]" * levels
    text = nested if shape == "array" else f'{{"reward": 1, "detail": {nested}}}'
    with pytest.raises(TaskError, match=r"^Harbor task 't': /logs/verifier/reward.json nests deeper than 128 levels "
                                        r"\(MAX_JSON_DEPTH\); a reward cannot be read from it: '[\[{]"):
        read_reward("json", text, "t")


def test_the_shipped_tasks_load_and_cover_the_required_kinds():
    tasks = load_taskset("harbor", {"path": str(SHIPPED)})
    assert len(tasks) >= 12
    assert all((SHIPPED / t.id / "solution" / "solve.sh").is_file() for t in tasks)
    assert any(t.toml.environment.network_mode == "no-network" for t in tasks)
    assert any(t.separate for t in tasks)
    assert all(t.data.info.get("category") for t in tasks)
    for task in tasks:   # every image builds offline, from the sandbox image
        dockerfile = (SHIPPED / task.id / "environment" / "Dockerfile").read_text()
        assert dockerfile.startswith("FROM prefect-rollouts-sandbox:latest\n")
    # the kinds issue 34 asks for (oracle 1 and nop 0 through tasks check: tests/prefect/test_harbor_eval.py)
    def text(name: str, path: str) -> str:
        return (SHIPPED / name / path).read_text()
    solve = text("install-logtidy-command", "solution/solve.sh")
    assert "/usr/local/bin/logtidy" in solve and "/etc/logtidy.conf" in solve
    assert "pip wheel" in text("pip-install-vendored-wheel", "environment/Dockerfile")
    assert "pip install --no-index" in text("pip-install-vendored-wheel", "solution/solve.sh")
    assert "setsid nohup python3 /app/server.py" in text("serve-inventory-api", "solution/solve.sh")
    assert "http://127.0.0.1:8000" in text("serve-inventory-api", "tests/test.sh")
    assert text("csv-column-stats", "tests/test.sh").startswith("#!/usr/bin/env python3\n")


def test_the_readmes_task_toml_is_valid_and_uses_only_known_keys():
    readme = (SHIPPED.parent.parent / "docs" / "harbor.md").read_text()   # the README's section moved there
    section = readme[readme.index("## `task.toml`"):]
    sample = section[section.index("```toml\nversion") + len("```toml\n"):]
    toml = TaskToml.model_validate(tomllib.loads(sample[:sample.index("```")]))
    assert toml.unknown_keys() == [] and toml.verifier.env == {"PYTHONDONTWRITEBYTECODE": "1"}
    assert (toml.environment.network_mode, toml.agent.timeout_sec) == ("public", 600.0)


@pytest.mark.parametrize("script", ["tests/test.sh", "solution/solve.sh"])
def test_a_script_with_windows_line_endings_is_refused_with_the_fix(tmp_path, script):
    """A new user's pass: a CRLF solve.sh failed at run time as "cannot execute: required file not found"."""
    directory = make_task(tmp_path, "crlf")
    (directory / script).parent.mkdir(exist_ok=True)
    (directory / script).write_bytes(b"#!/bin/bash\r\necho 1 > /logs/verifier/reward.txt\r\n")
    with pytest.raises(ConfigError, match=rf"{script} has Windows line endings \(CRLF\).*Convert it: sed -i"):
        load_taskset("harbor", {"path": str(directory)})
