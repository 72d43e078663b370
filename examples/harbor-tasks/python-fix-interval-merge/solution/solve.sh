#!/bin/bash
set -e
cd /app
python3 - <<'PY'
import pathlib
p = pathlib.Path("intervals/core.py")
src = p.read_text()
old = src[src.index("    result = []\n    for start, end in intervals:"):src.index("    return result\n")]
new = '''    result = []
    for start, end in sorted(intervals):
        if result and start <= result[-1][1]:
            last_start, last_end = result[-1]
            result[-1] = (last_start, max(last_end, end))
        else:
            result.append((start, end))
'''
src = src.replace(old, new)
src = src.replace("return sum(end - start for start, end in merge(intervals))",
                  "return sum(end - start + 1 for start, end in merge(intervals))")
p.write_text(src)
PY
python3 -m pytest -q -p no:cacheprovider tests
