#!/bin/bash
set -e
cd /app
cat > /app/migrate.py <<'PY'
"""Migrate a shop database from schema version 1 to 2: python3 migrate.py DB_PATH"""
import datetime
import sqlite3
import sys
from decimal import Decimal


def cents(amount):
    return int(Decimal(amount.strip()) * 100)


def iso(date):
    return datetime.datetime.strptime(date.strip(), "%d/%m/%Y").date().isoformat()


def migrate(path):
    db = sqlite3.connect(path)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version >= 2:
        return
    if version != 1:
        raise SystemExit(f"unexpected schema version {version}")
    with db:
        db.execute("ALTER TABLE orders ADD COLUMN amount_cents INTEGER")
        db.execute("ALTER TABLE orders ADD COLUMN created_on TEXT")
        rows = db.execute("SELECT id, amount, created FROM orders").fetchall()
        db.executemany("UPDATE orders SET amount_cents = ?, created_on = ? WHERE id = ?",
                       [(cents(a), iso(c), i) for i, a, c in rows])
        db.execute("CREATE INDEX idx_orders_customer ON orders(customer_id)")
        db.execute("""CREATE VIEW customer_totals AS
                      SELECT c.id AS customer_id, c.name AS name,
                             COUNT(o.id) AS order_count,
                             COALESCE(SUM(o.amount_cents), 0) AS total_cents
                      FROM customers c LEFT JOIN orders o ON o.customer_id = c.id
                      GROUP BY c.id, c.name""")
        db.execute("PRAGMA user_version = 2")
    db.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: migrate.py DB_PATH")
    migrate(sys.argv[1])
PY
python3 /app/migrate.py /app/shop.db
python3 /app/migrate.py /app/shop.db
python3 -c "import sqlite3; print(sqlite3.connect('/app/shop.db').execute('select * from customer_totals').fetchall())"
