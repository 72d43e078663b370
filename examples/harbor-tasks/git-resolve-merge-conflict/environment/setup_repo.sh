#!/bin/bash
# Builds two diverging branches in /app with fixed identities and dates (reproducible commit ids).
set -euo pipefail
cd /app
export GIT_AUTHOR_NAME="Sam Maintainer" GIT_AUTHOR_EMAIL="sam@example.com"
export GIT_COMMITTER_NAME="Sam Maintainer" GIT_COMMITTER_EMAIL="sam@example.com"
n=0
commit() {
    n=$((n + 1))
    export GIT_AUTHOR_DATE="2024-06-$(printf %02d $n)T09:00:00+00:00" GIT_COMMITTER_DATE="2024-06-$(printf %02d $n)T09:00:00+00:00"
    git add -A
    git -c commit.gpgsign=false commit -q -m "$1"
}
git init -q -b main .
printf '__pycache__/\n.pytest_cache/\n' > .gitignore
cat > appconfig.py <<'EOF'
"""Parse `key = value` configuration text."""

DEFAULTS = {"host": "localhost", "port": 8080, "timeout": 30}


def parse_value(key, raw):
    """Convert the raw string value of `key` to its type."""
    if key in ("port", "timeout"):
        return int(raw)
    return raw


def load_config(text):
    """Return the configuration dict: DEFAULTS updated by the lines of `text`."""
    cfg = dict(DEFAULTS)
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        key, _, raw = line.partition("=")
        key = key.strip().lower()
        cfg[key] = parse_value(key, raw.strip())
    return cfg
EOF
mkdir tests
cat > tests/test_config.py <<'EOF'
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from appconfig import load_config


def test_defaults():
    cfg = load_config("")
    assert cfg["host"] == "localhost" and cfg["port"] == 8080 and cfg["timeout"] == 30


def test_values():
    cfg = load_config("host = example.org\nPort=9000\n\n")
    assert cfg["host"] == "example.org" and cfg["port"] == 9000
EOF
commit "Config loader"

git checkout -q -b feature/retry
python3 - <<'EOF'
import pathlib
p = pathlib.Path("appconfig.py"); s = p.read_text()
s = s.replace('DEFAULTS = {"host": "localhost", "port": 8080, "timeout": 30}',
              'DEFAULTS = {"host": "localhost", "port": 8080, "timeout": 30, "retries": 3, "backoff": 0.5}')
s = s.replace('''    if key in ("port", "timeout"):
        return int(raw)
    return raw''', '''    if key not in DEFAULTS:
        raise ValueError(f"unknown key: {key}")
    if key in ("port", "timeout"):
        return int(raw)
    if key == "retries":
        value = int(raw)
        if not 0 <= value <= 10:
            raise ValueError("retries must be between 0 and 10")
        return value
    if key == "backoff":
        value = float(raw)
        if value < 0:
            raise ValueError("backoff must not be negative")
        return value
    return raw''')
s = s.replace('''    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        key, _, raw = line.partition("=")''', '''    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, _, raw = line.partition("=")''')
p.write_text(s)
EOF
cat > tests/test_retry.py <<'EOF'
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import pytest
from appconfig import load_config


def test_retry_defaults():
    cfg = load_config("")
    assert cfg["retries"] == 3 and cfg["backoff"] == 0.5


def test_retry_values():
    cfg = load_config("retries = 5\nbackoff = 1.25")
    assert cfg["retries"] == 5 and cfg["backoff"] == 1.25


def test_invalid():
    for text in ("retries = 11", "backoff = -1", "colour = red", "just words"):
        with pytest.raises(ValueError):
            load_config(text)
EOF
commit "Add retries and backoff settings with validation"

git checkout -q main
python3 - <<'EOF'
import pathlib
p = pathlib.Path("appconfig.py"); s = p.read_text()
s = s.replace('''    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue''', '''    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()   # comments run from '#' to the end of the line
        if not line:
            continue''')
p.write_text(s)
EOF
cat > tests/test_comments.py <<'EOF'
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from appconfig import load_config


def test_comments():
    cfg = load_config("# server\nhost = a.example  # primary\n   # indented comment\nport=1")
    assert cfg["host"] == "a.example" and cfg["port"] == 1
EOF
commit "Allow comments in config files"

python3 - <<'EOF'
import pathlib
p = pathlib.Path("appconfig.py"); s = p.read_text()
s = s.replace('"""Parse `key = value` configuration text."""', '"""Parse `key = value` configuration text."""\nimport os')
s = s.replace('''def load_config(text):
    """Return the configuration dict: DEFAULTS updated by the lines of `text`."""
    cfg = dict(DEFAULTS)''', '''def load_config(text, env=None):
    """Return the configuration dict: DEFAULTS updated by the lines of `text`,
    then by environment variables APP_<KEY> (for keys the config has)."""
    env = os.environ if env is None else env
    cfg = dict(DEFAULTS)''')
s = s.replace('''        cfg[key] = parse_value(key, raw.strip())
    return cfg''', '''        cfg[key] = parse_value(key, raw.strip())
    for key in list(cfg):
        name = "APP_" + key.upper()
        if name in env:
            cfg[key] = parse_value(key, env[name].strip())
    return cfg''')
p.write_text(s)
EOF
cat > tests/test_env.py <<'EOF'
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from appconfig import load_config


def test_env_override():
    cfg = load_config("port = 1\nhost = h", env={"APP_PORT": "2", "APP_OTHER": "x"})
    assert cfg["port"] == 2 and cfg["host"] == "h" and "other" not in cfg
EOF
commit "Environment variable overrides"
git log --all --format='%H %D %s'
