#!/bin/bash
# Runs in a fresh container with only /app kept: checks /app/shop.db and /app/migrate.py.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if timeout 40 python3 -I /tests/grade.py; then
    echo 1 > /logs/verifier/reward.txt
fi
echo "reward: $(cat /logs/verifier/reward.txt)"
