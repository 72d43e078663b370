#!/bin/bash
set -e
cat > /app/colstats.py <<'PY'
"""Min, max and mean of each numeric column of a CSV file."""
import csv
import sys


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


with open(sys.argv[1], newline="") as handle:
    rows = list(csv.reader(handle))
header, body = rows[0], rows[1:]
for index, name in enumerate(header):
    cells = [row[index].strip() for row in body if index < len(row) and row[index].strip()]
    values = [number(cell) for cell in cells]
    if not values or any(value is None for value in values):
        continue
    print(f"{name} min={min(values):.2f} max={max(values):.2f} mean={sum(values) / len(values):.2f}")
PY
python3 /app/colstats.py /app/data/sales.csv
