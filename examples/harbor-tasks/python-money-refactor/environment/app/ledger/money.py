"""Money helpers. Amounts are floats in the account's currency."""


def parse_amount(text):
    """'12.34' -> 12.34"""
    return float(text)


def fmt(amount):
    """12.3 -> '12.30'"""
    return f"{amount:.2f}"
