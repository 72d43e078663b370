"""Issue 35, item 4: no test writes a file of the machine outside its own temporary directories. Prefect's
own files of the session (a failed flow run's pickled exception under ``storage/``, its memo store) go
to a ``PREFECT_HOME`` of the session (tests/conftest.py), never to the user's ``~/.prefect``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_prefects_files_of_the_session_go_to_a_temporary_home_that_its_processes_share():
    code = ("from prefect.settings import get_current_settings as s; "
            "print(s().home); print(s().results.local_storage_path)")
    home, storage = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env=dict(os.environ)).stdout.split()   # as a worker or CLI eval sees it
    assert Path(home) == Path(os.environ["PREFECT_HOME"]) and Path(storage) == Path(home) / "storage"
    assert Path(home).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert Path(home).resolve() != (Path.home() / ".prefect").resolve()
