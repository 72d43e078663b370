#!/bin/bash
set -e
cat > /app/server.py <<'PY'
"""The inventory of /app/inventory.json over HTTP on port 8000."""
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

with open("/app/inventory.json") as handle:
    ITEMS = json.load(handle)
BY_SKU = {item["sku"]: item for item in ITEMS}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            return self.answer(200, b"ok", "text/plain")
        if self.path == "/total":
            value = round(sum(item["price"] * item["qty"] for item in ITEMS), 2)
            return self.answer(200, json.dumps({"count": len(ITEMS), "value": value}).encode())
        if self.path.startswith("/items/") and self.path[len("/items/"):] in BY_SKU:
            return self.answer(200, json.dumps(BY_SKU[self.path[len("/items/"):]]).encode())
        return self.answer(404, b'{"error": "not found"}')

    def answer(self, status, body, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
PY
# its own session, no terminal, output to a file: it outlives this script
setsid nohup python3 /app/server.py > /tmp/server.log 2>&1 < /dev/null &
for _ in $(seq 50); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=1)" 2>/dev/null; then
        echo "serving on 8000"; exit 0
    fi
    sleep 0.2
done
cat /tmp/server.log; exit 1
