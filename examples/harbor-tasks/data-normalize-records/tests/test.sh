#!/bin/bash
# Partial credit: writes {"reward": fraction, "rows_correct": n, "rows_total": m, ...} to reward.json.
mkdir -p /logs/verifier
echo '{"reward": 0.0, "rows_correct": 0, "rows_total": 0}' > /logs/verifier/reward.json
cd /tests && timeout 30 python3 -I /tests/grade.py
exit 0
