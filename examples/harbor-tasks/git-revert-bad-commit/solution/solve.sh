#!/bin/bash
set -e
cd /app
# Bisect between the good tag and the bad main, letting the test suite decide.
git bisect start HEAD v1.0
git bisect run sh -c 'PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider >/dev/null 2>&1'
bad=$(git rev-parse refs/bisect/bad)
git bisect reset
echo "first bad commit: $(git log -1 --format='%h %s' "$bad")"
git -c user.name=Agent -c user.email=agent@example.com revert --no-edit "$bad"
python3 -m pytest -q -p no:cacheprovider
git status --short
