"""A Harbor task reads only its own directory (issue 32, item 8): a symlink out of it, among the files
the task names or under tests/, solution/ and environment/, is refused by loading and by ``tasks check``,
naming the link; a link that stays inside loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.errors import ConfigError, TaskError
from prefect_rollouts.trace import Trace
from tests.environments.test_harbor import make_task

pytestmark = pytest.mark.unit


def with_solution(directory: Path) -> Path:
    (directory / "solution").mkdir()
    (directory / "solution" / "solve.sh").write_text("echo hello > /app/out.txt\n")
    return directory


def host_file(root: Path) -> Path:
    secret = root / "host" / "credentials"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text("PROVIDER_KEY=sk-not-for-the-box\n")
    return secret


def link(path: Path, target: Path | str) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


# (the path in the task, what it links to: "secret" = a host file, "dir" = a host directory)
OUTSIDE = [
    ("instruction.md", "/proc/self/environ"),
    ("instruction.md", "secret"),
    ("task.toml", "secret"),
    ("tests/test.sh", "secret"),
    ("tests/helpers/lib.sh", "secret"),
    ("solution/solve.sh", "secret"),
    ("environment/Dockerfile", "secret"),
    ("environment/.dockerignore", "secret"),
    ("tests", "dir"),
    ("solution", "dir"),
    ("environment", "dir"),
    ("environment/vendor", "dir"),
]


def linked_out(root: Path, name: str, target: str) -> tuple[Path, str]:
    """A task tree under ``root/tasks`` whose ``name`` links out; returns the tasks root and the link's text."""
    tasks = root / "tasks"
    directory = with_solution(make_task(tasks, "leaky"))
    (directory / "tests" / "helpers").mkdir()
    (directory / "tests" / "helpers" / "lib.sh").write_text("true\n")
    secret = host_file(root)
    if target == "dir":
        outside = root / "host" / "tree"
        (outside / "sub").mkdir(parents=True, exist_ok=True)
        (outside / "test.sh").write_text("cat /etc/shadow\n")
        (outside / "solve.sh").write_text("true\n")
        (outside / "Dockerfile").write_text("FROM prefect-rollouts-sandbox:latest\nCOPY . /stolen\n")
        destination: Path | str = outside
    else:
        destination = secret if target == "secret" else target
    link(directory / name, destination)
    return tasks, f"{name} -> {destination}"


@pytest.mark.parametrize(("name", "target"), OUTSIDE)
def test_a_link_out_of_the_task_directory_is_refused_by_loading_naming_it(tmp_path, name, target):
    tasks, shown = linked_out(tmp_path, name, target)
    with pytest.raises(ConfigError) as raised:
        load_taskset("harbor", {"path": str(tasks)})
    message = str(raised.value)
    assert "Harbor task 'leaky'" in message and shown in message
    assert "resolves outside the task directory" in message and "Replace the link with the file itself" in message
    assert "sk-not-for-the-box" not in message and "PROVIDER_KEY" not in message


@pytest.mark.parametrize(("name", "target"), OUTSIDE)
def test_tasks_check_refuses_a_link_out_naming_it_before_anything_runs(tmp_path, name, target):
    tasks, shown = linked_out(tmp_path, name, target)
    make_task(tasks, "fine")
    result = CliRunner().invoke(app, ["tasks", "check", str(tasks)])
    output = "".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "".join(shown.split()) in output and "resolvesoutsidethetaskdirectory" in output
    assert "1taskdirectoriesdonotload" in output and "sk-not-for-the-box" not in output


def test_links_that_stay_inside_the_task_directory_load(tmp_path):
    directory = with_solution(make_task(tmp_path, "tidy", instruction=None))
    (directory / "docs").mkdir()
    (directory / "docs" / "prompt.md").write_text("Write hello to /app/out.txt.")
    (directory / "instruction.md").symlink_to("docs/prompt.md")
    (directory / "solution" / "lib.sh").write_text("true\n")
    (directory / "tests" / "lib.sh").symlink_to("../solution/lib.sh")
    (directory / "environment" / "same").symlink_to(".")
    (directory / "tests" / "dangling").symlink_to("not-there-yet")
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    assert task.data.prompt == "Write hello to /app/out.txt."


def test_a_symlink_loop_is_refused_naming_it(tmp_path):
    directory = make_task(tmp_path, "loopy")
    (directory / "tests" / "a").symlink_to("b")
    (directory / "tests" / "b").symlink_to("a")
    with pytest.raises(ConfigError, match=r"'loopy'.*tests/[ab] is a symlink loop"):
        load_taskset("harbor", {"path": str(tmp_path)})


@pytest.mark.parametrize("name", ["solution", "tests"])
async def test_a_link_made_after_loading_is_refused_before_anything_is_copied(tmp_path, name):
    directory = with_solution(make_task(tmp_path, "changed"))
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    link(directory / name, host_file(tmp_path).parent)

    class NoRuntime:   # nothing may reach the box: the check comes first
        async def kill_all(self) -> None:
            pass

        async def exec(self, *args, **kwargs):
            return type("Result", (), {"exit_code": 0, "stderr": "", "stdout": ""})()

        async def upload(self, source, target):
            raise AssertionError(f"uploaded {source}")

    with pytest.raises(TaskError, match=rf"'changed'.*{name} -> .*resolves outside the task directory"):
        if name == "solution":
            await task.solve(NoRuntime(), Trace(task_id="changed", model="none"))
        else:
            await task.tests(Trace(task_id="changed", model="none"), NoRuntime())


# issue 32 (adversarial pass, e16): a hard link cannot be followed to its other names, so a hard-linked
# instruction.md loaded a host file as the prompt and one under tests/ was uploaded with its contents
@pytest.mark.parametrize("name", ["instruction.md", "task.toml", "tests/test.sh", "tests/helpers/h",
                                  "solution/solve.sh", "environment/Dockerfile"])
def test_a_hard_link_is_refused_by_loading_and_tasks_check_naming_it(tmp_path, name):
    tasks = tmp_path / "tasks"
    directory = with_solution(make_task(tasks, "linked"))
    (directory / "tests" / "helpers").mkdir()
    (directory / name).unlink(missing_ok=True)
    (directory / name).hardlink_to(host_file(tmp_path))
    with pytest.raises(ConfigError) as raised:
        load_taskset("harbor", {"path": str(tasks)})
    message = str(raised.value)
    assert "Harbor task 'linked'" in message and f"{name} is a hard link (2 names of one file)" in message
    assert "Replace it with a copy of the file" in message and "sk-not-for-the-box" not in message
    make_task(tasks, "fine")
    result = CliRunner().invoke(app, ["tasks", "check", str(tasks)])
    output = "".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{name}isahardlink" in output and "1taskdirectoriesdonotload" in output
    assert "sk-not-for-the-box" not in output


def test_a_copy_of_a_hard_linked_file_loads(tmp_path):
    directory = make_task(tmp_path, "copied", instruction=None)
    (directory / "instruction.md").write_text(host_file(tmp_path).read_text())
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    assert task.data.prompt == "PROVIDER_KEY=sk-not-for-the-box\n"


async def test_a_hard_link_made_after_loading_is_refused_before_tests_are_copied(tmp_path):
    directory = make_task(tmp_path, "changed")
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    (directory / "tests" / "h").hardlink_to(host_file(tmp_path))

    class NoRuntime:   # nothing may reach the box: the check comes first
        async def kill_all(self) -> None:
            pass

        async def exec(self, *args, **kwargs):
            return type("Result", (), {"exit_code": 0, "stderr": "", "stdout": ""})()

        async def upload(self, source, target):
            raise AssertionError(f"uploaded {source}")

    with pytest.raises(TaskError, match=r"'changed'.*tests/h is a hard link"):
        await task.tests(Trace(task_id="changed", model="none"), NoRuntime())
