"""kernels/common/layout.py: regions one after another, regions over earlier ones, and the bytes a
launch asks for."""

import pytest

from numba_flash.kernels.common.layout import SharedLayout


def test_regions_follow_one_another_and_the_bytes_add_the_reserve():
    lay = SharedLayout(2, [("q", 64 * 72), ("k", 2 * 32 * 72), ("p", 64 * 32)], reserve=1024)
    assert (lay.q, lay.k, lay.p) == (0, 64 * 72, 64 * 72 + 2 * 32 * 72)
    assert lay.sizes["k"] == 2 * 32 * 72
    assert lay.elements == 64 * 72 + 2 * 32 * 72 + 64 * 32
    assert lay.bytes == 2 * lay.elements + 1024
    assert SharedLayout(4, [("a", 3), ("b", 5)]).bytes == 32


def test_a_region_over_earlier_ones_adds_nothing_and_must_fit():
    lay = SharedLayout(4, [("k", 100), ("v", 100), ("o", 150, "k")])
    assert lay.o == 0 and lay.elements == 200
    with pytest.raises(ValueError, match="does not fit over 'v'"):
        SharedLayout(4, [("k", 100), ("v", 100), ("o", 101, "v")])
    with pytest.raises(ValueError, match="laid out twice"):
        SharedLayout(4, [("k", 1), ("k", 1)])
    with pytest.raises(AttributeError):
        lay.missing
