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
of one tile together from the pages that ``make_page_fetch`` read from the table one tile
earlier. A table read waits for global memory, and the address of a row's copy waits for its
read: read just before the copies, the lookups put that wait (and an integer division per row)
in front of every tile, which ran paged tiles at 0.53-0.71x the unpaged ones on an H200. Read a
tile ahead, they land while the tile before is computed. A row whose entry is not a page reads
nothing, is zero-filled (as a row past the sequence is) and is reported.

Every 16-byte copy needs a 16-byte aligned global address: rows and the data pointer must be
multiples of 16 bytes, which the host checks before it launches a kernel built on this.
"""

from numba import cuda, int32, uint32, uint64

from ..instructions import memory, wgmma
from .paged_kv import make_page_lookup
from .status import BAD_TABLE_ENTRY, report

NO_PAGE = -1  # the fetched entry of a row past the sequence or the table


def _geometry(DPAD, THREADS):
    """(CHUNKS, CHUNK_SLOTS, ROWS_PER_PASS, TID_MASK) of a tile copy: 16-byte chunks of a row,
    that rounded up to a power of two, the rows one pass of THREADS threads covers, and a mask
    of all bits of any thread index."""
    CHUNKS = DPAD // 8
    CHUNK_SLOTS = 1 << (CHUNKS - 1).bit_length()
    return CHUNKS, CHUNK_SLOTS, THREADS // CHUNK_SLOTS, (1 << (THREADS - 1).bit_length()) - 1


@cuda.jit(device=True, inline="always")
def _page_steps(n, page_size, rows_per_pass):
    """(slot, slot_step, blk, blk_step): key n's slot and block, and what a step of
    ``rows_per_pass`` keys adds to each: two shifts for a page size that is a power of two (the
    sizes serving engines use), else two unsigned divisions (about 20 instructions each)."""
    size = uint32(page_size)
    if size & (size - uint32(1)) == 0:
        shift = cuda.popc(size - uint32(1))
        blk = uint32(n) >> shift
        blk_step = uint32(rows_per_pass) >> shift
    else:
        blk = uint32(n) // size
        blk_step = uint32(rows_per_pass) // size
    return (int32(n - blk * size), int32(rows_per_pass - blk_step * size), int32(blk),
            int32(blk_step))


def make_page_fetch(DPAD, THREADS, NROWS):
    """``(PAGE_ROWS, fetch_pages)``: ``fetch_pages(entries, block_table, b, row0, seqlen, r0,
    page_size)`` reads into ``entries`` (PAGE_ROWS int32, local) the table entries of this
    thread's rows ``row0 + r0 + i * ROWS_PER_PASS`` of an NROWS-key tile of batch entry b
    (NO_PAGE past ``seqlen`` or the table's width), for ``copy_paged_kv`` a tile later."""
    ROWS_PER_PASS = _geometry(DPAD, THREADS)[2]
    PAGE_ROWS = (NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS
    table_entry = make_page_lookup(NO_PAGE)[0]

    @cuda.jit(device=True, inline="always")
    def fetch_pages(entries, block_table, b, row0, seqlen, r0, page_size):
        n = row0 + r0
        slot, slot_step, blk, blk_step = _page_steps(n, page_size, ROWS_PER_PASS)
        for i in range(PAGE_ROWS):
            entry = NO_PAGE
            if (NROWS % ROWS_PER_PASS == 0 or r0 + i * ROWS_PER_PASS < NROWS) and \
                    n + i * ROWS_PER_PASS < seqlen:
                entry = table_entry(block_table, b, blk)
            entries[i] = entry
            slot += slot_step
            blk += blk_step
            if slot >= page_size:
                slot -= page_size
                blk += 1

    return PAGE_ROWS, fetch_pages


@cuda.jit(device=True, inline="always")
def _paged_source(entry, n, seqlen, slot, num_pages, status):
    """(page, slot, valid) of a key row from its fetched table entry: (0, 0, False), a
    zero-filled copy from row 0, past ``seqlen`` or for an entry that is not a page (reported)."""
    valid = n < seqlen
    if valid and not (entry >= 0 and entry < num_pages):
        report(status, BAD_TABLE_ENTRY)
        valid = False
    if not valid:
        entry, slot = 0, 0
    return entry, slot, valid


@cuda.jit(device=True, inline="always")
def _row_addresses(k_head, v_head, page, slot, k, v):
    """Global addresses of row ``slot`` of page ``page`` in K and V, from their addresses at
    page 0, row 0 (this thread's head and column): 32 x 32-bit products (one IMAD.WIDE each;
    the host checks that page and row strides fit in 32 bits), where an element index would
    take 64-bit products of all four indices, twice."""
    p, s = uint64(uint32(page)), uint64(uint32(slot))
    return (k_head + p * uint64(uint32(k.strides[0])) + s * uint64(uint32(k.strides[1])),
            v_head + p * uint64(uint32(v.strides[0])) + s * uint64(uint32(v.strides[1])))


def make_tile_copy(HEAD_DIM, DPAD, STRIDE, THREADS):
    """``(copy_slot, copy_rows, copy_paged_kv)``: ``copy_slot(tid) -> (r0, c)``, the thread's
    first row and its chunk's first column; ``copy_rows(smem, offset, src, b, row0, head, NROWS,
    seqlen, r0, c)`` issues the thread's copies of rows ``row0 .. row0 + NROWS - 1`` of ``src[b,
    :, head, :]`` into ``smem[offset + r * STRIDE + col]`` (rows past ``seqlen`` and padding
    columns: zeros); ``copy_paged_kv(smem, k_off, v_off, k, v, entries, row0, head, NROWS,
    seqlen, r0, c, status)`` the same for keys ``row0 ..`` from paged K and V into the tiles at
    ``k_off`` and ``v_off``, from the pages ``make_page_fetch`` read into ``entries``."""
    CHUNKS, CHUNK_SLOTS, ROWS_PER_PASS, TID_MASK = _geometry(DPAD, THREADS)
    copy16, copy16_at = memory.cp_async_16_zfill, memory.cp_async_16_zfill_at

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
    def copy_paged_kv(smem, k_off, v_off, k, v, entries, row0, head, NROWS, seqlen, r0, c,
                      status):
        if CHUNKS == CHUNK_SLOTS or c < DPAD:
            col = c if c < HEAD_DIM else 0
            k_head = memory.global_address(k, (0, 0, head, col))
            v_head = memory.global_address(v, (0, 0, head, col))
            n = row0 + r0
            slot, slot_step, _, _ = _page_steps(n, k.shape[1], ROWS_PER_PASS)
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    page, s, valid = _paged_source(entries[i], n + i * ROWS_PER_PASS, seqlen,
                                                   slot, k.shape[0], status)
                    ok = valid and c < HEAD_DIM
                    k_at, v_at = _row_addresses(k_head, v_head, page, s, k, v)
                    copy16_at(smem, k_off + r * STRIDE + c, k_at, ok)
                    copy16_at(smem, v_off + r * STRIDE + c, v_at, ok)
                slot += slot_step
                if slot >= k.shape[1]:
                    slot -= k.shape[1]

    return copy_slot, copy_rows, copy_paged_kv


def make_swizzled_copy(HEAD_DIM, DPAD, THREADS):
    """``(copy_slot, copy_tile, copy_paged_kv)`` for wgmma tiles: DPAD (a multiple of 64)
    columns in the 128-byte-swizzle layout, the tile's NROWS rows a column block of ``NROWS x
    64`` elements each. ``copy_slot(tid) -> (r0, c)``, the thread's first row and its chunk
    column (in chunks); ``copy_tile(smem, offset, src, b, row0, head, NROWS, seqlen, r0, c)``
    issues the thread's copies of rows ``row0 .. row0 + NROWS - 1`` of ``src[b, :, head, :]``
    into the tile at ``offset`` (rows past ``seqlen`` and padding columns: zeros);
    ``copy_paged_kv`` as ``make_tile_copy``'s, into swizzled tiles."""
    CHUNKS, CHUNK_SLOTS, ROWS_PER_PASS, TID_MASK = _geometry(DPAD, THREADS)
    copy16, copy16_at = memory.cp_async_16_zfill, memory.cp_async_16_zfill_at

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
    def copy_paged_kv(smem, k_off, v_off, k, v, entries, row0, head, NROWS, seqlen, r0, c,
                      status):
        if CHUNKS == CHUNK_SLOTS or c < CHUNKS:
            col = 8 * c
            src_col = col if col < HEAD_DIM else 0
            k_head = memory.global_address(k, (0, 0, head, src_col))
            v_head = memory.global_address(v, (0, 0, head, src_col))
            n = row0 + r0
            slot, slot_step, _, _ = _page_steps(n, k.shape[1], ROWS_PER_PASS)
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    page, s, valid = _paged_source(entries[i], n + i * ROWS_PER_PASS, seqlen,
                                                   slot, k.shape[0], status)
                    at = wgmma.tile_offset(r, col, NROWS)
                    ok = valid and col < HEAD_DIM
                    k_at, v_at = _row_addresses(k_head, v_head, page, s, k, v)
                    copy16_at(smem, k_off + at, k_at, ok)
                    copy16_at(smem, v_off + at, v_at, ok)
                slot += slot_step
                if slot >= k.shape[1]:
                    slot -= k.shape[1]

    return copy_slot, copy_tile, copy_paged_kv
