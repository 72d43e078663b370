"""A Harbor task's scripts, run as Harbor runs them (Harbor 0.25/0.26: ``harbor/agents/oracle.py``,
``harbor/verifier/verifier.py``, ``harbor/utils/scripts.py``).

Harbor makes a script executable and executes it directly, in a command its docker environment runs
as ``bash -c``: a shebang counts (a ``#!/usr/bin/env python3`` ``test.sh`` runs under Python), and a
script without one is run by bash itself (bash's answer when the kernel refuses the file, ENOEXEC).
So here:

- ``solve.sh`` (the oracle): ``chmod +x /solution/solve.sh`` (as root: the upload is root's), then, as
  the agent's user, ``/solution/solve.sh >
  /logs/agent/oracle.txt 2>&1`` in the workdir with ``DEBIAN_FRONTEND=noninteractive`` and ``[solution]
  env``, in a session of its own (``setsid``, util-linux; without it in the image, what the script
  leaves in the background ends with it): what it starts in the background (a server) keeps running,
  as a ``docker exec`` leaves it in Harbor. Its exit code, time and the tail of ``oracle.txt`` are in
  ``trace.info["harbor"]["solution"]``; a non-zero exit or its deadline is the oracle's own failure,
  scored by the tests (``agent_exits``).
- ``test.sh``: the processes the agent left still run (Harbor's shared verifier mode: a server the
  agent started answers the tests), but the tests run in a private view of the box
  (``runtimes/docker/private.py``) whose ``/tests`` (the task's ``tests/``) and ``/logs/verifier``
  (empty) no process of the agent's can write: ``chmod +x /tests/test.sh && (/tests/test.sh) >
  /logs/verifier/test-stdout.txt 2>&1`` with ``[verifier] env``, for at most ``[verifier]
  timeout_sec``, with Docker's default capabilities (as in Harbor's box; the agent has none). When it
  ends, every process of the box is killed, then the reward is read from what the tests left:
  ``reward.json``, else ``reward.txt`` (``harbor.reward.read_reward``; not a symlink, at most
  ``REWARD_MAX_BYTES``). The box's visible ``/logs/verifier`` is made anew before (so no file of the
  agent's poses as the tests' output) and gets the tests' files afterwards (their last ``LOG_BYTES``).
  How the tests ran (exit code, time, the tail of ``test-stdout.txt``) is in
  ``trace.info["harbor"]["verifier"]``. No reward file, an empty or non-finite one, or a test run past
  its deadline is a scoring error (reward None), not 0; ``test.sh``'s exit code alone scores nothing.

Both logs are kept whole up to their last ``LOG_BYTES`` in ``trace.info["harbor"]["logs"]`` (keys
``agent/oracle.txt``, ``verifier/test-stdout.txt``). Must not import Prefect.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect_rollouts.agent_exits import COULD_NOT_START, box_broken, program_failure
from prefect_rollouts.config.env import resolve_env, template_variables
from prefect_rollouts.environments.harbor.reward import REWARD_MAX_BYTES, read_reward
from prefect_rollouts.errors import TaskError, register_secret, scrub
from prefect_rollouts.runtimes.base import IMAGE_USER, SCRUB_SLACK_BYTES
from prefect_rollouts.trace import Trace

LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
"""Harbor's log directories in the box."""
ROOT = "0"
"""The user (root by UID, which every image has) of the commands that make and clear the log directories."""
TAIL_CHARS = 4000
"""Characters of the end of ``oracle.txt`` and ``test-stdout.txt`` kept on the trace beside the exit code."""
LOG_BYTES = 32 * 1024
"""Bytes of the end of ``oracle.txt`` and ``test-stdout.txt`` kept in ``trace.info["harbor"]["logs"]`` (the
oracle's: at most the runtime's ``output_cap_bytes``)."""
KEEP_BYTES = max(LOG_BYTES + SCRUB_SLACK_BYTES, REWARD_MAX_BYTES)
"""Bytes read of the end of each file the tests leave: a whole reward file, a log with room to scrub."""

SOLVE = """mkdir -p /logs/agent
if command -v setsid >/dev/null 2>&1; then set -- setsid -w; else set --; fi
"$@" bash -c /solution/solve.sh > /logs/agent/oracle.txt 2>&1 </dev/null
code=$?
wc -c < /logs/agent/oracle.txt
tail -c KEEP /logs/agent/oracle.txt
exit $code
"""
"""The oracle's command: ``solve.sh`` as Harbor's oracle runs it (in a session of its own); prints the size
of ``oracle.txt`` on a line, then its last ``KEEP`` bytes, and exits with the script's code."""
TEST = "chmod +x /tests/test.sh && (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1"
"""The verifier's command, as Harbor's ``build_execution_command`` makes it for a ``.sh`` script."""

# /logs/verifier is made anew (a symlink or a file the agent left at /logs or /tests is removed, not followed)
# and /tests emptied, so no file of the agent's poses as the tests or their output in the visible box.
# Emptying /tests is best effort: a process the agent left may move it aside meanwhile ("find: '/tests': No
# such file or directory" made the rollout a TaskError that dropped out of the mean, under load), and the
# tests see their own /tests in the private view either way. A process that moves /logs aside 50 times a
# second can also take it between the mkdir and the chmod ("chmod: cannot access '/logs/agent'" on a
# clean-clone run): the whole clear is tried up to 5 times, 0.1 s apart, before it fails the rollout.
_CLEAR_ONCE = ("for d in /logs /tests; do if [ -L $d ] || { [ -e $d ] && [ ! -d $d ]; }; then rm -f $d; fi; done; "
               "rm -rf /logs/verifier; "
               "mkdir -p " + " ".join(LOG_DIRS) + " /tests && chmod 777 " + " ".join(LOG_DIRS) +
               " && { find /tests -mindepth 1 -delete 2>/dev/null; true; }")
_CLEAR = f"for try in 1 2 3 4 5; do {{ {_CLEAR_ONCE}; }} && exit 0; sleep 0.1; done; exit 1"


async def solve(task: Any, runtime: Any, trace: Trace, solution: Path) -> None:
    """Copy ``solution`` to ``/solution`` and run ``SOLVE`` within the agent deadline (see the module docstring);
    ``task`` is the ``harbor.HarborTask`` (its ``toml``, ``id``, ``timeout_multiplier``).

    Raises:
        AgentFailure: ``solve.sh`` exited non-zero (``program_failed``) or ran past the deadline
            (``program_timeout``): the oracle's own failure, scored by the tests as in Harbor (``agent_exits``).
        TaskError: it could not start (exit 126 or 127).
    """
    await runtime.upload(solution, "/solution")
    made = await runtime.exec("chmod +x /solution/solve.sh", timeout=60, user=ROOT)
    if made.exit_code != 0:
        raise TaskError(f"Harbor task {task.id!r}: cannot make solution/solve.sh executable: "
                        f"{made.stderr.strip()[-500:] or f'exit code {made.exit_code}'}")
    limit = (task.toml.agent.timeout_sec or 3600.0) * task.timeout_multiplier
    started = time.monotonic()
    env = {"DEBIAN_FRONTEND": "noninteractive",
           **resolved(task.toml.solution.env, f"Harbor task {task.id!r}: [solution] env")}
    keep = min(LOG_BYTES + SCRUB_SLACK_BYTES, runtime.config.output_cap_bytes - 64)   # all of it reaches stdout
    result = await runtime.exec(SOLVE.replace("KEEP", str(keep)), timeout=limit, env=env)
    head, _, output = result.stdout.partition("\n")
    size = int(head) if head.strip().isdigit() else None
    text = _log_text(output, keep if size is None else size, keep)
    harbor = trace.info.setdefault("harbor", {})
    harbor["solution"] = _outcome(result, started, text, size)
    harbor.setdefault("logs", {})["agent/oracle.txt"] = text
    if result.exit_code != 0:
        why = f"ran longer than {limit:g} s" if result.timed_out else f"exited with code {result.exit_code}"
        said = (text or result.stderr).strip()[-800:]
        raise program_failure(f"Harbor task {task.id!r}: solution/solve.sh {why}: {said or '(it printed nothing)'}",
                              timed_out=result.timed_out, started=result.exit_code not in COULD_NOT_START)


async def tests(task: Any, runtime: Any, trace: Trace, source: Path) -> float:
    """Run ``tests/`` (``source``) as the module docstring says and return the reward; the other keys of an
    object in ``reward.json`` become metrics of ``trace``.

    ``/logs`` is made and cleared as root; the tests run as ``[verifier] user``, else the image's user.

    Raises:
        AgentFailure: ``box_broken`` (``agent_exits.box_broken``): the agent broke the box so that no
            command starts in it (scored 0 without scoring).
        TaskError: the tests ran past ``[verifier] timeout_sec``, wrote no usable reward, or could not be run
            apart from the agent's processes (``docker/private.py``).
    """
    verifier = task.toml.verifier
    env = resolved(verifier.env, f"Harbor task {task.id!r}: [verifier] env")
    where = f"Harbor task {task.id!r}"
    cleared = await runtime.exec(_CLEAR, timeout=60, user=ROOT)
    if (broken := box_broken(cleared, "clearing /logs/verifier")) is not None:
        raise broken
    if cleared.exit_code != 0:
        raise TaskError(f"{where}: cannot clear /logs/verifier and /tests: "
                        f"{cleared.stderr.strip()[-500:] or f'exit code {cleared.exit_code}'}")
    limit = verifier.timeout_sec * task.timeout_multiplier
    started = time.monotonic()
    try:
        result, files = await runtime.exec_private(
            TEST, inputs={"/tests": source}, private=["/tests", "/logs/verifier"], collect="/logs/verifier",
            keep_bytes=KEEP_BYTES, timeout=limit, env=env,
            user=IMAGE_USER if verifier.user is None else str(verifier.user))
    except TaskError as exc:
        raise TaskError(f"{where}: {exc}") from None
    finally:
        await runtime.kill_all()   # the agent's leftovers served the tests; none outlives them
    output_size, output = files.get("test-stdout.txt", (0, b""))
    text = _log_text(output.decode("utf-8", errors="replace"), output_size, KEEP_BYTES)
    harbor = trace.info.setdefault("harbor", {})
    harbor["verifier"] = _outcome(result, started, text, output_size)
    harbor.setdefault("logs", {})["verifier/test-stdout.txt"] = text
    await _show(runtime, files)
    if result.timed_out:
        raise TaskError(f"{where}: tests/test.sh ran longer than [verifier] timeout_sec = {limit:g} s and was killed")
    kind = next((kind for kind in ("json", "txt") if f"reward.{kind}" in files), None)
    if kind is None:
        if (broken := box_broken(result, "tests/test.sh")) is not None:
            raise broken
        if result.exit_code != 0:
            raise TaskError(f"{where}: tests/test.sh exited with code {result.exit_code} before writing a reward: "
                            f"{text.strip()[-800:] or '(it printed nothing)'}")
        raise TaskError(f"{where}: tests/test.sh wrote no reward (/logs/verifier/reward.json or reward.txt); a "
                        "missing reward is an error, not 0")
    size, content = files[f"reward.{kind}"]
    if size > REWARD_MAX_BYTES:
        raise TaskError(f"{where}: /logs/verifier/reward.{kind} holds {size:,} bytes, more than a reward "
                        f"({REWARD_MAX_BYTES:,} at most)")
    value, metrics = read_reward(kind, scrub(content.decode("utf-8", errors="replace")), task.id)
    trace.metrics.update(metrics)
    return value


async def _show(runtime: Any, files: dict[str, tuple[int, bytes]]) -> None:
    """Put the tests' files (their last ``LOG_BYTES``) into the box's visible ``/logs/verifier``, as Harbor
    leaves them there; a failure to is not the rollout's (the reward is already read)."""
    if not files:
        return
    with tempfile.TemporaryDirectory() as staging:
        for name, (_, content) in files.items():
            (Path(staging) / name).write_bytes(content[-LOG_BYTES:])
        try:
            await runtime.upload(Path(staging), "/logs/verifier")
        except (OSError, ValueError):
            pass


def resolved(env: dict[str, str], table: str) -> dict[str, str]:
    """``env`` with its ``${VAR}`` templates filled in from this process's environment (as Harbor does);
    a value taken from the environment counts as a secret: scrubbed from what the trace records.

    Raises:
        ScoringEnvError: a ``${VAR}`` without default is unset here.
    """
    values = resolve_env(env, table=table, place="where the rollout runs")
    for template in env.values():
        for name in template_variables(template):
            register_secret(os.environ.get(name))   # the host's value, not a default
    return values


def _log_text(text: str, size: int, read: int) -> str:
    """The end of a log file of ``size`` bytes, of which ``text`` is the last ``read``, scrubbed of secrets and
    cut to ``LOG_BYTES``: when ``text`` starts inside the file, its first ``SCRUB_SLACK_BYTES`` characters go
    first (they may hold the end of a secret, which ``scrub`` cannot recognise)."""
    if size > read:
        text = text[SCRUB_SLACK_BYTES:]
    return scrub(text)[-LOG_BYTES:]


def _outcome(result: Any, started: float, output: str, output_bytes: int | None) -> dict[str, Any]:
    return {"exit_code": result.exit_code, "timed_out": result.timed_out,
            "seconds": round(time.monotonic() - started, 3), "output_tail": output[-TAIL_CHARS:],
            "output_bytes": output_bytes}

