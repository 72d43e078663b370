"""What ``prefect-rollouts eval`` shows in a terminal: Prefect's log lines at the level the user
asked for, a progress bar that keeps its own line, and the summary table.

The CLI only wires these. Nothing here imports Prefect: its console handler is configured through
its own environment variable, and found as a logging handler that prints through a rich ``Console``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from prefect_rollouts.traces.summary import EvalSummary

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


TOKEN_COLUMNS = ("total_tokens", "cached_tokens", "reasoning_tokens", "judge_tokens")
"""Columns of ``EvalSummary.table()`` the console prints as the run's totals under the table (the
artifact keeps them per environment), so the table fits 160 columns with a few reward components."""


def print_error(console: Console, prefix: str, exc: BaseException | str) -> None:
    """Print an error in red; its text is not markup (``[env.agent] key`` must print as written)."""
    console.print(f"{prefix}{exc}", style="red", markup=False, highlight=False)


def print_summary(console: Console, summary: EvalSummary) -> None:
    """``summary.table()`` as a table titled with the run id (None as ``—``; columns two spaces
    apart, headers never cut, long environment and model names wrap), then the wall time and the run's tokens, then
    the top errors, one line each: ``  <type> x<count>, e.g.: <example>``, the rollouts not scored
    (``not scored: scoring_timeout x6``), then the comparison with
    the baseline, a line per environment."""
    rows = summary.table()
    if not rows:
        console.print("no rollouts")
        return
    columns = [column for column in rows[0] if column not in TOKEN_COLUMNS]
    table = Table(title=f"run {summary.run_id}", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in columns:
        named = column in ("environment", "model")
        table.add_column(column, justify="left" if named else "right", overflow="fold",
                         min_width=None if named else len(column))
    for row in rows:
        table.add_row(*("—" if row[column] is None else str(row[column]) for column in columns))
    console.print(table)
    details = ", ".join(f"{name} {value}" for name, value in (("cached", summary.cached_tokens),
                                                              ("reasoning", summary.reasoning_tokens))
                        if value is not None)
    tokens = f"total tokens: {summary.total_tokens}" + (f" ({details})" if details else "")
    tokens += f", judge tokens: {summary.judge_tokens}" if summary.judge_tokens else ""
    wall = f"wall time: {summary.wall_time_s:.1f} s, " if summary.wall_time_s is not None else ""
    console.print(wall + tokens, markup=False, highlight=False)
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
