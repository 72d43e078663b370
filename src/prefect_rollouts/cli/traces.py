"""``prefect-rollouts traces`` (inspect, compare and compact trace datasets; a series' baseline; a run's
Prefect states written from its rows after an outage) and
``prefect-rollouts alerts`` (a notification when an eval regresses)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import Iterator
from typing import Annotated

import httpx
import typer
from rich.console import Console

from prefect_rollouts.cli.console import print_error, print_summary
from prefect_rollouts.errors import ConfigError, TraceStoreError

traces_app = typer.Typer(help="Inspect Parquet trace datasets.", no_args_is_help=True)
baseline_app = typer.Typer(help="A series' baseline: the run its next eval compares with (baseline = \"last\").",
                           no_args_is_help=True)
traces_app.add_typer(baseline_app, name="baseline")
alerts_app = typer.Typer(help="Prefect automations that notify when an eval regresses or improves.",
                         no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 160)  # piped output keeps whole columns


def _error(prefix: str, exc: BaseException | str) -> None:
    print_error(console, prefix, exc)


@contextlib.contextmanager
def _exits(config_code: int = 2) -> Iterator[None]:
    """A ``ConfigError`` exits ``config_code`` ("config error: ..."); a ``TraceStoreError``, or a
    Prefect API that does not answer, exits 1."""
    try:
        yield
    except ConfigError as exc:
        _error("config error: " if config_code == 2 else "", exc)
        raise typer.Exit(config_code) from None
    except TraceStoreError as exc:
        _error("", exc)
        raise typer.Exit(1) from None
    except (httpx.HTTPError, OSError) as exc:
        from prefect.settings import PREFECT_API_URL

        _error("", f"the Prefect API at {PREFECT_API_URL.value() or '(PREFECT_API_URL is not set)'} did not "
                   f"answer: {type(exc).__name__}: {exc}. Start it (prefect-rollouts server start) or set "
                   "PREFECT_API_URL")
        raise typer.Exit(1) from None


@traces_app.command("summary")
def traces_summary(
    path: Annotated[str, typer.Argument(help="Dataset root (holds rollouts/ and model_calls/): a directory or "
                                             "a URI such as s3://bucket/prefix.")],
    run_id: Annotated[str | None, typer.Option(
        help="Only this run, followed by its full summary (pass@k, outcomes, tokens).")] = None,
    pass_threshold: Annotated[float, typer.Option(help="Reward at which a rollout passes (pass@k).")] = 1.0,
    by_task: Annotated[bool, typer.Option(
        "--by-task", help="With --run-id: also a line per task (rollouts, mean reward, passed, errored, its most "
                          "frequent error).")] = False,
) -> None:
    """Print one row per run: date, run id, model, environment, rollouts, mean reward, stderr, errors."""
    from prefect_rollouts.traces import summarize_run
    from prefect_rollouts.traces.by_task import format_lines, run_task_lines
    from prefect_rollouts.traces.report import format_runs, run_rows

    if by_task and not run_id:
        _error("", "--by-task needs --run-id: the run whose tasks to list")
        raise typer.Exit(2)
    with _exits(config_code=1):
        runs = run_rows(path, run_id)
        summary = summarize_run(path, run_id, pass_threshold=pass_threshold) if runs and run_id else None
        tasks = run_task_lines(path, run_id, pass_threshold) if runs and run_id and by_task else None
    if not runs:
        console.print(f"no rollouts in {path}" + (f" for run {run_id}" if run_id else ""))
        raise typer.Exit(1)
    typer.echo(format_runs(runs))
    if summary is not None:
        print_summary(console, summary)
    if tasks is not None:
        typer.echo("\nper task:\n" + format_lines(tasks))


@traces_app.command("show")
def traces_show(
    path: Annotated[str, typer.Argument(help="Dataset root (holds rollouts/ and model_calls/): a directory or "
                                             "a URI such as s3://bucket/prefix.")],
    run_id: Annotated[str, typer.Argument(help="The run (see `traces summary`).")],
    task_id: Annotated[str | None, typer.Argument(help="The task; without it, the run's rollouts are listed.")] = None,
    index: Annotated[int | None, typer.Option(help="Only this rollout index of the task (default: each).")] = None,
    max_chars: Annotated[int, typer.Option(help="Characters shown of each message; 0 shows all.")] = 2000,
    environment: Annotated[str | None, typer.Option(
        help="Only this environment's rollout (a suite's environments may share task ids).")] = None,
    attempt: Annotated[int | None, typer.Option(
        min=1, help="Show this attempt of the rollout (default: its latest; a rollout run again after an error has "
                    "several, listed under its header).")] = None,
) -> None:
    """Print a rollout's transcript, rewards and errors, and its attempts when it has several (or, without
    TASK_ID, list the run's rollouts)."""
    from prefect_rollouts.traces.report import attempt_lines, format_rollout, format_rollout_list, read_rollout_traces

    with _exits(config_code=1):
        if task_id is None:
            if attempt is not None:
                raise typer.BadParameter(f"{attempt} needs a task: prefect-rollouts traces show {path} {run_id} "
                                         f"TASK_ID --attempt {attempt} (without --attempt it lists the run's task ids)",
                                         param_hint="--attempt")
            typer.echo(format_rollout_list(path, run_id))
            return
        traces = read_rollout_traces(path, run_id, task_id, index, environment, attempt)
        attempts = attempt_lines(path, run_id, task_id)
    several = len({env for env, _, _ in traces}) > 1
    typer.echo("\n\n".join(format_rollout(trace, index=i, environment=env if several or environment else None,
                                          max_chars=max_chars, attempts=attempts.get((env, i)), attempt=attempt)
                           for env, i, trace in traces))


@traces_app.command("compare")
def traces_compare(
    path: Annotated[str, typer.Argument(help="Dataset root: a directory or a URI such as s3://bucket/prefix.")],
    run_a: Annotated[str, typer.Argument(help="The baseline run.")],
    run_b: Annotated[str, typer.Argument(help="The run compared with it (differences are B - A).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    pass_threshold: Annotated[float, typer.Option(help="Reward at which a rollout passes (flipped tasks).")] = 1.0,
    resamples: Annotated[int, typer.Option(min=100, help="Bootstrap resamples of the tasks.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap (the same seed gives the same interval).")] = 0,
    by_task: Annotated[bool, typer.Option("--by-task", help="Also a line per task: mean reward in A and B, the "
                                                            "difference, errored rollouts in each.")] = False,
) -> None:
    """Compare two runs rollout by rollout: per environment and category, the paired reward difference
    with its 95% interval (bootstrap over tasks), McNemar's test, flipped tasks, tokens and latency."""
    from prefect_rollouts.traces.by_task import format_lines, run_task_lines, task_changes
    from prefect_rollouts.traces.compare import compare_runs
    from prefect_rollouts.traces.compare_report import format_comparison

    with _exits():
        result = compare_runs(path, run_a, run_b, pass_threshold=pass_threshold, resamples=resamples, seed=seed)
        changes = task_changes(run_task_lines(path, run_a, pass_threshold),
                               run_task_lines(path, run_b, pass_threshold)) if by_task else None
    if as_json and changes is None:
        typer.echo(result.model_dump_json(indent=2))
        return
    if as_json and changes is not None:
        payload = json.loads(result.model_dump_json())
        payload["tasks"] = json.loads(changes.to_json(orient="records"))   # NaN as null
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    typer.echo(format_comparison(result))
    if changes is not None:
        typer.echo("\nper task (difference = B - A):\n" + format_lines(changes))


@traces_app.command("view")
def traces_view(
    path: Annotated[str, typer.Argument(help="Dataset root: a directory or a URI such as s3://bucket/prefix.")],
    run_id: Annotated[str | None, typer.Argument(help="Open this run (default: the list of runs).")] = None,
    html: Annotated[str | None, typer.Option(
        "--html", help="Write the views as one self-contained HTML file here (no network needed to read it) "
                       "instead of serving them.")] = None,
    max_rollouts: Annotated[int, typer.Option(
        help="With --html: rollouts of each run embedded in full, in table order (every one is in the table; "
             "0: the table only).")] = 500,
    host: Annotated[str, typer.Option(help="Address to serve on: loopback unless you choose otherwise.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on (0: a free one).")] = 0,
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="Open the page in a browser, where one "
                                                                        "exists.")] = True,
    pass_threshold: Annotated[float, typer.Option(help="Reward at which a rollout passes (flipped tasks).")] = 1.0,
) -> None:
    """Look at a run in a browser: the runs with their summaries, a comparison of two, a run's rollouts
    (filter, sort) and each rollout in full, with plots. Served on loopback with a token in the URL it
    prints, or written as one offline HTML file with --html."""
    import secrets
    import webbrowser

    from prefect_rollouts.traces.files import run_ids
    from prefect_rollouts.traces.store import dataset_root
    from prefect_rollouts.traces.view.data import Dataset
    from prefect_rollouts.traces.view.render import write_html
    from prefect_rollouts.traces.view.server import LOOPBACK_NAMES, bind, serve, url

    dataset = Dataset(path, pass_threshold=pass_threshold)
    with _exits(config_code=1):
        if not run_ids(dataset_root(path)):   # directory names only: the summaries are computed when served
            raise TraceStoreError(f"no rollouts in {path}")
        if run_id is not None:
            dataset.table(run_id)   # an unknown run fails here, naming the runs
        if html is not None:
            size = write_html(dataset, html, run_id, max_rollouts=max_rollouts)
            console.print(f"wrote {html} ({size / 1e6:.1f} MB)", markup=False, highlight=False)
            return
        sock = bind(host, port)
    token = secrets.token_urlsafe(24)
    address = url(sock, token, run_id)
    console.print(f"viewer of {path}: {address}\n(Ctrl-C stops it)", markup=False, highlight=False, soft_wrap=True)
    with contextlib.suppress(webbrowser.Error):
        if open_browser and webbrowser.get():
            webbrowser.open(address)
    hosts = None if host in LOOPBACK_NAMES else [*LOOPBACK_NAMES, host, socket.gethostname(), socket.getfqdn()]
    serve(dataset, sock, token, run_id=run_id, allowed_hosts=hosts)


@traces_app.command("export")
def traces_export(
    path: Annotated[str, typer.Argument(help="Dataset root: a directory or a URI such as s3://bucket/prefix.")],
    run_id: Annotated[str, typer.Argument(help="The run whose rollouts to export.")],
    out: Annotated[str, typer.Option(help="Directory to write the files under.")],
    export_format: Annotated[str, typer.Option("--format", help="The file format: atif (Harbor's Agent "
                                                                "Trajectory Interchange Format).")] = "atif",
) -> None:
    """Write each rollout of RUN (its latest attempt) as a trajectory file: OUT/RUN/ENVIRONMENT/TASK__INDEX/agent/
    trajectory.json, validated by the atif package's models."""
    from prefect_rollouts.traces.atif import export_run

    if export_format != "atif":
        _error("", f"--format = {export_format!r}: not a format this command writes. Use --format atif")
        raise typer.Exit(2)
    with _exits(config_code=1):
        written = export_run(path, run_id, out)
    console.print(f"wrote {len(written)} ATIF trajectories under {out}", markup=False, highlight=False)


@traces_app.command("compact")
def traces_compact(
    path: Annotated[str, typer.Argument(help="Dataset root: a directory or a URI such as s3://bucket/prefix.")],
    run_id: Annotated[str, typer.Argument(help="The run whose files to rewrite.")],
) -> None:
    """Rewrite a run's Parquet files into one file per table and day (atomically, dropping duplicate rows)."""
    from prefect_rollouts.traces.compact import compact_run

    with _exits(config_code=1):
        result = compact_run(path, run_id)
    if not result.files_before["rollouts"]:
        console.print(f"no rollouts of run {run_id} in {path}", markup=False)
        raise typer.Exit(1)
    for table in ("rollouts", "model_calls"):
        console.print(f"{table}: {result.files_before[table]} -> {result.files_after[table]} files", markup=False)
    if result.duplicates_dropped:
        console.print(f"dropped {result.duplicates_dropped} duplicate rollout rows", markup=False)


@traces_app.command("reconcile")
def traces_reconcile(
    path: Annotated[str, typer.Argument(help="Dataset root: a directory or a URI such as s3://bucket/prefix.")],
    run_id: Annotated[str, typer.Argument(help="The eval run whose Prefect states to write.")],
) -> None:
    """Write the true final states of RUN's flow runs on the Prefect server from its rows: what an API or
    database outage left Pending or Running (or never created). Final states are left alone. Run it
    only while no eval of RUN is live (its flow run is not final either)."""
    from prefect_rollouts.flows.services.reconcile import reconcile_run

    with _exits():
        report = asyncio.run(reconcile_run(path, run_id))
    for label, names in (("rollout flow runs set", report.rollouts_set),
                         ("rollout flow runs created", report.rollouts_created),
                         ("eval flow runs set", report.evals_set)):
        shown = f": {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}" if names else ""
        console.print(f"{label}: {len(names)}{shown}", markup=False, highlight=False, soft_wrap=True)


@baseline_app.command("set")
def baseline_set(
    run_id: Annotated[str, typer.Argument(help="The run the series' next evals compare with.")],
    series: Annotated[str | None, typer.Option(
        help="The series: a deployment's name, else the run_name, else the taskset id (default: the series "
             "of RUN's eval flow run on the Prefect server).")] = None,
) -> None:
    """Make RUN the baseline of its series: evals with baseline = "last" compare with it (a Prefect Variable)."""
    from prefect_rollouts.flows.services.baseline import set_baseline
    from prefect_rollouts.flows.services.keys import variable_name

    with _exits():
        series = asyncio.run(set_baseline(run_id, series))
    console.print(f"baseline of series {series!r}: {run_id} (Prefect Variable {variable_name(series)})",
                  markup=False, highlight=False)


@baseline_app.command("show")
def baseline_show() -> None:
    """List every series' baseline on the Prefect server."""
    from prefect_rollouts.flows.services.baseline import baselines
    from prefect_rollouts.flows.services.keys import VARIABLE_PREFIX

    with _exits():
        found = asyncio.run(baselines())
    if not found:
        console.print("no baselines (an eval with baseline = \"last\" sets its series' baseline when it completes)",
                      markup=False, highlight=False)
    for name, run in found.items():
        console.print(f"{name.removeprefix(VARIABLE_PREFIX)}  {run}", markup=False, highlight=False)


@alerts_app.command("create")
def alerts_create(
    block: Annotated[str, typer.Option(help="Notification block to send to: <block type slug>/<block name>, e.g. "
                                            "slack-webhook/evals (prefect block ls lists them).")],
    on: Annotated[str, typer.Option(help="Which events: regressed, improved or both.")] = "regressed",
    name: Annotated[str | None, typer.Option(help="The automation's name (default: from --on and --block).")] = None,
) -> None:
    """Create (or update) the Prefect automation that sends BLOCK a message when an eval's comparison
    with its baseline emits prefect-rollouts.eval.regressed (or .improved)."""
    from prefect_rollouts.flows.services.alerts import ensure_regression_automation

    with _exits():
        automation, created = asyncio.run(ensure_regression_automation(block, on, name))
    console.print(f"{'created' if created else 'updated'} automation {automation!r}", markup=False, highlight=False)
