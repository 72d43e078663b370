"""A missing service, program or extra: a skip on a developer's machine, a failure in CI (``CI`` set),
where scripts/test and .ci/run must provide everything the tests need."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def unavailable(reason: str, fix: str = "CI must provide it (.ci/run, scripts/test)") -> None:
    """Skip the test (or, called at import, the module) because of ``reason``, or fail it when ``CI`` is set
    (then ``fix`` says what to change)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; {fix}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, why: str) -> ModuleType:
    """``import name``, as ``pytest.importorskip`` does, but a failure in CI: ``why`` says which extra
    or install step brings it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{name} is not installed ({why}): {exc}")
        raise   # unreachable: unavailable() skips or fails
