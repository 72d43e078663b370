"""The trace dataset: Arrow schemas, an atomic batched Parquet writer, pandas readers, the summary.

Contract: the root is a directory or an object-store URI (``store.dataset_root``); ``TraceWriter``
makes rows durable in files of its own (atomic on every store); ``read_rollouts`` /
``read_model_calls`` / ``read_network`` return DataFrames, opening only the partitions a filter names and
skipping an unreadable file with a warning (``files``); ``durable_keys`` says what ``--resume`` skips;
``run_config`` stores the run's config; ``compact_run`` rewrites a run into few files;
``summarize`` computes the eval summary from rows; ``compare_runs`` (``traces.compare.compare`` on
frames) pairs two runs' rollouts: difference, bootstrap interval, McNemar. Depends on pyarrow,
pandas and numpy; must not import Prefect. (``compare``, the function, is not re-exported here:
it would hide the module ``traces.compare`` of the same name.)
"""

from prefect_rollouts.traces.compact import CompactResult, compact_run
from prefect_rollouts.traces.compare import GroupComparison, RunComparison, compare_runs
from prefect_rollouts.traces.eval_summary import ErrorCount, EvalSummary
from prefect_rollouts.traces.read import (
    durable_keys,
    read_model_calls,
    read_network,
    read_rollouts,
    read_traces,
    scan_rollouts,
)
from prefect_rollouts.traces.run_config import RUN_CONFIG_VERSION, read_run_config
from prefect_rollouts.traces.schema import SCHEMA_VERSION
from prefect_rollouts.traces.store import DatasetRoot, dataset_root
from prefect_rollouts.traces.summary import (
    error_text,
    pass_at_k,
    run_failure,
    summarize,
    summarize_run,
)
from prefect_rollouts.traces.writer import TraceWriter

__all__ = ["RUN_CONFIG_VERSION", "SCHEMA_VERSION", "CompactResult", "DatasetRoot", "ErrorCount", "EvalSummary",
           "GroupComparison", "RunComparison", "TraceWriter", "compact_run", "compare_runs", "dataset_root",
           "durable_keys", "error_text", "pass_at_k", "read_model_calls", "read_network", "read_rollouts",
           "read_run_config", "read_traces", "run_failure", "scan_rollouts", "summarize", "summarize_run"]
