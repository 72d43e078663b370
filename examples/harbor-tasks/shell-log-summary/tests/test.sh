#!/bin/bash
# Checks /app/summary.txt, then re-runs /app/summarize.sh on a hidden log.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
ok=1
if ! cmp -s /app/summary.txt /tests/expected_access.txt; then
    echo "summary.txt differs from the expected summary"; diff /app/summary.txt /tests/expected_access.txt | head -20
    ok=0
fi
work=$(mktemp -d)
cp /tests/hidden.log "$work/requests log.txt"     # a path with a space, not the original name
if ! timeout 10 bash /app/summarize.sh "$work/requests log.txt" > "$work/out.txt" 2> "$work/err.txt" < /dev/null; then
    echo "summarize.sh failed or timed out on the hidden log"; head -5 "$work/err.txt"; ok=0
elif ! cmp -s "$work/out.txt" /tests/expected_hidden.txt; then
    echo "summarize.sh output on the hidden log is wrong"; diff "$work/out.txt" /tests/expected_hidden.txt | head -20
    ok=0
fi
rm -rf "$work"
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; fi
echo "reward: $(cat /logs/verifier/reward.txt)"
