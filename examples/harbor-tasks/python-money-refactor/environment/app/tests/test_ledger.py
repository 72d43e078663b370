import pytest
from ledger.accounts import Account, InsufficientFunds
from ledger.report import statement


def test_deposit_withdraw():
    a = Account("ann")
    a.deposit(10.0)
    a.withdraw(2.5)
    assert a.balance == 7.5


def test_insufficient():
    a = Account("ann")
    with pytest.raises(InsufficientFunds):
        a.withdraw(1.0)


def test_statement():
    a = Account("ann")
    a.deposit(0.1)
    a.deposit(0.2)
    assert statement(a)[-1] == "balance             0.30"
