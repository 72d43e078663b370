import dataclasses
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")
from ledger import money as money_mod  # noqa: E402
from ledger.money import Money, CurrencyMismatchError  # noqa: E402
from ledger.accounts import Account, InsufficientFunds  # noqa: E402
from ledger.report import statement  # noqa: E402
from ledger import cli  # noqa: E402


def test_error_type():
    assert issubclass(CurrencyMismatchError, ValueError)


def test_money_basics():
    m = Money(1234, "EUR")
    assert m.cents == 1234 and m.currency == "EUR"
    assert str(m) == "12.34 EUR"
    assert str(Money(-350, "USD")) == "-3.50 USD"
    assert str(Money(-5, "USD")) == "-0.05 USD"
    assert str(Money(0, "JPY")) == "0.00 JPY"
    assert hash(Money(5, "USD")) == hash(Money(5, "USD"))
    assert len({Money(5, "USD"), Money(5, "USD"), Money(5, "EUR")}) == 2


def test_money_immutable():
    m = Money(1, "USD")
    with pytest.raises(Exception):
        m.cents = 2
    assert m.cents == 1


@pytest.mark.parametrize("args", [(1, "usd"), (1, "US"), (1, "USDX"), (1, "U2D"), (1.5, "USD"), ("1", "USD"), (True, "USD"), (1, "ÄBC")])
def test_money_validation(args):
    with pytest.raises(ValueError):
        Money(*args)


@pytest.mark.parametrize("text,cents", [("12.34", 1234), ("7", 700), ("-3.5", -350), (" 0.05 ", 5), ("0.1", 10), ("1000000.99", 100000099), ("-0.01", -1)])
def test_parse(text, cents):
    assert Money.parse(text, "EUR") == Money(cents, "EUR")


@pytest.mark.parametrize("text", ["1.234", "1e3", "abc", "", "1,000", "--1", "1.", ".", "nan", "inf", "0x10"])
def test_parse_rejects(text):
    with pytest.raises(ValueError):
        Money.parse(text, "USD")


def test_arithmetic_and_ordering():
    a, b = Money(30, "USD"), Money(10, "USD")
    assert a + b == Money(40, "USD") and a - b == Money(20, "USD")
    assert b - a == Money(-20, "USD")
    assert b < a and b <= a and a > b and a >= b and a >= Money(30, "USD")
    assert Money(1, "USD") != Money(1, "EUR")
    assert not (Money(1, "USD") == Money(1, "EUR"))
    for op in (lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x < y, lambda x, y: x >= y):
        with pytest.raises(CurrencyMismatchError):
            op(Money(1, "USD"), Money(1, "EUR"))


def test_old_float_helpers_removed():
    assert not hasattr(money_mod, "parse_amount") and not hasattr(money_mod, "fmt")


def test_account_exact():
    a = Account("ann")
    assert a.currency == "USD" and a.balance == Money(0, "USD")
    a.deposit(Money.parse("0.30", "USD"))
    a.withdraw(Money.parse("0.10", "USD"))
    a.withdraw(Money.parse("0.20", "USD"))
    assert a.balance == Money(0, "USD")
    assert a.history == [("deposit", Money(30, "USD")), ("withdraw", Money(10, "USD")), ("withdraw", Money(20, "USD"))]


def test_account_errors():
    a = Account("bo", currency="EUR")
    a.deposit(Money(500, "EUR"))
    with pytest.raises(CurrencyMismatchError):
        a.deposit(Money(1, "USD"))
    with pytest.raises(CurrencyMismatchError):
        a.withdraw(Money(1, "USD"))
    for bad in (Money(0, "EUR"), Money(-1, "EUR")):
        with pytest.raises(ValueError):
            a.deposit(bad)
        with pytest.raises(ValueError):
            a.withdraw(bad)
    with pytest.raises(InsufficientFunds):
        a.withdraw(Money(501, "EUR"))
    assert a.balance == Money(500, "EUR") and len(a.history) == 1


def test_statement():
    a = Account("cy", currency="GBP")
    a.deposit(Money(123456, "GBP"))
    a.withdraw(Money(56, "GBP"))
    assert statement(a) == [
        "Statement for cy (GBP)",
        "deposit      1234.56 GBP",
        "withdraw        0.56 GBP",
        "balance      1234.00 GBP",
    ]


def run_cli(tmp_path, text, *args):
    p = tmp_path / "t.csv"
    p.write_text(text)
    return subprocess.run([sys.executable, "-m", "ledger.cli", *[str(a).replace("FILE", str(p)) for a in args]],
                          cwd="/app", capture_output=True, text=True, timeout=20)


def test_cli_default_currency(tmp_path):
    r = run_cli(tmp_path, "deposit,0.30\n\nwithdraw,0.10\nwithdraw,0.20\n", "dee", "FILE")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["Statement for dee (USD)", "deposit         0.30 USD",
                                     "withdraw        0.10 USD", "withdraw        0.20 USD", "balance         0.00 USD"]


def test_cli_currency_option(tmp_path):
    for args in (("ed", "FILE", "--currency", "CHF"), ("--currency", "CHF", "ed", "FILE")):
        r = run_cli(tmp_path, "deposit,5\n", *args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "Statement for ed (CHF)"
        assert r.stdout.splitlines()[-1] == "balance         5.00 CHF"


def test_cli_errors(tmp_path):
    r = run_cli(tmp_path, "deposit,5\nwithdraw,1.234\n", "fi", "FILE")
    assert r.returncode == 1 and r.stderr.startswith("line 2:")
    r = run_cli(tmp_path, "deposit,5\nwithdraw,6\n", "fi", "FILE")
    assert r.returncode == 1 and r.stderr.startswith("line 2:")
    r = run_cli(tmp_path, "refund,5\n", "fi", "FILE")
    assert r.returncode == 1 and r.stderr.startswith("line 1:")
    r = run_cli(tmp_path, "deposit,5\n", "fi")
    assert r.returncode == 2
    r = run_cli(tmp_path, "deposit,5\n", "fi", "FILE", "--currency", "eur")
    assert r.returncode == 2


def test_cli_main_returns_status(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("deposit,2.50\n")
    assert cli.main(["gus", str(p), "--currency", "EUR"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "balance         2.50 EUR"
