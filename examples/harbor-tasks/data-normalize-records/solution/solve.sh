#!/bin/bash
set -e
cd /app
python3 - <<'PY'
import csv, datetime as dt, json
from decimal import Decimal

MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"]
aliases = {k.strip().lower(): v for k, v in json.load(open("data/countries.json")).items()}

def date(v):
    if isinstance(v, int):
        return dt.datetime.fromtimestamp(v, dt.timezone.utc).date().isoformat()
    v = v.strip()
    if "," in v:
        month, day, year = v.replace(",", " ").split()
        return dt.date(int(year), MONTHS.index(month.lower()) + 1, int(day)).isoformat()
    parts = v.replace("/", "-").split("-")
    if len(parts[0]) == 4:
        y, m, d = parts
    else:
        d, m, y = parts
    return dt.date(int(y), int(m), int(d)).isoformat()

def cents(v):
    if isinstance(v, (int, float)):
        v = repr(v)
    v = v.strip().lstrip("$").replace(",", "")
    return int((Decimal(v) * 100).to_integral_value())

best = {}
for line in open("data/customers_raw.jsonl"):
    if not line.strip():
        continue
    r = json.loads(line)
    i = int(str(r["id"]).strip())
    if i in best and best[i]["updated_at"] >= r["updated_at"]:
        continue
    best[i] = r

with open("data/customers_clean.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["id", "name", "email", "signup_date", "country", "lifetime_value_cents"])
    for i in sorted(best):
        r = best[i]
        name = " ".join(x[:1].upper() + x[1:].lower() for x in r["name"].split())
        w.writerow([i, name, r["email"].strip().lower(), date(r["signup"]),
                    aliases[r["country"].strip().lower()], cents(r["lifetime_value"])])
PY
head -3 data/customers_clean.csv
