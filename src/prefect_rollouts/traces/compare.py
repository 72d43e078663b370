"""Compare two runs rollout by rollout: paired reward differences with intervals, per environment and category.

Method (Miller 2024, "Adding Error Bars to Evals: A Statistical Approach to Language Model
Evaluations", arXiv:2411.00640, its sections on clustered standard errors and paired differences):

- Rollouts are aligned by (environment, task id, rollout index). A pair counts only when both
  rollouts were scored: a rollout found in one run only, an errored one (no reward) and one whose
  scoring was skipped (a skip rule; reward 0 by convention) are counted on their own
  (``only_in_a``, ``errored_b``, ...), never dropped silently and never scored 0 here.
- The difference is ``mean_b - mean_a`` over the paired rollouts (B minus A: below 0, B did
  worse), i.e. the mean of the per-rollout differences. A task's rollouts are not independent
  (one hard task fails every time), so the task is the cluster: the interval is a **percentile
  interval of a paired bootstrap that resamples tasks** (``resamples`` replicates, seeded;
  ``traces.paired_stats.bootstrap_interval``), and ``stderr`` is the clustered standard error
  (equal to the plain one with one rollout per task).
- With binary rewards (every paired reward 0 or 1) and one paired rollout per task, ``p_value``
  is the two-sided **exact McNemar test** on the tasks that flipped. With several rollouts per
  task McNemar's independent pairs do not hold, so the test is a task-level **sign-flip
  randomization test** (``test = "cluster_sign_flip"``). Non-binary rewards get no test
  (``p_value`` None); the interval is the inference then.
- With few tasks (a few dozen or less) a percentile bootstrap interval is too narrow (it can
  exclude 0 where McNemar's p is 0.25 with four tasks): read ``p_value`` too. From about 80 tasks
  it covers 0 in 95% of comparisons of equal runs (``tests/traces/test_compare.py``).
- ``flipped_to_fail`` lists the tasks whose paired rollouts pass (``reward >= pass_threshold``)
  fewer times in B than in A, ``flipped_to_pass`` the reverse; with one rollout per task, the
  tasks that passed in A and failed in B, and the other way.
- Tokens (all rows of a run, errored ones included: the tokens were spent) and model-call
  latency (p50, p95 of ``latency_ms``) are given side by side for each run, under each run's
  harness and model.

Per environment; per task category too where a taskset stores one (``info["task"]["category"]``,
e.g. BFCL's ``simple_python``); and an ``overall`` line when there are several environments.
Depends on pandas and numpy; must not import Prefect.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.traces.files import run_ids
from prefect_rollouts.traces.paired_stats import (
    bootstrap_interval,
    clustered_stderr,
    mcnemar_exact,
    sign_flip_pvalue,
)
from prefect_rollouts.traces.read import category_of, read_model_calls, read_rollouts_with_categories
from prefect_rollouts.traces.run_config import with_harness
from prefect_rollouts.traces.store import DatasetRoot, dataset_root
from prefect_rollouts.traces.summary import distinct_values

#: Columns ``compare`` needs of each run's rows (``category``, or ``info`` to derive it, optional).
REQUIRED_COLUMNS = ["environment", "task_id", "rollout_index", "reward", "is_error", "scoring_skipped"]
#: What ``compare_runs`` reads of the ``rollouts`` table (``info`` is reduced to categories in Arrow).
ROLLOUT_COLUMNS = [*REQUIRED_COLUMNS, "total_tokens", "model"]
#: What ``compare_runs`` reads of the ``model_calls`` table.
CALL_COLUMNS = ["environment", "task_id", "latency_ms"]
#: A rollout's outcome in the aligned rows (-1: the run lacks it).
SCORED, ERRORED, SKIPPED = 0, 1, 2


class GroupComparison(BaseModel):
    """Two runs compared on one environment (``category`` None), one category of it, or all of them."""

    environment: str
    """The environment, or ``"all"`` for the overall line."""
    category: str | None = None
    n_paired: int
    """Rollouts scored in both runs (the pairs the statistics use)."""
    n_tasks: int
    """Tasks with at least one pair: the clusters the bootstrap resamples."""
    mean_a: float | None
    """Mean reward of run A over the paired rollouts; None without pairs."""
    mean_b: float | None
    difference: float | None
    """``mean_b - mean_a``."""
    ci_low: float | None
    """Lower end of the percentile interval of the task bootstrap (None without pairs)."""
    ci_high: float | None
    stderr: float | None
    """Clustered standard error of ``difference``; None below 2 tasks."""
    binary: bool
    """Every paired reward is 0 or 1."""
    test: Literal["mcnemar_exact", "cluster_sign_flip"] | None
    p_value: float | None
    """Two-sided p-value of ``test``; None where no test applies (non-binary rewards, no pairs)."""
    flipped_to_fail: list[str]
    """Task ids (``environment/task_id`` on the overall line) that pass fewer times in B, sorted."""
    flipped_to_pass: list[str]
    rollouts_a: int
    """Rows of run A here, whatever their outcome."""
    rollouts_b: int
    only_in_a: int
    """Rollouts of A whose (environment, task id, rollout index) B lacks."""
    only_in_b: int
    errored_a: int
    """Rollouts of A that errored (no reward), paired in B or not."""
    errored_b: int
    skipped_a: int
    """Rollouts of A whose scoring a skip rule skipped."""
    skipped_b: int
    total_tokens_a: int
    total_tokens_b: int
    tokens_per_rollout_a: float | None
    tokens_per_rollout_b: float | None
    model_calls_a: int | None = None
    """Model calls of A here (None when no calls were given)."""
    model_calls_b: int | None = None
    latency_p50_ms_a: float | None = None
    latency_p50_ms_b: float | None = None
    latency_p95_ms_a: float | None = None
    latency_p95_ms_b: float | None = None


class RunComparison(BaseModel):
    """What ``compare`` returns and ``prefect-rollouts traces compare --json`` prints."""

    run_a: str
    run_b: str
    harness_a: str | None = None
    """The harness of run A's rollouts (comma-joined when several; from its stored config); None if unknown."""
    harness_b: str | None = None
    model_a: str | None = None
    """The model of run A's rollouts (comma-joined when several); None if unknown."""
    model_b: str | None = None
    interval: str = "percentile interval of a paired bootstrap over tasks (tasks as clusters)"
    confidence: float
    resamples: int
    seed: int
    pass_threshold: float
    environments: list[GroupComparison]
    """One per environment found in either run, by name."""
    categories: list[GroupComparison] = []
    """One per (environment, category), for environments whose tasks have a category."""
    overall: GroupComparison | None = None
    """All environments together (tasks of different environments are different clusters); only
    when there are several."""


def compare(rows_a: pd.DataFrame, rows_b: pd.DataFrame, *, calls_a: pd.DataFrame | None = None,
            calls_b: pd.DataFrame | None = None, run_a: str | None = None, run_b: str | None = None,
            pass_threshold: float = 1.0, confidence: float = 0.95, resamples: int = 10_000,
            seed: int = 0) -> RunComparison:
    """Compare run B with run A, pairing their rollouts (the method is in this module's docstring).

    Args:
        rows_a: ``read_rollouts`` rows of run A (the baseline), with at least ``REQUIRED_COLUMNS``;
            ``total_tokens`` adds token figures, ``category`` (or ``info``, the JSON column, to
            derive it from) adds the category lines, ``harness`` and ``model`` name the run's.
        rows_b: The same of run B.
        calls_a: ``read_model_calls`` rows of run A (``environment``, ``task_id``, ``latency_ms``)
            for the latency figures; None leaves them out.
        calls_b: The same of run B.
        run_a: Name of run A in the result; default: the rows' ``run_id``, else ``"A"``.
        run_b: Name of run B; default: the rows' ``run_id``, else ``"B"``.
        pass_threshold: A rollout passes when ``reward >= pass_threshold`` (the flip lists).
        confidence: Coverage of the interval, between 0 and 1 (exclusive).
        resamples: Bootstrap replicates (and sign-flip replicates); at least 100.
        seed: Seed of the bootstrap: the same rows and seed give the same interval.

    Returns:
        A ``RunComparison``: per environment (and category) means, difference, interval, test,
        flipped tasks, counts of what was not paired, tokens and latency of both runs.

    Raises:
        ValueError: a frame lacks a required column, holds more than one run or the same
            rollout twice, or ``confidence`` / ``resamples`` is out of range; the message names it.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence = {confidence}: must lie between 0 and 1, e.g. 0.95")
    if resamples < 100:
        raise ValueError(f"resamples = {resamples}: must be at least 100 (10,000 is the default)")
    names = [_run_name(rows_a, run_a, "A", "rows_a"), _run_name(rows_b, run_b, "B", "rows_b")]
    tasks, merged = _align(_prepared(rows_a, "rows_a"), _prepared(rows_b, "rows_b"))
    calls = [_calls(calls_a, tasks), _calls(calls_b, tasks)]
    settings = {"pass_threshold": pass_threshold, "confidence": confidence, "resamples": resamples, "seed": seed}
    env_of_row = tasks["environment"].to_numpy()[merged["task"].to_numpy()]
    category_of_row = tasks["category"].to_numpy()[merged["task"].to_numpy()]
    environments, categories = [], []
    for env in sorted(tasks["environment"].unique()):
        of = [c[c["environment"] == env] if c is not None else None for c in calls]
        environments.append(_group(merged[env_of_row == env], tasks, of, settings, environment=str(env)))
        for category in sorted(tasks.loc[tasks["environment"] == env, "category"].dropna().unique()):
            of = [c[(c["environment"] == env) & (c["category"] == category)] if c is not None else None for c in calls]
            rows = merged[(env_of_row == env) & (category_of_row == category)]
            categories.append(_group(rows, tasks, of, settings, environment=str(env), category=str(category)))
    overall = None
    if len(environments) > 1:
        overall = _group(merged, tasks, calls, settings, environment="all")
    setup = {f"{column}_{side}": distinct_values(rows, column)
             for column in ("harness", "model") for side, rows in (("a", rows_a), ("b", rows_b))}
    return RunComparison(run_a=names[0], run_b=names[1], environments=environments, categories=categories,
                         overall=overall, **setup, **settings)


def compare_runs(root: str | Path | DatasetRoot, run_a: str, run_b: str, **options: Any) -> RunComparison:
    """``compare`` two runs of the dataset at ``root`` (a path, an object-store URI or a ``DatasetRoot``).

    Reads each table once for both runs, only the columns needed (``ROLLOUT_COLUMNS`` and
    ``info``, whose task categories are taken in Arrow from one row per task, so the large
    JSON never becomes Python objects; ``CALL_COLUMNS``), and each run's harness from its stored
    config (``run_config.with_harness``). ``options`` go to ``compare``.

    Raises:
        ConfigError: a run has no rollouts in the dataset; the message lists the runs it holds.
        TraceStoreError: the dataset cannot be read.
    """
    rows = with_harness(read_rollouts_with_categories(root, columns=ROLLOUT_COLUMNS, run_id=[run_a, run_b]), root)
    missing = [(field, run) for field, run in (("RUN_A", run_a), ("RUN_B", run_b)) if not (rows["run_id"] == run).any()]
    if missing:
        runs = run_ids(dataset_root(root))
        field, run = missing[0]
        raise ConfigError(f"{field} = {run!r}: no rollouts of this run in the trace dataset at {root}. "
                          + (f"Runs in it: {', '.join(runs)}" if runs else "It holds no rollouts"))
    calls = read_model_calls(root, columns=CALL_COLUMNS, run_id=[run_a, run_b])
    return compare(rows[rows["run_id"] == run_a], rows[rows["run_id"] == run_b],
                   calls_a=calls[calls["run_id"] == run_a], calls_b=calls[calls["run_id"] == run_b],
                   run_a=run_a, run_b=run_b, **options)


def _run_name(rows: pd.DataFrame, given: str | None, default: str, field: str) -> str:
    if given is not None:
        return given
    runs = rows["run_id"].dropna().unique() if "run_id" in rows else []
    if len(runs) > 1:
        raise ValueError(f"{field} holds {len(runs)} runs ({', '.join(map(str, runs[:5]))}): pass the rows of one "
                         "run, e.g. read_rollouts(root, run_id=...)")
    return str(runs[0]) if len(runs) else default


def _prepared(rows: pd.DataFrame, field: str) -> pd.DataFrame:
    """Key, reward, outcome (``scored`` / ``errored`` / ``skipped``), category and tokens of each row."""
    missing = [column for column in REQUIRED_COLUMNS if column not in rows]
    if missing:
        raise ValueError(f"{field} lacks columns {missing}: read them, e.g. "
                         "read_rollouts(root, run_id=..., columns=traces.compare.ROLLOUT_COLUMNS + ['info'])")
    _run_name(rows, None, "", field)
    if "category" in rows:
        category = rows["category"]
    elif "info" in rows:
        category = rows["info"].map(category_of)
    else:
        category = pd.Series(None, index=rows.index, dtype=object)
    errored = rows["is_error"].fillna(False).astype(bool) | (rows["reward"].isna() & rows["scoring_skipped"].isna())
    skipped = ~errored & rows["scoring_skipped"].notna()
    frame = pd.DataFrame({
        "environment": rows["environment"].astype(str), "task_id": rows["task_id"].astype(str),
        "rollout_index": rows["rollout_index"].astype("int64"), "reward": rows["reward"].astype(float),
        "outcome": np.where(errored, ERRORED, np.where(skipped, SKIPPED, SCORED)).astype("int8"), "category": category,
        "tokens": rows["total_tokens"].fillna(0).astype("int64") if "total_tokens" in rows else 0})
    return frame


def _align(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tasks of either run, and one row per (task, rollout index) of either run.

    Returns:
        ``tasks``: ``environment``, ``task_id``, ``category`` (A's, else B's; from any rollout of
        the task), indexed by a task code 0..n-1 in (environment, task id) order. ``merged``:
        ``task`` (the code), ``rollout_index``, and ``reward``, ``outcome`` (-1 where that run
        lacks the rollout) and ``tokens`` of each run, suffixed ``_a`` and ``_b``.
    """
    both = pd.concat([a, b], ignore_index=True)
    code = both.groupby(["environment", "task_id"], sort=True).ngroup().to_numpy()
    first = pd.DataFrame({"task": code, "category": both["category"]}).dropna().drop_duplicates("task")
    tasks = both[["environment", "task_id"]].groupby(code).first()
    tasks["category"] = pd.Series(first["category"].to_numpy(), index=first["task"].to_numpy(), dtype=object)
    columns = ["task", "rollout_index", "reward", "outcome", "tokens"]
    a, b = a.assign(task=code[:len(a)])[columns], b.assign(task=code[len(a):])[columns]
    for field, rows in (("rows_a", a), ("rows_b", b)):
        twice = rows.duplicated(["task", "rollout_index"]).to_numpy()
        if twice.any():
            (task, index), = rows.loc[twice, ["task", "rollout_index"]].head(1).itertuples(index=False, name=None)
            env, task_id = tasks.loc[task, ["environment", "task_id"]]
            raise ValueError(f"{field} holds rollout ({env}, {task_id}, {index}) twice: pass one run's rows, read "
                             "with read_rollouts (which keeps one row per rollout)")
    merged = a.merge(b, on=["task", "rollout_index"], how="outer", suffixes=("_a", "_b"), sort=False)
    for side in ("a", "b"):
        merged[f"outcome_{side}"] = merged[f"outcome_{side}"].fillna(-1).astype("int8")
        merged[f"tokens_{side}"] = merged[f"tokens_{side}"].fillna(0).astype("int64")
    return tasks, merged


def _calls(calls: pd.DataFrame | None, tasks: pd.DataFrame) -> pd.DataFrame | None:
    """``environment``, ``latency_ms`` and the task's ``category`` of each of ``calls``."""
    if calls is None:
        return None
    frame = pd.DataFrame({"environment": calls["environment"].astype(str),
                          "latency_ms": calls["latency_ms"].astype(float)})
    with_category = tasks.dropna(subset=["category"])
    if with_category.empty:
        return frame.assign(category=None)
    keys = pd.MultiIndex.from_arrays([calls["environment"].astype(str), calls["task_id"].astype(str)])
    lookup = with_category.set_index(["environment", "task_id"])["category"]
    return frame.assign(category=lookup.reindex(keys).to_numpy())


def _group(part: pd.DataFrame, tasks: pd.DataFrame, calls: list[pd.DataFrame | None], settings: dict[str, Any], *,
           environment: str, category: str | None = None) -> GroupComparison:
    paired = part[(part["outcome_a"] == SCORED) & (part["outcome_b"] == SCORED)]
    reward_a, reward_b = paired["reward_a"].to_numpy(float), paired["reward_b"].to_numpy(float)
    threshold = settings["pass_threshold"]
    per_task = pd.DataFrame({"task": paired["task"].to_numpy(), "d": reward_b - reward_a,
                             "passes": (reward_b >= threshold).astype(int) - (reward_a >= threshold)}).groupby(
        "task", sort=True).agg(sum=("d", "sum"), count=("d", "size"), passes=("passes", "sum"))
    sums, counts = per_task["sum"].to_numpy(float), per_task["count"].to_numpy(float)
    binary = bool(len(paired)) and bool(np.isin(reward_a, (0.0, 1.0)).all() and np.isin(reward_b, (0.0, 1.0)).all())
    stats: dict[str, Any] = dict.fromkeys(["mean_a", "mean_b", "difference", "ci_low", "ci_high", "test", "p_value"])
    if len(paired):
        rng = np.random.default_rng([settings["seed"], zlib.crc32(f"{environment}\0{category}".encode())])
        low, high = bootstrap_interval(sums, counts, confidence=settings["confidence"],
                                       resamples=settings["resamples"], rng=rng)
        stats.update(mean_a=float(reward_a.mean()), mean_b=float(reward_b.mean()),
                     difference=float(sums.sum() / counts.sum()), ci_low=low, ci_high=high)
        if binary and counts.max() == 1:
            to_fail, to_pass = int((sums < 0).sum()), int((sums > 0).sum())
            stats.update(test="mcnemar_exact", p_value=mcnemar_exact(to_fail, to_pass))
        elif binary:
            stats.update(test="cluster_sign_flip",
                         p_value=sign_flip_pvalue(sums, resamples=settings["resamples"], rng=rng))
    named = tasks["task_id"] if environment != "all" else tasks["environment"] + "/" + tasks["task_id"]
    side: dict[str, Any] = {}
    for suffix, other, run_calls in (("a", "b", calls[0]), ("b", "a", calls[1])):
        outcome = part[f"outcome_{suffix}"].to_numpy()
        rollouts, tokens = int((outcome >= 0).sum()), int(part[f"tokens_{suffix}"].sum())
        side.update({f"rollouts_{suffix}": rollouts, f"errored_{suffix}": int((outcome == ERRORED).sum()),
                     f"only_in_{suffix}": int(((outcome >= 0) & (part[f"outcome_{other}"].to_numpy() < 0)).sum()),
                     f"skipped_{suffix}": int((outcome == SKIPPED).sum()), f"total_tokens_{suffix}": tokens,
                     f"tokens_per_rollout_{suffix}": tokens / rollouts if rollouts else None})
        if run_calls is not None:
            latency = run_calls["latency_ms"].dropna().to_numpy(float)
            p50, p95 = np.quantile(latency, [0.5, 0.95]) if len(latency) else (None, None)
            side.update({f"model_calls_{suffix}": len(run_calls), f"latency_p50_ms_{suffix}": _float(p50),
                         f"latency_p95_ms_{suffix}": _float(p95)})
    return GroupComparison(
        environment=environment, category=category, n_paired=len(paired), n_tasks=len(per_task),
        stderr=clustered_stderr(sums, counts), binary=binary,
        flipped_to_fail=sorted(named.iloc[per_task.index[per_task["passes"] < 0]].astype(str)),
        flipped_to_pass=sorted(named.iloc[per_task.index[per_task["passes"] > 0]].astype(str)),
        **stats, **side)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
