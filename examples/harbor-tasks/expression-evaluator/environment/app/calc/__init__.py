"""Exact arithmetic expression evaluator. See /app/SPEC.md."""
from fractions import Fraction


class CalcError(ValueError):
    """Any error while parsing or evaluating an expression."""


def evaluate(expr: str) -> Fraction:
    """Evaluate `expr` exactly and return a Fraction."""
    raise NotImplementedError


def format_result(value: Fraction) -> str:
    """Render a result as described in /app/SPEC.md."""
    raise NotImplementedError
