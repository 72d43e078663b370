"""Operations on closed integer intervals ``(start, end)`` with ``start <= end``."""


def merge(intervals):
    """Merge overlapping or touching intervals.

    Input may be in any order and may be empty. Two intervals are merged when
    they share at least one point (``(1, 3)`` and ``(3, 5)`` -> ``(1, 5)``).
    Returns a new list of tuples sorted by start; the input is not modified.
    """
    result = []
    for start, end in intervals:
        if result and start < result[-1][1]:
            last_start, last_end = result[-1]
            result[-1] = (last_start, end)
        else:
            result.append((start, end))
    return result


def total_length(intervals):
    """Number of integer points covered by the union of the intervals.

    ``total_length([(1, 3)]) == 3`` (points 1, 2, 3).
    """
    return sum(end - start for start, end in merge(intervals))


def intersect(a, b):
    """Intersection of two intervals, or ``None`` when they share no point."""
    start = max(a[0], b[0])
    end = min(a[1], b[1])
    if start > end:
        return None
    return (start, end)


def contains(intervals, point):
    """True when ``point`` lies in at least one of the intervals."""
    return any(start <= point <= end for start, end in intervals)
