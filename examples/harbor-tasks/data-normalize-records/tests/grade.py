"""Partial credit: rows of /app/data/customers_clean.csv equal to the expected rows."""
import csv, json, sys

HEADER = ["id", "name", "email", "signup_date", "country", "lifetime_value_cents"]
with open("/tests/expected.csv", newline="") as f:
    expected = {row[0]: row for row in list(csv.reader(f))[1:]}
total = len(expected)
correct = extra = 0
try:
    with open("/app/data/customers_clean.csv", newline="") as f:
        rows = list(csv.reader(f))
except (OSError, UnicodeDecodeError, csv.Error) as e:
    print("cannot read output:", e)
    rows = []
if not rows or rows[0] != HEADER:
    print("missing file or wrong header:", rows[:1])
    rows = [HEADER]
seen = set()
for row in rows[1:]:
    if not row:
        continue
    key = row[0]
    if key in expected and key not in seen and row == expected[key]:
        correct += 1
    elif key not in expected or key in seen:
        extra += 1
        print("unexpected or duplicate row:", row)
    else:
        print("wrong row:", row, "expected:", expected[key])
    seen.add(key)
ids = [r[0] for r in rows[1:] if r]
order_ok = all(a.isdigit() for a in ids) and ids == sorted(ids, key=int)
if not order_ok:
    print("rows are not sorted by id; score halved")
reward = correct / (total + extra) if total + extra else 0.0
if not order_ok:
    reward /= 2
result = {"reward": round(reward, 4), "rows_correct": correct, "rows_total": total, "rows_extra": extra}
json.dump(result, open("/logs/verifier/reward.json", "w"))
print(result)
