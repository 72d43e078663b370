#!/bin/bash
# The agent's main must be the original history plus a revert of the bad commit.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
ORIG=89371c33a742388dab3f1df178d4ebf8a0ab09f2   # main as shipped
BAD=4c8306d208c6126efa9aa65bb6855e23485452be    # "Simplify rounding helper"
G="timeout 10 git -C /app"
fail() { echo "FAIL: $*"; exit 0; }

[ "$($G rev-parse --abbrev-ref HEAD 2>/dev/null)" = main ] || fail "HEAD is not on branch main"
$G cat-file -e "$ORIG^{commit}" 2>/dev/null || fail "original commit missing"
$G merge-base --is-ancestor "$ORIG" HEAD || fail "history was rewritten (original main is not an ancestor of HEAD)"
[ "$($G rev-parse HEAD)" != "$ORIG" ] || fail "no new commit on main"
[ -z "$($G status --porcelain --untracked-files=no)" ] || fail "uncommitted changes to tracked files"

work=$(mktemp -d)
timeout 20 git clone -q --no-hardlinks /app "$work/ref" || fail "cannot clone /app"
cd "$work/ref" || fail "clone missing"
timeout 10 git -c advice.detachedHead=false checkout -q "$ORIG" || fail "cannot check out original main"
timeout 10 git -c user.name=t -c user.email=t@example.com revert --no-edit "$BAD" >/dev/null || fail "reference revert failed"
want=$(git rev-parse 'HEAD^{tree}')
got=$($G rev-parse 'HEAD^{tree}')
[ "$want" = "$got" ] || { $G diff --stat "$want" HEAD; fail "HEAD's content is not the original main with the bad commit reverted"; }

# And the project's tests pass on the committed tree.
mkdir "$work/head" && $G archive HEAD | tar -x -C "$work/head" || fail "cannot export HEAD"
cd "$work/head" && PYTHONDONTWRITEBYTECODE=1 timeout 60 python3 -m pytest -q -p no:cacheprovider tests || fail "tests fail at HEAD"
echo 1 > /logs/verifier/reward.txt
echo "reward: 1"
