"""``prefect-rollouts eval`` in a process of its own, as a user runs it: its command line, its
environment, started (to signal or kill it mid-run) or run to its end, every wait bounded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.processes import descendants, kill

REPO = Path(__file__).resolve().parents[2]
CLI = ("-m", "prefect_rollouts.cli")


def eval_command(config: Path | str, *args: str, entry: Sequence[str] = CLI) -> list[str]:
    """``python -m prefect_rollouts.cli eval CONFIG ARGS`` with this interpreter. ``entry`` replaces
    ``-m prefect_rollouts.cli``, e.g. ``("-c", code)`` for a wrapper that sets a constant first."""
    return [sys.executable, *entry, "eval", str(config), *args]


def eval_env(api_url: str | None = "", **variables: str) -> dict[str, str]:
    """This process's environment for an eval: this checkout's package and the tests' tasksets
    importable (``PYTHONPATH``), no telemetry, then ``variables`` (e.g.
    ``PREFECT_LOGGING_LEVEL="WARNING"``, which keeps only the CLI's own lines).

    ``api_url`` is the Prefect API the eval reports to: ``""`` (the default) the one this process
    has (``PREFECT_API_URL``, in the prefect tier the session's test harness); ``None`` none at all,
    so the CLI starts its temporary server."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if api_url is None:
        env.pop("PREFECT_API_URL", None)
    elif api_url:
        env["PREFECT_API_URL"] = api_url
    else:   # Prefect imported here, not at import: the unit tier stays Prefect-free
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():
            env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return {**env, **variables}


def start_eval(config: Path | str, *args: str, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE,
               new_session: bool = False, entry: Sequence[str] = CLI) -> subprocess.Popen[str]:
    """Start ``prefect-rollouts eval CONFIG ARGS`` (``eval_command``) and return at once.

    Args:
        env: The whole environment; ``eval_env()`` when None.
        stdout: ``subprocess.PIPE`` (stderr merged into it, text; read it with ``finish``) or
            ``subprocess.DEVNULL`` for an eval whose output no one reads (a full pipe would stall it).
        new_session: Start it in a session (and process group) of its own, for ``os.killpg``.
        entry: As in ``eval_command``.
    """
    return subprocess.Popen(eval_command(config, *args, entry=entry), env=eval_env() if env is None else env,
                            stdout=stdout, stderr=subprocess.STDOUT, text=True, start_new_session=new_session)


def finish(process: subprocess.Popen[str], timeout_s: float) -> str:
    """Wait up to ``timeout_s`` seconds for ``process`` to exit and return its output ("" when it
    was not piped). Past the bound, ``kill -9`` it and what it started, and fail naming the bound and
    the output's last 3,000 characters."""
    try:
        return process.communicate(timeout=timeout_s)[0] or ""
    except subprocess.TimeoutExpired:
        started = descendants(process.pid)
        process.kill()   # first: killed after its children, a shell exits 137 on its own before the kill lands
        kill(started)
        try:
            output = process.communicate(timeout=30)[0] or ""
        except subprocess.TimeoutExpired:   # a process it left holds the pipe
            output = ""
        message = f"the eval ran past {timeout_s} s and was killed; its output ends:\n{output[-3000:]}"
        raise AssertionError(message) from None


def run_eval(config: Path | str, *args: str, env: dict[str, str] | None = None,
             timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``prefect-rollouts eval CONFIG ARGS`` to its end: its exit code, stdout and stderr apart
    (text). ``env`` as in ``start_eval``. Past ``timeout_s`` seconds ``subprocess.run`` kills it and
    raises ``TimeoutExpired``."""
    return subprocess.run(eval_command(config, *args), env=eval_env() if env is None else env, capture_output=True,
                          text=True, timeout=timeout_s)
