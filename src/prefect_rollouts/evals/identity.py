"""What a run is: the eval-config keys that define a run, stored when it starts and checked on ``--resume``.

A run's rows must all come from one config. When a run starts, its config (secrets removed) is
stored in the dataset (``traces.run_config``). ``--resume RUN_ID`` runs that stored config; a given
config or ``--set`` may change only the keys in ``HOW_KEYS`` (how the run runs: concurrency,
where the dataset and the model endpoint are, API timeouts and retries). Any other difference (the
run's size, rollouts per task, the agent, the taskset and its options, the granularity, the pass
threshold, and every key added later unless it is listed here) is a ``ConfigError`` naming the
keys, unless the caller forces it. Must not import Prefect.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect_rollouts.config.eval import EvalConfig, load_eval_config
from prefect_rollouts.config.eval_tables import TracesConfig
from prefect_rollouts.config.redact import leaves, redact_eval_config, render_key
from prefect_rollouts.config.sources import Source, merge, set_source
from prefect_rollouts.config.taskset import RUN_ID_MAX_BYTES, path_safe
from prefect_rollouts.errors import ConfigError, TraceStoreError
from prefect_rollouts.traces.read import durable_keys
from prefect_rollouts.traces.run_config import StoredRunConfig, read_run_config, run_config_path, write_run_config
from prefect_rollouts.traces.store import DatasetRoot

#: Keys (dotted prefixes; ``*`` matches any one key or list index) that change how a run runs, not
#: what it is: they may differ from the stored config on ``--resume``, and the given value is used.
HOW_KEYS: tuple[str, ...] = (
    "run_name",                            # names new runs only; a resumed run keeps its id
    "max_concurrent",                      # rollouts in flight
    "batch_size",                          # rollouts per shard task run (rows are identical)
    "flush_each_rollout",                  # when rows become durable, not what they hold
    "api_outage_limit_s",                  # how long to ride out a Prefect API outage
    "traces",                              # where the dataset is: path, URI or TraceStore block
    "env.agent.client",                    # where and how the model is reached: base_url, key, headers,
                                           # endpoint block, request timeout, HTTP retries, pool size
    "env.agent.retries",                   # stage retries after infrastructure errors
    "env.tasksets.*.agent.retries",        # the same, for a suite's environment
    "env.agent.scoring.judges.*.client",   # a judge's endpoint (its model and prompt stay fixed)
    "dispatch",                            # in-process or on a work pool, shard sizes, crash detection
    "limits",                              # shared concurrency limits (requests, containers)
    "max_error_fraction",                  # when the run counts as failed, not what its rows hold
    "baseline",                            # what the run is compared with at its end
    "token_budget",                        # how much the run may spend: a resume may raise it
    "cost_budget_usd",                     # (prices live in the clients' tables, HOW keys already)
    "max_rollout_attempts",                # how often an errored rollout runs again (each attempt its row)
    "retry_error_types",                   # which errors run again (--retry-errors TYPE,... sets it)
    "rollout_backoff_s",                   # the wait before a rollout's next attempt
)

_ABSENT = object()


def check_portable(config: EvalConfig, carrier: str) -> None:
    """Refuse a config that cannot travel as flow-run parameters, which anyone with access to the
    Prefect server can read: one that holds a secret (``redact_eval_config``: header values, a
    password in a ``base_url``, literal environment values). For a work pool's shard flow runs and
    the launch form.

    Args:
        carrier: What would carry the config, for the message (e.g. ``"a launch form"``).

    Raises:
        ConfigError: naming every key that holds a secret, and the fix.
    """
    if secret := redact_eval_config(config)[1]:
        raise ConfigError(f"{', '.join(secret)}: {carrier} cannot carry these values (literal environment "
                          "values and header values count as secrets, and flow-run parameters are visible). "
                          'Write environment values as "${NAME}" set where the eval runs (or "${NAME:-value}" '
                          "for a value that is no secret), and put headers in a ModelEndpoint block")


def config_differences(stored: dict[str, Any], given: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The keys outside ``HOW_KEYS`` whose values differ between two redacted config dicts.

    Returns:
        ``(dotted key, stored value, given value)`` sorted by key; a key missing on one side has
        the value ``None`` there.
    """
    left, right = dict(leaves(stored)), dict(leaves(given))
    patterns = [tuple(pattern.split(".")) for pattern in HOW_KEYS]
    keys = sorted(set(left) | set(right), key=render_key)
    return [(render_key(key), left.get(key), right.get(key)) for key in keys
            if left.get(key, _ABSENT) != right.get(key, _ABSENT) and not any(_matches(p, key) for p in patterns)]


def prepare_run(root: DatasetRoot, run_id: str, given: EvalConfig | None, *, resume: bool, force: bool = False,
                overrides: Sequence[str] = (), write: bool = True) -> EvalConfig:
    """Decide the config run ``run_id`` runs with, and store it when the run has none yet.

    Args:
        root: The dataset root.
        run_id: The run's id.
        given: The config given now; None to run the stored one (``overrides`` applied), which
            needs ``resume``.
        resume: Continue an existing run. False: a new run, whose id must not be taken.
        force: Run ``given`` even where it differs from the stored config in a key that defines the
            run (the stored config stays as it was).
        overrides: ``--set`` items, applied over the stored config when ``given`` is None.
        write: Store the config when the run has none (False: only check, e.g. in the CLI
            before anything starts; the eval flow stores it).

    Returns:
        The config to run: ``given`` (its keys outside ``HOW_KEYS`` equal the stored ones unless
        ``force``), or the stored config with ``overrides``.

    Raises:
        ConfigError: ``given`` differs from the stored config outside ``HOW_KEYS`` (the message names
            every differing key with both values) and not ``force``; a new run's id is taken; a
            resume without ``given`` finds no stored config, or one whose secrets were removed.
        TraceStoreError: the stored config cannot be read or written.
    """
    stored = read_run_config(root, run_id)
    where = f"{run_config_path(run_id)} in {root.uri}"
    if given is None:
        if stored is None:
            raise ConfigError(f"--resume {run_id}: the run has no stored config ({where} is missing). "
                              f"Give the eval config it started with: prefect-rollouts eval CONFIG --resume {run_id}")
        given = stored_eval_config(stored, overrides, where)
    if stored is None:
        if write:
            data, redacted = redact_eval_config(given)
            write_run_config(root, StoredRunConfig(run_id=run_id, config=data, redacted=redacted))
        return given
    if not resume:
        raise ConfigError(f"--run-id {run_id}: a run with this id already exists ({where}). "
                          f"Continue it with --resume {run_id}, or choose another id")
    differences = config_differences(_normalised(stored.config), redact_eval_config(given)[0])
    if differences and not force:
        listed = "; ".join(f"{key} (stored {_show(old)}, given {_show(new)})" for key, old, new in differences)
        raise ConfigError(f"--resume {run_id}: the config differs from the one the run started with ({where}) "
                          f"in keys that change what the run is: {listed}. Resume with the stored config "
                          f"(prefect-rollouts eval --resume {run_id}, or the config file and --set it started "
                          "with), or add --force-config to run the given config under this run id anyway")
    return given


def check_run_config(source: str | Path | None, overrides: Sequence[str], *, resume: str | None,
                     run_id: str | None, force: bool = False) -> EvalConfig:
    """The config ``prefect-rollouts eval`` runs, checked against the run's stored config before
    anything starts (nothing is written: the eval flow stores a new run's config).

    Args:
        source: The eval config TOML; None with ``resume`` runs the stored config.
        overrides: ``--set`` items (over ``source``, or over the stored config).
        resume: ``--resume`` run id. run_id: ``--run-id`` of a new run. force: ``--force-config``.

    Raises:
        ConfigError: neither ``source`` nor ``resume``; the config is invalid; or as ``prepare_run``.
            With a ``TraceStore`` block the stored config is checked by the eval flow instead,
            once the block is resolved, and ``--resume`` needs ``source``.
        TraceStoreError: the stored config cannot be read.
    """
    if source is None and resume is None:
        raise ConfigError("eval: no config given. Give an eval config TOML, or --resume RUN_ID to continue "
                          "a run with the config it started with")
    given = load_eval_config(source, list(overrides)) if source is not None else None
    traces = given.traces if given is not None else traces_of_overrides(overrides)
    existing = resume or run_id
    if traces.store:
        if given is None:
            raise ConfigError(f'--resume {resume} without a config file reads the stored config from [traces] path; '
                              f"with [traces] store = {traces.store!r} give the config file: "
                              f"prefect-rollouts eval CONFIG --resume {resume}")
        return given
    if existing is None:
        assert given is not None
        return given
    return prepare_run(traces.dataset_root(), existing, given, resume=resume is not None, force=force,
                       overrides=overrides, write=False)


def stored_eval_config(stored: StoredRunConfig, overrides: Sequence[str] = (), where: str = "") -> EvalConfig:
    """The ``EvalConfig`` of a stored run config, with ``--set`` ``overrides`` applied.

    Raises:
        ConfigError: the stored config had secrets (they are not stored: give the config file), or
            it or an override is not a valid config for this version.
    """
    if stored.redacted:
        raise ConfigError(f"--resume {stored.run_id}: the stored config ({where}) had secret values, which are not "
                          f"stored: {', '.join(stored.redacted)}. Give the eval config it started with: "
                          f"prefect-rollouts eval CONFIG --resume {stored.run_id}")
    sources = [Source(f"the stored config of run {stored.run_id}", stored.config), set_source(overrides)]
    try:
        return EvalConfig.model_validate(merge(sources))
    except ValueError as exc:
        raise ConfigError(f"--resume {stored.run_id}: the stored config ({where}) is not valid for this "
                          f"prefect-rollouts ({exc}). Give the eval config: prefect-rollouts eval CONFIG "
                          f"--resume {stored.run_id}") from None


def traces_of_overrides(overrides: Sequence[str]) -> TracesConfig:
    """The ``[traces]`` table that ``--set traces.path=...`` / ``traces.store=...`` give (default
    ``./traces``): where ``--resume`` without a config file looks for the run.

    Raises:
        ConfigError: an override is malformed or ``traces`` holds an unknown key.
    """
    data = merge([set_source(overrides)]).get("traces", {})
    try:
        return TracesConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"--set traces...: {exc}") from None


def _normalised(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored config as this version dumps it (keys added since then at their defaults), so only
    real differences show; as stored when it no longer validates."""
    try:
        return redact_eval_config(EvalConfig.model_validate(stored))[0]
    except ValueError:
        return stored


def _matches(pattern: tuple[str, ...], key: tuple[Any, ...]) -> bool:
    return len(key) >= len(pattern) and all(p == "*" or p == str(k) for p, k in zip(pattern, key, strict=False))


def _show(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)


def check_run_id(run_id: str) -> None:
    """Refuse a run id that cannot name the dataset's ``run_id=<id>`` directory.

    Raises:
        ConfigError: the id is empty, holds ``/``, ``\\``, ``=`` or a control character, or is longer
            than ``RUN_ID_MAX_BYTES`` in UTF-8.
    """
    if not path_safe(run_id, RUN_ID_MAX_BYTES):
        raise ConfigError(f"run id {run_id!r}: it names the dataset's run_id=<id> directory: no /, \\ or =, no "
                          f"control character, not empty, at most {RUN_ID_MAX_BYTES} bytes (UTF-8). Choose another "
                          "--run-id or run_name")


def has_rows(root: DatasetRoot, run_id: str) -> bool:
    """Whether the dataset at ``root`` holds rollouts of ``run_id`` (False when it cannot be read)."""
    try:
        return bool(durable_keys(root, run_id))
    except TraceStoreError:
        return False


def check_pinned_baseline(baseline: str, root: DatasetRoot, run_id: str | None = None) -> None:
    """Refuse a ``baseline = "<run id>"`` that is this run or has no rollouts in the dataset at ``root``.

    Raises:
        ConfigError: naming ``baseline`` and the fix.
    """
    if baseline == run_id:
        raise ConfigError(f"baseline = {baseline!r}: the run cannot be its own baseline. Name an earlier "
                          'run, or "last" for the last completed run of the series')
    if not has_rows(root, baseline):
        raise ConfigError(f"baseline = {baseline!r}: no rollouts of this run in the trace dataset at {root}. "
                          'Name a run it holds (prefect-rollouts traces summary PATH lists them), or "last"')
