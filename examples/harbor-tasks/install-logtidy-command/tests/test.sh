#!/bin/bash
# The command is an executable copy in /usr/local/bin, found on PATH, and tidies a fresh directory as
# /etc/logtidy.conf says (3 newest *.log kept, other files untouched).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
fail() { echo "FAIL: $*"; exit 0; }
[ -f /usr/local/bin/logtidy ] && [ ! -L /usr/local/bin/logtidy ] || fail "/usr/local/bin/logtidy is not a regular file"
[ -x /usr/local/bin/logtidy ] || fail "/usr/local/bin/logtidy is not executable"
cmp -s /usr/local/bin/logtidy /app/logtidy.sh || fail "/usr/local/bin/logtidy is not a copy of /app/logtidy.sh"
[ -r /etc/logtidy.conf ] || fail "/etc/logtidy.conf is missing"
[ "$(cd / && command -v logtidy)" = /usr/local/bin/logtidy ] || fail "logtidy is not found on PATH"
work=$(mktemp -d)
for day in 1 2 3 4 5; do touch -d "2026-01-0$day 12:00" "$work/app-$day.log"; done
touch -d "2026-01-01 00:00" "$work/notes.txt"
(cd / && logtidy "$work") > "$work.out" 2>&1
status=$?
cat "$work.out"
[ "$status" = 0 ] || fail "logtidy exited with $status"
left=$(cd "$work" && ls | tr '\n' ' ')
[ "$left" = "app-3.log app-4.log app-5.log notes.txt " ] || fail "left in the directory: $left"
echo 1 > /logs/verifier/reward.txt
echo "PASS"
