"""Shared-memory tiles of the SIMT attention kernels (forward.py, backward.py).

Thread mapping
    A block of 128 threads is 16 row groups of 8 lanes: the lanes of a group share the rows of a
    register micro-tile and split its columns, so a warp holds four row groups.

Tile loading
    ``make_tile_loader`` builds the device function that copies rows ``row0 ..`` of one head of a
    (B, S, H, D) tensor into shared memory as float32, zero-filling rows past the sequence end
    (their products then add nothing). Consecutive threads read consecutive ``d`` of a row, so a
    warp's global reads are contiguous; the shared layout is the caller's: row-major for tiles read
    along rows, transposed for tiles a row group reads down a column.

Padding
    ``row_pad`` is the rule that keeps the row groups of a warp on different banks when they read
    (one word each) or write (8 consecutive words each) a shared tile scattered over their lanes.
"""

from numba import cuda, float32

from ..common import formats

THREADS = 128
LANES_PER_ROW = 8  # threads sharing one row of a micro-tile
ROW_GROUPS = THREADS // LANES_PER_ROW


def row_pad(rows_per_group, width):
    """Smallest pad making the stride between row groups (``rows_per_group`` rows of ``width +
    pad`` words) ``8 mod 32`` words: the four row groups of a warp then start on banks 0, 8, 16,
    24 and read or write disjoint banks."""
    return next(p for p in range(32) if (rows_per_group * (width + p)) % 32 == 8)


def make_tile_loader(ROWS, HEAD_DIM, ROW_STRIDE, COL_STRIDE, FMT):
    """Device function ``load_tile(smem, offset, x, b, row0, h, seqlen, scale, tid)``: element
    ``(r, d)`` of ``x[b, row0:row0 + ROWS, h, :]``, times ``scale``, goes to ``smem[offset + r *
    ROW_STRIDE + d * COL_STRIDE]`` (row-major: ``COL_STRIDE = 1``; transposed: ``ROW_STRIDE =
    1``); rows at or past ``seqlen`` are zeros. Every thread of the block takes part."""
    load = formats.loader(FMT)
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def load_tile(smem, offset, x, b, row0, h, seqlen, scale, tid):
        for idx in range(tid, ROWS * HEAD_DIM, THREADS):
            r = idx // HEAD_DIM
            d = idx - r * HEAD_DIM
            val = ZERO
            if row0 + r < seqlen:
                val = load(x[b, row0 + r, h, d]) * scale
            smem[offset + r * ROW_STRIDE + d * COL_STRIDE] = val

    return load_tile
