"""Extreme ``task.toml`` values (issue 32, item 9) are refused naming the key, by loading and by
``tasks check``, instead of an ``OverflowError``, a Docker unmarshal error or a false "filled its disk
quota" once a rollout runs; the bounds themselves load."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from prefect_rollouts import bounds
from prefect_rollouts.cli import app
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.errors import ConfigError
from tests.environments.test_harbor import make_task

pytestmark = pytest.mark.unit

HEALTH = '[environment.healthcheck]\ncommand = "true"\n'

# (task.toml text, what the error names)
EXTREME = [
    ("[agent]\ntimeout_sec = 1e308\n", "agent.timeout_sec = 1e+308"),
    ("[verifier]\ntimeout_sec = 1e308\n", "verifier.timeout_sec = 1e+308"),
    ("[verifier]\ntimeout_sec = inf\n", "verifier.timeout_sec = inf"),
    ("[environment]\nbuild_timeout_sec = 1e308\n", "environment.build_timeout_sec = 1e+308"),
    (f"[environment]\nstorage_mb = {2**62}\n", f"environment.storage_mb = {2**62}"),
    (f"[environment]\nmemory_mb = {2**62}\n", f"environment.memory_mb = {2**62}"),
    (f"[environment]\ncpus = {2**62}\n", f"environment.cpus = {2**62}"),
    ('[environment]\nmemory = "1e300G"\n', "memory = '1e300G'"),
    ('[environment]\nstorage = "4000000000G"\n', "storage = '4000000000G'"),
    (HEALTH + "retries = -1\n", "environment.healthcheck.retries = -1"),
    (HEALTH + "retries = 1000000000\n", "environment.healthcheck.retries = 1000000000"),
    (HEALTH + "interval_sec = nan\n", "environment.healthcheck.interval_sec = nan"),
    (HEALTH + "interval_sec = -5.0\n", "environment.healthcheck.interval_sec = -5.0"),
    (HEALTH + "timeout_sec = 1e308\n", "environment.healthcheck.timeout_sec = 1e+308"),
    (HEALTH + "start_period_sec = 1e308\n", "environment.healthcheck.start_period_sec = 1e+308"),
]


@pytest.mark.parametrize(("extra", "named"), EXTREME)
def test_an_extreme_value_is_refused_by_loading_naming_the_key(tmp_path, extra, named):
    make_task(tmp_path, "extreme", 'version = "1.0"\n' + extra)
    with pytest.raises(ConfigError) as raised:
        load_taskset("harbor", {"path": str(tmp_path)})
    assert "Harbor task 'extreme'" in str(raised.value) and named in str(raised.value)


@pytest.mark.parametrize(("extra", "named"), EXTREME)
def test_tasks_check_refuses_an_extreme_value_naming_the_key_before_anything_runs(tmp_path, extra, named):
    make_task(tmp_path, "extreme", 'version = "1.0"\n' + extra)
    make_task(tmp_path, "fine")
    result = CliRunner().invoke(app, ["tasks", "check", str(tmp_path)])
    output = "".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Harbortask'extreme'" in output and "".join(named.split()) in output
    assert "1taskdirectoriesdonotload" in output


def test_the_bounds_themselves_load(tmp_path):
    make_task(tmp_path, "largest", 'version = "1.0"\n'
              f"[agent]\ntimeout_sec = {bounds.MAX_DEADLINE_S}\n[verifier]\ntimeout_sec = {bounds.MAX_DEADLINE_S}\n"
              f"[environment]\nbuild_timeout_sec = {bounds.MAX_DEADLINE_S}\ncpus = {bounds.MAX_CPUS}\n"
              f"memory_mb = {bounds.MAX_MEMORY_MB}\nstorage_mb = {bounds.MAX_STORAGE_MB}\n"
              f'{HEALTH.removeprefix("[environment]")}retries = 0\n')
    (task,) = load_taskset("harbor", {"path": str(tmp_path), "timeout_multiplier": bounds.MAX_TIMEOUT_MULTIPLIER,
                                      "storage_mb": bounds.MAX_STORAGE_MB})
    environment = task.toml.environment
    assert (environment.memory_mb, environment.storage_mb, environment.cpus) == (1024 * 1024, 1024 * 1024, 1024)
    assert task.toml.agent.timeout_sec == 7 * 24 * 3600


@pytest.mark.parametrize(("option", "value"), [("timeout_multiplier", 1e308), ("timeout_multiplier", 101.0),
                                               ("storage_mb", 2**62)])
def test_extreme_taskset_options_are_refused_naming_them(tmp_path, option, value):
    make_task(tmp_path, "t")
    with pytest.raises(ConfigError, match=re.escape(f"[env.taskset] {option} = {value}: must be")):
        load_taskset("harbor", {"path": str(tmp_path), option: value})


async def test_healthcheck_retries_0_still_waits_out_the_start_period(tmp_path, monkeypatch):
    make_task(tmp_path, "slow-start", 'version = "1.0"\n[environment.healthcheck]\ncommand = "ready"\n'
              "retries = 0\nstart_period_sec = 30.0\nstart_interval_sec = 0.0\ninterval_sec = 3600.0\n")
    (task,) = load_taskset("harbor", {"path": str(tmp_path)})
    answers = iter([1, 1, 0])   # mkdir, then the healthcheck fails twice while starting, then passes
    calls = []

    async def exec(command, timeout=None, env=None, user=None):
        calls.append(command)
        code = 0 if command.startswith("mkdir") else next(answers)
        return SimpleNamespace(exit_code=code, stderr="", stdout="", timed_out=False)

    slept: list[float] = []
    sleep = asyncio.sleep

    async def recorded_sleep(seconds: float) -> None:
        slept.append(seconds)
        await sleep(0)
    monkeypatch.setattr(asyncio, "sleep", recorded_sleep)
    runtime = SimpleNamespace(exec=exec, config=SimpleNamespace(image="i", workdir="/app"),
                              network=task.network("agent"))
    await task.setup(runtime, None)
    assert calls[1:] == ["ready"] * 3
    assert slept == [0.0, 0.0]   # start_interval_sec twice, inside the start period (interval_sec is 3600)
