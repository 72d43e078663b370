#!/bin/bash
# Rebuilds wcount from a copy of /app's sources and checks it on fresh inputs.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if timeout 120 python3 -I /tests/check_wcount.py; then
    echo 1 > /logs/verifier/reward.txt
fi
echo "reward: $(cat /logs/verifier/reward.txt)"
