"""Upper bounds of an eval's sizes and of a box's resources and deadlines, and where each comes from.
Must not import Prefect.

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

MAX_DEADLINE_S = 7 * 24 * 3600.0
"""Any deadline, timeout or backoff in seconds (a stage's, a command's, a request's, a Harbor task's
``timeout_sec``): a week, longer than any rollout of an eval. A deadline reaches places that cannot
hold every float: a socket timeout (the Docker client's build stream) is nanoseconds in 64 bits, at
most about 9.2e9 s (``build_timeout_sec = 1e308`` ended in ``OverflowError``)."""

MAX_TIMEOUT_MULTIPLIER = 100.0
"""Harbor's ``timeout_multiplier``: a week's deadline times 100 (6e7 s) still fits a socket timeout."""

MAX_RETRIES = 100
"""Retries of one stage or one model request: the stage policy lists a delay per retry
(``rollout.StagePolicy``), and ``backoff_s * 2**n`` overflows a float past n = 1023."""

MAX_MEMORY_MB = 1024 * 1024
"""A box's ``memory_mb``: 1 TiB, more than any host this runs on. Docker takes the limit in bytes as a
64-bit integer (``memory_mb = 2**62`` was an unmarshal error of the engine's)."""

MAX_STORAGE_MB = 1024 * 1024
"""A box's ``storage_mb``: 1 TiB. The quota is a Docker ``size`` option or a tmpfs ``size=`` in MiB,
in bytes a 64-bit integer to the kernel (``storage_mb = 2**62`` ended in a false "filled its disk
quota")."""

MAX_CPUS = 1024
"""A box's ``cpus``: more than any host has (Docker refuses more than the host's own count at start;
as nano-CPUs the value is a 64-bit integer)."""

MIN_CPUS = 0.01
"""A box's least ``cpus``: Docker's own minimum (``--cpus`` below 0.01 is refused by the CLI; the engine
passed ``cpus = 1e-9`` on as 1 nano-CPU, and runc failed ``cpus = 0.001`` with ``failed to write "100"``,
naming no key): a CFS quota of 1 ms per 100 ms period, the kernel's least."""

MAX_PIDS = 4_194_304
"""A box's ``pids_limit``: Linux's ``PID_MAX_LIMIT`` on 64-bit machines, the most PIDs there can be."""
