"""The run's config, stored in the dataset when the run starts: ``runs/run_id=<run>/config.json``.

One small JSON file per run, written once and atomically (``DatasetRoot.write_file``), beside the
``rollouts/`` and ``model_calls/`` tables (Parquet globs over those tables do not see it). It holds
the whole eval config with secrets replaced by ``"***"`` and lists where it did so, so
``--resume`` can run exactly the config that started the run. Its layout is versioned like the
Parquet schema: ``RUN_CONFIG_VERSION`` is bumped when a field is added or changes meaning, and a
reader refuses a file newer than it knows. This module handles the file only; what may differ on
resume is decided in ``prefect_rollouts.evals.identity``. Must not import Prefect.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

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
