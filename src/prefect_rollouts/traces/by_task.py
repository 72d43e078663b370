"""Per-task lines of a run (``traces summary --by-task``) and of two runs (``traces compare --by-task``).

An agentic suite has tens of tasks, each its own box and tests: which tasks pass, fail or error says
more than the mean. Depends on pandas; must not import Prefect.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from prefect_rollouts.traces.read import read_rollouts
from prefect_rollouts.traces.store import DatasetRoot

COLUMNS = ["environment", "task_id", "reward", "is_error", "error_type"]


def task_lines(rows: pd.DataFrame, pass_threshold: float = 1.0) -> pd.DataFrame:
    """One row per (environment, task) of one run's rollouts: ``rollouts``, ``mean_reward`` (of the
    scored ones; NaN when none was), ``passed`` (rollouts with reward >= ``pass_threshold``),
    ``errored`` and ``error`` (the most frequent error type, "" when none), in task order."""
    if rows.empty:
        return pd.DataFrame(columns=["environment", "task_id", "rollouts", "mean_reward", "passed", "errored",
                                     "error"])
    rows = rows.assign(passed=rows["reward"] >= pass_threshold, errored=rows["is_error"].fillna(False).astype(bool))
    grouped = rows.groupby(["environment", "task_id"], sort=True)
    lines = grouped.agg(rollouts=("task_id", "size"), mean_reward=("reward", "mean"), passed=("passed", "sum"),
                        errored=("errored", "sum")).reset_index()
    errors = grouped["error_type"].agg(lambda types: types.dropna().mode().iloc[0] if types.notna().any() else "")
    return lines.assign(error=errors.to_numpy())


def run_task_lines(root: str | Path | DatasetRoot, run_id: str, pass_threshold: float = 1.0) -> pd.DataFrame:
    """``task_lines`` of run ``run_id`` in the dataset at ``root``.

    Raises:
        TraceStoreError: the dataset cannot be read.
    """
    return task_lines(read_rollouts(root, columns=COLUMNS, run_id=run_id), pass_threshold)


def task_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two runs' ``task_lines`` side by side, per (environment, task) of either: ``reward_a``,
    ``reward_b``, ``difference`` (B - A; NaN where either has no score), ``errored_a``, ``errored_b``."""
    keys = ["environment", "task_id"]
    merged = a[[*keys, "mean_reward", "errored"]].merge(b[[*keys, "mean_reward", "errored"]], on=keys, how="outer",
                                                        suffixes=("_a", "_b")).sort_values(keys)
    merged = merged.rename(columns={"mean_reward_a": "reward_a", "mean_reward_b": "reward_b"})
    merged["difference"] = merged["reward_b"] - merged["reward_a"]
    for column in ("errored_a", "errored_b"):   # a task only one run has: no count in the other (not 0.000)
        merged[column] = merged[column].astype("Int64")
    return merged.reset_index(drop=True)


def format_lines(frame: pd.DataFrame) -> str:
    """``frame`` as aligned text, numbers to 3 decimals and NaN as ``—``."""
    if frame.empty:
        return "no tasks"
    shown = frame.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda value: "—" if pd.isna(value) else f"{value:.3f}")
        else:
            shown[column] = shown[column].map(lambda value: "—" if value is None or pd.isna(value) else value)
    return shown.to_string(index=False)
