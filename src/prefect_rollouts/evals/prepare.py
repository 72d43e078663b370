"""An eval before its first rollout: the config it runs, every check, and its plan, in one function.

``prepare_eval`` is what both callers run: ``prefect-rollouts eval`` as a dry run (nothing is
written; a bad config exits 2 before Prefect starts) and ``eval_flow`` for real (a new run's config
is stored). So a check added here holds for the CLI, the UI's launches and a notebook alike.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prefect_rollouts.config.eval import EvalConfig, load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.identity import (
    check_pinned_baseline,
    check_portable,
    check_run_id,
    prepare_run,
    traces_of_overrides,
)
from prefect_rollouts.evals.plan import Planned, RolloutKey, plan_rollouts, retry_predicate, still_to_run
from prefect_rollouts.retry_rule import check_error_types
from prefect_rollouts.traces.read import LatestAttempt, latest_attempts
from prefect_rollouts.traces.store import DatasetRoot

LAST = "last"
"""``baseline = "last"``: the series' last Completed run that did not regress (``flows/services/baseline.py``)."""


@dataclass(frozen=True, eq=False)
class PreparedEval:
    """An eval ready to run: its config, run id, dataset root, plan and what of it is already durable."""

    config: EvalConfig
    run_id: str
    root: DatasetRoot | None
    """None in a dry run whose ``[traces] store`` block only the Prefect layer can resolve."""
    plan: list[Planned]
    durable: set[RolloutKey]
    """Keys of the plan that are done (a resume: their latest attempt has a durable row and was not
    stopped from outside, ``traces.read.durable_keys``); empty for a new run."""
    latest: dict[RolloutKey, LatestAttempt] = field(default_factory=dict)
    """Each written rollout's latest attempt (a resume); empty for a new run."""
    again: Callable[[LatestAttempt], bool] | None = None
    """Which written latest attempts run again (``plan.retry_predicate``: ``--retry-errors``, in-run
    retries a stopped eval left); None: none."""

    @property
    def todo(self) -> list[Planned]:
        """The rollouts of the plan still to run, each as its next attempt: 1 when it has no row yet,
        else one past its latest (a rollout a budget stopped, an error that runs again: ``again``)."""
        return still_to_run(self.plan, self.latest, self.again)

    @property
    def retried(self) -> int:
        """Rollouts of ``todo`` that have a row already and run again (``--retry-errors``, a budget stop)."""
        return sum(planned.attempt > 1 for planned in self.todo)

    retry_errors: tuple[str, ...] | None = None
    """``--retry-errors``: the error types it runs again (``()``: every type); None: not given."""

    @property
    def total(self) -> int:
        return len(self.plan)

    def retry_line(self) -> str | None:
        """With ``retry_errors``, what it matched: ``--retry-errors ProviderError: 2 errored rollouts run again
        as new attempts; left as they are: 3 TaskError`` (the errored latest attempts it does not take, by
        type: other types, agent failures); None without ``--retry-errors``."""
        if self.retry_errors is None:
            return None
        keys = {planned.key for planned in self.plan}
        errored = {key: written for key, written in self.latest.items() if key in keys and written.error_type}
        again = self.again or (lambda _: False)
        matched = sum(again(written) for written in errored.values())
        left = Counter(written.error_type for written in errored.values() if not again(written))
        given = f" {','.join(self.retry_errors)}" if self.retry_errors else ""
        rest = ", ".join(f"{count} {kind}" for kind, count in left.most_common()) or "none"
        return (f"--retry-errors{given}: {matched} errored rollout{'' if matched == 1 else 's'} run again as new "
                f"attempts; errored ones left as they are: {rest}")

    def describe(self) -> str:
        """One line: ``run R: 12 rollouts (6 tasks x 2), 12 to run, traces in ROOT``; a resume that runs
        rollouts again says how many: ``..., 5 to run (3 of them again, as new attempts), ...``."""
        config = self.config
        environments = config.environments()
        suite = f" in {len(environments)} environments" if len(environments) > 1 else ""
        again = f" ({self.retried} of them again, as new attempts)" if self.retried else ""
        return (f"run {self.run_id}: {self.total} rollouts ({self.total // config.rollouts_per_task} tasks x "
                f"{config.rollouts_per_task}{suite}), {len(self.todo)} to run{again}, traces in {self.root}")


def load_eval(source: str | Path | None, overrides: Sequence[str], *, resume: str | None) -> EvalConfig:
    """The config a run starts or resumes with: ``source`` (an eval config TOML) with the ``--set``
    ``overrides``, or, with ``resume`` and no ``source``, the run's stored config with them.

    Raises:
        ConfigError: neither ``source`` nor ``resume``; the TOML or an override is invalid; the run
            has no stored config, or one whose secrets were removed; ``--resume`` without a file
            while the traces live in a ``TraceStore`` block (the stored config is read from ``[traces] path``).
        TraceStoreError: the stored config cannot be read.
    """
    if source is not None:
        return load_eval_config(source, list(overrides))
    if resume is None:
        raise ConfigError("eval: no config given. Give an eval config TOML, or --resume RUN_ID to continue "
                          "a run with the config it started with")
    traces = traces_of_overrides(overrides)
    if traces.store:
        raise ConfigError(f'--resume {resume} without a config file reads the stored config from [traces] path; '
                          f"with [traces] store = {traces.store!r} give the config file: "
                          f"prefect-rollouts eval CONFIG --resume {resume}")
    return prepare_run(traces.dataset_root(), resume, None, resume=True, overrides=overrides, write=False)


def prepare_eval(config: EvalConfig, *, run_id: str, resume: bool, force: bool = False,
                 root: DatasetRoot | None = None, dry_run: bool = False, retry_errors: bool = False,
                 retry_error_types: list[str] | None = None) -> PreparedEval:
    """Check ``config`` for run ``run_id`` and plan it; store a new run's config unless ``dry_run``.

    In order: the run id, the traces path (writable), every ``${VAR}`` of the agent's env tables
    (for a work pool instead: no secret in the config, which travels to its workers as flow-run
    parameters, ``evals.identity.check_portable``; they resolve ``${VAR}`` themselves), a pinned
    ``baseline`` (before the config is stored, so a bad one keeps the run id free), the run's
    identity against its stored config (``evals.identity.prepare_run``), the plan (every taskset
    loads), and on resume the keys already durable.

    Args:
        config: The eval config (``load_eval``).
        run_id: The run's id (``new_run_id`` for a new, unnamed run).
        resume: Continue ``run_id``; False: a new run, whose id must be free.
        force: Run ``config`` even where it differs from the stored one (``--force-config``).
        root: The dataset root; None: ``config.traces.dataset_root()``, or with a ``[traces] store``
            block in a dry run, unknown (its run checks wait for the flow, which resolves the block).
        dry_run: Check only; nothing is written.
        retry_errors: With ``resume``: run again, as a new attempt, every rollout whose latest attempt
            errored (``--retry-errors``), or only those of ``retry_error_types`` when given.
        retry_error_types: Error types for ``retry_errors``; they are also the run's
            ``retry_error_types`` (which errors retry within it), replacing the config's.

    Returns:
        ``PreparedEval``; its ``config`` is ``config`` (or, resumed with ``force``, still ``config``).

    Raises:
        ConfigError: the first check that fails, naming the key and the fix.
        ScoringEnvError: a ``${VAR}`` without default is unset.
        TraceStoreError: the stored config or the durable keys cannot be read, or the config not written.
    """
    check_run_id(run_id)
    if retry_errors and not resume:
        raise ConfigError("--retry-errors: runs the errored rollouts of an earlier run again; give the run: "
                          "--resume RUN_ID --retry-errors")
    if retry_error_types is not None:
        config = with_retry_error_types(config, retry_error_types)
    config.traces.check_writable()
    if config.dispatch.work_pool:   # its workers resolve ${VAR} in their own environment
        check_portable(config, "a work pool's shard flow runs (their parameters)")
    else:
        config.check_env()
    if root is None and not config.traces.store:
        root = config.traces.dataset_root()
    if root is not None:
        if config.baseline not in (None, LAST):
            check_pinned_baseline(config.baseline, root, run_id)
        config = prepare_run(root, run_id, config, resume=resume, force=force, write=not dry_run)
    plan = plan_rollouts(config)
    latest = latest_attempts(root, run_id) if resume and root is not None and not dry_run else {}
    again = retry_predicate(config, retry_errors, retry_error_types)
    durable = {key for key, attempt in latest.items() if attempt.done and not again(attempt)}
    return PreparedEval(config=config, run_id=run_id, root=root, plan=plan, durable=durable, latest=latest,
                        again=again, retry_errors=tuple(retry_error_types or ()) if retry_errors else None)


def with_retry_error_types(config: EvalConfig, types: list[str]) -> EvalConfig:
    """``config`` with ``retry_error_types = types`` (``--retry-errors TYPE,...``), checked.

    Raises:
        ConfigError: an unknown error type (the message lists the known ones), or none (``[]``: refused as
            in the config; None, not ``[]``, retries every type).
    """
    if not types:
        raise ConfigError("retry_error_types = []: names no error type. Give at least one (e.g. "
                          '["ProviderError"]), or None (--retry-errors alone) to run every errored rollout again')
    try:
        return config.model_copy(update={"retry_error_types": check_error_types(types)})
    except ValueError as exc:
        raise ConfigError(f"--retry-errors {','.join(types)}: {exc}") from None


def new_run_id(config: EvalConfig) -> str:
    """``<run_name, else environment-harness-model (EvalConfig.run_prefix)>-<UTC time>-<4 hex>``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{config.run_prefix}-{stamp}-{uuid.uuid4().hex[:4]}"
