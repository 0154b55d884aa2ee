from bench.intervals import clip, intersect, total, union


def test_union_merges_overlaps_and_touching():
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]


def test_intersection_and_total():
    a = [(0, 10)]
    b = [(1, 2), (5, 7), (9, 12)]
    assert intersect(a, b) == [(1, 2), (5, 7), (9, 10)]
    assert total(intersect(a, b)) == 4
    assert total([(0, 1), (0.5, 1.5)]) == 1.5


def test_clip():
    assert clip([(0, 5), (6, 8), (9, 10)], 1, 7) == [(1, 5), (6, 7)]
