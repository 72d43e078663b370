#!/usr/bin/env python3
"""The verifier, in Python (Harbor runs test.sh as an executable: its shebang picks the interpreter).

Runs /app/colstats.py on the shipped CSV and on two hidden ones; the reward is the fraction of files whose
output is exactly right (reward.json, with the count of files passed as a metric)."""

import json
import pathlib
import subprocess

CASES = {"/app/data/sales.csv": "/tests/expected_sales.txt",
         "/tests/hidden_sensors.csv": "/tests/expected_sensors.txt",
         "/tests/hidden_mixed.csv": "/tests/expected_mixed.txt"}
REWARD = pathlib.Path("/logs/verifier/reward.json")
REWARD.parent.mkdir(parents=True, exist_ok=True)
REWARD.write_text(json.dumps({"reward": 0.0, "files_passed": 0}))

passed = 0
for csv_file, expected_file in CASES.items():
    try:
        done = subprocess.run(["python3", "-I", "/app/colstats.py", csv_file], capture_output=True, text=True,
                              timeout=10, cwd="/tmp")
        output = done.stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        output = f"(failed: {exc})"
    expected = pathlib.Path(expected_file).read_text()
    ok = output == expected
    passed += ok
    print(f"{csv_file}: {'pass' if ok else 'FAIL'}")
    if not ok:
        print(f"  expected:\n{expected}  got:\n{output}")
REWARD.write_text(json.dumps({"reward": passed / len(CASES), "files_passed": passed}))
print(REWARD.read_text())
