"""The shipped Harbor tasks against Harbor's own task models: each ``examples/harbor-tasks/*/task.toml`` must
load with ``TaskConfig`` of the Harbor release we follow (``HARBOR_VERSION``), and read the same here.

Harbor needs Python 3.12 to run, but its pydantic task models (``harbor/models/task/config.py``) load under
3.11 from the wheel without its other dependencies: the wheel is downloaded once per machine (``pip download
--no-deps``) into ``~/.cache/prefect-rollouts/harbor-wheel`` and imported in a subprocess, with a stand-in for
the ``harbor`` package so that its ``__init__`` (which imports all of Harbor) does not run. Without PyPI the test skips
locally and fails in CI (``tests/support/extras.unavailable``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_rollouts.environments import load_taskset
from prefect_rollouts.runtimes.base import cache_dir
from tests.support.extras import unavailable

pytestmark = pytest.mark.system

HARBOR_VERSION = "0.26.0"
"""The Harbor release whose task schema ``harbor_config`` follows (its ``config.py`` is 0.25.0's plus a comment)."""
CHECKOUT = Path(__file__).resolve().parent.parent.parent
SHIPPED = CHECKOUT / "examples" / "harbor-tasks"
WHEELS = cache_dir("harbor-wheel")   # once per machine (~/.cache/prefect-rollouts), not per checkout

# Runs in a fresh interpreter: argv[1] = the wheel, argv[2:] = task.toml files; prints one JSON object per file.
_VALIDATE = r"""
import json, sys, types, warnings, zipfile
from pathlib import Path
wheel = Path(sys.argv[1])
unpacked = wheel.with_suffix("")
if not unpacked.is_dir():
    zipfile.ZipFile(wheel).extractall(unpacked)
package = types.ModuleType("harbor")   # not harbor/__init__.py: it imports the whole of Harbor
package.__path__ = [str(unpacked / "harbor")]
sys.modules["harbor"] = package
from harbor.models.task.config import TaskConfig
for path in sys.argv[2:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            config = TaskConfig.model_validate_toml(Path(path).read_text())
        except Exception as exc:
            print(json.dumps({"path": path, "error": str(exc)}))
            continue
    env, mode = config.environment, config.verifier.environment_mode
    print(json.dumps({"path": path, "warnings": [str(w.message) for w in caught], "read": {
        "agent_timeout": config.agent.timeout_sec, "agent_user": config.agent.user,
        "verifier_timeout": config.verifier.timeout_sec, "verifier_user": config.verifier.user,
        "separate": (mode.value if mode else ("separate" if config.verifier.environment else "shared")) == "separate",
        "cpus": env.cpus, "memory_mb": env.memory_mb, "storage_mb": env.storage_mb, "workdir": env.workdir,
        "network": env.network_mode.value, "steps": config.steps}}))
"""


def harbor_wheel() -> Path:
    """Harbor's wheel in ``<cache>/harbor-wheel``, downloaded from PyPI the first time on a machine."""
    name = f"harbor-{HARBOR_VERSION}-py3-none-any.whl"
    if not (WHEELS / name).is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", f"harbor=={HARBOR_VERSION}", "--no-deps",
                               "--only-binary=:all:", "--python-version", "3.12", "-d", str(WHEELS)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not (WHEELS / name).is_file():
            unavailable(f"harbor=={HARBOR_VERSION} could not be downloaded from PyPI: {done.stderr.strip()[-500:]}",
                        "CI must reach PyPI")
    return WHEELS / name


def test_every_shipped_task_is_valid_for_harbors_task_config_and_reads_the_same_here():
    wheel = harbor_wheel()
    files = sorted(SHIPPED.glob("*/task.toml"))
    done = subprocess.run([sys.executable, "-c", _VALIDATE, str(wheel), *map(str, files)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    upstream = {Path(row["path"]).parent.name: row for row in map(json.loads, done.stdout.splitlines())}
    assert sorted(upstream) == sorted(path.parent.name for path in files)
    assert {name: row["error"] for name, row in upstream.items() if "error" in row} == {}
    assert {name: row["warnings"] for name, row in upstream.items() if row["warnings"]} == {}
    for task in load_taskset("harbor", {"path": str(SHIPPED)}):
        ours, theirs = task.toml, upstream[task.id]["read"]
        environment = ours.environment
        assert {"agent_timeout": ours.agent.timeout_sec, "agent_user": ours.agent.user,
                "verifier_timeout": ours.verifier.timeout_sec, "verifier_user": ours.verifier.user,
                "separate": task.separate, "cpus": environment.cpus, "memory_mb": environment.memory_mb,
                "storage_mb": environment.storage_mb, "workdir": environment.workdir,
                "network": environment.baseline_network(), "steps": ours.steps} == theirs, task.id
