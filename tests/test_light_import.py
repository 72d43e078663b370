"""``import prefect_rollouts`` is light: a notebook or script that only builds configs and runs agents
loads neither Prefect nor the dataframe stack (issue 22: it loaded pandas, pyarrow and numpy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

HEAVY = ("prefect", "pandas", "pyarrow", "numpy", "docker", "uvicorn", "starlette")


def test_importing_the_package_loads_no_heavy_dependency():
    probe = ("import sys, prefect_rollouts; "
             f"print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == ""
