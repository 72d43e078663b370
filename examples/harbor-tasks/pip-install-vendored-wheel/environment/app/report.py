"""Total distance run, in kilometres, from /app/runs.csv (needs the tinyunits package)."""

import csv

import tinyunits

with open("/app/runs.csv", newline="") as handle:
    runs = list(csv.DictReader(handle))
for run in runs:
    print(f"{run['date']}  {tinyunits.convert(float(run['distance']), run['unit'], 'km'):7.2f} km")
total = sum(tinyunits.convert(float(run["distance"]), run["unit"], "km") for run in runs)
print(f"total       {total:7.2f} km (tinyunits {tinyunits.__version__})")
