"""``prefect-rollouts tasks check PATH``: are these Harbor tasks sound? The oracle must score 1 and nop 0.

It runs one eval through the eval flow (a suite of two environments over the same tasks: ``oracle``
with the ``oracle`` harness and ``nop`` with ``nop``, the ``docker`` runtime, model ``none``), then prints a
table per task (oracle reward, nop reward, image build time, the first error) and which tasks are
broken; exit 1 if any is, 2 on a config error.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from prefect_rollouts.cli.console import brief_failures, print_error, progress_bar, set_console_log_level
from prefect_rollouts.cli.server import on_server, temporary_server
from prefect_rollouts.cli.stop_signals import run_until_stopped
from prefect_rollouts.errors import ConfigError

tasks_app = typer.Typer(help="Agentic task directories (Harbor's format).", no_args_is_help=True)


@tasks_app.command("check")
def check_command(
    path: Annotated[Path, typer.Argument(help="A Harbor task directory, or a directory of them.")],
    tasks: Annotated[list[str] | None, typer.Option(
        "--task", help="Only this task (its directory name; repeatable).")] = None,
    max_concurrent: Annotated[int, typer.Option(help="Rollouts at once (oracle and nop of every task).")] = 4,
    traces: Annotated[Path | None, typer.Option(
        help="Keep the rows in this trace dataset (default: a temporary directory, removed after).")] = None,
) -> None:
    """Run the oracle and nop harnesses on every task through the eval flow (docker runtime) and print
    oracle reward, nop reward and build time per task. A task is broken when the oracle scores below 1 or
    nop above 0 (or either errors); exit 1 if any is. Task directories that do not load are listed
    first, all of them, and nothing runs (exit 2)."""
    from prefect_rollouts.cli.traces import console
    from prefect_rollouts.config.eval import EvalConfig
    from prefect_rollouts.environments.harbor import taskset as harbor
    from prefect_rollouts.traces import read_rollouts

    try:
        found = harbor.problems(str(path), tasks)
    except ConfigError as exc:
        print_error(console, "config error: ", exc)
        raise typer.Exit(2) from None
    if found:
        for problem in found:
            print_error(console, "config error: ", problem)
        print_error(console, "", f"{len(found)} task directories do not load; fix them and check again")
        raise typer.Exit(2)

    with contextlib.ExitStack() as stack:
        root = traces or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tasks-check-")))
        taskset: dict[str, Any] = {"id": "harbor", "path": str(path.resolve())}
        if tasks:
            taskset["tasks"] = list(tasks)
        try:
            config = EvalConfig.model_validate({
                "run_name": "tasks-check", "max_concurrent": max_concurrent, "max_error_fraction": 1.0,
                "rollout_granularity": "task", "traces": {"path": str(root)},
                "env": {"agent": {"model": "none", "harness": "nop", "runtime": {"type": "docker"}},
                        "tasksets": [{**taskset, "name": "oracle", "agent": {"harness": "oracle"}},
                                     {**taskset, "name": "nop", "agent": {"harness": "nop"}}]}})
            from prefect_rollouts.evals.plan import plan_rollouts

            plan_rollouts(config)   # a task directory's problems are config errors: before Prefect starts
        except (ConfigError, ValueError) as exc:
            print_error(console, "config error: ", exc)
            raise typer.Exit(2) from None
        set_console_log_level(False)   # before Prefect is imported: its warnings and errors only
        from prefect_rollouts.evals.engine import preparation_listener, progress_listener
        from prefect_rollouts.flows.eval import run_eval

        with progress_bar(console) as update, brief_failures(True), on_server(temporary_server(), console):
            progress_listener.set(update)
            preparation_listener.set(lambda line: console.print(line, markup=False, highlight=False))
            summary, _ = run_until_stopped(run_eval(config))
        rows = read_rollouts(root, run_id=summary.run_id,
                             columns=["task_id", "environment", "reward", "error_type", "error_message", "info"])
    table, broken = _table(rows)
    console.print(table)
    if broken:
        print_error(console, "broken: ", f"{len(broken)} of {len(table.rows)} tasks: {', '.join(broken)} "
                                         "(the oracle must score 1 and nop 0, without errors)")
        raise typer.Exit(1)
    count = len(table.rows)
    console.print(f"{'the task is' if count == 1 else f'all {count} tasks are'} sound: oracle 1, nop 0")


def _table(rows: Any) -> tuple[Table, list[str]]:
    """The per-task table and the broken tasks' ids, from the check's rows (the error column also names
    an agent failure, e.g. the oracle's ``solve.sh`` exiting non-zero, which is scored, not an error)."""
    table = Table("task", "oracle", "nop", "build s", "error", title="tasks check")
    broken = []
    for task_id in sorted(set(rows["task_id"])):
        mine = rows[rows["task_id"] == task_id]
        cells: dict[str, Any] = {}
        errors, notes = [], []
        build = None
        for environment in ("oracle", "nop"):
            row = mine[mine["environment"] == environment]
            if row.empty:
                cells[environment] = None
                continue
            first = row.iloc[0]
            reward = first["reward"]
            cells[environment] = None if reward is None or (isinstance(reward, float) and math.isnan(reward)) \
                else float(reward)
            if isinstance(first["error_type"], str) and first["error_type"]:
                message = str(first["error_message"]).strip().splitlines() or [""]
                errors.append(f"{environment}: {first['error_type']}: {message[0][:200]}")
            info = json.loads(first["info"]) if isinstance(first["info"], str) else {}
            failed = info.get("agent_failure") or {}   # scored, not an error: e.g. solve.sh exited non-zero
            if failed.get("message"):
                notes.append(f"{environment}: {failed.get('stop_condition')}: {str(failed['message'])[:200]}")
            seconds = (info.get("harbor") or {}).get("build_s")
            if isinstance(seconds, (int, float)):
                build = max(build or 0.0, float(seconds))
        sound = cells.get("oracle") == 1.0 and cells.get("nop") == 0.0 and not errors
        if not sound:
            broken.append(task_id)
        table.add_row(task_id, _shown(cells.get("oracle")), _shown(cells.get("nop")),
                      "—" if build is None else f"{build:.1f}",
                      "; ".join(errors + notes) or ("" if sound else "wrong reward"), style=None if sound else "red")
    return table, broken


def _shown(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"
