"""The paged-KV walk of the MLA decode: which piece of which request a CTA computes, where a
cache row lives, how it is copied into shared memory, and where a finished row goes.

A FlashMLA plan (``scheduler.py``) deals every request's keys out to ``num_sm_parts`` parts in
blocks of ``SCHED_BLOCK`` = 64 rows: metadata row ``part`` says which requests the part
touches (``BEGIN_REQ .. END_REQ``), where in the first and last it starts and stops
(``BEGIN_BLOCK``, ``END_BLOCK``), and the split slots of the pieces (``BEGIN_SPLIT``,
``FIRST_SPLIT``, ``LAST_SPLIT``). A request's keys sit in pages of ``page_size`` rows behind
its row of the block table: row ``pos`` is ``k_cache[block_table[req, pos // page_size], pos %
page_size]``. A piece that is a whole request writes the output (and the natural-log lse); a
split piece writes float32 partials and a base-2 lse to its slot of ``o_acc`` / ``lse_acc``,
which the combine kernel merges.

``make_paged_kv_walk`` returns the device functions, specialised for one decode configuration:

    cta_work(metadata, batch, status)        -> part, kv head, first packed row, first/last req
    piece_of(metadata, cache_seqlens, num_splits, part, req, begin_req, end_req, status)
                                             -> n_lo, n_hi, seqlen, split, slot
    row_source(block_table, num_pages, req, pos, n_end, page_size, status)
                                             -> page, slot, valid
    copy_row(tile, at, k_cache, hk, page, slot, valid, rl)   (this thread's share of a row:
                                             ``make_row_copy`` for HEAD_DIM columns)
    put(out, o_acc, split, req, slot, t, h, col, x, status)  (one output element)
    put_lse(lse, lse_acc, split, req, slot, t, h, m, l, status)  (a row's lse from m_i, l_i)

``make_kv_ring`` returns the ring of cache tiles the decodes of ordinary attention stream through
(V in its own cache, left padding, FP8 caches widened to 16 bits in shared memory:
``make_row_copy``, ``make_row_widen``).

``make_page_lookup`` returns the block-table lookup every decode goes through (``row_source``
above, the TMA tiles of the Hopper decodes): a table entry to a page of the cache, bounded, with
its status bit on a bad one. ``make_key_row`` is where a key of ordinary attention lies, in rows
or (paged varlen) behind the table: the SIMT forward's per-element lookup (the tensor-core
forwards go through a shared row table, ``copies.make_paged_steps``).

``make_piece_out`` returns how the tensor-core decodes write a finished piece's O_i: through
shared memory, so that whole rows leave as 16-byte stores. Written straight from the fragments,
one element per thread and column, the epilogue was about 5,900 instructions run once per piece:
17% of the warp samples of a 4k-key, h_q = 128 decode on an H200, mostly waiting for instruction
fetch (Nsight Compute):

    stage(smem_words, smem_f32, at, O_i, col0, r, half, t2, inv, split)
        a thread's fragment row ``half`` (packed row r, columns col0 + 8 dt + t2, + 1) times
        ``inv`` into the staged tile at word ``at``: float32 for a split piece, else 16-bit
    write(out, o_acc, smem, smem_f32, at, split, req, slot, m0, q_rows, group, hk, warp, lane,
          status)  every warp copies rows warp, warp + WARPS, ... of the staged tile out

``make_row_keys`` returns what the tensor-core decodes do with each thread's two fragment rows:

    start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, row0)
        at a piece's start: the keys rows row0 and row0 + 8 may see, m_i, l_i and O_i reset
    mask_keys(S, limit, key0)  S past each row's limit -> -inf (key0: the thread's first key)

and ``make_row_modifiers`` what ordinary attention's decode adds to them (a sliding window,
softcap, ALiBi).

Values only the device sees are bounded here, so no metadata, length or table entry can move an
access outside its array: a part whose first request is not in the batch is idle and its last
request is clamped to the batch; a piece never starts before key 0; every decode reads the
lengths in ``piece_of``, where a negative one leaves the piece empty, as length 0 does (the
planner, ``simt/mla_metadata.py``, reads it as 0 too); a cache row whose block lies
past the table's width, or whose page number is not a page of the cache, reads nothing and is
zero-filled (as rows past the piece end are); a partial result whose slot is not a row of the
accumulators is not written. Each of these sets its bit of the status word (``status.py``).
"""

import math

import numpy as np
from numba import cuda, float32, int32, uint16, uint32, uint64

from ... import scheduler
from ..instructions import convert, memory
from . import constants, formats
from .score_mods import make_score_mods
from .status import (BAD_INDEX, BAD_METADATA, BAD_SPLITS, BAD_TABLE_ENTRY, NEGATIVE_LENGTH,
                     PAST_TABLE, report)

SCHED_BLOCK = scheduler.BLOCK_N  # keys per scheduling block (64)


def make_page_lookup(NO_PAGE):
    """(table_entry, page_of, lookup): the page behind block ``blk`` of request ``req``, the one
    bounds check of every decode's block-table reads. A block past the table's width or an
    entry that is not a page of the cache gives (NO_PAGE, False) and sets its status bit.

        table_entry(block_table, req, blk)  -> the entry as stored, NO_PAGE past the width
        page_of(entry, blk, block_table, num_pages, status)  -> (page, valid) from that entry
        lookup(block_table, num_pages, req, blk, status)     -> (page, valid): both in one

    ``table_entry`` lets a caller read the entry well before its use (a test of the loaded value
    waits for the load); it indexes with uint64, as both indices are never negative. ``lookup``
    reads with the caller's own index types."""

    @cuda.jit(device=True, inline="always")
    def table_entry(block_table, req, blk):
        entry = NO_PAGE
        if blk < block_table.shape[1]:
            entry = block_table[uint64(req), uint64(blk)]  # both >= 0: no wraparound code
        return entry

    @cuda.jit(device=True, inline="always")
    def page_of(entry, blk, block_table, num_pages, status):
        page = NO_PAGE
        valid = blk < block_table.shape[1]
        if valid:
            valid = entry >= 0 and entry < num_pages
            if valid:
                page = entry
            else:
                report(status, BAD_TABLE_ENTRY)
        else:
            report(status, PAST_TABLE)
        return page, valid

    @cuda.jit(device=True, inline="always")
    def lookup(block_table, num_pages, req, blk, status):
        entry = NO_PAGE
        if blk < block_table.shape[1]:
            entry = block_table[req, blk]
        return page_of(entry, blk, block_table, num_pages, status)

    return table_entry, page_of, lookup


def make_key_row(PAGED, NO_PAGE=-1):
    """Device function ``key_row(k, block_table, b, n, status) -> (bb, row, valid)``: where key
    ``n`` of batch entry ``b`` lies in ``k``. Dense and packed rows: ``k[b, n]``. Paged
    (``PAGED``, k (num_pages, page_size, H, D)): slot ``n % page_size`` of page
    ``block_table[b, n // page_size]``, not valid (and its status bit set, ``make_page_lookup``)
    when that block lies past the table's width or its entry is not a page of k. The attention
    kernels' paged K/V reads go through here; n >= 0, so the division is unsigned."""
    table_entry, page_of, _ = make_page_lookup(NO_PAGE)

    @cuda.jit(device=True, inline="always")
    def in_rows(k, block_table, b, n, status):
        return b, n, True

    @cuda.jit(device=True, inline="always")
    def in_pages(k, block_table, b, n, status):
        page_size = uint32(k.shape[1])
        blk = uint32(n) // page_size
        page, valid = page_of(table_entry(block_table, b, blk), blk, block_table, k.shape[0],
                              status)
        return page, n - blk * page_size, valid

    return in_pages if PAGED else in_rows


# DeepSeek-V3.2's FP8 cache row (``CACHE = "v32"``): 512 e4m3 latent values, their four float32
# scales (one per 128 values), then 64 bfloat16 rope values: 656 bytes for 576 tile columns.
V32_LATENT, V32_BLOCK, V32_ROPE = 512, 128, 64
V32_SCALES = V32_LATENT  # byte offset of the scales,
V32_ROPE_AT = V32_LATENT + 4 * (V32_LATENT // V32_BLOCK)  # ... of the rope values
V32_ROW_BYTES = V32_ROPE_AT + 2 * V32_ROPE  # 656


def make_row_copy(COLS, TPR, FMT, VEC, CACHE=None, PLACE=None):
    """copy_row(tile, at, cache, hk, page, slot, valid, rl): this thread's share (lane ``rl`` of
    the TPR threads of a row) of the first COLS columns of one cache row -> tile[at ...]
    (storage elements): 16-byte cp.async chunks (zero-filled when not valid) or, for unaligned
    views (``VEC`` False), elements. ``PLACE(at, c, origin)``: where the row's 16-byte chunk c
    of the tile lies, for a swizzled tile (``VEC``; ``tc/mla_decode_wgmma.py``'s rule), given
    the shared address of the array's first byte (a swizzle follows absolute addresses); None:
    the row's chunks one after another from ``at``.

    ``CACHE`` names the cache's bytes when they are not the tile's FMT (16-bit) values:

    ``"e4m3"``  float8_e4m3fn values. A 16-byte chunk holds 16 of them, and lands in the upper
                half of the 32 bytes they take in the tile; ``make_row_widen`` turns them into
                16-bit values in place once they have landed. The element path converts as it
                copies.
    ``"v32"``   DeepSeek-V3.2's 656-byte rows (``V32_*``), COLS = 576 bfloat16 columns, ``VEC``
                only: the 32 latent chunks land as e4m3 chunks do, the 8 rope chunks (columns
                512-575) as they are, and every lane also copies the row's 16 bytes of scales
                into the lower half of its first latent chunk's place (its own copy: it widens
                its chunks with them before any other thread may look)."""
    FP8, V32 = CACHE is not None, CACHE == "v32"  # (kernels test booleans, not None)
    item = 1 if FP8 else 4 if FMT == "float32" else 2  # bytes per cache element
    CHUNK = memory.CP_ASYNC_BYTES // item  # elements per 16-byte copy
    LAND = CHUNK // 2 if FP8 else 0  # tile elements before the chunk's landing place
    PER = 2 if FP8 else 1  # tile chunks a copied chunk fills (it lands in the last)
    PLACED = PLACE is not None
    LATENT = V32_LATENT if V32 else COLS  # the columns copied as CHUNK-chunks
    CHUNKS = -(-(LATENT // CHUNK) // TPR)  # copies per thread and row
    CHUNKS_EXACT = (LATENT // CHUNK) % TPR == 0
    ROPE_CHUNKS = -(-(2 * V32_ROPE // memory.CP_ASYNC_BYTES) // TPR)  # ("v32")
    ROPE_PER_ROW = 2 * V32_ROPE // memory.CP_ASYNC_BYTES
    ZERO_BITS = np.float32(0) if FMT == "float32" else np.uint16(0)  # +0.0 in every format
    assert CACHE in (None, "e4m3", "v32")
    assert not CACHE or FMT in ("float16", "bfloat16")
    assert not (CACHE and VEC) or LATENT % CHUNK == 0
    assert CACHE != "v32" or (VEC and COLS == V32_LATENT + V32_ROPE and FMT == "bfloat16")
    fp8_to_f32, store = convert.e4m3_to_f32, formats.storer(FMT)

    @cuda.jit(device=True, inline="always")
    def copy_row(tile, at, cache, hk, page, slot, valid, rl):
        origin = memory.shared_address(tile, 0) if PLACED else 0
        if VEC:
            for i in range(CHUNKS):
                c = rl + TPR * i
                col = c * CHUNK
                if CHUNKS_EXACT or col < LATENT:
                    if PLACED:
                        dst = PLACE(at, PER * c + PER - 1, origin)
                    else:
                        dst = at + col + LAND
                    memory.cp_async_16_zfill(tile, uint64(dst), cache,
                                             (page, slot, hk, uint64(col)), valid)
            if V32:
                if rl * CHUNK < LATENT:  # the scales, beside the lane's first chunk
                    if PLACED:
                        dst = PLACE(at, PER * rl, origin)
                    else:
                        dst = at + rl * CHUNK
                    memory.cp_async_16_zfill(tile, uint64(dst), cache,
                                             (page, slot, hk, uint64(V32_SCALES)), valid)
                for i in range(ROPE_CHUNKS):
                    c = rl + TPR * i
                    if c < ROPE_PER_ROW:  # 8 bfloat16 columns per chunk
                        if PLACED:
                            dst = PLACE(at, V32_LATENT // 8 + c, origin)
                        else:
                            dst = at + V32_LATENT + 8 * c
                        memory.cp_async_16_zfill(tile, uint64(dst), cache,
                                                 (page, slot, hk, uint64(V32_ROPE_AT + 16 * c)),
                                                 valid)
        else:
            # A loop of run-time length (the row's COLS = its array's columns): unrolled, the
            # loads all run ahead of their stores and spill the decode's registers.
            for col in range(rl, cache.shape[3], TPR):
                x = ZERO_BITS
                if valid:
                    if FP8:
                        x = store(fp8_to_f32(cache[page, slot, hk, uint64(col)]))
                    else:
                        x = cache[page, slot, hk, uint64(col)]
                tile[uint64(at + col)] = x

    return copy_row


def make_row_widen(COLS, TPR, FMT, CACHE="e4m3", PLACE=None):
    """widen_row(words, at, rl): the chunks ``make_row_copy`` (``CACHE``, ``VEC``, ``PLACE``)
    landed for lane ``rl`` in the row at tile element ``at``, turned into FMT's 16-bit values in
    place. Each chunk's 16 bytes sit in the second of the two tile chunks its 32 bytes take, so
    the thread that copied it reads its 4 words before writing the 8, and no other thread
    touches them: after its own ``cp.async`` wait, before the barrier that hands the tile to the
    other warps.

    ``"e4m3"``: exactly (every e4m3 value is a float16 and a bfloat16). ``"v32"``: latent value
    ``x`` of block ``k`` becomes ``bf16(x * bf16(scale_k))``, FlashMLA's dequantization (exact
    for V3.2's power-of-two scales); the lane's copy of the scales is read first, as its first
    chunk's widening overwrites it."""
    CHUNK = memory.CP_ASYNC_BYTES  # e4m3 elements per copy
    V32 = CACHE == "v32"
    PLACED = PLACE is not None
    LATENT = V32_LATENT if V32 else COLS
    CHUNKS = -(-(LATENT // CHUNK) // TPR)
    CHUNKS_EXACT = (LATENT // CHUNK) % TPR == 0
    assert V32_LATENT // V32_BLOCK == 4
    CHUNKS_PER_BLOCK = V32_BLOCK // CHUNK
    widen = convert.widen_e4m3x2(FMT)
    to_f16x2 = convert.e4m3x2_to_f16x2
    unpack, pack = convert.unpack_f16x2, convert.pack_bf16x2

    @cuda.jit(device=True, inline="always")
    def put_word(words, w, a, scale):
        """4 e4m3 bytes -> words w and w + 1, two 16-bit values each (byte 0 lowest)."""
        if V32:
            x0, x1 = unpack(to_f16x2(uint16(a & 0xFFFF)))
            x2, x3 = unpack(to_f16x2(uint16(a >> 16)))
            words[uint64(w)] = pack(x0 * scale, x1 * scale)
            words[uint64(w + 1)] = pack(x2 * scale, x3 * scale)
        else:
            words[uint64(w)] = widen(uint16(a & 0xFFFF))
            words[uint64(w + 1)] = widen(uint16(a >> 16))

    @cuda.jit(device=True, inline="always")
    def scale_at(words, w):
        """The float32 scale in word w, rounded to bfloat16 (to nearest even)."""
        return convert.bf16_to_f32(convert.f32_to_bf16(convert.bits_to_f32(words[uint64(w)])))

    @cuda.jit(device=True, inline="always")
    def widen_chunk(words, at, c, s0, s1, s2, s3):
        """Copied chunk c of the row (latent block ``c // CHUNKS_PER_BLOCK``'s scale)."""
        origin = memory.shared_address(words, 0) if PLACED else 0
        col = c * CHUNK
        k = c // CHUNKS_PER_BLOCK
        scale = s0 if k == 0 else s1 if k == 1 else s2 if k == 2 else s3
        if PLACED:  # the first word of each destination chunk
            lo = PLACE(at, 2 * c, origin) >> 1
            hi = PLACE(at, 2 * c + 1, origin) >> 1
        else:
            lo = (at + col) >> 1
            hi = lo + 4
        a0 = words[uint64(hi)]
        a1 = words[uint64(hi + 1)]
        a2 = words[uint64(hi + 2)]
        a3 = words[uint64(hi + 3)]
        put_word(words, lo, a0, scale)
        put_word(words, lo + 2, a1, scale)
        put_word(words, hi, a2, scale)
        put_word(words, hi + 2, a3, scale)

    @cuda.jit(device=True, inline="always")
    def widen_row(words, at, rl):
        s0 = s1 = s2 = s3 = float32(1.0)  # the four blocks' scales (registers, not an array
        if V32 and rl * CHUNK < LATENT:  # indexed by the lane: local memory)
            if PLACED:
                w = PLACE(at, 2 * rl, memory.shared_address(words, 0)) >> 1
            else:
                w = (at + rl * CHUNK) >> 1
            s0, s1, s2, s3 = (scale_at(words, w), scale_at(words, w + 1),
                              scale_at(words, w + 2), scale_at(words, w + 3))
        if PLACED:
            # A loop of run-time length (lane rl's chunks): unrolled, the chunks' loads run
            # ahead of their stores and spill the wgmma decode's registers (44 bytes).
            for c in range(rl, LATENT // CHUNK, TPR):
                widen_chunk(words, at, c, s0, s1, s2, s3)
        else:
            for i in range(CHUNKS):
                c = rl + TPR * i
                if CHUNKS_EXACT or c * CHUNK < LATENT:
                    widen_chunk(words, at, c, s0, s1, s2, s3)

    return widen_row


def make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, VEC, SPARSE=False):
    """The walk's device functions for tiles of BLOCK_M packed query rows, TPR threads per
    copied cache row (``VEC``: 16-byte cp.async chunks, else element copies). ``SPARSE``: the
    block table holds each request's cache rows (``simt/sparse_indices.py``), key ``pos`` being
    row ``block_table[req, pos]`` = ``page * page_size + slot``."""
    store = formats.storer(FMT)
    NEG_INF, POS_INF, LN2 = constants.NEG_INF, constants.POS_INF, constants.LN2
    ZERO = float32(0.0)
    BEGIN_REQ, END_REQ, BEGIN_BLOCK, END_BLOCK = (scheduler.BEGIN_REQ, scheduler.END_REQ,
                                                  scheduler.BEGIN_BLOCK, scheduler.END_BLOCK)
    BEGIN_SPLIT, FIRST_SPLIT, LAST_SPLIT = (scheduler.BEGIN_SPLIT, scheduler.FIRST_SPLIT,
                                            scheduler.LAST_SPLIT)
    _, _, lookup = make_page_lookup(int32(0))

    @cuda.jit(device=True, inline="always")
    def cta_work(metadata, batch, status):
        """(part, KV head, first packed query row, first and last request) of this CTA; a part
        whose first request is not a request of the batch is idle (first request = batch), one
        whose last request is past the batch stops at its end."""
        part = cuda.blockIdx.x
        begin_req = metadata[part, BEGIN_REQ]
        end_req = metadata[part, END_REQ]
        if begin_req < 0 or (begin_req < batch and end_req >= batch):
            if cuda.threadIdx.x == 0:
                report(status, BAD_METADATA)
            if begin_req < 0:
                begin_req = batch
        return (part, cuda.blockIdx.y, cuda.blockIdx.z * BLOCK_M, begin_req,
                min(end_req, batch - 1))

    @cuda.jit(device=True, inline="always")
    def piece_of(metadata, cache_seqlens, num_splits, part, req, begin_req, end_req, status):
        """The piece of ``req`` this part handles (scheduler.part_pieces, on the device):
        keys [n_lo, n_hi), the request's length, whether it is split and its slot. A negative
        length gives n_hi < 0: no key, as for length 0."""
        first = req == begin_req
        last = req == end_req
        seqlen = cache_seqlens[req]
        if seqlen < 0:
            report(status, NEGATIVE_LENGTH)
        blk_lo = metadata[part, BEGIN_BLOCK] if first else 0
        blk_hi = metadata[part, END_BLOCK] if last else (max(seqlen - 1, 0) // SCHED_BLOCK + 1)
        piece = metadata[part, BEGIN_SPLIT] if first else 0
        split = metadata[part, FIRST_SPLIT] if first else (
            metadata[part, LAST_SPLIT] if last else 0)
        return (max(blk_lo, 0) * SCHED_BLOCK, min(blk_hi * SCHED_BLOCK, seqlen), seqlen, split,
                num_splits[req] + piece)

    @cuda.jit(device=True, inline="always")
    def row_source(block_table, num_pages, req, pos, n_end, page_size, status):
        """(page, slot, valid) of cache row ``pos``; a row at or past n_end reads no table
        entry, and one that ``lookup`` cannot place is not valid either: each gets page 0,
        slot 0 (an address inside the cache, never read)."""
        page = int32(0)
        slot = int32(0)
        valid = pos < n_end
        if SPARSE:  # (packed rows are rows of the cache; checked again all the same)
            if valid:
                valid = pos < block_table.shape[1]
            if valid:
                row = block_table[req, pos]
                valid = row >= 0 and row < num_pages * page_size
                if valid:
                    page = int32(convert.div_u32(row, page_size))
                    slot = row - page * page_size
                else:
                    report(status, BAD_INDEX)
        elif valid:  # 32-bit division (a 64-bit one is a subroutine call)
            pos32 = int32(pos)
            blk = int32(convert.div_u32(pos32, page_size))
            page, valid = lookup(block_table, num_pages, req, blk, status)
            if valid:
                slot = pos32 - blk * page_size
        return page, slot, valid

    copy_row = make_row_copy(HEAD_DIM, TPR, FMT, VEC)

    @cuda.jit(device=True, inline="always")
    def put(out, o_acc, split, req, slot, t, h, col, x, status):
        if split:
            if slot >= 0 and slot < o_acc.shape[0]:
                o_acc[slot, t, h, uint64(col)] = x
            else:
                report(status, BAD_SPLITS)
        else:
            out[req, t, h, uint64(col)] = store(x)

    @cuda.jit(device=True, inline="always")
    def put_lse(lse, lse_acc, split, req, slot, t, h, m, l, status):
        """Base-2 partial lse (split) or the final natural-log lse of a row (m_i, l_i)."""
        lse2 = NEG_INF if l == ZERO else m + math.log2(l)  # NaN stays NaN
        if split:
            if slot >= 0 and slot < lse_acc.shape[0]:
                lse_acc[slot, h, t] = lse2
            else:
                report(status, BAD_SPLITS)
        else:
            lse[req, h, t] = POS_INF if l == ZERO else lse2 * LN2

    return cta_work, piece_of, row_source, copy_row, put, put_lse


def make_kv_ring(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, TPR, FMT, VEC, RING_OFF,
                 KV_STRIDE, NSTAGES, SEPARATE_V, LEFTPAD, CACHE=None, SPARSE=False):
    """A ring of NSTAGES cache tiles in shared memory, NSTAGES - 1 of them in flight while one is
    computed: slot ``s`` at storage element ``RING_OFF + s BLOCK_N KV_STRIDE``, a tile row every
    KV_STRIDE elements holding the key's HEAD_DIM columns and, where V has its own cache
    (``SEPARATE_V``, ordinary attention), its HEAD_DIM_V value columns right after them, copied
    with the same table lookup. TPR threads share a row (lane ``rl = tid % TPR``), so thread
    ``tid`` copies the ROWS = BLOCK_N TPR / THREADS rows ``row + i THREADS / TPR`` (``row = tid
    / TPR``). ``LEFTPAD``: a sequence's key ``n`` is cache position ``key_start[req] + n``.
    ``CACHE`` (``make_row_copy``): ``"e4m3"`` (with ``SEPARATE_V``), both caches hold
    float8_e4m3fn bytes, or ``"v32"``, DeepSeek-V3.2's rows; they land as they are (half the
    bytes of a 16-bit cache on the way) and become the tile's 16-bit values (``make_row_widen``)
    when the tile is waited for, before its barrier: the compute reads the same tile either way
    (an e4m3 cache's descales are left to it). ``SPARSE``: ``make_paged_kv_walk``'s.

    The lanes of a row copy consecutive 16-byte chunks, so TPR sets how many bytes of one row a
    warp's copy instruction moves: 8 lanes, a whole 128-byte line (four 32-byte sectors, one L2
    request). At 2 lanes per row a warp's instruction asks for 16 one-sector pieces of 16 rows,
    and an H200 decode streaming K and V that way is bound by L2 requests near 2.7 TB/s (L2 94%
    busy, DRAM 58%: Nsight Compute, B 64, h_kv 8, 16k keys).

        first_key(key_start, req) -> cache position of the sequence's key 0
        ring_start(tile, k_cache, v_cache, block_table, num_pages, req, hk, key0, n_lo, n_hi,
                   row, rl, src, valid, page_size, status)
        ring_next(tile, words, k_cache, v_cache, block_table, num_pages, req, hk, key0, n0,
                  n_hi, rd, row, rl, src, valid, page_size, status)
    ``words`` is the shared buffer as uint32 (read only with ``CACHE``); ``src`` (int32 (2,
    ROWS)) and ``valid`` (boolean (ROWS,)), local arrays, carry the page, slot and validity of
    the thread's rows of the next tile, looked up a tile before their copies are issued.
    """
    SLOT = BLOCK_N * KV_STRIDE
    STEP = THREADS // TPR  # rows between a thread's rows
    ROWS = BLOCK_N // STEP
    assert ROWS * STEP == BLOCK_N
    WAIT = NSTAGES - 2  # copy groups left in flight when a tile is computed
    assert CACHE != "e4m3" or SEPARATE_V
    _, _, row_source, _, _, _ = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, VEC, SPARSE)
    copy_row = make_row_copy(HEAD_DIM, TPR, FMT, VEC, CACHE)
    V_CACHE = CACHE if SEPARATE_V else None  # (V's columns are K's otherwise)
    copy_v = make_row_copy(HEAD_DIM_V, TPR, FMT, VEC, V_CACHE)
    WIDEN = CACHE is not None and VEC  # (the element path converts as it copies)

    @cuda.jit(device=True, inline="always")
    def first_key(key_start, req):
        """Cache position of the sequence's key 0 (its left padding skipped)."""
        if LEFTPAD:
            return key_start[req]
        return int32(0)

    @cuda.jit(device=True, inline="always")
    def look_up_row(src, valid, i, block_table, num_pages, req, pos, n_end, page_size, status):
        page, pslot, ok = row_source(block_table, num_pages, req, pos, n_end, page_size, status)
        src[0, i] = page
        src[1, i] = pslot
        valid[i] = ok

    @cuda.jit(device=True, inline="always")
    def copy_tile_row(tile, at, k_cache, v_cache, hk, src, valid, i, rl):
        copy_row(tile, at, k_cache, hk, src[0, i], src[1, i], valid[i], rl)
        if SEPARATE_V:
            copy_v(tile, at + HEAD_DIM, v_cache, hk, src[0, i], src[1, i], valid[i], rl)

    if WIDEN:
        widen_k = make_row_widen(HEAD_DIM, TPR, FMT, CACHE)
        widen_v = make_row_widen(HEAD_DIM_V, TPR, FMT, V_CACHE or CACHE)

        @cuda.jit(device=True, inline="always")
        def widen_tile_row(words, at, rl):
            widen_k(words, at, rl)
            if SEPARATE_V:
                widen_v(words, at + HEAD_DIM, rl)
    else:
        @cuda.jit(device=True, inline="always")
        def widen_tile_row(words, at, rl):
            return None

    # The sources of the thread's rows of the tile whose row ``row`` is cache row pos, and their
    # copies into the tile row at ``at`` and on. One row takes no loop: its array entries are
    # registers from the start (a loop of one trip, removed late, gave ptxas another schedule).
    if ROWS == 1:
        @cuda.jit(device=True, inline="always")
        def look_up(src, valid, block_table, num_pages, req, pos, n_end, page_size, status):
            look_up_row(src, valid, 0, block_table, num_pages, req, pos, n_end, page_size, status)

        @cuda.jit(device=True, inline="always")
        def widen_tile(words, at, rl):
            widen_tile_row(words, at, rl)

        @cuda.jit(device=True, inline="always")
        def copy_tile(tile, at, k_cache, v_cache, hk, src, valid, rl):
            copy_tile_row(tile, at, k_cache, v_cache, hk, src, valid, 0, rl)
    else:
        @cuda.jit(device=True, inline="always")
        def look_up(src, valid, block_table, num_pages, req, pos, n_end, page_size, status):
            for i in range(ROWS):
                look_up_row(src, valid, i, block_table, num_pages, req, pos + STEP * i, n_end,
                            page_size, status)

        @cuda.jit(device=True, inline="always")
        def widen_tile(words, at, rl):
            for i in range(ROWS):
                widen_tile_row(words, at + STEP * i * KV_STRIDE, rl)

        @cuda.jit(device=True, inline="always")
        def copy_tile(tile, at, k_cache, v_cache, hk, src, valid, rl):
            for i in range(ROWS):
                copy_tile_row(tile, at + STEP * i * KV_STRIDE, k_cache, v_cache, hk, src, valid,
                              i, rl)

    @cuda.jit(device=True, inline="always")
    def ring_start(tile, k_cache, v_cache, block_table, num_pages, req, hk, key0, n_lo, n_hi,
                   row, rl, src, valid, page_size, status):
        """Issue the piece's first NSTAGES - 1 tiles, one copy group each (empty past the piece),
        and look up the sources of the next. Key ``n`` is cache position ``key0 + n``."""
        for st in range(NSTAGES - 1):
            n0 = n_lo + st * BLOCK_N
            if n0 < n_hi:
                look_up(src, valid, block_table, num_pages, req, key0 + n0 + row, key0 + n_hi,
                        page_size, status)
                copy_tile(tile, RING_OFF + st * SLOT + row * KV_STRIDE, k_cache, v_cache, hk, src,
                          valid, rl)
            memory.cp_async_commit()
        look_up(src, valid, block_table, num_pages, req,
                key0 + n_lo + (NSTAGES - 1) * BLOCK_N + row, key0 + n_hi, page_size, status)

    @cuda.jit(device=True, inline="always")
    def ring_next(tile, words, k_cache, v_cache, block_table, num_pages, req, hk, key0, n0, n_hi,
                  rd, row, rl, src, valid, page_size, status):
        """Wait for tile n0 (ring slot rd; FP8: widen the thread's chunks of it), then issue the
        tile NSTAGES - 1 ahead into the slot the previous tile was computed in, from the sources
        looked up a tile ago, and look up those of the tile after it."""
        memory.cp_async_wait(WAIT)
        if WIDEN:
            widen_tile(words, RING_OFF + rd * SLOT + row * KV_STRIDE, rl)
        cuda.syncthreads()  # tile n0 has landed; the slot written next is no longer read
        wr = rd - 1 if rd > 0 else NSTAGES - 1
        if n0 + (NSTAGES - 1) * BLOCK_N < n_hi:
            copy_tile(tile, RING_OFF + wr * SLOT + row * KV_STRIDE, k_cache, v_cache, hk, src,
                      valid, rl)
        memory.cp_async_commit()
        look_up(src, valid, block_table, num_pages, req, key0 + n0 + NSTAGES * BLOCK_N + row,
                key0 + n_hi, page_size, status)

    return first_key, ring_start, ring_next


def make_piece_out(HEAD_DIM_V, VH, BLOCK_M, WARPS, FMT):
    """(stage, write) for O_i fragments of 2 VH columns (VH per warpgroup, whole 64-column
    blocks) over BLOCK_M rows and WARPS warps. A staged row is 2 VH words (float32 or pairs of
    16-bit values); its 16-byte chunks are XOR-swizzled by ``row & 7``, so the eight rows a
    warp's fragment store touches land in eight different bank groups."""
    assert VH % 64 == 0
    DT = VH // 8
    PITCH = 2 * VH                                       # words per staged row
    pack = convert.pack(FMT)

    @cuda.jit(device=True, inline="always")
    def stage(smem_words, smem_f32, at, O_i, col0, r, half, t2, inv, split):
        row = at + r * PITCH
        sw = r & 7
        if split:
            for dt in range(DT):
                col = col0 + 8 * dt + t2
                w = row + ((((col >> 2) ^ sw) << 2) | (col & 3))
                smem_f32[w] = O_i[0, dt, 2 * half] * inv
                smem_f32[w + 1] = O_i[0, dt, 2 * half + 1] * inv
        else:
            for dt in range(DT):
                col = col0 + 8 * dt + t2
                smem_words[row + ((((col >> 3) ^ sw) << 2) | ((col & 7) >> 1))] = pack(
                    O_i[0, dt, 2 * half] * inv, O_i[0, dt, 2 * half + 1] * inv)

    @cuda.jit(device=True, inline="always")
    def copy_row(dst, i, t, h, view, PER, smem, row, sw, lane):
        """Staged row ``row`` (swizzle ``sw``) into ``dst[i, t, h, :HEAD_DIM_V]``, chunks of PER
        elements of ``view`` (the staged words as float32, or as 16-bit halves): one
        ``st.global.v4`` per chunk when the row is 16-byte aligned and the chunk lies inside
        HEAD_DIM_V, else element by element up to HEAD_DIM_V."""
        at = memory.global_address(dst, (i, t, h, 0))
        aligned = at & uint64(15) == 0
        for c in range(lane, -(-HEAD_DIM_V // PER), 32):
            src = row + ((c ^ sw) << 2)  # the chunk's first word
            if aligned and c < HEAD_DIM_V // PER:
                memory.st_global_16(at + uint64(16 * c), smem, 2 * src)
            else:
                for e in range(PER):
                    if PER * c + e < HEAD_DIM_V:
                        dst[i, t, h, uint64(PER * c + e)] = view[(PER // 4) * src + e]

    @cuda.jit(device=True, inline="always")
    def write(out, o_acc, smem, smem_f32, at, split, req, slot, m0, q_rows, group, hk, warp,
              lane, status):
        """Every warp copies rows warp, warp + WARPS, ... that hold a query row: float32 into
        the piece's slot of ``o_acc``, or 16-bit into ``out``."""
        if split and not (slot >= 0 and slot < o_acc.shape[0]):
            if warp == 0 and lane == 0:
                report(status, BAD_SPLITS)
            return
        for r in range(warp, BLOCK_M, WARPS):
            gr = m0 + r
            if gr < q_rows:
                t = int32(convert.div_u32(gr, group))
                h = hk * group + gr - t * group
                if split:
                    copy_row(o_acc, slot, t, h, smem_f32, 4, smem, at + r * PITCH, r & 7, lane)
                else:
                    copy_row(out, req, t, h, smem, 8, smem, at + r * PITCH, r & 7, lane)

    return stage, write


def make_row_keys(CAUSAL, NT, DT):
    """The key window of a thread's two C-fragment rows (``r`` and ``r + 8``) in a piece, for
    S fragments of NT 8-key tiles and O_i fragments of DT 8-column tiles."""
    NEG_INF = constants.NEG_INF
    ZERO = float32(0.0)

    @cuda.jit(device=True, inline="always")
    def start_rows(limit, m_i, l_i, O_i, n_hi, seqlen, s_q, group, row0):
        """The keys each row may see, the piece's and (causal) those before its token's
        diagonal (packed row r is token r / group); the online-softmax state reset."""
        for half in range(2):
            lim = n_hi
            if CAUSAL:
                t = int32(convert.div_u32(row0 + 8 * half, group))
                lim = min(lim, seqlen - (s_q - 1 - t))
            limit[half] = lim
            m_i[0, half] = NEG_INF
            l_i[0, half] = ZERO
        for dt in range(DT):
            for e in range(4):
                O_i[0, dt, e] = ZERO

    @cuda.jit(device=True, inline="always")
    def mask_keys(S, limit, key0):
        """Element (nt, e) holds key key0 + 8 nt + (e & 1) of row half e >> 1."""
        for half in range(2):
            lim = int32(limit[half] - key0)  # 32-bit: a 64-bit difference held two registers
            for nt in range(NT):
                for e in range(2 * half, 2 * half + 2):
                    if int32(8 * nt + (e & 1)) >= lim:
                        S[0, nt, e] = NEG_INF

    return start_rows, mask_keys


def make_row_modifiers(NT, WINDOW=False, SOFTCAP=False, ALIBI=False):
    """What the tensor-core decode of ordinary attention (``flash_attn_with_kvcache``) adds to
    ``make_row_keys`` for a thread's two fragment rows: flash-attn's sliding window, softcap and
    ALiBi, in the view of the sequence's keys its ``key_start`` begins (token t has ``diag =
    seqlen - s_q``: ``common/masks.py``'s rules; S in raw ``Q K^T`` units, the scale in the
    exponent).

        row_mods(limit, begin, softcap, alibi_slopes, req, hk, seqlen, s_q, group, q_rows, row0,
                 left, right, scale_log2) -> (mods0, mods1)
            after ``start_rows``: the window's sides tighten each row's ``limit`` and set its
            first key ``begin`` (2,); each row's ``score_mods`` factors (its head's slope)
        modify_keys(S, begin, mods0, mods1, key0)
            S -> the scores the softmax sees, then keys before a row's window -> -inf; before
            ``mask_keys``, which masks the rest (key0: the thread's first key)

    Without the options both cost nothing."""
    factors, modified = make_score_mods(False, SOFTCAP, ALIBI)
    NEG_INF = constants.NEG_INF

    @cuda.jit(device=True, inline="always")
    def row_mods(limit, begin, softcap, alibi_slopes, req, hk, seqlen, s_q, group, q_rows, row0,
                 left, right, scale_log2):
        diag = seqlen - s_q
        r0 = min(row0, q_rows - 1)  # rows past the last are never stored: any head will do
        r1 = min(row0 + 8, q_rows - 1)
        t0 = int32(convert.div_u32(r0, group))
        t1 = int32(convert.div_u32(r1, group))
        if WINDOW:
            begin[0] = t0 + diag - left
            begin[1] = t1 + diag - left
            limit[0] = min(limit[0], t0 + diag + right + 1)
            limit[1] = min(limit[1], t1 + diag + right + 1)
        return (factors(softcap, alibi_slopes, req, hk * group + r0 - t0 * group, scale_log2,
                        t0 + diag),
                factors(softcap, alibi_slopes, req, hk * group + r1 - t1 * group, scale_log2,
                        t1 + diag))

    @cuda.jit(device=True, inline="always")
    def modify_keys(S, begin, mods0, mods1, key0):
        for half in range(2):
            mods = mods0 if half == 0 else mods1
            rel = mods[3] - float32(key0)  # t + diag - j of the thread's first key
            lo = int32(begin[half] - key0) if WINDOW else int32(0)
            for nt in range(NT):
                for e in range(2 * half, 2 * half + 2):
                    col = 8 * nt + (e & 1)
                    if SOFTCAP or ALIBI:
                        S[0, nt, e] = modified(S[0, nt, e], mods, rel - float32(col))[0]
                    if WINDOW and int32(col) < lo:
                        S[0, nt, e] = NEG_INF

    return row_mods, modify_keys
