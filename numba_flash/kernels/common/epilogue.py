"""The end of a query tile: the lse of a row, and O written as whole 16-byte chunks of rows.

lse
    The kernels keep a row's running maximum in base-2 units (``m2 = scale * log2(e) * max``:
    the scale rides in every exponent, ``exp2(s * scale_log2 - m2)``) and its sum ``l`` of
    ``exp2`` terms; the natural-log lse is then ``(m2 + log2 l) ln 2``. A row that saw no key
    (causal with Sq > Sk) has l = 0 and gets +inf, the marker the backward and the MLA combine
    read as "contributes nothing". A row whose scores hold a NaN has a NaN ``l`` and gets a NaN
    lse, never the +inf of "no key".

Staged 16-byte stores
    A thread of an mma C fragment owns 2 adjacent columns of a row, so straight from the
    fragments a warp writes 8 bytes to each of 8 rows per instruction. The tc kernels instead
    stage O (rounded to 16 bits) through the shared tile Q occupied and write whole 16-byte
    chunks of rows from there: one ``st.global.v4`` per lane, a warp covering 512 contiguous-by-
    row bytes. Addresses are byte addresses (``memory.global_address`` once, then constant
    steps), and a warp whose rows are all in range and aligned stores without a test per chunk;
    ``store_chunk`` is the per-chunk store of the other warps, which also serves ``out=`` views
    whose rows are not 16-byte aligned (eight 2-byte stores instead of one).

    ``make_row_writer`` is that copy for the tiles of the wgmma kernels (the 128-byte swizzle of
    ``wgmma.tile_offset``, each warp its own 16 rows): the wgmma forward's O and the wgmma
    backward's dQ, dK and dV, each staged over a tile its products no longer read. Written
    straight from the fragments, the backward's outputs took two 2-byte stores per thread,
    column pair and row, each with its own bounds test and 64-bit index arithmetic.

Fragment stores
    The mma.sync backward kernels write dQ, dK, dV once per CTA straight from the accumulator
    fragments (``make_fragment_store``): two adjacent 16-bit elements per thread and 8-column
    tile, only where row and columns exist.
"""

import math

from numba import cuda, float32, uint64

from ..instructions import memory, wgmma
from . import formats
from .constants import LN2, POS_INF

ZERO = float32(0.0)


@cuda.jit(device=True, inline="always")
def lse_of(m2, l):
    """Natural-log lse of a row from its maximum ``m2`` in base-2 units and its sum ``l``."""
    return POS_INF if l == ZERO else (m2 + math.log2(l)) * LN2  # NaN stays NaN


@cuda.jit(device=True, inline="always")
def store_chunk(dst, smem, src, aligned):
    """16 bytes of ``smem`` from element ``src`` to global byte address ``dst``: one vector
    store when ``dst`` is 16-byte aligned, else eight 2-byte stores."""
    if aligned:
        memory.st_global_16(dst, smem, src)
    else:
        memory.st_global_16_unaligned(dst, smem, src)


def make_row_writer(HEAD_DIM, ROWS):
    """``write_rows(dst, b, row0, h, seqlen, smem, at, w_row, lane)``: one warp copies rows
    ``w_row .. w_row + 15`` of the tile of ``ROWS`` rows staged at element ``at`` of ``smem``
    (128-byte swizzle, ``wgmma.tile_offset``) to rows ``row0 ..`` of ``dst[b, :, h, :HEAD_DIM]``,
    those below ``seqlen``, as whole 16-byte chunks. The caller stages the rows and passes a
    barrier first."""
    ROW_CHUNKS = HEAD_DIM // 8          # 16-byte chunks of a row
    OUT_CHUNKS = 16 * ROW_CHUNKS        # ... of a warp's 16 rows
    ALIGN_MASK = uint64(15)

    @cuda.jit(device=True, inline="always")
    def write_rows(dst, b, row0, h, seqlen, smem, at, w_row, lane):
        out_w = memory.global_address(dst, (b, row0, h, 0))
        row_bytes = uint64(dst.strides[1])
        aligned = (out_w | row_bytes) & ALIGN_MASK == 0  # else a caller's view of odd alignment
        full = aligned and row0 + 16 <= seqlen
        for step in range((OUT_CHUNKS + 31) // 32):
            i = lane + 32 * step  # chunk i of the warp's rows: row i // ROW_CHUNKS
            if OUT_CHUNKS % 32 == 0 or i < OUT_CHUNKS:
                r = i // ROW_CHUNKS
                c = i - r * ROW_CHUNKS
                to = out_w + uint64(r) * row_bytes + uint64(16 * c)
                src = at + wgmma.tile_offset(w_row + r, 8 * c, ROWS)
                if full:
                    memory.st_global_16(to, smem, src)
                elif row0 + r < seqlen:
                    store_chunk(to, smem, src, aligned)

    return write_rows


def make_fragment_store(HEAD_DIM, DT_W, FMT):
    """``store_row(dst, b, row, h, seqlen, C, half, col0, t2, g_scale)``: the thread's two
    columns of each of the DT_W 8-column tiles of C-fragment row ``half``, from column ``col0``
    of row ``row`` of ``dst[b, :, h, :]``, times ``g_scale``, where row and columns exist: the
    backward's outputs, written once per CTA straight from the accumulator fragments."""
    store = formats.storer(FMT)

    @cuda.jit(device=True, inline="always")
    def store_row(dst, b, row, h, seqlen, C, half, col0, t2, g_scale):
        if row < seqlen:
            for dt in range(DT_W):
                col = col0 + 8 * dt + t2
                if col < HEAD_DIM:  # HEAD_DIM is a multiple of 8: col + 1 is in as well
                    dst[b, row, h, col] = store(C[dt, 2 * half] * g_scale)
                    dst[b, row, h, col + 1] = store(C[dt, 2 * half + 1] * g_scale)

    return store_row
