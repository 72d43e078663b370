"""A rollout as an ATIF trajectory (Harbor's Agent Trajectory Interchange Format, v1.8), built and
validated with the PyPI ``atif`` package's own pydantic models.

Steps follow the trace's messages: a ``system`` or ``user`` message is a step of that source (a user
message a send delivered carries ``extra.provenance``: ``steer`` or ``queue``, and its ``message_id``); an
assistant message is an ``agent`` step with its text, its thinking or reasoning as ``reasoning_content``,
its tool calls, and as ``observation`` the tool messages that answer them (``source_call_id`` = the call's
id); its ``metrics`` are those of the model call that produced it (the n-th successful model call gives the
n-th assistant message). ``final_metrics`` sums the usage; ``extra`` holds the reward, rewards, metrics,
task id, environment, stop condition and errors; the program launches go to ``agent.extra``.

``export_run`` writes one file per rollout in a Harbor-like layout:
``<out>/<run>/<environment>/<task>__<index>/agent/trajectory.json`` (latest attempts; a name that is not a
safe path component is made one, with a hash of it: ``_safe``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from prefect_rollouts.errors import ConfigError, TraceStoreError
from prefect_rollouts.trace import ModelCall, Trace
from prefect_rollouts.traces.read import read_rollouts, trace_of_row
from prefect_rollouts.traces.view.conversation import conversation

SCHEMA_VERSION = "ATIF-v1.8"
AGENT_NAME = "prefect-rollouts"


def _atif() -> Any:
    try:
        import atif
    except ImportError as exc:   # pragma: no cover - a dependency; the message names the fix
        raise ConfigError("--format atif needs the atif package: pip install 'atif>=1.8'") from exc
    return atif


def trajectory(trace: Trace, *, environment: str | None = None, rollout_index: int | None = None,
               attempt: int | None = None, harness: str | None = None) -> Any:
    """``trace`` as an ``atif.Trajectory`` (validated by its models; the module docstring says how).

    Raises:
        pydantic.ValidationError: the trajectory does not satisfy ATIF's models (a bug here, not bad input).
    """
    atif = _atif()
    messages = conversation(trace)
    calls = iter([call for call in trace.model_calls if call.error is None])
    steps: list[Any] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        step: dict[str, Any] = {"step_id": len(steps) + 1, "message": message["text"]}
        if message["role"] == "assistant":
            answers = []
            while index + 1 < len(messages) and messages[index + 1]["role"] == "tool":
                index += 1
                answers.append(messages[index])
            step |= _agent_step(atif, trace, trace.messages[message["index"]], message, next(calls, None), answers)
        elif message["role"] in ("system", "user"):
            step["source"] = message["role"]
            if message["provenance"]:
                step["extra"] = {"provenance": message["provenance"], "message_id": message["message_id"]}
        else:   # a tool message with no assistant before it, or a role ATIF has no source for
            step |= {"source": "system", "extra": {"role": message["role"], "tool_call_id": message["tool_call_id"]}}
        steps.append(atif.Step(**step))
        index += 1
    usage = trace.usage
    program = trace.info.get("program")
    agent = atif.Agent(name=AGENT_NAME, version=_version(), model_name=trace.model,
                       extra={k: v for k, v in {"harness": harness, "program": program}.items() if v} or None)
    final = atif.FinalMetrics(total_prompt_tokens=usage.prompt_tokens, total_completion_tokens=usage.completion_tokens,
                              total_cached_tokens=usage.cached_tokens, total_cost_usd=usage.cost_usd,
                              total_steps=len(steps),
                              extra={"reasoning_tokens": usage.reasoning_tokens, "model_calls": len(trace.model_calls),
                                     "judge_tokens": trace.judge_usage.total_tokens})
    extra = {"task_id": trace.task_id, "environment": environment, "rollout_index": rollout_index, "attempt": attempt,
             "reward": trace.reward, "rewards": trace.rewards, "reward_weights": trace.reward_weights,
             "metrics": trace.metrics, "stop_condition": trace.stop_condition, "is_truncated": trace.is_truncated,
             "is_timeout": trace.is_timeout, "errors": [e.model_dump() for e in trace.errors],
             "timings": trace.timings}
    return atif.Trajectory(schema_version=SCHEMA_VERSION, session_id=trace.id, agent=agent, steps=steps,
                           final_metrics=final, extra=json.loads(json.dumps(extra, default=repr)))


def _agent_step(atif: Any, trace: Trace, raw: dict[str, Any], message: dict[str, Any], call: ModelCall | None,
                answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields of the agent step of assistant message ``message`` (``raw``: as the trace holds it): its
    model call's metrics, its reasoning, its tool calls, and ``answers`` (the tool messages after it) as
    the observation, each tied to its call (an answer to no call of this step stays, untied)."""
    step: dict[str, Any] = {"source": "agent", "model_name": trace.model}
    if call is not None:
        extra = {"reasoning_tokens": call.reasoning_tokens, "latency_ms": call.latency_ms,
                 "finish_reason": call.finish_reason, "retries": call.retries or None}
        step["timestamp"] = _iso(call.started_at)
        step["metrics"] = atif.Metrics(prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens,
                                       cached_tokens=call.cached_tokens,
                                       extra={k: v for k, v in extra.items() if v is not None} or None)
        step["llm_call_count"] = 1
    reasoning = "\n\n".join(part["text"] for part in message["parts"])
    if reasoning:
        step["reasoning_content"] = reasoning
    tool_calls = raw.get("tool_calls") or []
    if tool_calls:
        step["tool_calls"] = [atif.ToolCall(tool_call_id=str(c.get("id")),
                                            function_name=str((c.get("function") or {}).get("name")),
                                            arguments=_arguments((c.get("function") or {}).get("arguments")))
                              for c in tool_calls]
    known = {str(c.get("id")) for c in tool_calls}
    if answers:
        step["observation"] = atif.Observation(results=[atif.ObservationResult(
            source_call_id=answer["tool_call_id"] if answer["tool_call_id"] in known else None,
            content=answer["text"], extra={"is_error": True} if answer["is_error"] else None) for answer in answers])
    return step


def export_run(root: str | Path, run_id: str, out: str | Path) -> list[Path]:
    """Write one ATIF ``trajectory.json`` per rollout of run ``run_id`` (its latest attempt) under ``out``
    (layout in the module docstring); return the paths written, in table order.

    Raises:
        ConfigError: the dataset holds no rollout of ``run_id``.
        TraceStoreError: the dataset cannot be read, or ``out`` cannot be written (the message names it).
    """
    rows = read_rollouts(root, run_id=run_id)
    if rows.empty:
        raise ConfigError(f"RUN = {run_id!r}: no rollouts of this run in the trace dataset at {root}. "
                          "List the runs with: prefect-rollouts traces summary PATH")
    from prefect_rollouts.traces.run_config import with_harness

    rows = with_harness(rows, str(root)).sort_values(["environment", "task_id", "rollout_index"])
    written = []
    for row in rows.to_dict("records"):
        document = trajectory(trace_of_row(row), environment=row["environment"],
                              rollout_index=int(row["rollout_index"]), attempt=int(row["attempt"]),
                              harness=row.get("harness"))
        path = (Path(out) / _safe(run_id) / _safe(str(row["environment"]))
                / f"{_safe(str(row['task_id']))}__{int(row['rollout_index'])}" / "agent" / "trajectory.json")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(document.to_json_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
        except OSError as exc:
            raise TraceStoreError(f"--out = {str(out)!r}: cannot write {path} ({exc}). Choose a writable "
                                  "directory") from exc
        written.append(path)
    return written


def _safe(name: str) -> str:
    """``name`` as one path component: characters outside ``[A-Za-z0-9._-]`` as ``_``, never ``.`` or ``..``,
    at most 120 characters; a name so changed ends in ``-`` and 10 hex digits of its SHA-256, so two names
    never share a file (``a/b`` and ``a_b`` were one path, the second rollout's file over the first's)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:120]
    if cleaned == name and cleaned.strip("."):
        return cleaned
    return f"{cleaned[:109]}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def _arguments(text: Any) -> dict[str, Any]:
    """A tool call's arguments as a JSON object: parsed, or ``{"raw": text}`` when they are not one."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except ValueError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"raw": text}


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def _version() -> str:
    try:
        return version("prefect-rollouts")
    except PackageNotFoundError:   # a source checkout without installed metadata
        return "0+unknown"
