"""Judges: a model of their own grades the finished trace; the grade is recorded as a reward.

A judge runs in the scoring stage after the task's metrics and rewards, in the orchestrating
process (it needs no runtime), for shared and isolated scoring alike; skip rules skip it too.
Each request is a ``JudgeCall`` on the trace and its tokens go to ``trace.judge_usage``, even
when the reply cannot be parsed. A judge that cannot reach its model or parse its reply raises
``JudgeError``: the rollout's reward is None and the error is on the trace, never a 0. Plugin
code that is not async (a sync ``score``, every reply parser) runs in a worker thread
(``threads.py``), so it cannot stall the other rollouts or outlast the scoring deadline.

Plugins subclass ``Judge``: ``[[env.agent.scoring.judges]] id = "pkg.module:Class"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib
import inspect
import json
from collections.abc import Sequence
from typing import Any

from prefect_rollouts.config.agent import ClientConfig
from prefect_rollouts.config.judge import JudgeConfig
from prefect_rollouts.errors import BudgetStop, ConfigError, JudgeError, TaskError
from prefect_rollouts.model.client import ModelClient
from prefect_rollouts.model.open import open_client
from prefect_rollouts.scoring.judge_base import (  # noqa: F401  (Judge: plugins subclass it from here)
    REPLY_CAP_CHARS,
    TOOL_OUTPUT_CAP_CHARS,
    Judge,
    cap_text,
    sampling_body,
)
from prefect_rollouts.scoring.judge_plugins import BUILTIN_JUDGES
from prefect_rollouts.scoring.rewards import as_score, record_total
from prefect_rollouts.task import Task, qualname
from prefect_rollouts.threads import note_in, run_sync
from prefect_rollouts.trace import Trace


class JudgeClients:
    """Model clients of judges, opened on first use and shared by all rollouts of an agent.

    Judges with the same model and client config share one client. A judge that sets no
    ``client`` uses ``default_client`` (the agent's endpoint); on the agent's own model as well
    it uses the agent's client (and its local server).

    Args:
        shared: Clients the registry may hand out but does not close, keyed by
            ``client_key(model, config)`` (the agent's own).
        default_client: Client config of judges that set none; None: ``ClientConfig()``.
    """

    def __init__(self, shared: dict[str, ModelClient] | None = None,
                 default_client: ClientConfig | None = None) -> None:
        self._shared = dict(shared or {})
        self._default = default_client or ClientConfig()
        self._owned: dict[str, tuple[ModelClient, Any]] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    def client_config(self, config: JudgeConfig) -> ClientConfig:
        """The endpoint ``config`` uses: its own ``client``, else the default."""
        return config.client or self._default

    async def get(self, config: JudgeConfig) -> ModelClient:
        """The client of ``config``'s model and endpoint, opened on first use.

        Raises:
            JudgeError: the registry is closed (its agent was closed).
            ConfigError: the endpoint block or local model cannot be loaded.
            InfrastructureError: a local model server did not start.
        """
        client_config = self.client_config(config)
        key = client_key(config.model, client_config)
        async with self._lock:
            if self._closed:
                raise JudgeError(f"judge {config.reward_name!r}: the agent was closed before its judges ran")
            if key in self._shared:
                return self._shared[key]
            if key not in self._owned:
                self._owned[key] = await open_client(config.model, client_config)
            return self._owned[key][0]

    async def aclose(self) -> None:
        """Close the clients this registry opened and stop their local servers; later ``get``
        calls raise ``JudgeError``."""
        async with self._lock:
            self._closed = True
            owned, self._owned = self._owned, {}
        async with contextlib.AsyncExitStack() as stack:   # every client closed, every server stopped
            for client, server in owned.values():
                if server is not None:
                    stack.push_async_callback(server.stop)
                stack.push_async_callback(client.aclose)


def client_key(model: str, config: ClientConfig) -> str:
    """Registry key of a model on an endpoint config (a digest: header values are secrets)."""
    visible = config.model_dump(mode="json", exclude={"headers"})
    payload = json.dumps([model, visible, sorted(config.header_values().items())], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def load_judge(config: JudgeConfig) -> type[Judge]:
    """The ``Judge`` class of ``config.id``: a built-in or an imported ``pkg.module:Class``.

    Raises:
        ConfigError: the import path does not import or is not a ``Judge`` subclass.
    """
    if config.id in BUILTIN_JUDGES:
        return BUILTIN_JUDGES[config.id]
    module_name, _, attribute = config.id.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # ImportError, AttributeError, or whatever the module raised on import
        raise ConfigError(f"[[env.agent.scoring.judges]] id = {config.id!r}: cannot import it ({exc}). "
                          "Check the module is installed and the class name") from exc
    if not (isinstance(found, type) and issubclass(found, Judge)):
        raise ConfigError(f"[[env.agent.scoring.judges]] id = {config.id!r}: not a subclass of "
                          "prefect_rollouts.scoring.judges.Judge")
    return found


async def run_judges(judges: Sequence[JudgeConfig], task: Task, trace: Trace, clients: JudgeClients | None) -> None:
    """Run ``judges`` concurrently on the scored ``trace``; record each as a reward and re-total.

    Every judge's reward is first recorded as None; each judge that succeeds records its
    value, so a failing judge does not hide the others' grades. ``trace.reward`` becomes the
    weighted sum of task rewards and judge rewards once every judge succeeded, else None.

    Args:
        judges: The effective ``scoring.judges``.
        task: The task (its ``data.answer`` and prompt feed the reference judge).
        trace: A trace whose task rewards are recorded.
        clients: Shared judge clients; None opens clients for this call and closes them after.

    Raises:
        JudgeError: a judge failed; the message names every failed judge.
        TaskError: a judge's name clashes with a task reward, or a rubric metric with a task metric.
        ConfigError: a plugin does not import, or its endpoint cannot be loaded.
        BudgetStop: the eval's budget was reached before a judge call (``judge_base.JUDGE_BUDGET``).
    """
    if not judges:
        return
    trace.reward = None
    for config in judges:
        if config.reward_name in trace.rewards:
            raise TaskError(f"judge {config.reward_name!r}: the task has a reward of that name; "
                            "give the judge another name (name = ...)")
        clash = [key for key in trace.metrics if key.startswith(f"{config.reward_name}/")]
        if clash:
            raise TaskError(f"judge {config.reward_name!r}: the task has metrics {clash} under that name; "
                            "give the judge another name (name = ...)")
    for config in judges:
        trace.rewards[config.reward_name] = None
        trace.reward_weights[config.reward_name] = config.weight
    own = clients is None
    registry = JudgeClients() if clients is None else clients
    try:
        results = await asyncio.gather(*(_judge(config, task, trace, registry) for config in judges),
                                       return_exceptions=True)
    finally:
        if own:
            await registry.aclose()
    stopped = next((result for result in results if isinstance(result, BudgetStop)), None)
    if stopped is not None:   # the budget, not a judge, ended scoring: the rollout is not done
        raise stopped
    failed = []
    for config, result in zip(judges, results, strict=True):
        if isinstance(result, BaseException):
            failed.append((config.reward_name, result))
        else:
            trace.rewards[config.reward_name] = result
    if failed:
        first = failed[0][1]
        if len(failed) == 1 or not isinstance(first, JudgeError):
            raise first
        others = ", ".join(repr(name) for name, _ in failed[1:])
        raise JudgeError(f"{first} (judges {others} failed too; see trace.judge_calls)",
                         status_code=first.status_code) from first
    record_total(trace)


async def open_judges(judges: Sequence[JudgeConfig], clients: JudgeClients) -> None:
    """Import every judge's plugin and open its client now, so a bad judge fails before any rollout.

    Raises:
        ConfigError: a plugin does not import, or an endpoint block or local model cannot be loaded.
        JudgeError: a judge model is unavailable (e.g. a local server did not start).
    """
    for config in judges:
        await _plugin_and_client(config, clients)


async def _plugin_and_client(config: JudgeConfig, clients: JudgeClients) -> tuple[type[Judge], ModelClient]:
    name = config.reward_name
    plugin = load_judge(config)
    try:
        return plugin, await clients.get(config)
    except JudgeError:
        raise
    except ConfigError as exc:
        raise ConfigError(f"judge {name!r}: {exc}") from None
    except Exception as exc:  # e.g. a local judge model that did not start
        raise JudgeError(f"judge {name!r}: its model {config.model!r} is unavailable ({cap_text(str(exc))})",
                         status_code=getattr(exc, "status_code", None)) from None


async def _judge(config: JudgeConfig, task: Task, trace: Trace, clients: JudgeClients) -> float:
    name = config.reward_name
    plugin, client = await _plugin_and_client(config, clients)
    try:
        judge = plugin(config, client)
        if inspect.iscoroutinefunction(judge.score):
            value: Any = await judge.score(task, trace)
        else:   # a plugin may define score() without async: off the loop, like a sync reward
            value = await run_sync(functools.partial(judge.score, task, trace),
                                   f"judge {name!r} ({qualname(judge.score)})", note_in(trace.info))
            if inspect.isawaitable(value):
                value = await value
    except (JudgeError, TaskError, BudgetStop):
        raise
    except Exception as exc:
        raise JudgeError(f"judge {name!r}: score() raised {type(exc).__name__}: {cap_text(str(exc))}") from None
    number = as_score(value)
    if number is None:
        raise JudgeError(f"judge {name!r}: score() returned {cap_text(repr(value))}; return a finite number")
    return number


