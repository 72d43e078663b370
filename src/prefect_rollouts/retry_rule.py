"""Which errored rollouts run again, and when: the one rule behind ``max_rollout_attempts``,
``retry_error_types`` and ``prefect-rollouts eval --resume RUN_ID --retry-errors``. Must not import Prefect.

A rollout's **attempt** (the row column ``attempt``: 1, 2, ...) is one whole run of the rollout: a new
trace and a new row, the earlier ones kept (``traces.read``). It is not a model call's HTTP
``attempts`` (tries of one request, ``[env.agent.client.retries]``) nor a stage's retries
(``[env.agent.retries]``): those happen inside one attempt, and only when they are used up does the
attempt end in an error that this rule looks at.
"""

from __future__ import annotations

import builtins
import random
from dataclasses import dataclass
from typing import Any

from prefect_rollouts import errors

RETRY_ERROR_TYPES = frozenset({errors.InfrastructureError.__name__, errors.ProviderError.__name__,
                               errors.RuntimeUnavailableError.__name__})
"""The default rule of which errored attempts run again (``max_rollout_attempts``), by the type of the
attempt's first error (``ErrorRecord.type``, the row's ``error_type``): the errors of the system around
the agent, which another attempt can clear: ``ProviderError`` (the model endpoint failed after the client's
own retries: a rate limit, a 5xx, a dropped connection), ``RuntimeUnavailableError`` (a runtime or container
could not start or was lost) and any other ``InfrastructureError``.

Never retried by default: a ``TaskError`` (the task's own code: a hook, a reward, a judge), a
``ConfigError`` (the same config fails the same way), a ``StageTimeoutError`` deadline (no error: the
trace's ``is_timeout``), and a rollout the agent itself failed (``AGENT_FAILURE_STOPS``: a result, not an
error). ``retry_error_types`` replaces this set; the agent-failure exclusion holds whatever it says."""

AGENT_FAILURE_STOPS = frozenset({"program_failed", "program_timeout", "box_broken", "storage_quota"})
"""Stop conditions of a rollout the agent itself failed (``errors.AgentFailure``, raised by
``agent_exits.py`` and the docker runtime's disk quota): its result is the agent's, so it is never run
again, not even when a later stage recorded an error on it."""

ROLLOUT_BACKOFF_CAP_S = 300.0
"""The longest wait before an in-run retry, seconds: five minutes, past the one-minute windows
providers count rate limits in, short beside an eval's hours."""

JITTER = 0.5
"""Each wait is scaled by a random factor in ``1 ± JITTER`` (as stage retries, ``rollout.StagePolicy``),
so rollouts that failed together do not all come back at once."""


def known_error_types() -> list[str]:
    """The error types an attempt can record, sorted: every exception class of ``errors.py`` and the
    rows' own (``TraceNotWritable``, ``TraceNotReadable``), then Python's built-in exceptions (a task's
    code raised one). What ``retry_error_types`` may name."""
    ours = sorted(_subclasses(errors.RolloutsError) - _NEVER_RECORDED | {"TraceNotWritable", "TraceNotReadable"})
    return ours + sorted(name for name, value in vars(builtins).items()
                         if isinstance(value, type) and issubclass(value, BaseException) and name not in ours)


_NEVER_RECORDED = {"RolloutsError", "AgentFailure", "BudgetStop", "EvalFailedError", "RunInUseError"}
"""Classes of ``errors.py`` no attempt records as its error (a base class; the agent's failure and the
budget's stop, stop conditions; errors of a whole eval)."""


def _subclasses(cls: type) -> set[str]:
    """Names of ``cls`` and its subclasses defined in ``errors.py`` (not what other modules imported so far)."""
    found = {cls.__name__} if cls.__module__ == errors.__name__ else set()
    subclass: type
    for subclass in cls.__subclasses__():
        found |= _subclasses(subclass)
    return found


def check_error_types(types: list[str]) -> list[str]:
    """``types`` when each is a known error type (``known_error_types``), without duplicates.

    Raises:
        ValueError: an unknown or empty type; the message names it, lists prefect-rollouts' own
            types and says built-in exception names are accepted too.
    """
    known = known_error_types()
    for name in types:
        if name not in known:
            ours = [kind for kind in known if not hasattr(builtins, kind)]
            raise ValueError(f"{name!r} is not an error type a rollout records. Use the "
                             f"row's error_type: one of {', '.join(ours)}, or a built-in exception name "
                             "(e.g. ValueError)")
    return list(dict.fromkeys(types))


def retries(error_type: str | None, stop_condition: str | None, types: frozenset[str] | None = None) -> bool:
    """Whether an attempt that ended with ``error_type`` (its first error's type, None for none) and
    ``stop_condition`` is one the rule runs again: an error of ``types`` (``RETRY_ERROR_TYPES`` when
    None), never an agent failure (``AGENT_FAILURE_STOPS``)."""
    return (error_type is not None and stop_condition not in AGENT_FAILURE_STOPS
            and error_type in (RETRY_ERROR_TYPES if types is None else types))


def backoff_s(retry: int, base_s: float) -> float:
    """The wait before in-run retry ``retry`` (1 for the first), seconds: ``base_s * 2**(retry - 1)``
    capped at ``ROLLOUT_BACKOFF_CAP_S``, then jittered by ``JITTER``. ``base_s`` is the eval's
    ``rollout_backoff_s`` (default 10 s: longer than the client's own backoff of one request, which
    already waited its turn, ``[env.agent.client.retries]``)."""
    nominal = min(base_s * 2 ** min(retry - 1, 30), ROLLOUT_BACKOFF_CAP_S)
    return nominal * random.uniform(1 - JITTER, 1 + JITTER)


@dataclass(frozen=True, slots=True)
class InRunRetry:
    """The retries within one eval (``EvalConfig.max_rollout_attempts``, ``retry_error_types``,
    ``rollout_backoff_s``); the default retries nothing."""

    max_attempts: int = 1
    types: frozenset[str] | None = None
    """Error types that retry; None: ``RETRY_ERROR_TYPES``."""
    backoff_s: float = 10.0

    @classmethod
    def of(cls, config: Any) -> InRunRetry:
        """The retries of an ``EvalConfig`` (typed ``Any``: the config module imports this one)."""
        types = None if config.retry_error_types is None else frozenset(config.retry_error_types)
        return cls(config.max_rollout_attempts, types, config.rollout_backoff_s)

    def again(self, trace: Any, attempt: int) -> bool:
        """Whether ``trace`` (a ``Trace``, attempt number ``attempt``) runs again as attempt ``attempt + 1``."""
        error = trace.errors[0].type if trace.errors else None
        return attempt < self.max_attempts and retries(error, trace.stop_condition, self.types)

    def wait_s(self, attempt: int) -> float:
        """Seconds to wait after errored attempt ``attempt`` (``backoff_s``)."""
        return backoff_s(attempt, self.backoff_s)
