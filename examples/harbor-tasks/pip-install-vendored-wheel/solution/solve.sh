#!/bin/bash
set -e
# Debian marks its Python as externally managed (PEP 668): a system-wide pip install must say so.
python3 -m pip install --no-index --break-system-packages /usr/local/share/wheels/tinyunits-1.2.0-py3-none-any.whl
cd / && python3 /app/report.py
tinyunits 5 km m
