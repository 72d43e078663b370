"""How many rollouts of a run were run again after an error, and how many of them recovered: the
``retried`` and ``recovered`` of an ``EvalSummary`` (``--retry-errors``, ``max_rollout_attempts``).

A rollout counts as **retried** when an attempt before its latest ended in an error (a budget stop is
no error: a rollout resumed after one is not counted), and as **recovered** when it was retried and its
latest attempt has no error. Read from every attempt's row (``read_rollouts(..., attempts="all")``), so
``prefect-rollouts traces summary`` and the eval's own summary say the same.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from prefect_rollouts.traces.read import ROLLOUT_KEY, read_rollouts
from prefect_rollouts.traces.store import DatasetRoot


def retry_counts(root: str | Path | DatasetRoot, run_id: str) -> tuple[int, int]:
    """``(retried, recovered)`` of run ``run_id`` (see the module docstring); ``(0, 0)`` for a run whose
    rollouts have one attempt each. Reads four small columns of the run's files.

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    rows = read_rollouts(root, columns=["is_error"], attempts="all", run_id=run_id)
    return counts_of(rows)


def counts_of(rows: pd.DataFrame) -> tuple[int, int]:
    """``retry_counts`` of ``rows``: every attempt of some rollouts (``ROLLOUT_KEY``, ``attempt``, ``is_error``)."""
    if rows.empty or int(rows["attempt"].max()) <= 1:
        return 0, 0
    rows = rows.assign(is_error=rows["is_error"].fillna(False).astype(bool))
    latest = rows.groupby(ROLLOUT_KEY, sort=False)["attempt"].transform("max")
    last, earlier = rows[rows["attempt"] == latest], rows[rows["attempt"] < latest]
    errored_before = earlier[earlier["is_error"]].drop_duplicates(ROLLOUT_KEY)[ROLLOUT_KEY]
    retried = last.merge(errored_before, on=ROLLOUT_KEY, how="inner")
    return len(retried), int((~retried["is_error"]).sum())
