"""Accounts with a balance and a history of transactions."""


class InsufficientFunds(Exception):
    """A withdrawal larger than the balance."""


class Account:
    def __init__(self, owner):
        self.owner = owner
        self.balance = 0.0
        self.history = []          # list of (kind, amount)

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("withdrawal must be positive")
        if amount > self.balance:
            raise InsufficientFunds(f"balance {self.balance} < {amount}")
        self.balance -= amount
        self.history.append(("withdraw", amount))
