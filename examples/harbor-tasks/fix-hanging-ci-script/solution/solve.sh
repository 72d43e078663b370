#!/bin/bash
set -e
cd /app
cat > /app/ci.sh <<'SH'
#!/bin/bash
# CI smoke test: build the site, serve it locally, check it over HTTP.
set -e
cd "$(dirname "$0")"

./build.sh
# The server must not hold our stdout/stderr open (a pipe reader would wait for it forever),
# and it must be stopped however this script exits.
python3 -m http.server 8765 --bind 127.0.0.1 --directory public > server.log 2>&1 < /dev/null &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
python3 check.py
echo "ci: done"
SH
chmod +x /app/ci.sh
./ci.sh 2>&1 | cat
