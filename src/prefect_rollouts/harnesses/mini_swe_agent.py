"""The ``mini-swe-agent`` program harness: the real mini-swe-agent from PyPI, pinned, run in the runtime.

mini-swe-agent and its dependencies come to the runtime one of two ways:

- **baked into the image**: ``prefect-rollouts sandbox build --with mini-swe-agent`` copies an
  install into ``/usr/local/mini-swe-agent`` (``IMAGE_SITE``); a rollout then installs nothing.
- **installed at setup**: otherwise the rollout's setup installs it on the host, once per
  version, Python and machine, into ``<cache>/mini-swe-agent/<key>`` (``pip install --target`` with
  the runtime's Python version and platform, wheels only), which the docker runtime mounts
  read-only at ``/usr/local/prefect-rollouts/mini-swe-agent`` and the local runtime reads in place. The
  first rollout waits for pip (about 35 s and 370 MB here); the others share the install. The
  runtime needs no network and no pip for it, so it works under ``network = "none"``.

``<cache>`` is ``$PREFECT_ROLLOUTS_CACHE``, else ``$XDG_CACHE_HOME/prefect-rollouts``, else
``~/.cache/prefect-rollouts``. The install leaves out the dependencies only mini-swe-agent's
interactive and batch commands import (``datasets``, ``textual``, ``prompt_toolkit``: 380 MB of
the 750 MB a plain ``pip install mini-swe-agent`` takes); the in-runtime driver
(``programs/mini_swe_agent.py``) runs its ``DefaultAgent`` and says how the run ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_rollouts.errors import TaskError
from prefect_rollouts.harnesses.installs import install_once, run_installer
from prefect_rollouts.nesting import loads
from prefect_rollouts.runtimes.base import cache_dir

if TYPE_CHECKING:
    from prefect_rollouts.runtimes import Runtime

VERSION = "2.4.6"
"""The mini-swe-agent release this package runs (PyPI ``mini-swe-agent``)."""

DEPENDENCIES = ("pyyaml", "requests", "jinja2", "pydantic>=2.0", "litellm>=1.75.5,!=1.82.7,!=1.82.8", "tenacity",
                "rich", "python-dotenv", "typer", "platformdirs", "openai!=1.100.0,!=1.100.1")
"""mini-swe-agent 2.4.6's requirements (its wheel's ``Requires-Dist``) without ``datasets``,
``textual`` and ``prompt_toolkit``, which the non-interactive agent never imports."""

IMAGE_SITE = "/usr/local/mini-swe-agent"
"""Where ``sandbox build --with mini-swe-agent`` puts the install in the image."""

MOUNTED = "/usr/local/prefect-rollouts/mini-swe-agent"
"""Where the docker runtime mounts the host's install cache (read-only)."""

MARKER = "[mini-swe-agent] "
"""Prefix of the driver's last stderr line: a JSON object with ``exit_status``, ``model_calls``, ``site``."""

_PROBE = ("python3 -c 'import os, platform, sys; print(\"%d.%d\" % sys.version_info[:2], platform.machine(), "
          f"os.path.isdir(\"{IMAGE_SITE}/minisweagent\"))'")


def cache_root() -> Path:
    """The host directory that holds mini-swe-agent installs (see the module docstring); created."""
    return cache_dir("mini-swe-agent")


def install(python: str, machine: str, *, root: Path | None = None, timeout_s: float = 900) -> Path:
    """Install mini-swe-agent ``VERSION`` for CPython ``python`` ("3.11") on ``machine`` ("x86_64").

    Idempotent and safe to call from many processes at once (``installs.install_once``).

    Returns:
        The install directory (``<root>/<VERSION>-cp311-x86_64``), holding ``minisweagent/``.

    Raises:
        TaskError: pip failed or ran longer than ``timeout_s`` (its stderr's end in the message).
    """
    def build(scratch: Path) -> None:
        platforms = [arg for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28", "linux")
                     for arg in ("--platform", f"{tag}_{machine}")]
        common = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  "--no-warn-conflicts", "--target", str(scratch), "--python-version", python,
                  "--implementation", "cp", "--only-binary=:all:", *platforms]
        for argv in ([*common, *DEPENDENCIES], [*common, "--no-deps", f"mini-swe-agent=={VERSION}"]):
            run_installer(argv, timeout_s=timeout_s, tmp=scratch / ".tmp", what=f"mini-swe-agent {VERSION}: pip",
                          fix="It needs PyPI (or your index) where the rollout runs, or an image made with "
                              "`prefect-rollouts sandbox build --with mini-swe-agent`")

    return install_once(root or cache_root(), f"{VERSION}-cp{python.replace('.', '')}-{machine}",
                        ready=lambda target: (target / "minisweagent").is_dir(), build=build,
                        note=f"installing mini-swe-agent {VERSION} for Python {python} on {machine} (about 35 s)")


async def site_in(runtime: Runtime, *, local: bool, timeout_s: float) -> str:
    """The directory, as the runtime sees it, from which the driver imports mini-swe-agent: the
    image's ``IMAGE_SITE`` when baked in, else the host install (made now if missing) as mounted.

    Raises:
        TaskError: the runtime has no python3, or the install failed (``install``).
    """
    if local:
        python, machine = f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine()
    else:
        probe = await runtime.exec(_PROBE, timeout=60)
        words = probe.stdout.split()
        if probe.exit_code != 0 or len(words) != 3:
            raise TaskError(f'harness "mini-swe-agent": the runtime\'s python3 did not answer '
                            f"(exit {probe.exit_code}: {(probe.stderr or probe.stdout).strip()[-500:]}). "
                            "It needs python3 >= 3.10")
        python, machine, baked = words
        if baked == "True":
            return IMAGE_SITE
    if tuple(int(part) for part in python.split(".")) < (3, 10):
        raise TaskError(f'harness "mini-swe-agent": the runtime\'s python3 is {python}; '
                        f"mini-swe-agent {VERSION} needs 3.10 or newer. Use another image")
    target = await asyncio.to_thread(install, python, machine, timeout_s=timeout_s)
    return str(target) if local else f"{MOUNTED}/{target.name}"


def report(stdout_tail: str, stderr_tail: str) -> dict[str, Any]:
    """What the driver said about its run: ``{"exit_status", "submission", "mini_swe_agent_calls",
    "mini_swe_agent_site"}`` (the calls it counted, the install it ran from)
    (``exit_status`` is mini-swe-agent's: Submitted, LimitsExceeded, RepeatedFormatError, or the
    name of the exception that ended it); empty when the driver printed no report."""
    for line in reversed(stderr_tail.splitlines()):
        if line.startswith(MARKER):
            with contextlib.suppress(ValueError):
                said = loads(line[len(MARKER):], "the report")   # the box's output: bounded nesting
                if not isinstance(said, dict):
                    continue
                return {"exit_status": said.get("exit_status"), "submission": stdout_tail,
                        "mini_swe_agent_calls": said.get("model_calls"), "mini_swe_agent_site": said.get("site")}
    return {}
