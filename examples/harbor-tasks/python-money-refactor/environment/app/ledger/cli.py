"""Command line: python3 -m ledger.cli OWNER FILE.csv

Each line of FILE.csv is `deposit,AMOUNT` or `withdraw,AMOUNT`.
"""
import sys

from .accounts import Account, InsufficientFunds
from .money import parse_amount
from .report import statement


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: ledger OWNER FILE.csv", file=sys.stderr)
        return 2
    owner, path = argv
    account = Account(owner)
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            kind, _, text = line.partition(",")
            try:
                amount = parse_amount(text)
                if kind == "deposit":
                    account.deposit(amount)
                elif kind == "withdraw":
                    account.withdraw(amount)
                else:
                    raise ValueError(f"unknown kind {kind!r}")
            except (ValueError, InsufficientFunds) as e:
                print(f"line {number}: {e}", file=sys.stderr)
                return 1
    print("\n".join(statement(account)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
