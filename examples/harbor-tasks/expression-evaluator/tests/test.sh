#!/bin/bash
# Hidden cases for /app/calc; reward.json = {"reward": 0|1, "cases_passed": n, "cases_total": m}.
mkdir -p /logs/verifier
echo '{"reward": 0.0, "cases_passed": 0, "cases_total": 0}' > /logs/verifier/reward.json
cd /tests && PYTHONDONTWRITEBYTECODE=1 timeout 60 python3 -I /tests/grade.py
exit 0
