#!/bin/bash
set -e
cd /app
cat > calc/__init__.py <<'PY'
"""Exact arithmetic expression evaluator. See /app/SPEC.md."""
from fractions import Fraction


class CalcError(ValueError):
    """Any error while parsing or evaluating an expression."""


FUNCTIONS = {"abs": (1, 1), "min": (1, None), "max": (1, None)}


def _tokens(expr):
    out, i, n = [], 0, len(expr)
    while i < n:
        c = expr[i]
        if c in " \t":
            i += 1
        elif "0" <= c <= "9":
            j = i
            while j < n and "0" <= expr[j] <= "9":
                j += 1
            if j < n and expr[j] == ".":
                k = j + 1
                while k < n and "0" <= expr[k] <= "9":
                    k += 1
                if k == j + 1:
                    raise CalcError(f"bad number at {i}")
                j = k
            if j < n and (expr[j] == "." or "a" <= expr[j].lower() <= "z" or expr[j] == "_"):
                raise CalcError(f"bad number at {i}")
            out.append(("num", Fraction(expr[i:j])))
            i = j
        elif "a" <= c <= "z" or "A" <= c <= "Z" or c == "_":
            j = i
            while j < n and (expr[j].isascii() and (expr[j].isalnum() or expr[j] == "_")):
                j += 1
            name = expr[i:j]
            if name not in FUNCTIONS:
                raise CalcError(f"unknown name {name!r}")
            out.append(("name", name))
            i = j
        elif c in "+-*/^(),":
            out.append((c, None))
            i += 1
        else:
            raise CalcError(f"unexpected character {c!r} at {i}")
    out.append(("end", None))
    return out


class _Parser:
    def __init__(self, expr):
        self.toks = _tokens(expr)
        self.pos = 0

    def peek(self):
        return self.toks[self.pos][0]

    def take(self, kind=None):
        tok = self.toks[self.pos]
        if kind is not None and tok[0] != kind:
            raise CalcError(f"expected {kind!r}, found {tok[0]!r}")
        self.pos += 1
        return tok

    def parse(self):
        value = self.sum()
        self.take("end")
        return value

    def sum(self):
        value = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()[0]
            rhs = self.product()
            value = value + rhs if op == "+" else value - rhs
        return value

    def product(self):
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()[0]
            rhs = self.unary()
            if op == "*":
                value = value * rhs
            else:
                if rhs == 0:
                    raise CalcError("division by zero")
                value = value / rhs
        return value

    def unary(self):
        if self.peek() in ("+", "-"):
            op = self.take()[0]
            value = self.unary()
            return -value if op == "-" else value
        return self.power()

    def power(self):
        base = self.primary()
        if self.peek() == "^":
            self.take()
            exp = self.unary()        # right-assoc; exponent may carry signs
            if exp.denominator != 1:
                raise CalcError("exponent must be an integer")
            if abs(exp) > 1000:
                raise CalcError("exponent too large")
            if base == 0 and exp < 0:
                raise CalcError("zero to a negative power")
            return base ** int(exp)
        return base

    def primary(self):
        kind, val = self.take()
        if kind == "num":
            return val
        if kind == "(":
            value = self.sum()
            self.take(")")
            return value
        if kind == "name":
            self.take("(")
            args = []
            if self.peek() != ")":
                args.append(self.sum())
                while self.peek() == ",":
                    self.take()
                    args.append(self.sum())
            self.take(")")
            lo, hi = FUNCTIONS[val]
            if len(args) < lo or (hi is not None and len(args) > hi):
                raise CalcError(f"wrong number of arguments for {val}")
            return {"abs": lambda a: abs(a[0]), "min": min, "max": max}[val](args)
        raise CalcError(f"unexpected {kind!r}")


def evaluate(expr: str) -> Fraction:
    """Evaluate `expr` exactly and return a Fraction."""
    if not isinstance(expr, str):
        raise CalcError("expression must be a string")
    try:
        return Fraction(_Parser(expr).parse())
    except CalcError:
        raise
    except (ArithmeticError, RecursionError, ValueError) as e:
        raise CalcError(str(e)) from None


def format_result(value: Fraction) -> str:
    """Render a result as described in /app/SPEC.md."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    d, twos, fives = value.denominator, 0, 0
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10 ** places // value.denominator
    whole, frac = divmod(scaled, 10 ** places)
    sign = "-" if value < 0 else ""
    return f"{sign}{whole}.{str(frac).rjust(places, '0').rstrip('0')}"
PY
cat > calc/__main__.py <<'PY'
"""python3 -m calc EXPR"""
import sys

from . import CalcError, evaluate, format_result


def main(argv):
    if len(argv) != 1:
        print("usage: python3 -m calc EXPR", file=sys.stderr)
        return 2
    try:
        print(format_result(evaluate(argv[0])))
    except CalcError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
python3 -m calc '-2^2 + 2^-1 * max(1, 3/2)'
