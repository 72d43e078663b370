#!/bin/bash
# Hidden API tests for the refactored ledger package, plus the agent's own updated tests.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
export PYTHONDONTWRITEBYTECODE=1
cd /tests || exit 0
if timeout 60 python3 -m pytest -q -p no:cacheprovider --rootdir=/tests /tests/test_api.py; then
    echo 1 > /logs/verifier/reward.txt
fi
echo "reward: $(cat /logs/verifier/reward.txt)"
