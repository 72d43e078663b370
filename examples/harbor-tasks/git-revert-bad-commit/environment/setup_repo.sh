#!/bin/bash
# Builds the task's git history in /app with fixed identities and dates (so commit ids are reproducible).
set -euo pipefail
cd /app
export GIT_AUTHOR_NAME="Dana Developer" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Developer" GIT_COMMITTER_EMAIL="dana@example.com"
n=0
commit() {
    n=$((n + 1))
    export GIT_AUTHOR_DATE="2024-05-0${n}T10:00:00+00:00" GIT_COMMITTER_DATE="2024-05-0${n}T10:00:00+00:00"
    git add -A
    git -c commit.gpgsign=false commit -q -m "$1"
}
git init -q -b main .

cat > .gitignore <<'EOF'
__pycache__/
.pytest_cache/
EOF
cat > pricing.py <<'EOF'
"""Price calculations for the shop. All amounts are in dollars."""
from decimal import Decimal, ROUND_HALF_UP

TAX_RATE = Decimal("0.08")


def round_cents(amount):
    """Round a Decimal amount to whole cents, halves away from zero."""
    return Decimal(amount).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def apply_discount(price, percent):
    """Price after a percentage discount, rounded to cents."""
    price = Decimal(str(price))
    return round_cents(price * (Decimal(100) - Decimal(str(percent))) / Decimal(100))


def with_tax(price):
    """Price including sales tax, rounded to cents."""
    return round_cents(Decimal(str(price)) * (1 + TAX_RATE))
EOF
mkdir -p tests
cat > tests/test_pricing.py <<'EOF'
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from decimal import Decimal
import pricing


def test_discount():
    assert pricing.apply_discount("19.99", 15) == Decimal("16.99")
    assert pricing.apply_discount("19.95", 15) == Decimal("16.96")


def test_tax_rounds_half_up():
    assert pricing.with_tax("10.00") == Decimal("10.80")
    assert pricing.with_tax("0.25") == Decimal("0.27")
    assert pricing.with_tax("0.35") == Decimal("0.38")
EOF
cat > README.md <<'EOF'
# shop-pricing

Price helpers for the shop. Run the tests with `python3 -m pytest -q`.
EOF
commit "Initial pricing module"

cat >> pricing.py <<'EOF'


def bulk_price(unit_price, quantity):
    """Total for `quantity` items; 10% off from 10 items on."""
    total = Decimal(str(unit_price)) * quantity
    if quantity >= 10:
        total = total * Decimal("0.9")
    return round_cents(total)
EOF
cat >> tests/test_pricing.py <<'EOF'


def test_bulk_price():
    assert pricing.bulk_price("2.50", 4) == Decimal("10.00")
    assert pricing.bulk_price("1.15", 10) == Decimal("10.35")
EOF
commit "Add bulk pricing"
git tag v1.0

python3 - <<'EOF'
import pathlib
p = pathlib.Path("pricing.py")
s = p.read_text()
s = s.replace('''def round_cents(amount):
    """Round a Decimal amount to whole cents, halves away from zero."""
    return Decimal(amount).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)''',
'''def round_cents(amount):
    """Round a Decimal amount to whole cents, halves away from zero."""
    return Decimal(int(Decimal(amount) * 100)) / 100''')
p.write_text(s)
EOF
commit "Simplify rounding helper"

cat > CHANGELOG.md <<'EOF'
# Changelog

## 1.1 (unreleased)
- Price formatting helper
- Coupons
EOF
commit "Start a changelog"

cat >> pricing.py <<'EOF'


def format_price(amount):
    """'$1,234.50' style string for a Decimal amount."""
    return "${:,.2f}".format(Decimal(amount))
EOF
cat >> tests/test_pricing.py <<'EOF'


def test_format_price():
    assert pricing.format_price(Decimal("1234.5")) == "$1,234.50"
EOF
commit "Add format_price"

cat > coupons.py <<'EOF'
"""Coupon codes: a code maps to a percentage discount."""
from pricing import apply_discount

COUPONS = {"SPRING10": 10, "VIP25": 25}


def redeem(price, code):
    """Price after applying the coupon `code` (unknown codes raise KeyError)."""
    return apply_discount(price, COUPONS[code.upper()])
EOF
cat > tests/test_coupons.py <<'EOF'
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from decimal import Decimal
import pytest
import coupons


def test_redeem():
    assert coupons.redeem("40.00", "spring10") == Decimal("36.00")
    assert coupons.redeem("0.95", "SPRING10") == Decimal("0.86")


def test_unknown_code():
    with pytest.raises(KeyError):
        coupons.redeem("1.00", "NOPE")
EOF
commit "Add coupon codes"

cat >> README.md <<'EOF'

Coupons live in `coupons.py`; prices are formatted with `pricing.format_price`.
EOF
commit "Document coupons in the README"
git log --oneline
