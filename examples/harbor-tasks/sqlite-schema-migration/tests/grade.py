"""Checks /app/shop.db and re-runs /app/migrate.py on a fresh, different version-1 database."""
import datetime as dt, shutil, sqlite3, subprocess, sys, tempfile
from decimal import Decimal

problems = []


def original(seed_sql):
    db = sqlite3.connect(":memory:")
    db.executescript(open(seed_sql).read())
    orders = {r[0]: (int(Decimal(r[1]) * 100), dt.datetime.strptime(r[2], "%d/%m/%Y").date().isoformat())
              for r in db.execute("SELECT id, amount, created FROM orders")}
    totals = db.execute("""SELECT c.id, c.name, COUNT(o.id), 0 FROM customers c
                           LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id ORDER BY c.id""").fetchall()
    cents = {}
    for oid, cid in db.execute("SELECT id, customer_id FROM orders"):
        cents[cid] = cents.get(cid, 0) + orders[oid][0]
    totals = [(cid, name, n, cents.get(cid, 0)) for cid, name, n, _ in totals]
    base = {t: db.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in ("customers", "orders")}
    return orders, totals, base


def check(path, seed_sql, label):
    orders, totals, base = original(seed_sql)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        if db.execute("PRAGMA user_version").fetchone()[0] != 2:
            problems.append(f"{label}: user_version is not 2")
        cols = [r[1] for r in db.execute("PRAGMA table_info(orders)")]
        for c in ("id", "customer_id", "amount", "created", "amount_cents", "created_on"):
            if c not in cols:
                problems.append(f"{label}: orders.{c} missing")
        got = {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, amount_cents, created_on FROM orders")}
        if got != orders:
            bad = [k for k in orders if got.get(k) != orders[k]][:3]
            problems.append(f"{label}: amount_cents/created_on wrong, e.g. " + ", ".join(f"{k}: {got.get(k)} != {orders[k]}" for k in bad))
        for t in ("customers", "orders"):
            old_cols = "id, name, email" if t == "customers" else "id, customer_id, amount, created"
            if db.execute(f"SELECT {old_cols} FROM {t} ORDER BY id").fetchall() != base[t]:
                problems.append(f"{label}: existing rows of {t} changed")
        idx = {r[1] for r in db.execute("PRAGMA index_list(orders)")}
        if "idx_orders_customer" not in idx or \
                [r[2] for r in db.execute("PRAGMA index_info(idx_orders_customer)")] != ["customer_id"]:
            problems.append(f"{label}: index idx_orders_customer on orders(customer_id) missing")
        view = db.execute("SELECT customer_id, name, order_count, total_cents FROM customer_totals ORDER BY customer_id").fetchall()
        if view != totals:
            problems.append(f"{label}: customer_totals wrong: {view[:3]}... != {totals[:3]}...")
        db.close()
    except sqlite3.Error as e:
        problems.append(f"{label}: {e}")


check("/app/shop.db", "/tests/shipped_v1.sql", "/app/shop.db")

work = tempfile.mkdtemp()
fresh = f"{work}/fresh.db"
db = sqlite3.connect(fresh)
db.executescript(open("/tests/hidden_v1.sql").read())
db.commit()
db.close()
for run in (1, 2):
    try:
        r = subprocess.run([sys.executable, "/app/migrate.py", fresh], capture_output=True, text=True, timeout=20, cwd=work)
    except subprocess.TimeoutExpired:
        problems.append(f"migrate.py run {run} timed out")
        break
    if r.returncode != 0:
        problems.append(f"migrate.py run {run} exited {r.returncode}: {r.stderr[-500:]}")
        break
    if run == 1:
        shutil.copy(fresh, f"{work}/after1.db")
check(fresh, "/tests/hidden_v1.sql", "fresh db after two runs")
a, b = sqlite3.connect(f"{work}/after1.db"), sqlite3.connect(fresh)
dump = lambda c: list(c.iterdump()) + [c.execute("PRAGMA user_version").fetchone()]
if dump(a) != dump(b):
    problems.append("second run of migrate.py changed the database")

print("\n".join(problems) or "all checks passed")
sys.exit(1 if problems else 0)
