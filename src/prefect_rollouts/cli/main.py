"""The ``prefect-rollouts`` command: run evals, summarise trace datasets, serve the deployments."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

import typer
from rich.console import Console
from typer.core import TyperGroup

from prefect_rollouts.cli.console import brief_failures, print_error, print_summary, progress_bar, set_console_log_level
from prefect_rollouts.cli.retry import RETRY_ALL, retry_errors_args
from prefect_rollouts.cli.server import drain_prefect_services, on_server, temporary_server
from prefect_rollouts.cli.stop_signals import StopSignal, run_until_stopped
from prefect_rollouts.cli.tasks import tasks_app
from prefect_rollouts.cli.traces import alerts_app, traces_app
from prefect_rollouts.errors import ConfigError, TraceStoreError


class _Commands(TyperGroup):
    """The command group. Lets ``eval --retry-errors`` go without a value (typer's parser has no
    optional option values): see ``retry_errors_args``."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        if name == "eval":
            rest = retry_errors_args(rest)
        return name, command, rest


app = typer.Typer(help="Run and score LLM-agent rollouts with Prefect.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False, cls=_Commands)
app.add_typer(traces_app, name="traces")
app.add_typer(alerts_app, name="alerts")
app.add_typer(tasks_app, name="tasks")
console = Console(width=None if sys.stdout.isatty() else 160)  # piped output keeps whole columns


@app.command("eval")
def eval_command(
    config: Annotated[Path | None, typer.Argument(
        help="Eval config TOML (tables env.taskset, env.agent, traces, ...); optional with --resume, which "
             "runs the config stored when the run started.")] = None,
    set_: Annotated[list[str] | None,
                    typer.Option("--set", help="Override a key: dotted.key=value (repeatable).")] = None,
    resume: Annotated[str | None,
                      typer.Option(help="Continue run RUN_ID: run only rollouts without a durable row (and the retries "
                                        "max_rollout_attempts left), with the run's stored config.")] = None,
    retry_errors: Annotated[str | None, typer.Option(
        "--retry-errors", metavar="[TYPE,...]",
        help="With --resume: also run again, each as a new attempt, every rollout whose latest attempt is an error "
             "(also after a kill: a retry that errored runs again; only these error types when given, comma "
             "separated, e.g. ProviderError,RuntimeUnavailableError; they also become retry_error_types). Earlier "
             "attempts stay in the dataset. See docs/retries.md.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Id for a new run (default: generated).")] = None,
    force_config: Annotated[bool, typer.Option(
        "--force-config", help="With --resume: run the given config even where it differs from the stored one "
                               "in keys that define the run.")] = False,
    work_pool: Annotated[str | None, typer.Option(
        help="Run the rollouts as shard flow runs on this Prefect work pool (\\[dispatch] work_pool).")] = None,
    shard_size: Annotated[int | None, typer.Option(
        help="Rollouts per shard flow run (\\[dispatch] shard_size).")] = None,
    fail_on_regression: Annotated[bool, typer.Option(
        "--fail-on-regression", help="Exit 3 when the comparison with the baseline (baseline = ...) shows an "
                                     "environment regressed.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Print Prefect's INFO lines (each flow and task run) and tracebacks too; by "
                                "default only its warnings and errors, a line per failed rollout. The Prefect UI "
                                "has every line either way.")] = False,
) -> None:
    """Run an evaluation as a Prefect flow and print its summary.

    Without ``PREFECT_API_URL`` the eval gets a temporary Prefect server that ends with it (also on
    ``kill -9``). A run that stops early (Ctrl-C, an API outage past ``api_outage_limit_s``, an
    unwritable dataset, rollouts without a row) prints how many rollouts are durable and the
    ``--resume`` command, and exits 1 (130 on Ctrl-C, 143 on SIGTERM, which ends it the same way). A run where more than
    ``max_error_fraction`` of the rollouts errored prints its summary and top errors, and exits 1.
    A resume whose config differs from the run's stored config in a key that defines the run exits 2.
    ``--resume RUN_ID --retry-errors`` finishes a run whose provider failed on some rollouts: they run
    again as new attempts, and the summary says how many were retried and how many recovered.
    With ``--fail-on-regression``, a run that regressed against its baseline exits 3. A run that its
    ``token_budget`` or ``cost_budget_usd`` stopped prints its spend, the budget and the ``--resume``
    command (with a larger budget), and exits 4.
    """
    from prefect_rollouts.evals.prepare import load_eval, new_run_id, prepare_eval

    set_ = [*(set_ or []), *([f"dispatch.work_pool={json.dumps(work_pool)}"] if work_pool else []),
            *([f"dispatch.shard_size={shard_size}"] if shard_size is not None else [])]
    retry_types = None if retry_errors in (None, RETRY_ALL) else [
        kind.strip() for kind in retry_errors.split(",") if kind.strip()]
    try:   # everything the eval flow will check, before Prefect starts: a bad config exits 2 here
        if retry_types == []:
            raise ConfigError(f"--retry-errors={retry_errors}: names no error type. Give types separated by "
                              "commas (--retry-errors ProviderError,RuntimeUnavailableError), or --retry-errors "
                              "alone for every errored rollout")
        eval_config = load_eval(config, set_, resume=resume)
        run_id = resume or run_id or new_run_id(eval_config)
        total = prepare_eval(eval_config, run_id=run_id, resume=resume is not None, force=force_config,
                             dry_run=True, retry_errors=retry_errors is not None, retry_error_types=retry_types).total
    except (ConfigError, TraceStoreError) as exc:
        _error("config error: ", exc)
        raise typer.Exit(2) from None
    set_console_log_level(verbose)   # before Prefect is imported
    from prefect_rollouts.evals.engine import preparation_listener, progress_listener
    from prefect_rollouts.flows.eval import run_eval

    resume_base = " ".join(shlex.quote(part) for part in [
        "prefect-rollouts", "eval", *([str(config)] if config else []), *(f"--set={item}" for item in set_ or []),
        "--resume", run_id])
    resume_hint = resume_base + (f" --retry-errors={shlex.quote(retry_errors)}" if retry_errors else "")
    temporary = temporary_server()
    if temporary is not None and eval_config.dispatch.work_pool:
        _error("config error: ", ConfigError(
            f"[dispatch] work_pool = {eval_config.dispatch.work_pool!r} needs the Prefect server its workers poll: "
            "set PREFECT_API_URL (e.g. to the URL .venv/bin/prefect-rollouts server start prints)"))
        raise typer.Exit(2)
    with progress_bar(console) as update, brief_failures(not verbose):
        progress_listener.set(update)
        preparation_listener.set(lambda line: console.print(line, markup=False, highlight=False))
        stopped: BaseException | None = None
        try:
            with on_server(temporary, console):
                summary, failure = run_until_stopped(run_eval(eval_config, resume=resume, run_id=run_id,
                                                              force_config=force_config,
                                                              retry_errors=retry_errors is not None,
                                                              retry_error_types=retry_types))
        except ConfigError as exc:
            _error("config error: ", exc)
            raise typer.Exit(2) from None
        except (Exception, KeyboardInterrupt) as exc:  # the run stopped: say why, what is durable, how to go on
            stopped = exc
    if stopped is not None:
        _finish_stopped(stopped, eval_config, run_id, total, resume_hint)
    print_summary(console, summary)
    root = (eval_config.traces.store and f"TraceStore block {eval_config.traces.store!r}") or eval_config.traces.path
    console.print(f"traces: {root} (run_id={summary.run_id})")
    if temporary:
        console.print("Prefect UI: none (the temporary server has stopped; set PREFECT_API_URL to keep runs)")
    else:
        console.print(f"eval flow run: {_ui_url().rstrip('/')}/runs/flow-run/{summary.flow_run_id}")
    if summary.budget_stop:
        _finish_budget_stop(summary, eval_config, resume_hint, summary.budget_not_done or 0)
    if failure is not None:
        _error("eval failed: ", failure)
        if summary.errored:   # --retry-errors runs them again (not the agent's own failures: not errors)
            console.print(f"run the {summary.errored} errored rollout{'' if summary.errored == 1 else 's'} again "
                          f"(as new attempts) with: {resume_base} --retry-errors", markup=False, highlight=False,
                          soft_wrap=True)
        raise typer.Exit(1)
    if fail_on_regression and summary.regressed:
        _error("regressed: ", f"{', '.join(summary.regressed)} against baseline {summary.baseline}")
        raise typer.Exit(3)


BUDGET_EXIT = 4
"""Exit code of an eval its token or cost budget stopped (1 failure, 2 config, 3 regression, 130/143 signals)."""


def _finish_budget_stop(summary: Any, eval_config: Any, resume_hint: str, not_done: int) -> NoReturn:
    """Say that the budget stopped the run (spend, budget, rollouts not done) and how to finish it (the
    resume command with each budget raised to an estimate: ``evals.budget.resume_estimate``; earlier
    ``--set`` items of the raised keys left out), exit 4."""
    from prefect_rollouts.evals.budget import Budget, MemoryLedger, Spend, resume_estimate

    spend = summary.spend
    budget = Budget(eval_config.token_budget, eval_config.cost_budget_usd, MemoryLedger())
    budget.spent = Spend(spend.tokens, spend.cost_usd or 0.0) if spend is not None else Spend()
    caps = [env.agent.max_rollout_tokens for env in eval_config.environments()]
    try:
        per_rollout, basis = (resume_estimate(eval_config.traces.path, summary.run_id, caps)
                              if not eval_config.traces.store else (None, "twice the budget"))
    except TraceStoreError:
        per_rollout, basis = None, "twice the budget"
    _error("budget reached: ", summary.budget_stop)
    raised = budget.raised_overrides(not_done, per_rollout)
    keys = tuple(f"--set={item.split('=')[0]}=" for item in raised)
    hint = " ".join(shlex.quote(part) for part in shlex.split(resume_hint) if not part.startswith(keys))
    console.print(f"resume with a larger budget: {hint} {' '.join(f'--set={item}' for item in raised)} (an "
                  f"estimate: the spend so far and {basis})", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(BUDGET_EXIT)


def _exit_without_waiting_for_prefect(code: int) -> NoReturn:
    """Exit with ``code`` after at most a few seconds of sending Prefect's queued logs and events.

    A normal exit waits until Prefect's events worker has tried every queued event, about 7 s
    each while the API is unreachable: a run stopped by an outage would hang for minutes. If the
    queues do not empty in time, the process exits at once (``os._exit``) without them.
    """
    if drain_prefect_services(timeout_s=5.0):
        raise typer.Exit(code)
    console.file.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _reason(exc: BaseException) -> str:
    """The message of an ``ApiOutageError`` in ``exc``'s chain (Prefect may raise its own error
    while failing the flow run on a dead API), else ``exc`` as ``Type: message``."""
    from prefect_rollouts.flows.services.outage import ApiOutageError

    if isinstance(exc, StopSignal):
        return exc.reason
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop(0)
        if isinstance(current, ApiOutageError):
            return str(current)
        seen.add(id(current))
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None and id(e) not in seen)
    return f"{type(exc).__name__}: {exc}"


def _finish_stopped(stopped: BaseException, eval_config: Any, run_id: str, total: int,
                    resume_hint: str) -> NoReturn:
    """Report an eval that ended by an exception or Ctrl-C, and exit. With every row durable only
    Prefect's bookkeeping failed: print the summary from the dataset, say which states are missing
    and the command that writes them (``traces reconcile``), exit 1. Otherwise say why, how many
    rows are durable and how to resume, exit 1 (130 on Ctrl-C, 143 on
    SIGTERM)."""
    durable = _durable_count(eval_config, run_id)
    if durable == total and not isinstance(stopped, KeyboardInterrupt):
        from prefect_rollouts.traces import run_failure, summarize_run

        summary = summarize_run(eval_config.traces.path, run_id, rollouts_per_task=eval_config.rollouts_per_task,
                                pass_threshold=eval_config.pass_threshold)
        print_summary(console, summary)
        _error("warning: ", f"every rollout is durable, but Prefect could not be told ({_reason(stopped)}); "
                            "the eval flow run's final state and summary artifact are missing on the server")
        failure = run_failure(summary, total, eval_config.max_error_fraction)
        if failure is not None:
            _error("eval failed: ", failure)
        console.print("states not written to Prefect: this eval flow run's and any rollout flow run the outage left "
                      "unfinished or uncreated; once the API and its database answer, write them with: "
                      f"prefect-rollouts traces reconcile {shlex.quote(str(eval_config.traces.path))} {run_id}",
                      markup=False, highlight=False, soft_wrap=True)
        _exit_without_waiting_for_prefect(1)
    _error("eval stopped: ", _reason(stopped))
    console.print(f"{'an unknown number' if durable is None else durable} of {total} rollouts durable; "
                  f"resume with: {resume_hint}", markup=False, highlight=False, soft_wrap=True)
    if isinstance(stopped, KeyboardInterrupt):
        _exit_without_waiting_for_prefect(stopped.exit_code if isinstance(stopped, StopSignal) else 130)
    _exit_without_waiting_for_prefect(1)


def _durable_count(eval_config: Any, run_id: str) -> int | None:
    """How many rollouts of ``run_id`` have a durable row; None when that cannot be told here
    (a ``TraceStore`` block's dataset, or an unreadable one: its error was printed already)."""
    from prefect_rollouts.traces import durable_keys

    if eval_config.traces.store:
        return None
    try:
        return len(durable_keys(eval_config.traces.path, run_id))
    except Exception:
        return None


@app.command("serve")
def serve_command(
    config: Annotated[Path, typer.Argument(help="Eval config TOML: the nightly eval and its form defaults.")] = Path(
        "examples/nightly.toml"),
    cron: Annotated[str, typer.Option(help="Schedule of the nightly eval (cron).")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option(help="Time zone of the schedule.")] = "UTC",
) -> None:
    """Serve the nightly eval and the sandbox janitor deployments from this process (no work pool needed)."""
    from prefect_rollouts.flows.deployments import serve_deployments

    try:
        serve_deployments(config, cron=cron, timezone=timezone)
    except ConfigError as exc:   # raised while the deployments are built, before serving starts
        _error("config error: ", exc)
        raise typer.Exit(2) from None


sandbox_app = typer.Typer(help="The Docker sandbox image.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("build")
def sandbox_build(
    tag: Annotated[str, typer.Option(help="Image name to build.")] = "prefect-rollouts-sandbox:latest",
    offline: Annotated[bool | None, typer.Option(
        "--offline/--pull",
        help="Force debootstrap, or force a pull (default: pull, then debootstrap if no registry answers).")] = None,
    with_: Annotated[list[str] | None, typer.Option(
        "--with", help="Bake a program harness's agent into the image (repeatable): mini-swe-agent (its pinned "
                       "release, from PyPI into /usr/local/mini-swe-agent), codex or claude-code (their pinned "
                       "npm releases, into /usr/local/<id>/<version>; needs npm here). Rollouts then install "
                       "nothing.")] = None,
) -> None:
    """Build the default sandbox image of the docker runtime (bash, coreutils, python3, /workspace)."""
    import logging

    from prefect_rollouts.errors import RuntimeUnavailableError, TaskError
    from prefect_rollouts.harnesses import mini_swe_agent, npm_agents
    from prefect_rollouts.runtimes.docker.sandbox import bake_directory, build_sandbox_image, image_python

    known = ["mini-swe-agent", *npm_agents.AGENTS]
    unknown = sorted(set(with_ or []) - set(known))
    if unknown:
        _error("", ConfigError(f"--with {unknown[0]}: not a program this image can bake in. Known: {', '.join(known)}"))
        raise typer.Exit(2)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        image_id = build_sandbox_image(tag, offline=offline)
        python, machine = image_python(tag) if with_ else ("", "")
        for name in dict.fromkeys(with_ or []):
            if name == "mini-swe-agent":   # the install logs what it fetches (installs.install_once)
                site, target, version = (mini_swe_agent.install(python, machine), mini_swe_agent.IMAGE_SITE,
                                         mini_swe_agent.VERSION)
            else:
                agent = npm_agents.AGENTS[name]
                site, target, version = (npm_agents.install(agent, machine=machine),
                                         npm_agents.image_dir(agent, agent.version), agent.version)
            image_id = bake_directory(tag, site, target, labels={f"org.prefect-rollouts.{name}": version})
    except (RuntimeUnavailableError, TaskError) as exc:
        _error("", exc)
        raise typer.Exit(1) from None
    console.print(f"built {tag} ({image_id[:19]})" + (f" with {', '.join(with_)}" if with_ else ""))


server_app = typer.Typer(help="A local Prefect server on PostgreSQL (faster than SQLite for many flow runs).",
                          no_args_is_help=True)
app.add_typer(server_app, name="server")


@server_app.command("start")
def server_start(
    home: Annotated[Path, typer.Option(help="Directory for the database, the Prefect home and logs.",
                                       envvar="PREFECT_ROLLOUTS_SERVER_HOME")] = Path(".prefect-rollouts"),
    port: Annotated[int | None, typer.Option(
        help="Prefect API port. Default: the one this home's server used, else 4200 when free, else a free port.",
        envvar="PREFECT_ROLLOUTS_SERVER_PORT")] = None,
    pg_port: Annotated[int | None, typer.Option(
        help="PostgreSQL port on 127.0.0.1 (never another address). Default: the one this home used, else 5433 "
             "when free, else a free port.", envvar="PREFECT_ROLLOUTS_PG_PORT")] = None,
    host: Annotated[str, typer.Option(help="Address the Prefect API listens on; beyond loopback (e.g. 0.0.0.0, "
                                           "for workers on other machines) PREFECT_SERVER_API_AUTH_STRING "
                                           "must be set.")] = "127.0.0.1",
) -> None:
    """Start PostgreSQL and a Prefect server on it in the background; print PREFECT_API_URL."""
    from prefect_rollouts.errors import RuntimeUnavailableError
    from prefect_rollouts.servers import postgres as pgserver

    try:
        api_url = pgserver.start(home, port=port, pg_port=pg_port, host=host)
    except ConfigError as exc:
        _error("config error: ", exc)
        raise typer.Exit(2) from None
    except RuntimeUnavailableError as exc:
        _error("", exc)
        raise typer.Exit(1) from None
    console.print(f"Prefect server on PostgreSQL is up. UI: {api_url.removesuffix('/api')}")
    for line in pgserver.client_hints(api_url, host, urlsplit(api_url).port or 0):   # the port it chose
        console.print(line, markup=False, highlight=False)


@server_app.command("stop")
def server_stop(
    home: Annotated[Path, typer.Option(help="The directory given to `server start`.",
                                       envvar="PREFECT_ROLLOUTS_SERVER_HOME")] = Path(".prefect-rollouts"),
) -> None:
    """Stop the Prefect server and PostgreSQL started by `server start`."""
    from prefect_rollouts.servers import postgres as pgserver

    pgserver.stop(home)
    console.print("stopped")


def _error(prefix: str, exc: BaseException | str) -> None:
    print_error(console, prefix, exc)


def _ui_url() -> str:
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

    api = PREFECT_API_URL.value() or ""
    return PREFECT_UI_URL.value() or (api.removesuffix("/api") if api else "no Prefect server configured (ephemeral)")


if __name__ == "__main__":  # pragma: no cover
    app()
