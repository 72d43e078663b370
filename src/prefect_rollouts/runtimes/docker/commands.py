"""A command in a docker runtime's container: the wrapper that runs it in its own process group with a
deadline, and the blocking exec call that streams its output up to the runtime's cap. Must not import Prefect."""

from __future__ import annotations

from typing import Any

import docker.errors

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.base import SCRUB_SLACK_BYTES, output_text

# Runs the command in its own process group and kills that group when the command ends, so a
# background job neither outlives the command nor holds its output open; a watchdog (output
# to /dev/null, so it holds nothing) kills the group at the deadline. The wrapper's own job-control
# messages go to /dev/null; the command's stderr is fd 3. $1 = command, $2 = seconds.
WRAPPER = r"""exec 3>&2 2>/dev/null
set -m
bash -c "$1" </dev/null 2>&3 3>&- &
pid=$!
( sleep "$2"; kill -9 -- -$pid ) >/dev/null </dev/null 3>&- &
watchdog=$!
wait $pid
code=$?
kill -9 -- -$pid
kill -9 -- -$watchdog
exit $code
"""


def run(api: Any, container_id: str, cmd: str, limit_s: float, config: RuntimeConfig, environment: dict[str, str],
        user: str = "") -> tuple[int, str, str]:
    """Run ``cmd`` (``bash -c``) in ``config.workdir`` of container ``container_id`` under ``WRAPPER``, killed
    with its process group after ``limit_s`` seconds; blocks (call it in a thread).

    Returns:
        The exit code (137 when the deadline or a limit killed it, -1 when the engine gave none), stdout and
        stderr, each kept to ``config.output_cap_bytes`` (read up to that plus ``SCRUB_SLACK_BYTES``).

    Raises:
        RuntimeUnavailableError: the container is gone or the engine failed (retryable).
    """
    cap = config.output_cap_bytes + SCRUB_SLACK_BYTES
    argv = ["bash", "-c", WRAPPER, "bash", cmd, f"{limit_s:.3f}"]
    try:
        exec_id = api.exec_create(container_id, argv, workdir=config.workdir, environment=environment,
                                  user=user)["Id"]
        out, err = bytearray(), bytearray()
        for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
            if chunk_out and len(out) < cap:
                out += chunk_out[: cap - len(out)]
            if chunk_err and len(err) < cap:
                err += chunk_err[: cap - len(err)]
        code = api.exec_inspect(exec_id)["ExitCode"]
    except docker.errors.APIError as exc:
        raise RuntimeUnavailableError(f'runtime "docker": exec in container {container_id[:12]} failed '
                                      f"({exc.explanation or exc})") from exc
    shown = config.output_cap_bytes
    return int(code if code is not None else -1), output_text(out, shown), output_text(err, shown)
