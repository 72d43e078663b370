import random
import sys

sys.path.insert(0, "/app")
from intervals import merge, total_length, intersect, contains  # noqa: E402


def brute_points(intervals):
    pts = set()
    for s, e in intervals:
        pts.update(range(s, e + 1))
    return pts


def test_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_adjacent_not_touching():
    assert merge([(1, 2), (3, 4)]) == [(1, 2), (3, 4)]


def test_unsorted():
    assert merge([(8, 10), (1, 3), (2, 6), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]


def test_nested():
    assert merge([(1, 10), (2, 3), (4, 5)]) == [(1, 10)]


def test_empty_and_single():
    assert merge([]) == []
    assert merge([(4, 4)]) == [(4, 4)]


def test_input_not_modified():
    data = [(5, 6), (1, 2)]
    merge(data)
    assert data == [(5, 6), (1, 2)]


def test_total_length():
    assert total_length([(1, 3)]) == 3
    assert total_length([(1, 3), (2, 5), (10, 10)]) == 6
    assert total_length([]) == 0


def test_intersect_point():
    assert intersect((1, 3), (3, 7)) == (3, 3)


def test_random_against_brute_force():
    rng = random.Random(1234)
    for _ in range(300):
        ivs = []
        for _ in range(rng.randint(0, 8)):
            s = rng.randint(-20, 20)
            ivs.append((s, s + rng.randint(0, 6)))
        out = merge(ivs)
        assert out == sorted(out)
        assert brute_points(out) == brute_points(ivs)
        for (s1, e1), (s2, e2) in zip(out, out[1:]):
            assert s2 > e1
        assert all(isinstance(iv, tuple) for iv in out)
        assert total_length(ivs) == len(brute_points(ivs))
        for p in range(-22, 30):
            assert contains(out, p) == (p in brute_points(ivs))
