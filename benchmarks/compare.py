"""How long comparing two runs takes: ``compare_runs`` on two runs of N rollouts each, bootstrap included.

    .venv/bin/python benchmarks/compare.py [--rollouts 100000] [--per-task 4] [--continuous] [--repeat 3]

The runs are synthetic rows written by the real ``TraceWriter`` (not timed): half the rollouts in a
``bfcl`` environment whose tasks carry a category and a function schema of about 1 KB in ``info``
(as BFCL's do), half in ``humaneval``; ``--per-task`` rollouts per task, two model calls each; run
B passes a little less often than run A. ``--continuous`` makes rewards uniform in [0, 1] (every
task's differences distinct: the bootstrap resamples task indices instead of task kinds).
Prints the wall and CPU time of each comparison (reading both tables, aligning, 10,000 bootstrap
resamples per environment and category, tests) and the load average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import prefect_rollouts as vf
from prefect_rollouts.trace import ModelCall
from prefect_rollouts.traces import TraceWriter
from prefect_rollouts.traces.compare import compare_runs

DESCRIPTION = "Calculate the area of a triangle given its base and height; both in the same unit. " * 6


def bfcl_info(task: int) -> dict:
    """About 1 KB, shaped like a BFCL item's info."""
    return {"task": {"category": ("simple_python", "multiple")[task // 2 % 2],
                     "functions": [{"name": f"area_{task}", "description": DESCRIPTION,
                                    "parameters": {"type": "dict", "required": ["base", "height"], "properties": {
                                        "base": {"type": "integer", "description": "The base of the triangle."},
                                        "height": {"type": "integer", "description": "The height of the triangle."}}}}],
                     "ground_truth": [{f"area_{task}": {"base": [10], "height": [5]}}]}}


def write_run(root: str, run_id: str, rollouts: int, per_task: int, pass_rate: float, continuous: bool) -> None:
    rng = random.Random(run_id)
    writer = TraceWriter(root, run_id, batch_size=10_000)
    for i in range(rollouts):
        task, index = divmod(i, per_task)
        environment = ("bfcl", "humaneval")[task % 2]
        reward = rng.random() if continuous else float(rng.random() < pass_rate)
        info = bfcl_info(task) if environment == "bfcl" else {"task": {"entry_point": f"f{task}"}}
        trace = vf.Trace(task_id=f"task-{task}", model="m", reward=reward, stop_condition="agent_completed",
                         info=info, started_at=1_800_000_000.0)
        for call in range(2):
            trace.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0 + call,
                                               latency_ms=rng.uniform(20, 400), prompt_tokens=300,
                                               completion_tokens=40, finish_reason="stop"))
            trace.usage.add(300, 40)
        if writer.add(trace, rollout_index=index, environment=environment, config_hash="h", elapsed_s=1.0):
            writer.flush()
    writer.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=100_000, help="rollouts per run")
    parser.add_argument("--per-task", type=int, default=4, help="rollouts per task")
    parser.add_argument("--continuous", action="store_true", help="uniform rewards instead of pass/fail")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        write_run(root, "run-a", args.rollouts, args.per_task, 0.60, args.continuous)
        write_run(root, "run-b", args.rollouts, args.per_task, 0.58, args.continuous)
        print(f"wrote 2 runs x {args.rollouts} rollouts ({args.per_task} per task, "
              f"{'uniform' if args.continuous else 'binary'} rewards) in {time.perf_counter() - started:.1f} s")
        walls, cpus = [], []
        for _ in range(args.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            result = compare_runs(root, "run-a", "run-b")
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    for group in [*result.environments, *result.categories]:
        label = group.environment + (f" / {group.category}" if group.category else "")
        print(f"  {label:<24} pairs {group.n_paired:>6}  B - A {group.difference:+.4f} "
              f"[{group.ci_low:+.4f}, {group.ci_high:+.4f}]  p {group.p_value if group.p_value is None else f'{group.p_value:.4f}'}")
    print(f"compare_runs, {result.resamples} resamples per line: wall {statistics.median(walls):.2f} s median "
          f"(min {min(walls):.2f}), CPU {statistics.median(cpus):.2f} s median over {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
