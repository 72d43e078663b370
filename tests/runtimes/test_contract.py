"""The ``Runtime`` contract (runtimes/base.py), run on every implementation: the same cases on
``local`` and ``docker``. What only one of them does is tested beside it."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.runtimes import make_runtime


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.unit),
                        pytest.param("docker", marks=pytest.mark.system)])   # each case, once per tier
async def runtime(request):
    if request.param == "docker":
        request.getfixturevalue("docker_engine")   # a skip locally without an engine, a failure in CI
    rt = make_runtime(vf.RuntimeConfig(type=request.param, exec_timeout_s=20, output_cap_bytes=1024,
                                       env={"GREETING": "hi"}, artifact_max_bytes=40_000))
    await rt.start()
    yield rt
    await rt.stop()


async def test_exec_gives_exit_code_and_both_streams(runtime):
    result = await runtime.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)


async def test_exec_gets_config_env_and_call_env(runtime):
    result = await runtime.exec('echo "$GREETING $NAME"', env={"NAME": "contract"})
    assert result.stdout == "hi contract\n"


async def test_a_timeout_kills_the_command_and_its_background_jobs(runtime):
    result = await runtime.exec("sleep 30 & sleep 30; echo never", timeout=0.5)
    assert (result.exit_code, result.timed_out, result.stdout) == (-9, True, "")


async def test_output_is_capped_per_stream(runtime):
    result = await runtime.exec("head -c 100000 /dev/zero | tr '\\0' a; head -c 5000 /dev/zero | tr '\\0' b >&2")
    assert (result.exit_code, len(result.stdout), len(result.stderr)) == (0, 1024, 1024)


async def test_files_round_trip_and_paths_cannot_leave_the_workspace(runtime):
    await runtime.write_file("a/b.txt", "hello")
    assert await runtime.read_file("a/b.txt") == b"hello"
    assert (await runtime.exec("cat a/b.txt")).stdout == "hello"
    with pytest.raises(ValueError, match="leaves the workspace"):
        await runtime.read_file("../../etc/passwd")
    with pytest.raises(FileNotFoundError):
        await runtime.read_file("absent.txt")


async def test_artifacts_carry_only_declared_paths_and_respect_the_cap(runtime):
    await runtime.write_file("src/main.py", "print(1)")
    await runtime.write_file("secret.txt", "agent only")
    archive, missing = await runtime.collect_artifacts(["src", "missing.txt"])
    assert missing == ["missing.txt"]
    other = make_runtime(runtime.config)
    await other.start()
    try:
        await other.restore_artifacts(archive)
        assert await other.read_file("src/main.py") == b"print(1)"
        assert (await other.exec("test -e secret.txt")).exit_code == 1
    finally:
        await other.stop()
    await runtime.write_file("big.bin", b"x" * 50_000)
    with pytest.raises(vf.TaskError, match="artifact_max_bytes"):
        await runtime.collect_artifacts(["big.bin"])


async def test_a_scoped_view_adds_env_and_stopping_it_keeps_the_workspace(runtime):
    await runtime.write_file("kept.txt", "yes")
    view = await runtime.scoped(env={"SCORING": "1"})
    assert (await view.exec('echo "$SCORING"; cat kept.txt')).stdout == "1\nyes"
    await view.stop()
    assert await runtime.read_file("kept.txt") == b"yes"


async def test_stop_is_idempotent_and_later_calls_fail(runtime):
    await runtime.stop()
    await runtime.stop()
    with pytest.raises(RuntimeError, match="not started"):
        await runtime.exec("true")
