"""Interval arithmetic over timeline spans: union, total length, intersection."""

from __future__ import annotations

Interval = tuple[float, float]


def union(spans: list[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def total(spans: list[Interval]) -> float:
    return sum(b - a for a, b in union(spans))


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(spans: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]
