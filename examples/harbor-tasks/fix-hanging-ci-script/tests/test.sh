#!/bin/bash
# Runs /app/ci.sh through a pipe (bounded by timeout) in a passing and a failing setup, and looks
# for processes it left behind (tagged with a per-run environment marker).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
work=$(mktemp -d)
token="v$RANDOM$RANDOM"
MARK="ci-test-$RANDOM$RANDOM"

leftovers() {   # pids of processes still carrying the marker
    local p
    for p in /proc/[0-9]*; do
        tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "CI_MARK=$MARK" && echo "${p#/proc/}"
    done
}
cleanup() { local p; for p in $(leftovers); do kill -9 "$p" 2>/dev/null; done; }
fail() { echo "FAIL: $*"; cleanup; exit 0; }

run_ci() {   # $1 = output file; prints the pipeline's exit status (124 = timed out)
    timeout 10 env CI_MARK="$MARK" bash -c 'set -o pipefail; cd /app && ./ci.sh 2>&1 | cat' > "$1" 2>&1 < /dev/null
    echo $?
}

[ -f /app/site/index.html ] && [ -x /app/ci.sh ] || fail "/app/ci.sh or the site is missing"
cp /app/site/index.html "$work/index.html"
printf '%s\n' "$token" > /app/VERSION

# 1. checks pass
rc=$(run_ci "$work/pass.txt")
echo "--- passing run (exit $rc):"; tail -n 15 "$work/pass.txt"
[ "$rc" != 124 ] || fail "ci.sh did not finish within 10 s when piped"
[ "$rc" = 0 ] || fail "ci.sh exited $rc although the checks pass"
grep -qx "served version: $token" "$work/pass.txt" || fail "the version was not served over HTTP"
grep -q "ALL CHECKS PASSED" "$work/pass.txt" || fail "checks did not pass"
sleep 0.5
[ -z "$(leftovers)" ] || fail "processes left running after a passing run: $(leftovers | tr '\n' ' ')"

# 2. checks fail (the page loses its <title>)
sed 's/<title>.*<\/title>//' "$work/index.html" > /app/site/index.html
rc=$(run_ci "$work/fail.txt")
cp "$work/index.html" /app/site/index.html
echo "--- failing run (exit $rc):"; tail -n 15 "$work/fail.txt"
[ "$rc" != 124 ] || fail "ci.sh did not finish within 10 s when the checks fail"
[ "$rc" != 0 ] || fail "ci.sh exited 0 although a check failed"
grep -q "ALL CHECKS PASSED" "$work/fail.txt" && fail "checks claimed to pass on a broken page"
sleep 0.5
[ -z "$(leftovers)" ] || fail "processes left running after a failing run: $(leftovers | tr '\n' ' ')"

cleanup
echo 1 > /logs/verifier/reward.txt
echo "reward: 1"
