"""Smoke checks against the site served on http://127.0.0.1:8765/."""
import sys
import time
import urllib.request

BASE = "http://127.0.0.1:8765/"


def get(path):
    for _ in range(50):
        try:
            with urllib.request.urlopen(BASE + path, timeout=2) as r:
                return r.read().decode()
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"cannot fetch {path}")


index = get("index.html")
if "<title>" not in index:
    print("CHECK FAILED: index.html has no <title>")
    sys.exit(1)
print("served version:", get("version.txt").strip())
print("ALL CHECKS PASSED")
