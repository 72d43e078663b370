"""The ``--html`` file: the viewer's page with the views it shows embedded, readable offline from disk."""

from __future__ import annotations

import os
import tempfile
from itertools import combinations, pairwise
from pathlib import Path
from typing import Any

from prefect_rollouts.errors import ConfigError, TraceStoreError
from prefect_rollouts.traces.view.data import Dataset
from prefect_rollouts.traces.view.page import render_page

MAX_ROLLOUTS = 500
"""Rollouts of each run whose full view (conversation, calls, ...) a file embeds by default, in table
order: every rollout is in the table, the first ``MAX_ROLLOUTS`` open (``--max-rollouts``)."""
MAX_COMPARED_RUNS = 8
"""A file embeds the comparison of every pair of its runs (A older than B) up to this many runs; past it,
each run with the run before it. A file of one run compares it with this many of the latest other runs."""


def file_data(dataset: Dataset, run_id: str | None = None, *, max_rollouts: int = MAX_ROLLOUTS) -> dict[str, Any]:
    """What a file embeds: ``runs`` (every run's summary), ``rollouts`` (the table of ``run_id``, or of
    every run), ``plots`` (of those runs), ``details`` (the full view of the first ``max_rollouts``
    rollouts of each, by rollout id), ``comparisons`` (keyed ``"<A>\\0<B>"``: pairs with ``run_id`` when
    given, else ``MAX_COMPARED_RUNS``' rule) and ``capped`` (per run, how many rollouts have no full view here).

    Raises:
        ConfigError: ``run_id`` has no rollouts in the dataset; ``max_rollouts`` is negative.
    """
    if max_rollouts < 0:
        raise ConfigError(f"--max-rollouts = {max_rollouts}: must be 0 or more. Give how many rollouts of each "
                          "run to embed in full (0: the table only)")
    order = dataset.run_ids()
    shown = [run_id] if run_id else order
    tables: dict[str, Any] = {}
    details: dict[str, Any] = {}
    capped: dict[str, int] = {}
    drawn: dict[str, dict[str, str]] = {}
    for run in shown:
        tables[run] = dataset.rollouts(run)
        drawn[run] = dataset.plots(run)
        ids = [row[0] for row in tables[run]["rows"]]   # rollout_id is TABLE_COLUMNS[0]
        details |= dataset.rollout_views(run, ids[:max_rollouts]) if max_rollouts else {}
        capped[run] = max(0, len(ids) - max_rollouts)
    if run_id:
        others = set([r for r in order if r != run_id][-MAX_COMPARED_RUNS:])   # the latest others
        pairs = [(a, b) for a, b in combinations(order, 2) if run_id in (a, b) and ({a, b} & others)]
    elif len(order) <= MAX_COMPARED_RUNS:
        pairs = list(combinations(order, 2))
    else:
        pairs = list(pairwise(order))
    comparisons = {}
    for a, b in pairs:
        try:
            comparisons[f"{a}\0{b}"] = dataset.compare(a, b)
        except (ConfigError, ValueError):   # runs with no rollout in common: nothing to pair
            continue
    return {"mode": "file", "run": run_id, "runs": dataset.runs(), "rollouts": tables, "plots": drawn,
            "details": details, "comparisons": comparisons, "capped": capped}


def write_html(dataset: Dataset, out: str | Path, run_id: str | None = None, *,
               max_rollouts: int = MAX_ROLLOUTS) -> int:
    """Write the viewer as one self-contained HTML file at ``out`` (atomically: a temporary file renamed);
    return its size in bytes. ``file_data`` says what it holds.

    Raises:
        ConfigError: as ``file_data``.
        TraceStoreError: ``out`` cannot be written (the message names it).
    """
    page = render_page(file_data(dataset, run_id, max_rollouts=max_rollouts), served=False).encode()
    target = Path(out)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(handle, "wb") as file:
            file.write(page)
        os.replace(temporary, target)
    except OSError as exc:
        raise TraceStoreError(f"--html = {str(out)!r}: cannot write it ({exc}). Choose a writable path") from exc
    return len(page)
