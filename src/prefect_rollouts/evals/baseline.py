"""Verdicts of an eval against its baseline: which environments regressed or improved, the lines
and markdown that say so, the events' payloads, and whether the run may become the baseline.

Plain functions of a ``traces.RunComparison`` (run A the baseline, run B this run); the Prefect
layer (``flows/services/baseline.py``) finds the baseline, publishes the artifact, emits the events and
moves the series' Variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect_rollouts.evals.prepare import LAST
from prefect_rollouts.traces.compare import RunComparison
from prefect_rollouts.traces.compare_report import format_comparison
from prefect_rollouts.traces.eval_summary import EvalSummary

__all__ = ["EVENT_TASKS", "IMPROVED", "LAST", "REGRESSED", "Baseline", "BaselineOutcome", "baseline_move",
           "comparison_events", "comparison_markdown", "replaces_baseline", "verdict_lines"]

REGRESSED = "prefect-rollouts.eval.regressed"
IMPROVED = "prefect-rollouts.eval.improved"
#: Flipped task ids carried in an event's payload (the artifact lists them all).
EVENT_TASKS = 20


@dataclass
class Baseline:
    """What an eval compares with: ``run_id`` (None: no comparison) and, when there is none or it
    is not used, ``note``, a line for the summary saying why."""

    run_id: str | None
    note: str | None = None


def replaces_baseline(comparison: RunComparison) -> bool:
    """Whether a Completed run compared with the series' baseline may become the baseline: only
    when it scored every rollout the baseline scored (a quick run of 3 tasks, one of another seed,
    or one whose rollouts errored must not replace a baseline of 50 and hide the next night's drop)."""
    return all(group.n_paired >= group.rollouts_a - group.errored_a - group.skipped_a
               for group in comparison.environments)


@dataclass
class BaselineOutcome:
    """What the comparison with the baseline found."""

    comparison: RunComparison
    events: list[dict[str, Any]]
    """The events emitted: ``{"event": ..., "resource": ..., "payload": ...}`` each."""
    markdown: str


def comparison_events(result: RunComparison, series: str) -> list[dict[str, Any]]:
    """An event per environment whose interval lies wholly below zero (``REGRESSED``) or above it
    (``IMPROVED``); none where it covers 0 or there are no pairs. B is this run, A the baseline.

    With a few dozen tasks or fewer a percentile bootstrap interval is too narrow (``traces.compare``),
    so where a test applies (pass/fail rewards) its ``p_value`` must also be below ``1 - confidence``
    (0.05): pairs of equal runs of 10 tasks had an interval excluding 0 far more often than 5% of
    the time, most with p >= 0.05 (benchmarks/README.md, "Regression events need the exact test too").
    """
    events = []
    for group in result.environments:
        if group.ci_low is None or group.ci_high is None or group.ci_low <= 0.0 <= group.ci_high:
            continue
        if group.p_value is not None and group.p_value >= 1.0 - result.confidence:
            continue   # the exact test does not back the interval (a few tasks: the bootstrap is too narrow)
        events.append({
            "event": REGRESSED if group.ci_high < 0.0 else IMPROVED,
            "resource": {"prefect.resource.id": f"prefect-rollouts.environment.{group.environment}",
                         "prefect.resource.name": group.environment, "prefect-rollouts.series": series},
            "payload": {
                "environment": group.environment, "series": series,
                "run_id": result.run_b, "baseline_run_id": result.run_a,
                "difference": group.difference, "ci_low": group.ci_low, "ci_high": group.ci_high,
                "confidence": result.confidence, "p_value": group.p_value, "test": group.test,
                "mean": group.mean_b, "baseline_mean": group.mean_a, "n_paired": group.n_paired,
                "flipped_to_fail": group.flipped_to_fail[:EVENT_TASKS],
                "flipped_to_pass": group.flipped_to_pass[:EVENT_TASKS],
                "n_flipped_to_fail": len(group.flipped_to_fail), "n_flipped_to_pass": len(group.flipped_to_pass),
                "only_in_run": group.only_in_b, "only_in_baseline": group.only_in_a}})
    return events


def verdict_lines(result: RunComparison, events: list[dict[str, Any]]) -> list[str]:
    """One line per environment: ``<environment>: regressed, difference -0.250 [-0.400, -0.100]``
    (``improved``, ``no change shown`` where the interval covers 0, ``nothing to compare`` without pairs)."""
    verdicts = {e["payload"]["environment"]: "regressed" if e["event"] == REGRESSED else "improved" for e in events}
    lines = []
    for group in result.environments:
        verdict = verdicts.get(group.environment, "no change shown" if group.n_paired else "nothing to compare")
        interval = "" if group.ci_low is None else f" [{group.ci_low:+.3f}, {group.ci_high:+.3f}]"
        difference = "—" if group.difference is None else f"{group.difference:+.3f}"
        paired = ""
        if group.only_in_a or group.only_in_b:
            paired = (f" ({group.n_paired} rollouts paired; {group.only_in_b} only in this run, {group.only_in_a} "
                      "only in the baseline)")
        lines.append(f"{group.environment}: {verdict}, difference {difference}{interval}{paired}")
    return lines


def comparison_markdown(result: RunComparison, events: list[dict[str, Any]], series: str) -> str:
    """The comparison artifact: ``verdict_lines`` as a list, then ``format_comparison``'s tables."""
    lines = [f"# Run {result.run_b} against baseline {result.run_a}", "",
             f"Series `{series}`. Difference = mean of this run - mean of the baseline, paired by task and "
             f"rollout; {result.confidence:.0%} {result.interval}.", ""]
    lines += [f"- {line}" for line in verdict_lines(result, events)]
    return "\n".join([*lines, "", "```text", format_comparison(result), "```"])


def baseline_move(summary: EvalSummary, baseline: Baseline, *, completed: bool, ran: bool,
                  replaces: bool) -> tuple[bool, str | None]:
    """Whether this run becomes the series' baseline, and the summary's note saying so or why not
    (None: keep the note there is). A run that failed or regressed never does: the next night would
    compare with the bad run and the regression would vanish; nor a resume that ran nothing (it would
    move the baseline back in time), nor a run that did not score every rollout the baseline scored
    (``replaces``). ``traces baseline set RUN`` makes such a run the baseline on purpose.

    Returns:
        ``(moves, note)``.
    """
    stays = f"the baseline stays {baseline.run_id}" if baseline.run_id else "the series keeps no baseline"
    if not completed:
        return False, f"{stays}: this run failed"
    if summary.regressed:
        return False, (f"{stays}: this run regressed ({', '.join(summary.regressed)}); to compare the next runs "
                       f"with it all the same: prefect-rollouts traces baseline set {summary.run_id}")
    if not ran:
        return False, "the baseline stays as it is: this resume ran no rollout"
    if not replaces:
        return False, (f"{stays}: this run did not score every rollout it scored (a smaller run, another seed, "
                       "or errors)")
    return True, f"this run is now the baseline (it was {baseline.run_id})" if baseline.run_id else None
