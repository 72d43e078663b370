#!/bin/bash
# Hidden driver + wordfreq runs under AddressSanitizer/LeakSanitizer/UBSan.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if timeout 150 python3 -I /tests/check.py; then
    echo 1 > /logs/verifier/reward.txt
fi
echo "reward: $(cat /logs/verifier/reward.txt)"
