"""Length unit conversion: ``convert(5, "km", "m") == 5000.0``; the ``tinyunits VALUE FROM TO`` command."""

import sys

__version__ = "1.2.0"

FACTORS = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "mi": 1609.344}
"""Metres per unit."""


def convert(value: float, source: str, target: str) -> float:
    """``value`` in unit ``source`` expressed in unit ``target``."""
    return value * FACTORS[source] / FACTORS[target]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[1] not in FACTORS or args[2] not in FACTORS:
        print(f"usage: tinyunits VALUE FROM TO (units: {' '.join(FACTORS)})", file=sys.stderr)
        return 2
    print(f"{convert(float(args[0]), args[1], args[2]):g}")
    return 0
