"""Files per run and what compacting them costs: a run of N rollouts written one file per rollout
(as with ``flush_each_rollout`` or a slow model), then ``compact_run``.

    .venv/bin/python benchmarks/compact.py [--rollouts 1000] [--turns 4] [--s3]

Each rollout has ``--turns`` model calls and a ~1 KB reply per call. ``--s3`` writes to moto's S3
server on loopback instead of a temporary directory. Prints the write time, the files per table
before and after, the compaction time and the time to read the run back before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import prefect_rollouts as vf
from prefect_rollouts.trace import ModelCall
from prefect_rollouts.traces import TraceWriter, compact_run, read_rollouts


def make_trace(index: int, turns: int) -> vf.Trace:
    trace = vf.Trace(task_id=f"t{index}", model="m", reward=float(index % 2), stop_condition="agent_completed")
    for turn in range(turns):
        trace.messages.append({"role": "assistant", "content": f"reply {turn} " + "x" * 1000})
        trace.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0 + turn, latency_ms=50.0,
                                           prompt_tokens=100, completion_tokens=250, finish_reason="stop"))
    return trace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--s3", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.s3:
            from tests.fakes.object_store import CREDENTIALS, moto_s3, new_bucket
            os.environ.update(CREDENTIALS)
            server = moto_s3()
            endpoint = server.__enter__()
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            root = f"s3://{new_bucket(endpoint)}/traces"
        else:
            root = tmp
        writer = TraceWriter(root, "bench", batch_size=1)
        started = time.perf_counter()
        for i in range(args.rollouts):
            writer.add(make_trace(i, args.turns), rollout_index=0, environment="e", config_hash="h", elapsed_s=1.0)
            writer.flush()
        wrote_s = time.perf_counter() - started
        started = time.perf_counter()
        assert len(read_rollouts(root, run_id="bench")) == args.rollouts
        read_before_s = time.perf_counter() - started
        started = time.perf_counter()
        result = compact_run(root, "bench")
        compact_s = time.perf_counter() - started
        started = time.perf_counter()
        assert len(read_rollouts(root, run_id="bench")) == args.rollouts
        read_after_s = time.perf_counter() - started
    print(f"store: {'moto S3 on loopback' if args.s3 else 'local directory'}, {args.rollouts} rollouts x "
          f"{args.turns} calls")
    print(f"write, one file per rollout: {wrote_s:.2f} s ({1000 * wrote_s / args.rollouts:.1f} ms per flush)")
    print(f"files per table: {result.files_before} -> {result.files_after}")
    print(f"compact: {compact_s:.2f} s; read the run: {read_before_s:.2f} s before, {read_after_s:.2f} s after")


if __name__ == "__main__":
    main()
