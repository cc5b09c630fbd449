"""simt/tiles.py: the bank-padding rule, the tile loader and the causal key range (tiny kernels,
on the simulator or a GPU)."""

import numpy as np
import pytest
from numba import cuda, float32

from numba_flash.kernels.simt import tiles
from helpers import randn, to_device, to_host


@pytest.mark.parametrize("rows", [1, 2, 4, 8])
@pytest.mark.parametrize("width", [8, 16, 24, 32, 64])
def test_row_pad_puts_the_row_groups_of_a_warp_on_distinct_banks(rows, width):
    pad = tiles.row_pad(rows, width)
    stride = rows * (width + pad)  # words from one row group to the next
    assert sorted(g * stride % 32 for g in range(4)) == [0, 8, 16, 24]
    assert all(rows * (width + p) % 32 != 8 for p in range(pad)), "not the smallest pad"


_KERNEL = """
def kernel(out, {params}):
    smem = cuda.shared.array(WORDS, float32)
    tid = cuda.threadIdx.x
    for i in range(tid, WORDS, THREADS):
        smem[i] = NAN
    cuda.syncthreads()
    device_fn(smem, {params}, tid)
    cuda.syncthreads()
    for i in range(tid, WORDS, THREADS):
        out[i] = smem[i]
"""


def _kernel(device_fn, words, nargs):
    """One block of tiles.THREADS threads that calls ``device_fn(smem, *args, tid)`` on a
    NaN-poisoned shared array and copies the shared array out. Numba kernels take no ``*args``,
    so the kernel is written out for ``nargs`` arguments."""
    params = ", ".join(f"a{i}" for i in range(nargs))
    scope = dict(cuda=cuda, float32=float32, device_fn=device_fn, WORDS=words,
                 THREADS=tiles.THREADS, NAN=float32(np.nan))
    exec(_KERNEL.format(params=params), scope)
    return scope["kernel"]


def _run(device_fn, words, *args):
    out = to_device(np.zeros(words, np.float32))
    cuda.jit(_kernel(device_fn, words, len(args)))[1, tiles.THREADS](out, *args)
    return to_host(out)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("transposed", [False, True])
def test_tile_loader_places_scaled_rows_and_zero_fills_past_the_end(fmt, transposed, rng):
    rows, head_dim, offset, row0, seqlen, b, h = 24, 16, 5, 8, 27, 1, 2
    x = randn(rng, (2, 40, 3, head_dim), fmt)
    # Transposed: element (r, d) at d * (rows + 1) + r; row-major: at r * (head_dim + 1) + d.
    row_stride, col_stride = (1, rows + 1) if transposed else (head_dim + 1, 1)
    words = offset + rows * head_dim + max(rows, head_dim) + 2  # room for the padding columns
    load_tile = tiles.make_tile_loader(rows, head_dim, row_stride, col_stride, fmt)
    bits = x if fmt == "float32" else x.view(np.uint16)  # kernels see 16-bit floats as bits
    scale = np.float32(0.75)
    got = _run(load_tile, words, offset, to_device(bits), b, row0, h, seqlen, scale)

    want = np.full(words, np.nan, np.float32)
    for r in range(rows):
        for d in range(head_dim):
            value = x[b, row0 + r, h, d].astype(np.float32) * scale if row0 + r < seqlen else 0
            want[offset + r * row_stride + d * col_stride] = value
    np.testing.assert_array_equal(got, want)  # padding words keep their NaN
