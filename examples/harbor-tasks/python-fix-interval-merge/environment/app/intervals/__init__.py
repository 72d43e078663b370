"""Closed integer intervals."""
from .core import merge, total_length, intersect, contains

__all__ = ["merge", "total_length", "intersect", "contains"]
