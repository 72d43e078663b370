"""When a failure is the agent's own result and when it is an error (issue 34; docs/scoring-failed-agents.md).

Harbor's rule (``harbor/trial``: an agent that exits non-zero or times out is recorded and the
verifier still runs): a program that *started* and then failed on its own is a result. It raises
``errors.AgentFailure`` and the task's tests decide the reward (usually 0):

- ``program_failed``: it exited non-zero after it started;
- ``program_timeout``: its own deadline killed it (``[env.agent.harness] timeout_s``, or the oracle's
  ``solve.sh`` at the task's agent deadline); ``is_timeout`` is set, so ``skip_on_timeout`` applies;
- ``box_broken``: the agent broke its box so that the tests cannot run there (``box_broken``):
  reward 0 without scoring.

What could not start stays an error (``TaskError``, reward None): exit 126 or 127 (a shell's "cannot
execute" and "not found": a missing command or interpreter) from a program that did nothing before
it, and a launcher that failed (``programs/launch.py``). The agent deadline (``timeouts.agent``) is not
here: it stops any harness as ``agent_timeout`` (``stages.run_segment``), scored as a timeout.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from prefect_rollouts.errors import AgentFailure, TaskError

if TYPE_CHECKING:
    from prefect_rollouts.runtimes.base import ExecResult

COULD_NOT_START = frozenset({126, 127})
"""Exit codes of a command that could not be run: 126 found but not executable, 127 not found (POSIX
shells, ``env`` for a missing interpreter, and ``programs/launch.py`` when the program's argv cannot run)."""

# What the container runtime answers when it cannot start the exec's process at all (runc, crun; docker
# 20.10 answers exit 126 with the first form): the runtime's shell or the workdir is gone or unusable.
_RUNTIME = re.compile(r"OCI runtime|^exec \S+: exec format error", re.IGNORECASE)
_CANNOT_EXEC = re.compile(r"executable file .{0,200}not found|chdir to|permission denied|no such file or directory|"
                          r"exec format error", re.IGNORECASE)
_INFRASTRUCTURE = re.compile(r"setns|cgroup|exit status \d|container .{0,40}not running|/dev/pts", re.IGNORECASE)


def program_failure(message: str, *, timed_out: bool, started: bool) -> AgentFailure | TaskError:
    """What a program's failed end is: ``message`` as the agent's own result, or as an error.

    Args:
        message: What happened (the program, its exit code, the last lines it printed), in the shape
            ``errors.py`` gives messages; it becomes ``trace.info["agent_failure"]["message"]`` or the error.
        timed_out: Its own deadline killed it.
        started: It ran: the caller knows it started (e.g. it called the model) or its exit code is not
            in ``COULD_NOT_START``.

    Returns:
        ``AgentFailure(message, "program_timeout", timeout=True)`` when ``timed_out``; else
        ``TaskError(message)`` when it did not start; else ``AgentFailure(message, "program_failed")``.
    """
    if timed_out:
        return AgentFailure(message, "program_timeout", timeout=True)
    if not started:
        return TaskError(message)
    return AgentFailure(message, "program_failed")


def box_broken(result: ExecResult, what: str) -> AgentFailure | None:
    """``AgentFailure(..., "box_broken", scored=False)`` when the runtime could not start ``what`` at all,
    else None.

    Call it on a command run in the agent's box after the agent phase, before other checks of its
    result (e.g. the verifier's: clearing ``/logs/verifier``; ``tests/test.sh`` when it wrote no reward,
    so a test's own output never decides). Setup ran commands through the same runtime shell and
    workdir before the agent, so a container runtime that now answers it cannot exec (``bash``
    deleted, made non-executable or overwritten, the workdir removed) means the agent broke the box,
    and the tests cannot run: reward 0, not an error an agent could use to drop out of the mean. An
    engine fault (a cgroup or namespace error, a stopped container) is not matched and stays an error.

    Args:
        result: The command's ``ExecResult``.
        what: What the command was, for the message (e.g. ``"tests/test.sh"``).
    """
    if result.exit_code == 0:
        return None
    firsts = [text.strip().splitlines()[0] for text in (result.stdout, result.stderr) if text.strip()]
    said = [line for line in firsts if _RUNTIME.search(line) and _CANNOT_EXEC.search(line)
            and not _INFRASTRUCTURE.search(line)]
    if not said:
        return None
    line = said[0]
    return AgentFailure(f"{what} cannot run: the box cannot start a process any more (exit {result.exit_code}: "
                        f"{line[:300]}); the agent broke it, so the tests cannot run", "box_broken", scored=False)
