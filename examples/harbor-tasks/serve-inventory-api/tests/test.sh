#!/bin/bash
# Queries the server the agent left running on 127.0.0.1:8000; partial credit per check in reward.json.
mkdir -p /logs/verifier
echo '{"reward": 0.0, "checks_passed": 0}' > /logs/verifier/reward.json
timeout 30 python3 -I - <<'PY'
import json
import urllib.error
import urllib.request

BASE = "http://127.0.0.1:8000"
ITEMS = json.load(open("/app/inventory.json"))


def get(path):
    try:
        with urllib.request.urlopen(BASE + path, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def check_health():
    return get("/health") == (200, b"ok")


def check_items():
    return all(json.loads(get(f"/items/{item['sku']}")[1]) == item for item in ITEMS) and \
        all(get(f"/items/{item['sku']}")[0] == 200 for item in ITEMS)


def check_missing():
    return get("/items/Z-999")[0] == 404 and get("/nothing-here")[0] == 404


def check_total():
    status, body = get("/total")
    value = round(sum(item["price"] * item["qty"] for item in ITEMS), 2)
    return status == 200 and json.loads(body) == {"count": len(ITEMS), "value": value}


checks = [check_health, check_items, check_missing, check_total]
passed = 0
for check in checks:
    try:
        ok = check()
    except Exception as exc:   # refused, reset, not JSON: a failed check
        ok = False
        print(f"{check.__name__}: {type(exc).__name__}: {exc}")
    print(f"{check.__name__}: {'pass' if ok else 'FAIL'}")
    passed += ok
with open("/logs/verifier/reward.json", "w") as out:
    json.dump({"reward": passed / len(checks), "checks_passed": passed}, out)
PY
cat /logs/verifier/reward.json
