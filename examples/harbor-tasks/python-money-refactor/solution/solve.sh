#!/bin/bash
set -e
cd /app
cat > ledger/money.py <<'PY'
"""Exact money: integer cents plus an ISO-style currency code."""
import re
from dataclasses import dataclass

_AMOUNT = re.compile(r"(-?)([0-9]+)(?:\.([0-9]{1,2}))?")
_CURRENCY = re.compile(r"[A-Z]{3}")


class CurrencyMismatchError(ValueError):
    """An operation on amounts of different currencies."""


@dataclass(frozen=True)
class Money:
    cents: int
    currency: str

    def __post_init__(self):
        if not isinstance(self.cents, int) or isinstance(self.cents, bool):
            raise ValueError(f"cents must be an int, not {self.cents!r}")
        if not isinstance(self.currency, str) or not _CURRENCY.fullmatch(self.currency):
            raise ValueError(f"invalid currency {self.currency!r}")

    @classmethod
    def parse(cls, text, currency):
        m = _AMOUNT.fullmatch(text.strip())
        if not m:
            raise ValueError(f"invalid amount {text!r}")
        sign, whole, frac = m.groups()
        cents = int(whole) * 100 + int((frac or "0").ljust(2, "0"))
        return cls(-cents if sign else cents, currency)

    def _check(self, other):
        if not isinstance(other, Money):
            return NotImplemented
        if other.currency != self.currency:
            raise CurrencyMismatchError(f"{self.currency} vs {other.currency}")
        return None

    def __add__(self, other):
        if self._check(other) is NotImplemented:
            return NotImplemented
        return Money(self.cents + other.cents, self.currency)

    def __sub__(self, other):
        if self._check(other) is NotImplemented:
            return NotImplemented
        return Money(self.cents - other.cents, self.currency)

    def __lt__(self, other):
        if self._check(other) is NotImplemented:
            return NotImplemented
        return self.cents < other.cents

    def __le__(self, other):
        if self._check(other) is NotImplemented:
            return NotImplemented
        return self.cents <= other.cents

    def __gt__(self, other):
        if self._check(other) is NotImplemented:
            return NotImplemented
        return self.cents > other.cents

    def __ge__(self, other):
        if self._check(other) is NotImplemented:
            return NotImplemented
        return self.cents >= other.cents

    def __str__(self):
        sign = "-" if self.cents < 0 else ""
        whole, frac = divmod(abs(self.cents), 100)
        return f"{sign}{whole}.{frac:02d} {self.currency}"
PY
cat > ledger/accounts.py <<'PY'
"""Accounts with a balance and a history of transactions."""
from .money import CurrencyMismatchError, Money


class InsufficientFunds(Exception):
    """A withdrawal larger than the balance."""


class Account:
    def __init__(self, owner, currency="USD"):
        self.owner = owner
        self.currency = currency
        self.balance = Money(0, currency)
        self.history = []          # list of (kind, Money)

    def _check(self, money, what):
        if not isinstance(money, Money):
            raise ValueError(f"{what} must be Money, not {money!r}")
        if money.currency != self.currency:
            raise CurrencyMismatchError(f"{what} in {money.currency}, account in {self.currency}")
        if money.cents <= 0:
            raise ValueError(f"{what} must be positive")

    def deposit(self, money):
        self._check(money, "deposit")
        self.balance = self.balance + money
        self.history.append(("deposit", money))

    def withdraw(self, money):
        self._check(money, "withdrawal")
        if money > self.balance:
            raise InsufficientFunds(f"balance {self.balance} < {money}")
        self.balance = self.balance - money
        self.history.append(("withdraw", money))
PY
cat > ledger/report.py <<'PY'
"""Text statements."""


def statement(account):
    """The account's statement as a list of lines."""
    lines = [f"Statement for {account.owner} ({account.currency})"]
    for kind, money in account.history:
        lines.append(f"{kind:<10}{str(money):>14}")
    lines.append(f"{'balance':<10}{str(account.balance):>14}")
    return lines
PY
cat > ledger/cli.py <<'PY'
"""Command line: python3 -m ledger.cli OWNER FILE.csv [--currency CUR]

Each line of FILE.csv is `deposit,AMOUNT` or `withdraw,AMOUNT`.
"""
import argparse
import sys

from .accounts import Account, InsufficientFunds
from .money import Money
from .report import statement


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(prog="ledger")
    parser.add_argument("owner")
    parser.add_argument("file")
    parser.add_argument("--currency", default="USD")
    try:
        args = parser.parse_args(argv)
        account = Account(args.owner, args.currency)
        Money(0, args.currency)
    except SystemExit as e:
        return e.code
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(args.file) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            kind, _, text = line.partition(",")
            try:
                money = Money.parse(text, args.currency)
                if kind == "deposit":
                    account.deposit(money)
                elif kind == "withdraw":
                    account.withdraw(money)
                else:
                    raise ValueError(f"unknown kind {kind!r}")
            except (ValueError, InsufficientFunds) as e:
                print(f"line {number}: {e}", file=sys.stderr)
                return 1
    print("\n".join(statement(account)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
cat > tests/test_ledger.py <<'PY'
import pytest
from ledger.accounts import Account, InsufficientFunds
from ledger.money import Money
from ledger.report import statement


def test_deposit_withdraw():
    a = Account("ann")
    a.deposit(Money.parse("0.30", "USD"))
    a.withdraw(Money.parse("0.10", "USD"))
    a.withdraw(Money.parse("0.20", "USD"))
    assert a.balance == Money(0, "USD")


def test_insufficient():
    a = Account("ann")
    with pytest.raises(InsufficientFunds):
        a.withdraw(Money(100, "USD"))


def test_statement():
    a = Account("ann")
    a.deposit(Money(10, "USD"))
    a.deposit(Money(20, "USD"))
    assert statement(a)[-1] == "balance         0.30 USD"
PY
python3 -m pytest -q -p no:cacheprovider tests
