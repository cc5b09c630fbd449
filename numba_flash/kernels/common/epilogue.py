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

Fragment stores
    The backward kernels write dQ, dK, dV once per CTA, after a whole loop of products, so they
    store straight from the accumulator fragments (``make_fragment_store``): two adjacent 16-bit
    elements per thread and 8-column tile, only where row and columns exist.
"""

import math

from numba import cuda, float32

from ..instructions import memory
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
