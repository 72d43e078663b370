#!/bin/bash
# Compares /app/report.json and a fresh run of /app/report.sh on a hidden file (as normalized JSON).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
same_json() { [ "$(jq -S -c . "$1" 2>/dev/null)" = "$(jq -S -c . "$2")" ] && [ -n "$(jq -c . "$1" 2>/dev/null)" ]; }
ok=1
if ! same_json /app/report.json /tests/expected_orders.json; then
    echo "report.json is wrong or missing"; ok=0
fi
work=$(mktemp -d)
cp /tests/hidden_orders.json "$work/export.json"
if ! timeout 10 bash /app/report.sh "$work/export.json" > "$work/out.json" 2> "$work/err.txt" < /dev/null; then
    echo "report.sh failed or timed out"; head -5 "$work/err.txt"; ok=0
elif ! same_json "$work/out.json" /tests/expected_hidden.json; then
    echo "report.sh output on the hidden file is wrong:"; head -c 600 "$work/out.json"; echo; ok=0
fi
[ "$ok" = 1 ] && echo 1 > /logs/verifier/reward.txt
echo "reward: $(cat /logs/verifier/reward.txt)"
