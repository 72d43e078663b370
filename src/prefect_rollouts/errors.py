"""Every public exception of prefect-rollouts.

The tree::

    RolloutsError
    ├── ConfigError(ValueError)          bad TOML, arguments or config; raised before anything starts
    │   ├── ScoringEnvError              a ${VAR} in scoring.env is unset and has no default
    │   └── RunInUseError                another live eval is running the same run id
    ├── InfrastructureError              .retryable tells a stage whether to retry it
    │   ├── RuntimeUnavailableError      a runtime (workspace, engine, namespace) cannot start
    │   └── ProviderError                transport error or non-2xx from the model server; .status_code
    ├── TaskError                        user code (task hook, tool, reward, metric) raised
    │   └── JudgeError                   a judge could not reach its model or parse its reply
    ├── StageTimeoutError(TimeoutError)  a stage deadline from [env.agent.timeouts] expired
    ├── TraceStoreError(OSError)         the Parquet trace dataset cannot be written or read
    ├── RolloutFailedError               a rollout ended in an error; .trace (its Failed flow run's data)
    └── EvalFailedError                  too many rollouts errored, or some have no row; .summary

The error model: a rollout failure is recorded once on the trace as data (``trace.errors``,
``trace.stop_condition``); ``Agent.run`` does not raise it. Only infrastructure errors propagate
out of a stage function, so an orchestrator (the Prefect layer) can decide to retry that stage.
The Prefect runs say the same: a rollout's Failed flow run holds a ``RolloutFailedError`` and a
failed eval's flow run an ``EvalFailedError``; awaiting the flow without ``return_state=True``
raises them, the trace or the summary attached.
Messages follow ``<where> = <value>: <what is wrong>. <how to fix>.`` and never hold a secret.

Secrets in text from outside (an error body that echoes the ``Authorization`` header, a tool's
output, an exception's message): the model client registers every key and header value it
sends (``register_secret``), and everything that records outside text passes it through
``scrub`` *before* cutting it, so no cut can leave a prefix of a key behind. The egress proxy's
per-rollout credentials (``EGRESS_CREDENTIAL``) are scrubbed by their pattern instead: one per
rollout would grow the registry, which every ``scrub`` walks, without bound.
"""

from __future__ import annotations

import re
import threading
from typing import Any

EGRESS_CREDENTIAL = re.compile(r"rollout-egress-[0-9a-f]{32}", re.IGNORECASE)
"""The form of an egress proxy credential (``runtimes/egress/proxy.py``); ``scrub`` removes every match."""

#: Secrets sent by this process (API keys, header values), longest first; see ``scrub``.
_secrets: tuple[str, ...] = ()
_secrets_lock = threading.Lock()

#: Values shorter than this are not scrubbed: replacing 1-3 characters would mangle text, not hide a key.
MIN_SECRET_CHARS = 4


def register_secret(value: str | None) -> None:
    """Remember ``value`` (an API key or header value this process sends) so ``scrub`` removes it.

    Values shorter than ``MIN_SECRET_CHARS`` (after stripping) are ignored. Kept in memory only.
    """
    global _secrets
    value = (value or "").strip()
    if len(value) < MIN_SECRET_CHARS or value in _secrets:
        return
    with _secrets_lock:
        if value not in _secrets:
            _secrets = tuple(sorted({*_secrets, value}, key=len, reverse=True))


def scrub(text: str, extra: tuple[str, ...] = ()) -> str:
    """``text`` with every registered secret (and each of ``extra``) replaced by ``***``.

    Call it on the whole text *before* cutting it to a length: a cut first could leave a
    prefix of a key that no longer matches.
    """
    secrets = _secrets
    if extra:
        secrets = tuple(sorted({*secrets, *(e.strip() for e in extra if len(e.strip()) >= MIN_SECRET_CHARS)},
                               key=len, reverse=True))
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    if "rollout-egress-" in text.lower():   # in any case: an upper-cased copy too (the regex alone: ~30x slower)
        text = EGRESS_CREDENTIAL.sub("***", text)
    return text


def scrub_cut(text: str, limit: int, note: bool = True) -> str:
    """``scrub(text)`` cut to ``limit`` characters; ``note`` appends ``... [N more characters]``."""
    text = scrub(text)
    if len(text) <= limit:
        return text
    return text[:limit] + (f"... [{len(text) - limit} more characters]" if note else "")


class RolloutsError(Exception):
    """Base class of every exception raised by prefect-rollouts."""


class ConfigError(RolloutsError, ValueError):
    """A configuration value, TOML key or argument is invalid; the message names it and the fix."""


class ScoringEnvError(ConfigError):
    """``scoring.env`` references ``${VAR}`` that is unset where scoring runs and has no default."""


class RunInUseError(ConfigError):
    """Another eval flow run, not known to be dead, is running the same run id (``flows/services/run_lock.py``);
    the message names it. The CLI exits 2."""


class InfrastructureError(RolloutsError):
    """Something outside the task failed (model server, runtime). ``retryable`` says if a retry can help."""

    retryable: bool = True

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class RuntimeUnavailableError(InfrastructureError):
    """A runtime could not be started or reached (workspace, container engine, namespace)."""


class ProviderError(InfrastructureError):
    """The model endpoint failed after all client retries.

    Attributes:
        status_code: HTTP status of the last attempt; None when no response arrived (a refused,
            unresolvable or dropped connection: there is no status to report), 504 for a
            timeout, 502 for a malformed response (the mapping verifiers uses, so 5xx means
            "the provider side failed").
        retryable: True for 429, 5xx and failures without a response; False for other 4xx.
        retries: Attempts beyond the first (set by the model client).
        attempts: Every failed attempt in order, the last one included: ``{"status_code": int
            | None, "error": str}``, the error scrubbed of secrets, then cut.
    """

    def __init__(self, message: str, *, status_code: int | None, retryable: bool | None = None, retries: int = 0,
                 attempts: list[dict[str, Any]] | None = None) -> None:
        if retryable is None:
            retryable = status_code is None or status_code == 429 or status_code >= 500
        super().__init__(message, retryable=retryable)
        self.status_code = status_code
        self.retries = retries
        self.attempts = list(attempts or [])


class TaskError(RolloutsError):
    """User code of a task raised: a ``setup``/``finalize`` hook, a reward or a metric."""


class AgentFailure(RolloutsError):
    """The agent failed on its own: a result of the rollout, not an error of the system (Harbor's rule,
    ``harbor/trial``: an agent that exits non-zero or times out is recorded and the tests still run).

    Raised by a harness or a runtime during a segment (a program that exited non-zero after it
    started, one its own deadline stopped, a box the agent filled past its disk quota) and turned by
    the stages into ``Trace.record_agent_failure``: the run stops with ``stop_condition`` (e.g.
    ``program_failed``, ``program_timeout``, ``storage_quota``) and no ``ErrorRecord``.

    Attributes:
        stop_condition: The trace's stop condition.
        scored: True: the task's scoring still runs (the tests decide, usually 0). False: the box
            cannot be scored (the agent broke it); reward 0 without scoring.
        timeout: The agent's deadline stopped it: ``is_timeout`` is set, so ``skip_on_timeout`` applies.
    """

    def __init__(self, message: str, stop_condition: str, *, scored: bool = True, timeout: bool = False) -> None:
        super().__init__(message)
        self.stop_condition = stop_condition
        self.scored = scored
        self.timeout = timeout


class JudgeError(TaskError):
    """A judge could not reach its model or parse its reply: a scoring error (reward None), never 0.

    ``status_code`` is the judge endpoint's HTTP status when the call itself failed, else None.
    """

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class BudgetStop(RolloutsError):
    """The eval's token or cost budget was reached before a judge call started (``Judge.ask``): the
    rollout stops as ``budget`` (not scored, not done: a resume runs it again), not a scoring error."""


class StageTimeoutError(RolloutsError, TimeoutError):
    """A stage deadline (``[env.agent.timeouts]``) expired. ``stage`` names it."""

    def __init__(self, stage: str, seconds: float) -> None:
        super().__init__(f"stage {stage!r} exceeded its deadline of {seconds:g} s "
                         f"([env.agent.timeouts] {stage} = {seconds:g})")
        self.stage = stage
        self.seconds = seconds


class TraceStoreError(RolloutsError, OSError):
    """The Parquet trace dataset cannot be written or read; the message names the path."""


class RolloutFailedError(RolloutsError):
    """A rollout ended in an error (``trace.errors``); the message is its first, ``<type>: <message>``.

    Not raised by ``Agent.run`` (failures are data): it is what a rollout's Failed flow or task
    run holds, so that awaiting one without ``return_state=True`` raises something meaningful.
    ``trace`` is the rollout's full ``Trace`` (typed ``Any`` here: this module imports nothing of ours).
    """

    def __init__(self, message: str, trace: Any) -> None:
        super().__init__(message)
        self.trace = trace


class EvalFailedError(RolloutsError):
    """An eval ran, but more than ``max_error_fraction`` of its rollouts errored, or some have no
    row. The message says which (``"6 of 6 rollouts errored (ProviderError: ...)"``); ``summary``
    is the run's ``EvalSummary`` (typed ``Any`` as ``trace`` above). Held by the eval's Failed flow
    run; raised by awaiting it."""

    def __init__(self, message: str, summary: Any) -> None:
        super().__init__(message)
        self.summary = summary
