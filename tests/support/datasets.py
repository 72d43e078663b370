"""What a trace dataset holds on disk, read the way a test checks it: from the Parquet footers, without
the package's readers (the thing under test)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def durable_rows(root: Path) -> int:
    """How many rollout rows are durable under the dataset root ``root`` (the ``traces.path`` of an
    eval): the row counts in the footers of its ``rollouts/**/part-*.parquet`` files, 0 before the
    first is written. A file is renamed into place whole, so a running eval's count only grows."""
    rollouts = root / "rollouts"
    return sum(pq.read_metadata(p).num_rows for p in rollouts.rglob("part-*.parquet")) if rollouts.exists() else 0
