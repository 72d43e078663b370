"""The wheel a clean checkout builds holds the Prefect layer under the one package name.

``flows/``, ``tasks/`` and ``blocks/`` live at the repository root (the design card's top level)
and are ``prefect_rollouts.flows``, ``.tasks`` and ``.blocks`` through symlinks in
``src/prefect_rollouts/`` (``tests/test_layout.py``); setuptools follows them into the wheel.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.system


@pytest.mark.timeout(600)
def test_the_wheel_holds_flows_tasks_and_blocks_inside_the_package(tmp_path):
    if not (REPOSITORY / "pyproject.toml").is_file():
        pytest.skip("an installed package, not a checkout")
    clean = tmp_path / "clean"   # what a clean clone holds: the committed tree, symlinks as symlinks
    clean.mkdir()
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", "HEAD"], check=True, capture_output=True,
                             timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", str(clean)], input=archive, check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path),
                    str(clean)], check=True, timeout=540)
    (wheel,) = tmp_path.glob("prefect_rollouts-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("flows", "tasks", "blocks"):
        prefix = f"prefect_rollouts/{package}/"   # its subpackages too (flows/services/)
        sources = {name.removeprefix(prefix) for name in names if name.startswith(prefix) and name.endswith(".py")}
        expected = {str(path.relative_to(clean / package)) for path in (clean / package).rglob("*.py")}
        assert sources == expected, package
    assert {name.split("/")[0] for name in names} == {"prefect_rollouts", wheel.name.split("-")[0] + "-"
                                                      + wheel.name.split("-")[1] + ".dist-info"}
