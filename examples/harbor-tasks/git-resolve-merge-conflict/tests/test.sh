#!/bin/bash
# main must be a merge of the original main and feature/retry, with both branches' behaviour.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
MAIN=0c7016f317923ee05f2746f70409bf0121f5b667      # main as shipped
FEATURE=1bbdc50e55ecf6a05b48d06bc7fd3bc61e13b249   # feature/retry as shipped
G="timeout 10 git -C /app"
fail() { echo "FAIL: $*"; exit 0; }

[ "$($G rev-parse --abbrev-ref HEAD 2>/dev/null)" = main ] || fail "HEAD is not on branch main"
[ ! -e /app/.git/MERGE_HEAD ] || fail "the merge is still in progress"
parents=$($G rev-list --parents -n 1 HEAD | cut -d' ' -f2-)
[ "$parents" = "$MAIN $FEATURE" ] || fail "HEAD is not a merge commit of main and feature/retry (parents: $parents)"
[ -z "$($G status --porcelain --untracked-files=no)" ] || fail "uncommitted changes to tracked files"
$G diff --quiet "$FEATURE" HEAD -- tests/test_retry.py || fail "tests/test_retry.py was changed"
$G diff --quiet "$MAIN" HEAD -- tests/test_config.py tests/test_comments.py tests/test_env.py || fail "main's tests were changed"
if $G grep -nE '^(<<<<<<<|=======|>>>>>>>)' HEAD -- . >/dev/null; then fail "conflict markers committed"; fi

work=$(mktemp -d)
$G archive HEAD | tar -x -C "$work" || fail "cannot export HEAD"
export PYTHONDONTWRITEBYTECODE=1
cd "$work" || fail "no export"
env -u APP_TIMEOUT -u APP_RETRIES timeout 60 python3 -m pytest -q -p no:cacheprovider tests || fail "the repository's tests fail"
cd /tests || fail "no /tests"
MERGED_TREE="$work" timeout 60 python3 -m pytest -q -p no:cacheprovider --rootdir=/tests /tests/test_merged.py || fail "combined behaviour is wrong"
echo 1 > /logs/verifier/reward.txt
echo "reward: 1"
