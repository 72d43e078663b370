"""Write an eval run's true final states on the Prefect server from its rows (``prefect-rollouts traces reconcile``).

An outage the eval could not outlast (the API, or only its database, away past
``api_outage_limit_s`` at the end, or a process killed meanwhile) can leave the run's flow runs
Pending or Running for good, and rollouts that ran inline without a flow run at all. The dataset
knows how each rollout ended, so ``reconcile_run`` puts the server right afterwards:

- a ``rollout`` flow run of the run that is not final gets the state its row says (Completed, or
  Failed with the row's error), Crashed when the rollout has no row (it never finished);
- a rollout with a row but no flow run gets one created in that state (tag ``api-outage``), with
  ``flow`` granularity only (the other granularities have no rollout flow runs);
- a rollout run several times (``attempt`` 1, 2, ...: ``--retry-errors``, ``max_rollout_attempts``) has a
  flow run per attempt: each gets the state of its own attempt's row (matched by the rollout id the flow
  run's parameters and the row share), and an attempt's row without a flow run gets one;
- an ``eval`` flow run named after the run that is not final gets the run's verdict
  (``traces.run_failure`` over the rows and the stored config's plan): Completed or Failed.

Idempotent: final states are never touched, so running it twice changes nothing the second time.
Run it only while no eval of the run is live: a live eval's own flow run is not final either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName
from prefect.states import Completed, Crashed, Failed, State

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.identity import stored_eval_config
from prefect_rollouts.evals.plan import plan_rollouts
from prefect_rollouts.traces import DatasetRoot, dataset_root, read_rollouts, run_failure, summarize_run
from prefect_rollouts.traces.run_config import read_run_config
from prefect_rollouts.traces.summary import error_text

PAGE = 200
_ROWS = ["rollout_id", "task_type", "model", "flow_run_id", "is_error", "error_type", "error_message"]
MESSAGE = "written from the run's rows after a Prefect API outage (prefect-rollouts traces reconcile)"


@dataclass
class ReconcileReport:
    """What ``reconcile_run`` wrote: flow-run names per kind of change."""

    rollouts_set: list[str] = field(default_factory=list)
    """Rollout flow runs that were not final and got the state of their row (or Crashed without one)."""
    rollouts_created: list[str] = field(default_factory=list)
    """Rollouts with a row and no flow run that got one, in their final state."""
    evals_set: list[str] = field(default_factory=list)
    """Eval flow runs of the run that were not final, with the state they got."""


async def reconcile_run(root: str | DatasetRoot, run_id: str) -> ReconcileReport:
    """Give every flow run of eval run ``run_id`` on the Prefect server its true final state, from
    the rows in the dataset at ``root`` (see the module docstring).

    Raises:
        ConfigError: the dataset has no rollouts of ``run_id``.
        TraceStoreError: the dataset cannot be read.
        httpx.HTTPError: the Prefect API (or its database) does not answer.
    """
    from prefect_rollouts.flows.rollout import RUN_NAME, RolloutRequest, rollout_flow

    root = root if isinstance(root, DatasetRoot) else dataset_root(root)
    rows = read_rollouts(root, columns=_ROWS, run_id=run_id, attempts="all")
    if not len(rows):
        raise ConfigError(f"RUN = {run_id!r}: no rollouts of this run in the trace dataset at {root.uri}. "
                          "Check the run id (prefect-rollouts traces summary PATH lists them) and the path")
    records = rows.to_dict("records")
    by_rollout = {str(r["rollout_id"]): r for r in records}
    by_id = {str(r["flow_run_id"]): r for r in records if isinstance(r["flow_run_id"], str)}
    by_key = {_key(r["task_type"], r["task_id"], r["rollout_index"], r["attempt"]): r for r in records}
    report = ReconcileReport()
    async with get_client() as client:
        seen: set[str] = set()   # rollout ids (one per attempt) and flow run ids that have a flow run
        for flow_run in await _flow_runs(client, "rollout"):
            request = flow_run.parameters.get("rollout") or {}
            if request.get("run_id") != run_id:
                continue
            key = _key(request.get("task_type"), request.get("task_id"), request.get("rollout_index"),
                       request.get("attempt"))
            seen |= {str(request.get("rollout_id")), str(flow_run.id)}
            if flow_run.state is not None and flow_run.state.is_final():
                continue
            row = by_rollout.get(str(request.get("rollout_id"))) or by_id.get(str(flow_run.id)) or by_key.get(key)
            await client.set_flow_run_state(flow_run.id, _rollout_state(row), force=True)
            report.rollouts_set.append(flow_run.name)
        config = _stored_config(root, run_id)
        if config is not None and config.rollout_granularity == "flow":
            for row in records:
                if str(row["rollout_id"]) in seen or str(row["flow_run_id"]) in seen:
                    continue
                request = RolloutRequest(rollout_id=str(row["rollout_id"]), task_id=str(row["task_id"]),
                                         rollout_index=int(row["rollout_index"]), task_type=str(row["task_type"]),
                                         model=str(row["model"]), run_id=run_id, attempt=int(row.get("attempt", 1)))
                name = RUN_NAME.format(rollout=request)
                await client.create_flow_run(rollout_flow, name=name, parameters={"rollout": request.model_dump()},
                                             tags=["api-outage"], state=_rollout_state(row))
                report.rollouts_created.append(name)
        for flow_run in await _flow_runs(client, "eval", FlowRunFilter(name=FlowRunFilterName(any_=[run_id]))):
            if flow_run.state is None or not flow_run.state.is_final():
                state = _eval_state(root, run_id, config)
                await client.set_flow_run_state(flow_run.id, state, force=True)
                report.evals_set.append(f"{flow_run.name} ({state.name})")
    return report


async def _flow_runs(client: Any, flow: str, flow_run_filter: FlowRunFilter | None = None) -> list[Any]:
    """Every flow run of ``flow`` (matching ``flow_run_filter``), page by page."""
    found, offset = [], 0
    while True:
        page = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
                                           flow_run_filter=flow_run_filter, limit=PAGE, offset=offset)
        found += page
        if len(page) < PAGE:
            return found
        offset += PAGE


def _key(task_type: Any, task_id: Any, rollout_index: Any, attempt: Any) -> tuple[str, str, int, int]:
    """A rollout attempt as a flow run's parameters and a row both name it (when their rollout ids differ):
    its environment's task type, task, rollout index and attempt (null: 1)."""
    return str(task_type), str(task_id), int(rollout_index or 0), int(attempt or 1)


def _rollout_state(row: dict[str, Any] | None) -> State[Any]:
    """The final state a rollout's row says: Failed with its error, Completed, or Crashed without a row."""
    if row is None:
        return Crashed(message="the rollout has no row: it never finished (resume the run to run it)")
    if row["is_error"]:
        return Failed(message=error_text(str(row["error_type"]), str(row["error_message"] or "")))
    return Completed(message=MESSAGE)


def _stored_config(root: DatasetRoot, run_id: str) -> Any:
    """The run's stored ``EvalConfig``; None when it has none or it cannot be rebuilt (secrets removed)."""
    stored = read_run_config(root, run_id)
    if stored is None:
        return None
    try:
        return stored_eval_config(stored, [], run_id)
    except ConfigError:
        return None


def _eval_state(root: DatasetRoot, run_id: str, config: Any) -> State[Any]:
    """The eval flow run's verdict from the rows (``run_failure``); Crashed when the plan is unknown."""
    if config is None:
        return Crashed(message="left unfinished by a Prefect API outage; the run's plan is unknown here "
                               "(no usable stored config), so its verdict is not written: see traces summary")
    summary = summarize_run(root, run_id, rollouts_per_task=config.rollouts_per_task,
                            pass_threshold=config.pass_threshold)
    failure = run_failure(summary, len(plan_rollouts(config)), config.max_error_fraction)
    return Completed(message=MESSAGE) if failure is None else Failed(message=failure)
