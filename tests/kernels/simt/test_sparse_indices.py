"""The sparse decode's index packing (kernels/simt/sparse_indices.py): each query token's valid
cache rows in their order and their count, -1 skipped silently, entries outside the cache and
lengths outside 0 .. topk bounded and reported, and the plan-only lengths."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash.kernels import registry
from numba_flash.runtime import arrays, device, status
from helpers import assert_compiles_clean, int32_array, to_device, to_host


def pack(indices, topk_length, num_rows, pack=True):
    """(packed, lengths) of the kernel for indices (b, s_q, topk) on the device."""
    b, s_q, topk = indices.shape
    ind = arrays.adapt(int32_array(indices), "indices")
    lengths = arrays.empty(ind, (b * s_q,), "int32", "lengths")
    packed = arrays.empty(ind, (b * s_q, topk), "int32", "packed")
    p = dict(indices=ind, packed=packed, lengths=lengths, status=status.word(ind), s_q=s_q,
             num_rows=num_rows, topk_length=arrays.prefix(lengths, 0) if topk_length is None
             else arrays.adapt(int32_array(topk_length), "topk_length"))
    spec = registry.SPARSE_INDICES
    spec.launch(spec.Config(pack), p, arrays.stream_of(ind), device.current())
    return to_host(packed.obj), to_host(lengths.obj)


def expected(indices, topk_length, num_rows):
    b, s_q, topk = indices.shape
    rows = []
    for i in range(b):
        n = topk if topk_length is None else min(max(topk_length[i], 0), topk)
        for t in range(s_q):
            rows.append([r for r in indices[i, t, :n] if 0 <= r < num_rows])
    return rows


@pytest.mark.parametrize("topk", [1, 7, 70])
def test_valid_rows_are_packed_in_order(rng, topk):
    indices = rng.integers(-1, 40, (3, 2, topk)).astype(np.int32)  # rows 0..39, -1 empty
    packed, lengths = pack(indices, None, 40)
    nf.check_errors()  # -1 is not an error
    for r, want in enumerate(expected(indices, None, 40)):
        assert lengths[r] == len(want)
        np.testing.assert_array_equal(packed[r, :len(want)], want)


def test_rows_outside_the_cache_and_bad_lengths_are_dropped_and_reported(rng):
    indices = rng.integers(-5, 50, (2, 3, 33)).astype(np.int32)  # rows past 39, below -1
    topk_length = np.array([-4, 20], np.int32)
    packed, lengths = pack(indices, topk_length, 40)
    with pytest.raises(RuntimeError, match="indices, topk_length"):
        nf.check_errors()
    for r, want in enumerate(expected(indices, topk_length, 40)):
        assert lengths[r] == len(want)
        np.testing.assert_array_equal(packed[r, :len(want)], want)
    assert lengths[:3].tolist() == [0, 0, 0]  # a negative length reads nothing
    _, lengths = pack(indices[:1], np.array([99], np.int32), 40)  # past topk: clamped
    assert lengths.tolist() == [len(w) for w in expected(indices[:1], None, 40)]
    with pytest.raises(RuntimeError, match="topk_length"):
        nf.check_errors()


def test_without_packing_every_length_is_topk(rng):
    _, lengths = pack(rng.integers(-5, 50, (2, 3, 9)).astype(np.int32), None, 0, pack=False)
    assert lengths.tolist() == [9] * 6
    nf.check_errors()


def test_compiles_without_spills():
    assert_compiles_clean("simt.sparse_indices", [((True,), None), ((False,), None)])
