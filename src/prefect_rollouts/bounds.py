"""Upper bounds of an eval's sizes, and where each comes from. Must not import Prefect.

A config past a bound is a config error that names the key, before anything starts: a typo such
as ``rollouts_per_task = 100000000`` used to build its plan in memory until a ``MemoryError``
(gigabytes in under a minute). The bounds are generous for real evals and keep one eval's memory
within a few hundred MB of plan and durable-row keys (``tracemalloc``; benchmarks/README.md,
"Bounds"). Larger work is several runs.
"""

from __future__ import annotations

MAX_TASKS = 100_000
"""Tasks of one environment (``num_tasks``, or a taskset's whole length): 7 times MMLU's 14,042
questions, 40 times SWE-bench's 2,294; a task is held in memory for the whole eval (~1.2 KB each
for ``arithmetic``, more with files)."""

MAX_ROLLOUTS_PER_TASK = 1_000
"""``rollouts_per_task``: 5 times the 200 samples per task of the Codex paper's pass@k (the
largest in common use); the summary reports pass@k for every k up to it."""

MAX_ROLLOUTS = 1_000_000
"""Rollouts of one eval, all environments together: over an hour at the fastest granularity and
days at ``flow``, with a few hundred MB of plan and durable-row keys (benchmarks/README.md,
"Bounds"). Split larger work into several runs."""

MAX_CONCURRENT = 1_000
"""Rollouts in flight at once in one process (``max_concurrent``): each holds a model connection
(an open file) and, with docker, a container and a thread of the runtime's 512-thread pool
(``runtimes.docker.MAX_THREADS``); a common soft limit of open files is 1,024."""

MAX_BATCH = 10_000
"""Rollouts in one Prefect task run (``batch_size``) or shard flow run (``[dispatch] shard_size``):
a shard's keys are a flow run parameter in Prefect's database, ~60 bytes each (600 KB at the
bound), and a batch's rollouts are quoted arguments of one task run."""
