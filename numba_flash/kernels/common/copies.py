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
of one tile together, from global addresses (``cp_async_16_zfill_at``), each row's page and slot
read from a small row table in shared memory that the tile's owners wrote a tile earlier
(``make_paged_rows``: thread t looks up row t, its table read issued two tiles ahead). Each of
a row's CHUNK_SLOTS copying threads looking the row up itself, with 64-bit index products, cost
a paged tile half again the instructions of an unpaged one (0.53-0.71x the unpaged forward on an
H200). A row whose entry is not a page reads nothing, is zero-filled (as a row past the sequence
is) and is reported by its owner.

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


ROW_WORDS = 2  # 32-bit words a key row takes in the shared row table: its page and slot


def make_paged_steps(copy_paged_kv, THREADS, NROWS):
    """``(paged_first, paged_next)``: the paged K/V pipeline of a forward kernel whose tiles
    are NROWS keys, around its ``copy_paged_kv`` (the third function of either tile factory).

    The block table's rows go through a row table in shared memory, ``words`` from word
    ``rows_w``: two buffers of NROWS rows, ROW_WORDS words each (its page plus one, 0 for a row
    that reads as zeros, and its slot). Thread ``t < NROWS`` owns row t of every tile: it reads the
    row's table entry two tiles before the tile is copied, so that the read's latency hides
    behind the products of a tile, and writes the row's page and slot a tile before, which every
    copying thread reads after the next barrier.

        paged_first(smem, words, rows_w, k_off, v_off, k, v, block_table, b, hk, seqlen, r0, c,
                    status) -> entry
            rows of tiles 0 and 1 written, a barrier, tile 0's copies issued; returns the
            entry of tile 2 (its read in flight)
        paged_next(smem, words, rows_w, k_off, v_off, k, v, block_table, b, hk, j, seqlen, r0,
                   c, entry, status) -> entry
            after the barrier of tile j: tile j + 1's copies issued, tile j + 2's rows written
            over tile j's, tile j + 3's entry read

    The page and slot of a key: shifts for a page size that is a power of two (the sizes
    serving engines use), else an unsigned division."""
    assert THREADS >= NROWS
    table_entry = make_page_lookup(NO_PAGE)[0]
    TABLE = ROW_WORDS * NROWS  # words of one buffer

    @cuda.jit(device=True, inline="always")
    def block_of(n, page_size):
        size = uint32(page_size)
        if size & (size - uint32(1)) == 0:
            return uint32(n) >> cuda.popc(size - uint32(1))
        return uint32(n) // size

    @cuda.jit(device=True, inline="always")
    def fetch_entry(block_table, b, n, seqlen, page_size):
        entry = NO_PAGE
        if n < seqlen:
            entry = table_entry(block_table, b, block_of(n, page_size))
        return entry

    @cuda.jit(device=True, inline="always")
    def publish_row(words, at, entry, n, seqlen, num_pages, page_size, status):
        t = cuda.threadIdx.x
        page = NO_PAGE
        if n < seqlen:
            if entry >= 0 and entry < num_pages:
                page = entry
            else:
                report(status, BAD_TABLE_ENTRY)
        words[at + ROW_WORDS * t] = uint32(page + 1)  # 0: NO_PAGE (the words are unsigned)
        words[at + ROW_WORDS * t + 1] = uint32(n - block_of(n, page_size) * uint32(page_size))

    @cuda.jit(device=True, inline="always")
    def paged_first(smem, words, rows_w, k_off, v_off, k, v, block_table, b, hk, seqlen, r0, c,
                    status):
        t = cuda.threadIdx.x
        entry = NO_PAGE
        if t < NROWS:
            for tile in range(2):
                n = tile * NROWS + t
                publish_row(words, rows_w + tile * TABLE,
                            fetch_entry(block_table, b, n, seqlen, k.shape[1]), n, seqlen,
                            k.shape[0], k.shape[1], status)
            entry = fetch_entry(block_table, b, 2 * NROWS + t, seqlen, k.shape[1])
        cuda.syncthreads()
        copy_paged_kv(smem, words, rows_w, k_off, v_off, k, v, hk, NROWS, r0, c)
        return entry

    @cuda.jit(device=True, inline="always")
    def paged_next(smem, words, rows_w, k_off, v_off, k, v, block_table, b, hk, j, seqlen, r0,
                   c, entry, status):
        copy_paged_kv(smem, words, rows_w + ((j + 1) & 1) * TABLE, k_off, v_off, k, v, hk,
                      NROWS, r0, c)
        t = cuda.threadIdx.x
        if t < NROWS:
            n = (j + 2) * NROWS + t
            publish_row(words, rows_w + (j & 1) * TABLE, entry, n, seqlen, k.shape[0],
                        k.shape[1], status)
            entry = fetch_entry(block_table, b, n + NROWS, seqlen, k.shape[1])
        return entry

    return paged_first, paged_next


@cuda.jit(device=True, inline="always")
def _row_addresses(k_head, v_head, page, slot, k, v):
    """Global addresses of row ``slot`` of page ``page`` in K and V, from their addresses at
    page 0, row 0 (this thread's head and column): 32 x 32-bit products (one IMAD.WIDE each;
    the host checks that page and row strides fit in 32 bits), where an element index would
    take 64-bit products of all four indices, twice."""
    p, s = uint64(uint32(page)), uint64(uint32(slot))
    return (k_head + p * uint64(uint32(k.strides[0])) + s * uint64(uint32(k.strides[1])),
            v_head + p * uint64(uint32(v.strides[0])) + s * uint64(uint32(v.strides[1])))


def _make_paged_kv_copy(HEAD_DIM, DPAD, THREADS, column, tile_at):
    """The third function of either tile factory, ``copy_paged_kv(smem, words, rows_at, k_off,
    v_off, k, v, head, NROWS, r0, c)``, for its layout: ``column(c)`` is the element column of
    the thread's chunk slot ``c`` (as its ``copy_slot`` gives it), ``tile_at(r, col, NROWS)``
    the element offset of row r, column col in a tile."""
    CHUNKS, CHUNK_SLOTS, ROWS_PER_PASS, _ = _geometry(DPAD, THREADS)
    column = cuda.jit(device=True, inline="always")(column)
    copy16_at = memory.cp_async_16_zfill_at

    @cuda.jit(device=True, inline="always")
    def copy_paged_kv(smem, words, rows_at, k_off, v_off, k, v, head, NROWS, r0, c):
        col = column(c)
        if CHUNKS == CHUNK_SLOTS or col < DPAD:  # the thread's chunk slot lies in the row
            src_col = col if col < HEAD_DIM else 0
            k_head = memory.global_address(k, (0, 0, head, src_col))
            v_head = memory.global_address(v, (0, 0, head, src_col))
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    page = int32(words[rows_at + ROW_WORDS * r]) - 1
                    ok = page >= 0 and col < HEAD_DIM
                    k_at, v_at = _row_addresses(k_head, v_head, max(page, 0),
                                                words[rows_at + ROW_WORDS * r + 1], k, v)
                    at = tile_at(r, col, NROWS)
                    copy16_at(smem, k_off + at, k_at, ok)
                    copy16_at(smem, v_off + at, v_at, ok)

    return copy_paged_kv


def make_tile_copy(HEAD_DIM, DPAD, STRIDE, THREADS):
    """``(copy_slot, copy_rows, copy_paged_kv)``: ``copy_slot(tid) -> (r0, c)``, the thread's
    first row and its chunk's first column; ``copy_rows(smem, offset, src, b, row0, head, NROWS,
    seqlen, r0, c)`` issues the thread's copies of rows ``row0 .. row0 + NROWS - 1`` of ``src[b,
    :, head, :]`` into ``smem[offset + r * STRIDE + col]`` (rows past ``seqlen`` and padding
    columns: zeros); ``copy_paged_kv(smem, words, rows_at, k_off, v_off, k, v, head, NROWS, r0,
    c)`` the same for a tile of paged K and V into the tiles at ``k_off`` and ``v_off``, each
    row's page and slot read from the shared row table at word ``rows_at`` (``make_paged_rows``;
    page NO_PAGE: zeros)."""
    CHUNKS, CHUNK_SLOTS, ROWS_PER_PASS, TID_MASK = _geometry(DPAD, THREADS)
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
    def tile_at(r, col, NROWS):
        return r * STRIDE + col

    copy_paged_kv = _make_paged_kv_copy(HEAD_DIM, DPAD, THREADS, lambda c: c, tile_at)

    return copy_slot, copy_rows, copy_paged_kv


def make_swizzled_copy(HEAD_DIM, DPAD, THREADS, CHUNK_ELEMS=8):
    """``(copy_slot, copy_tile, copy_paged_kv)`` for wgmma tiles: DPAD (a multiple of 64)
    columns in the 128-byte-swizzle layout, the tile's NROWS rows a column block of ``NROWS x
    64`` elements each. ``copy_slot(tid) -> (r0, c)``, the thread's first row and its chunk
    column (in chunks); ``copy_tile(smem, offset, src, b, row0, head, NROWS, seqlen, r0, c)``
    issues the thread's copies of rows ``row0 .. row0 + NROWS - 1`` of ``src[b, :, head, :]``
    into the tile at ``offset`` (rows past ``seqlen`` and padding columns: zeros);
    ``copy_paged_kv`` as ``make_tile_copy``'s, into swizzled tiles. ``CHUNK_ELEMS``: elements of
    ``src`` per 16-byte chunk, 16 for an 8-bit source (``HEAD_DIM`` counts them; the tile's
    columns stay 16-bit units, two bytes each; paged copies take 16-bit sources only)."""
    CHUNKS, CHUNK_SLOTS, ROWS_PER_PASS, TID_MASK = _geometry(DPAD, THREADS)
    copy16 = memory.cp_async_16_zfill

    @cuda.jit(device=True, inline="always")
    def copy_slot(tid):
        return (tid & TID_MASK) // CHUNK_SLOTS, tid & (CHUNK_SLOTS - 1)

    @cuda.jit(device=True, inline="always")
    def copy_tile(smem, offset, src, b, row0, head, NROWS, seqlen, r0, c):
        if CHUNKS == CHUNK_SLOTS or c < CHUNKS:
            col = 8 * c
            first = CHUNK_ELEMS * c  # the chunk's first element of the source row
            src_col = first if first < HEAD_DIM else 0
            for i in range((NROWS + ROWS_PER_PASS - 1) // ROWS_PER_PASS):
                r = r0 + i * ROWS_PER_PASS
                if NROWS % ROWS_PER_PASS == 0 or r < NROWS:
                    valid = row0 + r < seqlen
                    copy16(smem, offset + wgmma.tile_offset(r, col, NROWS), src,
                           (b, row0 + r if valid else 0, head, src_col),
                           valid and first < HEAD_DIM)

    copy_paged_kv = _make_paged_kv_copy(HEAD_DIM, DPAD, THREADS, lambda c: 8 * c,
                                        wgmma.tile_offset)

    return copy_slot, copy_tile, copy_paged_kv
