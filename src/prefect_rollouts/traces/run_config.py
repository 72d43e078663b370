"""The run's config, stored in the dataset when the run starts: ``runs/run_id=<run>/config.json``.

One small JSON file per run, written once and atomically (``DatasetRoot.write_file``), beside the
``rollouts/`` and ``model_calls/`` tables (Parquet globs over those tables do not see it). It holds
the whole eval config with secrets replaced by ``"***"`` and lists where it did so, so
``--resume`` can run exactly the config that started the run, and the summary and ``traces
compare`` can name each environment's harness (``with_harness``). Its layout is versioned like the
Parquet schema: ``RUN_CONFIG_VERSION`` is bumped when a field is added or changes meaning, and a
reader refuses a file newer than it knows. This module handles the file only; what may differ on
resume is decided in ``prefect_rollouts.evals.identity``. Must not import Prefect.
"""

from __future__ import annotations

import datetime as dt
import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.traces.schema import SCHEMA_VERSION
from prefect_rollouts.traces.store import DatasetRoot, dataset_root

#: Version 1: ``config`` (secrets as ``"***"``), ``redacted`` keys, ``run_id``, ``written_at``, ``schema_version``.
RUN_CONFIG_VERSION = 1


class StoredRunConfig(BaseModel):
    """The content of a run's ``config.json``."""

    version: int = RUN_CONFIG_VERSION
    """Layout version of this file (``RUN_CONFIG_VERSION`` when written)."""
    run_id: str
    written_at: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    """When the run started (UTC, ISO 8601)."""
    schema_version: int = SCHEMA_VERSION
    """The Parquet schema version the run's rows were written with at its start."""
    config: dict[str, Any]
    """The eval config as JSON, every secret value replaced by ``"***"``."""
    redacted: list[str] = []
    """Dotted keys of ``config`` whose values were secrets (``env.agent.client.headers.X-Key``)."""


def run_config_path(run_id: str) -> str:
    """Where the config of ``run_id`` lives, relative to the dataset root."""
    return f"runs/run_id={run_id}/config.json"


def write_run_config(root: str | Path | DatasetRoot, stored: StoredRunConfig) -> None:
    """Write ``stored`` as its run's config file, atomically (replacing an older one).

    Raises:
        TraceStoreError: the file cannot be written.
    """
    text = json.dumps(stored.model_dump(mode="json"), indent=2, sort_keys=True)
    dataset_root(root).write_file(run_config_path(stored.run_id), text.encode())


def read_run_config(root: str | Path | DatasetRoot, run_id: str) -> StoredRunConfig | None:
    """The stored config of ``run_id``; None when the run has none (never started, or started
    before configs were stored).

    Raises:
        TraceStoreError: the file cannot be read, is not valid, or was written by a newer
            prefect-rollouts (version above ``RUN_CONFIG_VERSION``).
    """
    store = dataset_root(root)
    data = store.read_file(run_config_path(run_id))
    if data is None:
        return None
    where = f"trace dataset {store.uri}: {run_config_path(run_id)}"
    try:
        stored = StoredRunConfig.model_validate_json(data)
    except ValueError as exc:
        raise TraceStoreError(f"{where}: not a valid run config ({exc}). Restore it or remove it") from None
    if stored.version > RUN_CONFIG_VERSION:
        raise TraceStoreError(f"{where}: version {stored.version} is newer than this prefect-rollouts reads "
                              f"(up to {RUN_CONFIG_VERSION}). Upgrade prefect-rollouts")
    return stored


def environment_harnesses(config: dict[str, Any]) -> dict[str, str]:
    """The harness id of each environment of a stored eval config, as ``EvalConfig.environments``
    names and merges them (``[env.agent] harness``, default ``tools``; a suite entry's own
    ``agent.harness`` over it), read from the plain dict: a stored config need not validate where it
    is read (a harness's ``files`` may name paths of another machine).

    Returns:
        ``{environment name: harness id}``; empty when the config names no taskset.
    """
    env = config.get("env") or {}
    base = _harness_id((env.get("agent") or {}).get("harness"), "tools")
    if env.get("tasksets"):
        return {str(entry.get("name") or entry.get("id")): _harness_id((entry.get("agent") or {}).get("harness"), base)
                for entry in env["tasksets"]}
    taskset = env.get("taskset") or {}
    return {str(taskset["id"]): base} if "id" in taskset else {}


def with_harness(rows: pd.DataFrame, root: str | Path | DatasetRoot) -> pd.DataFrame:
    """``rows`` (of ``read_rollouts``: ``run_id`` and ``environment``) with a ``harness`` column taken
    from each run's stored config (the Parquet rows do not carry it; runs of every schema version
    have a stored config). None for a run without one, or whose config cannot be read (a warning
    names it: the rows are still shown)."""
    harnesses: dict[tuple[str, str], str] = {}
    for run_id in rows["run_id"].dropna().unique() if len(rows) else []:
        try:
            stored = read_run_config(root, str(run_id))
        except TraceStoreError as exc:
            warnings.warn(f"run {run_id}: its harness is unknown: {exc}", stacklevel=2)
            continue
        if stored is not None:
            harnesses |= {(str(run_id), env): harness for env, harness in environment_harnesses(stored.config).items()}
    keys = zip(rows["run_id"].astype(str), rows["environment"].astype(str), strict=True) if len(rows) else []
    return rows.assign(harness=[harnesses.get(key) for key in keys])


def _harness_id(value: Any, default: str) -> str:
    """A ``harness`` value's id: the string itself, a table's ``id``, else ``default``."""
    if isinstance(value, str):
        return value
    return value["id"] if isinstance(value, dict) and isinstance(value.get("id"), str) else default
