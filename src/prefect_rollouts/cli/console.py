"""What ``prefect-rollouts eval`` shows in a terminal: Prefect's log lines at the level the user
asked for, a progress bar that keeps its own line, and the summary table.

The CLI only wires these. Nothing here imports Prefect: its console handler is configured through
its own environment variable, and found as a logging handler that prints through a rich ``Console``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from prefect_rollouts.traces.eval_summary import EvalSummary

CONSOLE_LEVEL_ENV = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"
"""Prefect's setting of its console handler's level (its ``logging.yml``, overridable by environment)."""


def set_console_log_level(verbose: bool) -> None:
    """Show Prefect's INFO lines (flow and task runs created, stages finished) on the console only
    when ``verbose``; else only its warnings and errors.

    Only the console handler changes: every record still reaches the Prefect API, so the UI shows
    the flow runs' full logs either way. Without ``verbose`` a level the user set in
    ``PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL`` stands (default ``WARNING``); ``verbose`` shows all
    (``NOTSET``, Prefect's default; ``PREFECT_LOGGING_LEVEL`` still applies). Prefect reads the
    variable when it is imported; if it was imported already (a taskset module may import it),
    its console handler gets the level here.
    """
    if verbose:
        os.environ[CONSOLE_LEVEL_ENV] = "NOTSET"
    else:
        os.environ.setdefault(CONSOLE_LEVEL_ENV, "WARNING")
    for handler in _console_handlers():
        handler.setLevel(os.environ[CONSOLE_LEVEL_ENV].upper())


def _console_handlers() -> list[logging.Handler]:
    """The root logger's handlers that print through a rich ``Console`` (Prefect's console handler)."""
    return [h for h in logging.getLogger().handlers if isinstance(getattr(h, "console", None), Console)]


@contextlib.contextmanager
def progress_bar(console: Console) -> Iterator[Callable[[int, int], None]]:
    """A ``rollouts`` progress bar on ``console`` while the block runs; yields ``update(done, total)``.

    The bar keeps its own line: while it is shown, log handlers that print through a rich
    ``Console`` of their own (Prefect's console handler) print through ``console`` instead, which
    puts each record on a line above the bar (two consoles writing to one terminal would splice a
    record into the bar's line). Print anything else through ``console`` too while the bar is shown.
    """
    with Progress(TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress, _logs_through(console):
        bar = progress.add_task("rollouts", total=None)

        def update(done: int, total: int) -> None:
            progress.update(bar, completed=done, total=total)
        yield update


@contextlib.contextmanager
def _logs_through(console: Console) -> Iterator[None]:
    """Point the root logger's rich-console handlers at ``console`` (their own again at exit)."""
    handlers = _console_handlers()
    saved = [h.console for h in handlers]  # type: ignore[attr-defined]
    for handler in handlers:
        handler.console = console  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for handler, own in zip(handlers, saved, strict=True):
            handler.console = own  # type: ignore[attr-defined]


ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
"""Prefect's flow and task engines log through these: a run's "Finished in state ..." line, and
the traceback of an exception a task run raised."""

ROLLOUT_FLOW = "rollout"
"""The name of ``rollout_flow`` (``flows/rollout.py``): its stage task runs' failures are its own."""

ROLLOUT_TASKS = frozenset({"rollout", "batch"})
"""The task runs of a rollout (``task`` granularity) and of a batch of them (``flows/execute.py``)."""


@contextlib.contextmanager
def brief_failures(enabled: bool = True) -> Iterator[None]:
    """While the block runs, print Prefect's failure lines on the console in brief (unless not ``enabled``).

    A failed rollout is one line, its flow run's (or at ``task`` granularity its task run's)
    ``Finished in state Failed('<type>: <message>')``: the records that repeat that message (its
    stage task runs' "Task run failed with exception", with a traceback, and "Finished in state
    Failed"; a rollout task run's "Task run failed with state") are not printed. No record of Prefect's engines
    prints a traceback; a run whose final state the API did not take (an outage) says so instead
    of ``Finished in state Running()``. Only the console changes: every record, traceback
    included, still reaches the Prefect API, and with ``--verbose`` (``enabled=False``) the
    console prints them as Prefect does.
    """
    if not enabled:
        yield
        return
    handlers = _console_handlers()
    saved = [handler.formatter for handler in handlers]
    for handler in handlers:
        handler.addFilter(_skip_stage_failures)
        handler.setFormatter(_BriefFormatter(handler.formatter or logging.Formatter()))
    try:
        yield
    finally:
        for handler, formatter in zip(handlers, saved, strict=True):
            handler.removeFilter(_skip_stage_failures)
            handler.setFormatter(formatter)


def _skip_stage_failures(record: logging.LogRecord) -> bool:
    """False for a failure record that repeats another line: of a ``rollout_flow`` run's stage task
    run (its flow run's line says it), and the "Task run failed with" of a ``rollout`` or ``batch``
    task run (its "Finished in state Failed" line says it)."""
    if record.name != "prefect.task_runs" or record.levelno < logging.ERROR:
        return True
    text = str(record.msg)
    if getattr(record, "flow_name", None) == ROLLOUT_FLOW:
        return not text.startswith(("Task run failed with", "Finished in state"))
    return not (getattr(record, "task_name", None) in ROLLOUT_TASKS and text.startswith("Task run failed with"))


class _BriefFormatter(logging.Formatter):
    """Formats as ``inner`` does, but a record of Prefect's engines without its traceback, and
    ``Finished in state Running()`` as what it means. The record itself is left as it is (the
    API's handler and others see it whole)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if record.name not in ENGINE_LOGGERS:
            return self.inner.format(record)
        brief = copy.copy(record)
        brief.exc_info, brief.exc_text, brief.stack_info = None, None, None
        if record.getMessage() == "Finished in state Running()":
            brief.msg, brief.args = ("Ended, but the Prefect API did not take its final state (the server still "
                                     "shows it Running)"), ()
            brief.levelno, brief.levelname = logging.WARNING, "WARNING"
        return self.inner.format(brief)


TOKEN_COLUMNS = ("total_tokens", "cached_tokens", "reasoning_tokens", "judge_tokens")
"""Columns of ``EvalSummary.table()`` the console prints as the run's totals under the table (the
artifact keeps them per environment), so the table fits 160 columns with a few reward components."""


def print_error(console: Console, prefix: str, exc: BaseException | str) -> None:
    """Print an error in red; its text is not markup (``[env.agent] key`` must print as written)."""
    console.print(f"{prefix}{exc}", style="red", markup=False, highlight=False)


def print_summary(console: Console, summary: EvalSummary) -> None:
    """``summary.table()`` as a table titled with the run id (None as ``—``; columns two spaces
    apart, headers never cut, long environment, harness and model names wrap), then the wall time
    and the run's tokens, the spend of every attempt (tokens, cost where priced, the costliest tasks and
    rollouts), then the top errors, one line each: ``  <type> x<count>, e.g.: <example>``,
    the rollouts not scored (``not scored: scoring_timeout x6``), then the comparison with the
    baseline, a line per environment."""
    rows = summary.table()
    if not rows:
        console.print("no rollouts")
        return
    columns = [column for column in rows[0] if column not in TOKEN_COLUMNS]
    table = Table(title=f"run {summary.run_id}", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in columns:
        named = column in ("environment", "harness", "model")
        table.add_column(column, justify="left" if named else "right", overflow="fold",
                         min_width=None if named else len(column))
    for row in rows:
        table.add_row(*("—" if row[column] is None else str(row[column]) for column in columns))
    console.print(table)
    details = ", ".join(f"{name} {value}" for name, value in (("cached", summary.cached_tokens),
                                                              ("reasoning", summary.reasoning_tokens))
                        if value is not None)
    tokens = f"tokens of the latest attempts: {summary.total_tokens}" + (f" ({details})" if details else "")
    tokens += f", judge tokens: {summary.judge_tokens}" if summary.judge_tokens else ""
    wall = f"wall time: {summary.wall_time_s:.1f} s, " if summary.wall_time_s is not None else ""
    console.print(wall + tokens, markup=False, highlight=False)
    if summary.spend is not None and summary.spend.attempts:   # every attempt, judges, cost (traces/spend.py)
        console.print(summary.spend.text(), markup=False, highlight=False, soft_wrap=True)
    if summary.unfinished and not summary.budget_stop:   # a run its budget stopped, seen later (traces summary)
        console.print(summary.unfinished_text(), markup=False, highlight=False, soft_wrap=True)
    if summary.retried:   # --retry-errors, max_rollout_attempts: rows of the earlier attempts stay
        console.print(f"retried: {summary.retried} rollout{'' if summary.retried == 1 else 's'} after an errored "
                      f"attempt, {summary.recovered} recovered",
                      markup=False, highlight=False)
    if summary.errors:
        console.print("top errors:", markup=False, highlight=False)
    for error in summary.errors:
        console.print(f"  {error.type} x{error.count}, e.g.: {error.example}", markup=False, highlight=False,
                      soft_wrap=True)
    if summary.unscored:   # deadlines, skip_on_timeout: they count against max_error_fraction
        console.print("not scored: " + ", ".join(f"{cause} x{count}" for cause, count in summary.unscored.items()),
                      markup=False, highlight=False)
    if summary.baseline:
        console.print(f"against baseline {summary.baseline}:", markup=False, highlight=False)
    for line in summary.against_baseline:
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if summary.baseline_note:
        console.print(f"baseline: {summary.baseline_note}", markup=False, highlight=False, soft_wrap=True)
