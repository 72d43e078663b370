#!/bin/bash
set -e
cd /app
git checkout -q main
git -c user.name=Agent -c user.email=agent@example.com merge --no-edit feature/retry || true
python3 - <<'PY'
import pathlib, re
p = pathlib.Path("appconfig.py")
s = p.read_text()
s = re.sub(r"<<<<<<< HEAD\n.*?>>>>>>> feature/retry\n",
           "    for number, line in enumerate(text.splitlines(), 1):\n"
           "        line = line.split(\"#\", 1)[0].strip()   # comments run from '#' to the end of the line\n",
           s, flags=re.S)
p.write_text(s)
PY
python3 -m pytest -q -p no:cacheprovider
git add appconfig.py
git -c user.name=Agent -c user.email=agent@example.com commit -q --no-edit
git log --oneline --graph -5
