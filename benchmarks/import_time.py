"""How long ``import prefect_rollouts`` takes in a fresh interpreter, and which heavy packages it loads.

Each run is a new ``python -c`` process timing the import with ``time.perf_counter`` (interpreter
start-up not counted). Issue 22's target: no Prefect, pandas, pyarrow or numpy (checked by
``tests/test_light_import.py``); the time is printed, not asserted.

    .venv/bin/python benchmarks/import_time.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HEAVY = ("prefect", "pandas", "pyarrow", "numpy", "docker", "uvicorn", "starlette")
PROBE = ("import json, sys, time; t = time.perf_counter(); import prefect_rollouts; s = time.perf_counter() - t; "
         f"print(json.dumps([s, [m for m in {HEAVY!r} if m in sys.modules]]))")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    seconds, loaded = [], set()
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
        took, heavy = json.loads(out)
        seconds.append(took)
        loaded.update(heavy)
    print(f"import prefect_rollouts, {args.runs} fresh interpreters: median {statistics.median(seconds):.3f} s, "
          f"min {min(seconds):.3f} s, max {max(seconds):.3f} s")
    print(f"heavy packages loaded: {', '.join(sorted(loaded)) or 'none'}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
