"""Text statements."""
from .money import fmt


def statement(account):
    """The account's statement as a list of lines."""
    lines = [f"Statement for {account.owner}"]
    for kind, amount in account.history:
        lines.append(f"{kind:<10}{fmt(amount):>14}")
    lines.append(f"{'balance':<10}{fmt(account.balance):>14}")
    return lines
