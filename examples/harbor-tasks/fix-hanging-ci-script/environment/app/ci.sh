#!/bin/bash
# CI smoke test: build the site, serve it locally, check it over HTTP.
set -e
cd "$(dirname "$0")"

./build.sh
python3 -m http.server 8765 --bind 127.0.0.1 --directory public &
python3 check.py
echo "ci: done"
