#!/bin/bash
# tinyunits 1.2.0 is installed by pip (pip knows it), system-wide (under /usr/local), its command is on
# PATH, and report.py prints the expected report from another directory.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
fail() { echo "FAIL: $*"; exit 0; }
cd /
shown=$(python3 -m pip show tinyunits 2>/dev/null) || fail "pip does not know tinyunits (not installed with pip)"
echo "$shown" | grep -qx "Version: 1.2.0" || fail "tinyunits is not version 1.2.0: $shown"
location=$(echo "$shown" | sed -n 's/^Location: //p')
case "$location" in /usr/local/lib/python3*/dist-packages) ;; *) fail "tinyunits is installed in $location, not system-wide" ;; esac
[ "$(command -v tinyunits)" = /usr/local/bin/tinyunits ] || fail "the tinyunits command is not /usr/local/bin/tinyunits"
[ "$(tinyunits 2.5 mi ft)" = 13200 ] || fail "tinyunits 2.5 mi ft printed $(tinyunits 2.5 mi ft 2>&1)"
python3 -I /app/report.py > /tmp/report.out 2>&1 || { cat /tmp/report.out; fail "report.py failed"; }
if ! cmp -s /tmp/report.out /tests/expected_report.txt; then
    diff /tmp/report.out /tests/expected_report.txt; fail "report.py printed a different report"
fi
echo 1 > /logs/verifier/reward.txt
echo "PASS"
