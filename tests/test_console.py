"""The console's brief form of Prefect's engine records (issue 19, item 10); the CLI runs are in
tests/prefect/test_console.py."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from prefect_rollouts.cli.console import brief_failures

pytestmark = pytest.mark.unit


class RichHandler(logging.Handler):
    """A handler that prints through a rich ``Console``, as Prefect's console handler does."""

    def __init__(self) -> None:
        super().__init__()
        self.console = Console(file=io.StringIO(), width=200)

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(self.format(record), markup=False)


def log_through_a_console_handler(verbose: bool) -> tuple[str, list[logging.LogRecord]]:
    handler, seen = RichHandler(), []
    handler.setFormatter(logging.Formatter("%(levelname)s | %(message)s"))
    keep = logging.Handler()
    keep.emit = seen.append  # type: ignore[method-assign]
    root, logger = logging.getLogger(), logging.getLogger("prefect.flow_runs")
    root.addHandler(handler)
    logger.addHandler(keep)
    try:
        with brief_failures(not verbose):
            logger.error("Finished in state Running()")
            try:
                raise OSError("api gone")
            except OSError:
                logger.error("Encountered exception during execution", exc_info=True)
            logging.getLogger("prefect.task_runs").error(
                "Task run failed with exception: %r", OSError("x"), extra={"flow_name": "rollout"})
            logging.getLogger("prefect.task_runs").error("Finished in state Failed()", extra={"flow_name": "eval"})
            rollout_task = {"flow_name": "eval", "task_name": "rollout"}   # task granularity: one line, not two
            logging.getLogger("prefect.task_runs").error("Task run failed with state: Failed(message='E: 1')",
                                                         extra=rollout_task)
            logging.getLogger("prefect.task_runs").error("Finished in state Failed('E: 2')", extra=rollout_task)
    finally:
        root.removeHandler(handler)
        logger.removeHandler(keep)
    return handler.console.file.getvalue(), seen   # type: ignore[attr-defined]


def test_a_run_whose_final_state_the_api_did_not_take_says_so_without_a_traceback():
    text, seen = log_through_a_console_handler(verbose=False)
    assert "Finished in state Running()" not in text
    assert "WARNING | Ended, but the Prefect API did not take its final state (the server still shows it Running)" \
        in text
    assert "ERROR | Encountered exception during execution" in text and "Traceback" not in text
    assert "Task run failed" not in text            # a rollout's stage: its flow run's line says it
    assert "ERROR | Finished in state Failed()" in text    # a task run of another flow is kept
    assert "E: 1" not in text and "ERROR | Finished in state Failed('E: 2')" in text
    assert [record.exc_info is not None for record in seen] == [False, True]   # the API's handler gets it whole


def test_verbose_prints_the_engine_records_as_they_are():
    text, _ = log_through_a_console_handler(verbose=True)
    assert "ERROR | Finished in state Running()" in text and "Traceback" in text and "Task run failed" in text
