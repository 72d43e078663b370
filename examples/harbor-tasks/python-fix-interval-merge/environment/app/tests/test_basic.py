from intervals import merge, intersect, contains


def test_merge_disjoint():
    assert merge([(1, 2), (5, 6)]) == [(1, 2), (5, 6)]


def test_intersect():
    assert intersect((1, 5), (4, 9)) == (4, 5)
    assert intersect((1, 2), (3, 4)) is None


def test_contains():
    assert contains([(1, 2), (5, 6)], 5)
    assert not contains([(1, 2), (5, 6)], 4)
