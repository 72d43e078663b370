"""Baselines and regression events: an eval compares itself with a baseline run when it ends.

A *series* is the runs that answer the same question night after night: the runs of one
deployment (its name), else of one ``run_name``, else of one taskset id (``series_name``; the
summary artifact's key uses it too). With ``baseline = "last"`` in the eval config the baseline is
the series' last Completed run that did not regress, kept in the Prefect Variable
``prefect-rollouts-baseline-<series>`` (``variable_name``): the eval compares with it and, when it
ends Completed itself without a regression, becomes it (a failed or regressed run never does).
``prefect-rollouts traces baseline set RUN`` points the Variable at another run (a known good
one, or on purpose a regressed one). ``baseline = "<run id>"`` pins a run instead and leaves the Variable alone.

At its end the eval compares the baseline (run A) with itself (run B) with ``traces.compare_runs``
(paired by task and rollout index, a bootstrap interval over tasks), publishes the comparison as a
markdown artifact ``eval-comparison-<series>``, and for each environment whose interval lies below
zero emits the Prefect event ``prefect-rollouts.eval.regressed`` (above zero:
``prefect-rollouts.eval.improved``), its resource the environment, its payload the difference,
the interval and both run ids (``comparison_events``). ``flows/services/alerts.py`` makes the automation
that sends a notification block a message on those events.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.events import emit_event
from prefect.variables import Variable

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.errors import ConfigError, TraceStoreError
from prefect_rollouts.evals.baseline import (
    LAST,
    REGRESSED,
    Baseline,
    BaselineOutcome,
    baseline_move,
    comparison_events,
    comparison_markdown,
    replaces_baseline,
    verdict_lines,
)
from prefect_rollouts.evals.identity import has_rows
from prefect_rollouts.flows.services.keys import VARIABLE_PREFIX, comparison_key, variable_name
from prefect_rollouts.traces import DatasetRoot, EvalSummary, compare_runs

log = logging.getLogger("prefect_rollouts.baseline")

SERIES_TAG = "prefect-rollouts-series:"
"""Tag of an eval flow run naming its series, so ``traces baseline set RUN`` finds the Variable."""


async def series_name(config: EvalConfig) -> str:
    """The series of the current eval: its deployment's name, else ``EvalConfig.default_name``
    (``run_name``, else the taskset id, else the suite's environments joined by ``+``).

    The deployment's name comes from ``PREFECT__DEPLOYMENT_NAME``, which Prefect's workers and
    ``serve`` set in the process of a deployment's flow run (so an eval run as a subflow of the
    ``launch`` flow has it too); without it, an eval flow run of a deployment reads the deployment
    from the API (one call).
    """
    name = os.environ.get("PREFECT__DEPLOYMENT_NAME")
    context = FlowRunContext.get()
    deployment_id = context.flow_run.deployment_id if context and context.flow_run else None
    if not name and deployment_id is not None:
        async with get_client() as client:
            name = (await client.read_deployment(deployment_id)).name
    return name or config.default_name


def series_tag(series: str) -> str:
    return f"{SERIES_TAG}{series}"


async def resolve_baseline(config: EvalConfig, root: DatasetRoot, series: str, run_id: str) -> Baseline:
    """The run this eval compares with, found before any rollout runs.

    ``baseline = "last"``: the run in the series' Variable; none when it is unset (the first run of
    a series) or names a run the dataset does not hold (the note and a warning say so). Any other
    value is a run id, which the caller checked with ``evals.identity.check_pinned_baseline`` before
    the run's config was stored (a bad one then keeps the run id free).
    """
    if config.baseline is None:
        return Baseline(None)
    if config.baseline == LAST:
        baseline = await Variable.aget(variable_name(series))
        if not isinstance(baseline, str) or not baseline or baseline == run_id:
            return Baseline(None, f"no baseline yet for series {series!r}: this run becomes it if it completes")
        if not has_rows(root, baseline):
            note = (f"no comparison: the baseline {baseline!r} (Prefect Variable {variable_name(series)}) has no "
                    f"rollouts in the trace dataset at {root}; set another with prefect-rollouts traces baseline "
                    "set RUN")
            _logger().warning(note)
            return Baseline(None, note)
        return Baseline(baseline)
    return Baseline(config.baseline)   # checked before the run's config was stored (check_pinned_baseline)


def _logger() -> Any:
    """The flow run's logger (its lines reach the UI), or this module's outside a flow run."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log


async def compare_with_baseline(root: DatasetRoot, baseline: str, run_id: str, series: str,
                                pass_threshold: float) -> BaselineOutcome:
    """Compare ``run_id`` with ``baseline``, publish the markdown artifact ``eval-comparison-<series>``
    and emit the regression and improvement events (``comparison_events``). Call inside the eval
    flow run: the events then name it (and its deployment) among their related resources.

    Raises:
        ConfigError: either run has no rollouts in the dataset.
        TraceStoreError: the dataset cannot be read.
    """
    from prefect.artifacts import acreate_markdown_artifact

    result = compare_runs(root, baseline, run_id, pass_threshold=pass_threshold)
    events = comparison_events(result, series)
    related = await _deployment_related() if events else []
    for event in events:
        emit_event(**event, related=related)
    markdown = comparison_markdown(result, events, series)
    await acreate_markdown_artifact(markdown=markdown, key=comparison_key(series),
                                    description=f"Run {run_id} against baseline {baseline}")
    return BaselineOutcome(result, events, markdown)


async def _deployment_related() -> list[dict[str, str]]:
    """The deployment of this eval as a related resource of its events (Prefect adds the flow run,
    flow and tags itself): the eval flow run's own deployment, else, for an eval run as a subflow
    (the ``launch`` flow's), that of the process's flow run (``PREFECT__FLOW_RUN_ID``, which
    Prefect's workers set). Empty outside a deployment."""
    context = FlowRunContext.get()
    deployment_id = context.flow_run.deployment_id if context and context.flow_run else None
    try:
        async with get_client() as client:
            if deployment_id is None and (top := os.environ.get("PREFECT__FLOW_RUN_ID")):
                deployment_id = (await client.read_flow_run(top)).deployment_id   # type: ignore[arg-type]
            if deployment_id is None:
                return []
            name = (await client.read_deployment(deployment_id)).name
    except Exception as exc:   # the events go out without it
        _logger().warning("could not find this eval's deployment for its events: %s", exc)
        return []
    return [{"prefect.resource.id": f"prefect.deployment.{deployment_id}", "prefect.resource.role": "deployment",
             "prefect.resource.name": name}]


async def finish_with_baseline(summary: EvalSummary, baseline: Baseline, config: EvalConfig, root: DatasetRoot,
                               series: str, *, completed: bool, ran: bool) -> str | None:
    """The end of an eval with a baseline: compare with it (``compare_with_baseline``), put the
    verdict lines, the regressed environments and any note on ``summary``, and, when the run
    ``completed`` with ``baseline = "last"`` and did not regress, make it the series' baseline if it
    may replace it (``replaces_baseline``; a resume that ``ran`` nothing never does: it would move the
    baseline back in time). ``summary.baseline_moved`` and ``summary.baseline_note`` say whether it
    moved. A comparison that fails (the baseline's rows gone, the dataset unreadable) is a note and
    a warning, never the run's failure.

    Returns:
        The comparison artifact's key, or None when there was no comparison.
    """
    logger, run_id = _logger(), summary.run_id
    summary.baseline_note = baseline.note
    replaces, key = True, None
    if baseline.run_id is not None:
        try:
            outcome = await compare_with_baseline(root, baseline.run_id, run_id, series, config.pass_threshold)
        except (ConfigError, TraceStoreError) as exc:
            summary.baseline_note = f"no comparison with {baseline.run_id}: {exc}"
            logger.warning("run %s: %s", run_id, summary.baseline_note)
            return None
        summary.baseline = baseline.run_id
        summary.against_baseline = verdict_lines(outcome.comparison, outcome.events)
        summary.regressed = [e["payload"]["environment"] for e in outcome.events if e["event"] == REGRESSED]
        replaces, key = replaces_baseline(outcome.comparison), comparison_key(series)
        if summary.regressed:
            logger.warning("run %s regressed against baseline %s in %s", run_id, baseline.run_id,
                           ", ".join(summary.regressed))
    if config.baseline == LAST:
        moves, note = baseline_move(summary, baseline, completed=completed, ran=ran, replaces=replaces)
        if moves:
            await remember_baseline(series, run_id)   # the next run of the series compares with this one
            summary.baseline_moved = True
        summary.baseline_note = note or summary.baseline_note
    return key


async def remember_baseline(series: str, run_id: str) -> None:
    """Make ``run_id`` the series' baseline (its Prefect Variable, created or overwritten)."""
    await Variable.aset(variable_name(series), run_id, overwrite=True, tags=["prefect-rollouts", "baseline"])


async def series_of_run(run_id: str) -> str | None:
    """The series of eval run ``run_id``, from the tag of its latest eval flow run on the Prefect
    server (``SERIES_TAG``); None when the server has no such flow run."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["eval"])),
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_id])),
            sort=FlowRunSort.START_TIME_DESC, limit=20)
    for run in runs:
        for tag in run.tags or []:
            if tag.startswith(SERIES_TAG):
                return tag[len(SERIES_TAG):]
    return None


async def set_baseline(run_id: str, series: str | None = None) -> str:
    """Point the baseline Variable of ``series`` (default: the series of ``run_id``'s eval flow run,
    ``series_of_run``) at ``run_id``; returns the series.

    Raises:
        ConfigError: no series given and the server knows no eval flow run named ``run_id``.
    """
    series = series or await series_of_run(run_id)
    if series is None:
        raise ConfigError(f"RUN = {run_id!r}: this Prefect server has no eval flow run of that name to take the "
                          "series from. Check PREFECT_API_URL, or name the series: --series <deployment name, "
                          "else run_name, else taskset id>")
    await remember_baseline(series, run_id)
    return series


async def baselines() -> dict[str, str]:
    """Every series' baseline on the server: ``{variable name: run id}``, by name."""
    async with get_client() as client:   # filtered by name on the server: a plain read stops at its page size
        response = await client.request("POST", "/variables/filter", json={
            "variables": {"name": {"like_": VARIABLE_PREFIX}}, "limit": 200})
    return dict(sorted((v["name"], str(v["value"])) for v in response.json() if v["name"].startswith(VARIABLE_PREFIX)))
