"""The trace dataset: Arrow schemas, an atomic batched Parquet writer, pandas readers, the summary.

Contract: ``TraceWriter`` makes rows durable (temp file, fsync, rename); ``read_rollouts`` /
``read_model_calls`` return DataFrames; ``summarize`` computes the eval summary from rows.
Depends on pyarrow and pandas; must not import Prefect.
"""

from prefect_rollouts.traces.read import durable_keys, read_model_calls, read_rollouts, read_traces
from prefect_rollouts.traces.schema import SCHEMA_VERSION
from prefect_rollouts.traces.summary import (
    ErrorCount,
    EvalSummary,
    error_text,
    pass_at_k,
    run_failure,
    summarize,
    summarize_run,
)
from prefect_rollouts.traces.writer import TraceWriter

__all__ = ["SCHEMA_VERSION", "ErrorCount", "EvalSummary", "TraceWriter", "durable_keys", "error_text", "pass_at_k",
           "read_model_calls", "read_rollouts", "read_traces", "run_failure", "summarize", "summarize_run"]
