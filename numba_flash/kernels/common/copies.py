"""Tiles of rows global -> shared with 16-byte ``cp.async``, zero-filled past the sequence end.

Two layouts: padded rows (``make_tile_copy``, the mma.sync kernels' ``ldmatrix`` tiles) and
wgmma's 128-byte swizzle (``make_swizzled_copy``: ``ptx/layout.py`` ``tile_offset``).

A tile is NROWS rows of one head of a (B, S, H, D) tensor, each row ``DPAD`` 16-bit elements
(HEAD_DIM rounded up to the mma k-step; the padding columns are zero-filled) at ``STRIDE``
elements apart in shared memory. A row is ``CHUNKS = DPAD / 8`` chunks of 16 bytes; thread
``tid`` always copies chunk column ``tid % CHUNK_SLOTS`` (CHUNKS rounded up to a power of two)
of rows ``tid // CHUNK_SLOTS + pass * ROWS_PER_PASS``, so all index arithmetic but the row
offset is done once per kernel (``copy_slot``). An invalid chunk reads from row 0 of its own
column with the zero-fill size, so no address outside the tensor is formed.

Paged K/V (varlen over a block table): each factory's third function copies the K and V rows
of one tile together, each row's page and slot looked up once for both (``paged_kv.make_key_row``);
a row whose block is past the table or whose entry is not a page reads nothing and is
zero-filled, as a row past the sequence is.

Every 16-byte copy needs a 16-byte aligned global address: rows and the data pointer must be
multiples of 16 bytes, which the host checks before it launches a kernel built on this.
"""

from numba import cuda

from ..instructions import memory, wgmma
from .paged_kv import make_key_row

key_row = make_key_row(True)


@cuda.jit(device=True, inline="always")
def paged_row(k, block_table, b, n, seqlen, status):
    """(page, slot, valid) of key ``n`` of batch entry ``b`` behind the block table; keys past
    ``seqlen`` and bad table entries give (0, 0, False): a zero-filled copy from row 0."""
    page, slot, valid = 0, 0, False
    if n < seqlen:
        page, slot, valid = key_row(k, block_table, b, n, status)
        if not valid:
            page, slot = 0, 0
    return page, slot, valid


def make_tile_copy(HEAD_DIM, DPAD, STRIDE, THREADS):
    """``(copy_slot, copy_rows, copy_paged_kv)``: ``copy_slot(tid) -> (r0, c)``, the thread's
    first row and its chunk's first column; ``copy_rows(smem, offset, src, b, row0, head, NROWS,
    seqlen, r0, c)`` issues the thread's copies of rows ``row0 .. row0 + NROWS - 1`` of ``src[b,
    :, head, :]`` into ``smem[offset + r * STRIDE + col]`` (rows past ``seqlen`` and padding
    columns: zeros); ``copy_paged_kv(smem, k_off, v_off, k, v, block_table, b, row0, head, NROWS,
    seqlen, r0, c, status)`` the same for keys ``row0 ..`` of batch entry b from paged K and V
    into the tiles at ``k_off`` and ``v_off``."""
    CHUNKS = DPAD // 8
    CHUNK_SLOTS = 1 << (CHUNKS - 1).bit_length()
    ROWS_PER_PASS = THREADS // CHUNK_SLOTS
    TID_MASK = (1 << (THREADS - 1).bit_length()) - 1  # all bits of any tid
    copy16 = memory.cp_async_16_zfill

    @cuda.jit(device=True, inline="always")
    def copy_slot(tid):
        return (tid & TID_MASK) // CHUNK_SLOTS, (tid & (CHUNK_SLOTS - 1)) * 8

    @cuda.jit(device=True, inline="always")
    def copy_rows(smem, offset, src, b, row0, head, NROWS, seqlen, r0, c):
        if CHUNKS == CHUNK_SLOTS or c < DPAD:  # the thread's chunk slot lies in the row
            col = c if c < HEAD_DIM else 0
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    valid = row0 + r < seqlen
                    copy16(smem, offset + r * STRIDE + c, src,
                           (b, row0 + r if valid else 0, head, col), valid and c < HEAD_DIM)

    @cuda.jit(device=True, inline="always")
    def copy_paged_kv(smem, k_off, v_off, k, v, block_table, b, row0, head, NROWS, seqlen, r0, c,
                      status):
        if CHUNKS == CHUNK_SLOTS or c < DPAD:
            col = c if c < HEAD_DIM else 0
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    page, slot, valid = paged_row(k, block_table, b, row0 + r, seqlen, status)
                    ok = valid and c < HEAD_DIM
                    copy16(smem, k_off + r * STRIDE + c, k, (page, slot, head, col), ok)
                    copy16(smem, v_off + r * STRIDE + c, v, (page, slot, head, col), ok)

    return copy_slot, copy_rows, copy_paged_kv


def make_swizzled_copy(HEAD_DIM, DPAD, THREADS):
    """``(copy_slot, copy_tile, copy_paged_kv)`` for wgmma tiles: DPAD (a multiple of 64)
    columns in the 128-byte-swizzle layout, the tile's NROWS rows a column block of ``NROWS x
    64`` elements each. ``copy_slot(tid) -> (r0, c)``, the thread's first row and its chunk
    column (in chunks); ``copy_tile(smem, offset, src, b, row0, head, NROWS, seqlen, r0, c)``
    issues the thread's copies of rows ``row0 .. row0 + NROWS - 1`` of ``src[b, :, head, :]``
    into the tile at ``offset`` (rows past ``seqlen`` and padding columns: zeros);
    ``copy_paged_kv`` as ``make_tile_copy``'s, into swizzled tiles."""
    CHUNKS = DPAD // 8
    CHUNK_SLOTS = 1 << (CHUNKS - 1).bit_length()
    ROWS_PER_PASS = THREADS // CHUNK_SLOTS
    TID_MASK = (1 << (THREADS - 1).bit_length()) - 1  # all bits of any tid
    copy16 = memory.cp_async_16_zfill

    @cuda.jit(device=True, inline="always")
    def copy_slot(tid):
        return (tid & TID_MASK) // CHUNK_SLOTS, tid & (CHUNK_SLOTS - 1)

    @cuda.jit(device=True, inline="always")
    def copy_tile(smem, offset, src, b, row0, head, NROWS, seqlen, r0, c):
        if CHUNKS == CHUNK_SLOTS or c < CHUNKS:
            col = 8 * c
            src_col = col if col < HEAD_DIM else 0
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    valid = row0 + r < seqlen
                    copy16(smem, offset + wgmma.tile_offset(r, col, NROWS), src,
                           (b, row0 + r if valid else 0, head, src_col), valid and col < HEAD_DIM)

    @cuda.jit(device=True, inline="always")
    def copy_paged_kv(smem, k_off, v_off, k, v, block_table, b, row0, head, NROWS, seqlen, r0, c,
                      status):
        if CHUNKS == CHUNK_SLOTS or c < CHUNKS:
            col = 8 * c
            src_col = col if col < HEAD_DIM else 0
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    page, slot, valid = paged_row(k, block_table, b, row0 + r, seqlen, status)
                    at = wgmma.tile_offset(r, col, NROWS)
                    ok = valid and col < HEAD_DIM
                    copy16(smem, k_off + at, k, (page, slot, head, src_col), ok)
                    copy16(smem, v_off + at, v, (page, slot, head, src_col), ok)

    return copy_slot, copy_tile, copy_paged_kv
