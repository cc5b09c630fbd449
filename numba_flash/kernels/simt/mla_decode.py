"""Paged MLA decode on CUDA cores: split-KV attention over a block-table cache (FlashMLA's job).

What it computes
    DeepSeek's Multi-head Latent Attention in decode: the ``s_q`` new tokens of a sequence, with
    ``h_q`` heads each, attend that sequence's latent KV cache: ``HEAD_DIM`` (576 = 512 latent
    + 64 rope) columns per cached token and KV head, the first ``HEAD_DIM_V`` of which are also
    the values. The cache lives in pages of ``page_block_size`` tokens; token ``pos`` of request
    ``req`` is slot ``pos % page`` of page ``block_table[req, pos // page]``.

    Every query head of a KV head reads the same cache rows, so the ``s_q * h_q / h_kv`` query
    rows of one KV head are packed into the M dimension of one tile: packed row ``r`` is query
    token ``t = r // group`` of query head ``hk * group + r % group`` (``group = h_q / h_kv``).
    One KV tile in shared memory then serves all of them, K for the scores and its first
    ``HEAD_DIM_V`` columns as V: the cache is read from memory once per tile of query rows.

    The work is dealt out by the MLA tile scheduler (``scheduler.py``): a CTA walks the pieces of
    its metadata row exactly as ``scheduler.part_pieces`` does. For each piece it runs the
    online softmax of the forward kernel over key tiles of BLOCK_N rows,

        S = Q K^T (base 2: scaled by scale * log2 e)
        m_new = max(m_i, rowmax S);  P = exp2(S - m_new);  alpha = exp2(m_i - m_new)
        l_i = alpha l_i + rowsum P;  O_i = alpha O_i + P V;  m_i = m_new

    and then writes the final ``out = O_i / l_i`` and natural-log ``lse`` of a request handled in
    one piece, or, for a piece of a split request, the float32 partial ``O_i / l_i`` and the
    base-2 partial ``m_i + log2 l_i`` into accumulator slot ``num_splits[req] + piece``, which
    ``combine.py`` merges. A row without visible keys gives ``out = 0, lse = +inf`` (partial:
    ``O = 0, lse = -inf``, weight 0 in the combine).

The cache stream (both variants below)
    Decode reads every cache byte once and does little arithmetic per byte (at h_q = 1, one FMA
    per element for S and one for PV), and the scheduler gives each SM one CTA, so a CTA must
    keep the memory system busy by itself. Cache tiles go straight from global to shared memory
    with 16-byte ``cp.async`` copies into a ring of NSTAGES = 3 tiles, in the storage format
    (16-bit bits or float32): tile ``j + 2`` is issued when tile ``j`` is about to be computed,
    so two tiles are always in flight, no register holds the tile, and a 16-bit tile takes
    half the shared memory of a float32 one. Every thread copies one row of the tile: the
    ``THREADS / BLOCK_N`` threads of a row issue its 16-byte chunks ``lane, lane + THREADS /
    BLOCK_N, ...``, so each thread does one block-table lookup per tile, fetched one tile ahead
    (the lookup's latency is hidden behind a tile's compute). A row at or past the piece end is
    zero-filled (``cp.async`` with source size 0): it reads neither its block-table entry nor
    its slot, which may be garbage, and its zeros keep ``P V`` finite.

    16-byte copies need 16-byte aligned chunks. The API honours any strides but the last, so
    the host checks the cache (``arrays.rows_16_byte_aligned``: data pointer and every stride a
    multiple of 16 bytes) and compiles the same kernel with ``VEC = False`` for a view that is not
    aligned: its threads copy the same rows element by element with plain loads and stores (a
    slower stream, the same results).

    The compute reads the 16-bit tile as 32-bit words, two elements per shared load (unpacked to
    float32); a float32 tile is read as element pairs. Offsets below count such *pairs*.

Narrow variant: few query rows (MLA: BLOCK_M <= 2, h_q = 1; short rows: ``narrow_lanes``)
    grid = (num_sm_parts, h_kv, ceil(q_rows / BLOCK_M)); block = THREADS = 256 (8 warps).
    A single query row has nothing to split over 256 threads but the keys, so the warps split
    them: warp ``w`` owns rows ``w * KPW .. w * KPW + KPW - 1`` of every tile (KPW = BLOCK_N /
    WARPS) and runs its own online softmax (its own m_i, l_i, O_i) over them; the WARPS partial
    results are merged once per piece, as the combine kernel merges splits. Lane ``lane`` owns
    pairs ``lane + 32 i`` of the head dim: the query rows, pre-scaled and staged through the
    ring, live in its registers (HEAD_DIM / 32 floats per row), and it reads pairs
    ``lane + 32 i`` of each key row, a whole
    32-word row per warp-wide load (no bank conflicts, no padding). Per batch of KBW keys (4
    for one query row, 1 for two: the registers of the S batch and of the two rows' O_i): the
    lane's partial dot products, summed over the warp by a 5-step ``shfl_xor`` butterfly (all
    lanes get all scores), the softmax update in registers, and ``O_i += P V`` from the same
    words read again (V is the first HEAD_DIM_V columns of the key rows; keeping the batch's
    words in registers instead spills on sm_80). One ``syncthreads`` per tile (the ring's);
    O_i is 16 floats per lane and row.

    Short rows (HEAD_DIM <= SHORT_ROW = 256, ordinary attention): a 128-column row gives a lane
    two pairs, and the 5-step butterfly would cost more than the dot product. There LPK = 8
    lanes share a key row: lane group ``kq = lane / 8`` of a warp scores keys ``key + k * 4 +
    kq`` with a 3-step butterfly, the groups share each row's maximum (2 more steps per batch)
    and keep their own l_i and O_i, which are added up once per piece. Ring rows are then
    padded so that the 4 rows a warp reads start 8 banks apart. Tiles of SHORT_BLOCK_N = 64
    keys, BLOCK_M x HEAD_DIM up to 512 (GQA groups of up to 4 at D = 128). On an H200
    (B 64, Hq 32, Hk 8, D 128, 16k keys, page 64) this reads 2.75 TB/s where the wide variant
    read 0.92 (bench/results/NVIDIA-H200/kvcache.csv; docs/perf-notes.md has the steps).

V in its own cache (``SEPARATE_V``: ``flash_attn_with_kvcache``)
    A tile row holds the key's HEAD_DIM columns, then its HEAD_DIM_V value columns copied from
    ``v_cache`` with the same block-table lookup (``kv_row``); P V reads the second part. With
    ``LEFTPAD`` a sequence's key ``n`` is cache position ``key_start[req] + n``. ``WINDOW``,
    ``SOFTCAP``, ``ALIBI``: flash-attn's sliding window, softcap and ALiBi per packed row
    (``make_row_modifiers``; the keys before the first token's window are out of the view,
    ``kvcache_prepare.py``), compile-time options that cost nothing when off. ``CACHE =
    "e4m3"``: float8_e4m3fn caches, copied as bytes and widened to 16 bits in the ring by the
    thread that copied them (``paged_kv.make_row_widen``; the element path converts as it
    copies), with ``k_descale[req, hk]`` folded into the query's scale and ``v_descale[req,
    hk]`` into the rows' normalisation (narrow variant).

Sparse attention and DeepSeek-V3.2's FP8 cache (``SPARSE``, ``CACHE = "v32"``)
    With ``SPARSE`` each request is one query token whose keys are the cache rows its packed
    indices list (``simt/sparse_indices.py`` packs them; ``block_table`` is that list, and
    ``paged_kv``'s row lookup reads it). ``"v32"``: 656-byte cache rows (512 e4m3 latent
    values, their four float32 scales, 64 bfloat16 rope values), widened in the ring into the
    576 bfloat16 columns of an ordinary MLA tile (``paged_kv.make_row_copy``), so the compute
    is the dense decode's.

Wide variant: more query rows (MLA: h_q >= 4 or s_q h_q >= 4)
    grid as above; block = THREADS = 256. All threads share each tile; every phase uses the
    thread layout that suits it (``wide_threads`` computes all of them):

    S = QK^T  thread = (row group, key group, d lane): a TM x TN register micro-tile of S over
              the 1 / DS slice ``pair = ds + DS * i`` of the head dim (TM = min(BLOCK_M, 8)
              rows: 2 (8 + TN) shared loads per 16 TN FMAs). The query rows are held in shared
              memory as storage bits (S is scaled afterwards). Each d-lane writes its partial
              sums to its own plane of shared memory (cheaper than a DS-lane butterfly).
    softmax   SL lanes per row add the DS partial planes up, scale, mask the keys the row may not
              see, and hold m_i and a partial l_i in registers (the row maximum is an SL-lane
              ``shfl_xor`` reduction); P and the rescale factor alpha go through shared memory
              to the PV layout.
    O += PV   thread = (row group, pair lane): a TMo x 2 TDo register micro-tile of O_i, pairs
              ``lane + Co * j`` (consecutive threads, consecutive words: conflict-free V reads).
    Three ``syncthreads`` per tile (ring, S planes, P).

Shared memory (dynamic; one buffer seen as storage elements, 32-bit words and float32;
``shared_layout`` describes it, in words, to the spec and to the kernel factories)
    narrow  ring   NSTAGES x BLOCK_N x row storage elements (``narrow_row_stride``: the key
                   columns, V's when it has its own cache, padding for short rows)
            at the start of a piece the last slot passes the float32 query rows to registers;
            after the last tile of a piece, the buffer's start holds the WARPS partial (m_i,
            l_i), then O_i (over the ring, or past it for a tile of few keys)
    wide    Q      BLOCK_M x HEAD_DIM storage elements
            ring   NSTAGES x BLOCK_N x KV_STRIDE (HEAD_DIM padded so that the key groups of a
                   warp read different banks)
            S/P    DS planes of BLOCK_M x P_STRIDE float32 (the partial S of each d-lane; then P)
            alpha, l, m   3 x BLOCK_M float32
    e.g. HEAD_DIM 576, HEAD_DIM_V 512, bfloat16: 108 KiB (BLOCK_M 1 or 2, BLOCK_N 32), 149 KiB
    (BLOCK_M 8, BLOCK_N 32), 104 KiB (BLOCK_M 16, BLOCK_N 16); the spec picks the tiles (and
    halves BLOCK_N, for a wide tile not below BLOCK_M, then BLOCK_M, while a configuration
    exceeds the device's shared memory, as float32 may).

Indexing
    Shared-memory indices and the innermost index of global arrays are cast to uint64. Numba
    gives signed indices Python's negative-index wraparound: a compare and a select per access,
    whose copies, hoisted out of the unrolled loops, cost dozens of registers and keep constant
    offsets from folding into the load instructions.

Limits
    HEAD_DIM a multiple of 8 up to 576, any HEAD_DIM_V <= HEAD_DIM, any page size; BLOCK_N must
    divide the scheduler's 64-row block (so a key tile never straddles two pieces), be a
    multiple of the warp count and at most THREADS. float32 accumulation; float16 / bfloat16
    (uint16 bits) or float32. Unlike the reference, which gathers the whole sequence, it never
    touches a cache slot at or past ``seqlen`` nor a block-table entry past ``ceil(seqlen /
    page)``.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, types, uint32, uint64

from ...runtime.device import SIMULATOR, Device
from ...runtime.spec import SM80, SM90, Sample, Tiles

from ..attention import KVCacheDecodeSpec
from ..common import constants, formats
from ..common.layout import SharedLayout
from ..common.paged_kv import SCHED_BLOCK, make_kv_ring, make_paged_kv_walk
from ..common.score_mods import make_score_mods
from ..instructions import convert, memory, sync

SHARED_ALIGN = memory.SHARED_ALIGN  # a module-level name: alignment= takes constants only
THREADS = 256  # per CTA on a GPU (the simulator runs fewer: see LAUNCH_THREADS)
MAX_HEAD_DIM = 576
NSTAGES = 3  # cache tiles in the shared ring: two in flight while one is computed
NARROW_PAIRS = 18  # query pairs per lane (all rows) up to which the narrow variant runs
SHORT_ROW = 256  # head dims up to this share a warp among several keys (narrow_lanes)
SHORT_ROW_ELEMS = 512  # short rows: BLOCK_M x HEAD_DIM up to which the narrow variant runs
SHORT_BATCH_ROWS = 8  # short rows: keys per batch x rows (narrow_batch)
SHORT_BLOCK_N = 32 if SIMULATOR else 64  # short rows: keys per tile of the narrow variant
# (simulated: every key of a tile costs Python time, and test sequences are short)
NEG_INF = constants.NEG_INF
ZERO, ONE = float32(0.0), float32(1.0)
shfl_xor = sync.shfl_xor


def _log2(n):
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def _cdiv(a, b):
    return -(-a // b)


def _item(FMT):
    return 4 if FMT == "float32" else 2  # bytes of a stored element


def _bank_stride(n, g):
    """Smallest stride >= n that is an odd multiple of g (g a power of two). Rows that many
    words apart start on banks g apart, all different for 32 / g rows: lanes reading g
    consecutive words of each of 32 / g rows then hit 32 different banks."""
    if g >= 32:
        return n
    m = _cdiv(n, g)
    return g * (m + 1 - m % 2)


def narrow_lanes(BLOCK_M, HEAD_DIM):
    """Lanes that share one key row in the narrow variant (``LPK``), or None when BLOCK_M rows
    take the wide variant. MLA's rows (HEAD_DIM > SHORT_ROW) take a whole warp per key and stay
    narrow up to NARROW_PAIRS query pairs per lane, as measured for them (module docstring).
    Shorter rows take 8 lanes per key, so that a warp works on 4 keys at once and each key's
    butterfly has 3 steps, while the rows' elements stay within SHORT_ROW_ELEMS (a lane's query
    pairs and O_i in registers without spills on sm_80 and sm_90)."""
    if BLOCK_M > BLOCK_N_BY_ROWS[0][0]:  # the query rows are staged in one 32-key ring slot
        return None
    if HEAD_DIM > SHORT_ROW:
        return 32 if BLOCK_M * _cdiv(HEAD_DIM // 2, 32) <= NARROW_PAIRS else None
    return 8 if BLOCK_M * HEAD_DIM <= SHORT_ROW_ELEMS else None


def narrow_batch(BLOCK_M, HEAD_DIM, KEYS):
    """Keys a lane group scores per batch in the narrow variant (of its KEYS per tile): MLA's
    rows 4 for one query row, 1 for two (the registers of the S batch and of O_i); short rows
    up to 8 / BLOCK_M (independent butterflies to overlap)."""
    if HEAD_DIM > SHORT_ROW:
        return min(4 if BLOCK_M == 1 else 1, KEYS)
    return min(max(1, SHORT_BATCH_ROWS // BLOCK_M), KEYS)


def narrow_row_stride(HEAD_DIM, HEAD_DIM_V, SEPARATE_V, LPK):
    """Storage elements from one tile row to the next in the narrow ring: the row itself, padded
    when a warp reads several rows at once (LPK < 32) so that its 32 / LPK rows start LPK banks
    apart."""
    row = kv_row(HEAD_DIM, HEAD_DIM_V, SEPARATE_V)
    return row if LPK == 32 else 2 * _bank_stride(row // 2, LPK)


def kv_row(HEAD_DIM, HEAD_DIM_V, SEPARATE_V):
    """Storage elements of one cache row in a tile: its HEAD_DIM key columns, then, when V has a
    cache of its own, its HEAD_DIM_V value columns (else V is the first key columns)."""
    return HEAD_DIM + (HEAD_DIM_V if SEPARATE_V else 0)


def wide_threads(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, THREADS=THREADS, SEPARATE_V=False):
    """The wide variant's thread layout of each phase, and the strides (KV row in storage
    elements, P row and S plane in words) that keep the lanes of a warp on different banks."""
    VP = _cdiv(HEAD_DIM_V, 2)  # pairs of a key row's value part
    # S = Q K^T: R row groups x C key groups x DS d-lanes, each thread a TM x TN micro-tile.
    TM = min(BLOCK_M, 8)
    R = BLOCK_M // TM
    lanes = THREADS // R  # >= 32 at 256 threads: one row group per warp reads one set of Q rows
    TN = max(1, min(4, BLOCK_N * 32 // lanes))
    C = BLOCK_N // TN
    DS = lanes // C
    assert C * TN == BLOCK_N and C * DS == lanes and DS <= 32
    # softmax: SL lanes per row, TS scores per lane.
    SL = min(32, THREADS // BLOCK_M)
    TS = _cdiv(BLOCK_N, SL)
    assert SL * TS == BLOCK_N or BLOCK_N < SL
    # O += P V: Ro row groups x Co pair lanes, each thread a TMo x 2 TDo micro-tile.
    TMo = min(BLOCK_M, 8)
    Ro = BLOCK_M // TMo
    Co = THREADS // Ro
    TDo = _cdiv(VP, Co)
    # The S phase reads DS words of each of 32 / DS KV rows and writes 32 / DS words of each of
    # DS planes; the softmax reads SL words of each of 32 / SL rows of a plane. A KV row stays a
    # multiple of 16 bytes (cp.async).
    kv_stride = 2 * _bank_stride(kv_row(HEAD_DIM, HEAD_DIM_V, SEPARATE_V) // 2, max(DS, 4))
    p_stride = _bank_stride(BLOCK_N, SL)
    plane = _bank_stride(BLOCK_M * p_stride, 32 // DS)
    return dict(TM=TM, R=R, TN=TN, C=C, DS=DS, SL=SL, TS=TS, TMo=TMo, Ro=Ro, Co=Co, TDo=TDo,
                kv_stride=kv_stride, p_stride=p_stride, plane=plane)


def shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, FMT, THREADS=THREADS, SEPARATE_V=False):
    """The dynamic shared memory of one configuration (module docstring), in 32-bit words: the
    spec's shared bytes and the factory's offsets (a tile region's offset times 4 / item is its
    offset in storage elements)."""
    assert BLOCK_M & (BLOCK_M - 1) == 0 and 1 <= BLOCK_M <= 64, BLOCK_M
    assert THREADS & (THREADS - 1) == 0 and THREADS >= max(32, BLOCK_M), THREADS
    assert SCHED_BLOCK % BLOCK_N == 0 and BLOCK_N % (THREADS // 32) == 0, BLOCK_N
    assert BLOCK_N <= THREADS
    assert HEAD_DIM % 8 == 0 and HEAD_DIM <= MAX_HEAD_DIM and 1 <= HEAD_DIM_V <= HEAD_DIM
    item = _item(FMT)
    LPK = narrow_lanes(BLOCK_M, HEAD_DIM)
    if LPK:
        WARPS = THREADS // 32
        assert BLOCK_N * item >= 4 * BLOCK_M  # the float32 query rows fit in one ring slot
        ring = NSTAGES * BLOCK_N * narrow_row_stride(HEAD_DIM, HEAD_DIM_V, SEPARATE_V,
                                                     LPK) * item // 4
        # After the last tile of a piece the buffer's start holds the warps' partial results:
        # (m_i, l_i) per warp and row, then O_i (2 VP floats). The ring lies over them and, but
        # for a tile of few keys, past them ("ring_end"): the larger of the two sets the size.
        stat, o = 2 * WARPS * BLOCK_M, WARPS * BLOCK_M * 2 * _cdiv(HEAD_DIM_V, 2)
        return SharedLayout(4, [("stat", stat), ("o", o), ("ring_end", max(0, ring - stat - o)),
                                ("ring", ring, "stat")])
    th = wide_threads(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, THREADS, SEPARATE_V)
    return SharedLayout(4, [("q", BLOCK_M * HEAD_DIM * item // 4),
                            ("ring", NSTAGES * BLOCK_N * th["kv_stride"] * item // 4),
                            ("p", th["DS"] * th["plane"]),  # the S planes, then P over plane 0
                            ("alpha", BLOCK_M), ("l", BLOCK_M), ("m", BLOCK_M)])


@lru_cache(maxsize=None)
def make_mla_decode_kernel(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT,
                           VEC=True, SEPARATE_V=False, LEFTPAD=False, WINDOW=False,
                           SOFTCAP=False, ALIBI=False, CACHE=None, SPARSE=False):
    """Python kernel function specialised for one configuration (``SPEC`` compiles it), of the
    variant BLOCK_M selects; ``VEC``: the caches are 16-byte aligned
    (``arrays.rows_16_byte_aligned``); ``SEPARATE_V``: V is ``v_cache``, not the first key
    columns; ``LEFTPAD``: sequence ``req``'s keys start at cache position ``key_start[req]``;
    ``WINDOW``, ``SOFTCAP``, ``ALIBI``: ordinary attention's masks and score modifiers
    (``make_row_modifiers``); ``CACHE``: the cache's bytes (None: FMT's; ``"e4m3"``: both caches
    hold float8_e4m3fn values with their descales, narrow variant only; ``"v32"``: DeepSeek-V3.2's
    rows); ``SPARSE``: ``block_table`` holds each request's packed cache rows."""
    make = make_narrow_kernel if narrow_lanes(BLOCK_M, HEAD_DIM) else make_wide_kernel
    return make(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT, VEC, SEPARATE_V,
                LEFTPAD, WINDOW, SOFTCAP, ALIBI, CACHE, SPARSE)


def make_row_modifiers(WINDOW, SOFTCAP, ALIBI):
    """Ordinary attention's sliding window, softcap and ALiBi (``flash_attn_with_kvcache``) for
    one packed query row, in the view of the sequence's keys ``key_start`` begins (token t has
    ``diag = seqlen - s_q``, ``common/masks.py``'s rules), S in base-2 units:

        row_window(gr, visible, hk, group, q_rows, seqlen, s_q, left, right, softcap,
                   alibi_slopes, req, scale_log2) -> (visible, begin, mods)
            packed row ``gr``'s end of keys tightened by the window's right side, its first key,
            and its ``score_mods`` factors (its head's slope; rel0 = t + diag)
        modified(s, mods, rel) -> (score, slope)   ``score_mods``' (rel = t + diag - key)

    Without the options they cost nothing."""
    factors, modified = make_score_mods(True, SOFTCAP, ALIBI)

    @cuda.jit(device=True, inline="always")
    def row_window(gr, visible, hk, group, q_rows, seqlen, s_q, left, right, softcap,
                   alibi_slopes, req, scale_log2):
        r = min(gr, q_rows - 1)  # rows past the last are never stored: any head will do
        t = r // group
        diag = seqlen - s_q
        begin = 0
        if WINDOW:
            begin = t + diag - left
            visible = min(visible, t + diag + right + 1)
        return visible, begin, factors(softcap, alibi_slopes, req, hk * group + r - t * group,
                                       scale_log2, t + diag)

    return row_window, modified


# ----------------------------------------------------------------------------- both variants

def make_stream(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, FMT, VEC, RING_OFF, KV_STRIDE,
                SEPARATE_V, LEFTPAD, CACHE=None, SPARSE=False):
    """The device functions both variants share: the paged-KV walk and its cache ring
    (``paged_kv.py``: slot ``s`` at storage element ``RING_OFF + s BLOCK_N KV_STRIDE``, a tile
    row every KV_STRIDE elements: the key columns, then the value columns when V has its own
    cache) and the read of a pair from shared memory."""
    TPR = THREADS // BLOCK_N  # copy: threads per cache row
    PACKED = FMT != "float32"  # a pair is one 32-bit word
    unpack = convert.unpack(FMT if PACKED else "bfloat16")  # (never called for float32)
    cta_work, piece_of, _, _, put, put_lse = make_paged_kv_walk(HEAD_DIM, BLOCK_M, TPR, FMT, VEC)
    first_key, ring_start, ring_next = make_kv_ring(
        HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, TPR, FMT, VEC, RING_OFF, KV_STRIDE,
        NSTAGES, SEPARATE_V, LEFTPAD, CACHE, SPARSE)

    @cuda.jit(device=True, inline="always")
    def pair(words, floats, p):
        """Elements 2p and 2p + 1 of the shared buffer as float32."""
        if PACKED:
            return unpack(words[uint64(p)])
        return floats[uint64(2 * p)], floats[uint64(2 * p + 1)]

    return cta_work, piece_of, put, put_lse, first_key, ring_start, ring_next, pair


# ----------------------------------------------------------------------------- narrow

def make_narrow_piece_ends(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT,
                           SEPARATE_V, put, put_lse, DESCALES=False):
    """The narrow variant's phases that open a piece (the query rows into registers) and close it
    (the warps' partial results merged and written); ``put``, ``put_lse`` from the walk;
    ``DESCALES``: the rows are scaled by the value cache's descale on their way out."""
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, FMT, THREADS, SEPARATE_V)
    WARPS = THREADS // 32
    LPK = narrow_lanes(BLOCK_M, HEAD_DIM)
    LOG_LPK = _log2(LPK)
    DP, VP = HEAD_DIM // 2, _cdiv(HEAD_DIM_V, 2)  # pairs of a key row, of its value part
    NQ, NV = _cdiv(DP, LPK), _cdiv(VP, LPK)  # ... a lane holds
    Q_EXACT, V_EXACT = DP % LPK == 0, VP % LPK == 0
    Q_STEPS, Q_STEPS_EXACT = _cdiv(HEAD_DIM, THREADS), HEAD_DIM % THREADS == 0
    OUT_STEPS = _cdiv(HEAD_DIM_V, THREADS)
    # The ring's last slot, in words.
    Q_STAGE = lay.ring + (NSTAGES - 1) * BLOCK_N * narrow_row_stride(
        HEAD_DIM, HEAD_DIM_V, SEPARATE_V, LPK) * _item(FMT) // 4
    STAT_OFF, O_OFF, O_STRIDE = lay.stat, lay.o, 2 * VP
    load = formats.loader(FMT)

    @cuda.jit(device=True, inline="always")
    def stage_q(q, floats, visible, req, hk, m0, s_q, group, q_rows, seqlen, scale_log2, tid):
        """The keys each row may see; the query rows, pre-scaled so that S is in base-2 units,
        into the ring's last slot (free until the first tile's barrier) in consecutive columns
        per thread. (Loaded as pairs directly, the lane's 2 NQ addresses, with the run-time
        stride of q, stay in registers for the whole kernel: ~36 of them, and spills on sm_80.)"""
        for m in range(BLOCK_M):
            gr = m0 + m
            t = gr // group
            h = hk * group + gr - t * group
            if CAUSAL:
                visible[m] = min(seqlen - (s_q - 1 - t), seqlen)
            else:
                visible[m] = seqlen
            for j in range(Q_STEPS):
                d = tid + THREADS * j
                if Q_STEPS_EXACT or d < HEAD_DIM:
                    x = ZERO
                    if gr < q_rows:
                        x = load(q[req, t, h, uint64(d)]) * scale_log2
                    floats[uint64(Q_STAGE + HEAD_DIM * m + d)] = x

    @cuda.jit(device=True, inline="always")
    def start_rows(floats, qv, m_i, l_i, O_i, ll):
        """The lane's pairs ll + LPK i of the staged query rows into registers; m_i, l_i, O_i
        of a new piece."""
        for m in range(BLOCK_M):
            for i in range(NQ):
                p = ll + LPK * i
                for e in range(2):
                    x = ZERO
                    if Q_EXACT or p < DP:
                        x = floats[uint64(Q_STAGE + HEAD_DIM * m + 2 * p + e)]
                    qv[m, i, e] = x
            m_i[m] = NEG_INF
            l_i[m] = ZERO
            for i in range(NV):
                for e in range(2):
                    O_i[m, i, e] = ZERO

    @cuda.jit(device=True, inline="always")
    def store_partials(floats, m_i, l_i, O_i, warp, lane, scratch, tid):
        """The warp's (m_i, l_i) and O_i of each row, into the idle ring: first the sums of its
        32 / LPK key groups added up (they share m_i)."""
        for j in range(LOG_LPK, 5):
            for m in range(BLOCK_M):
                l_i[m] += shfl_xor(l_i[m], 1 << j, scratch, tid)
                for i in range(NV):
                    for e in range(2):
                        O_i[m, i, e] += shfl_xor(O_i[m, i, e], 1 << j, scratch, tid)
        ll = lane & (LPK - 1)
        for m in range(BLOCK_M):
            at = warp * BLOCK_M + m
            if lane == 0:
                floats[uint64(STAT_OFF + 2 * at)] = m_i[m]
                floats[uint64(STAT_OFF + 2 * at + 1)] = l_i[m]
            if lane < LPK:
                for i in range(NV):
                    p = ll + LPK * i
                    if V_EXACT or p < VP:
                        for e in range(2):
                            floats[uint64(O_OFF + O_STRIDE * at + 2 * p + e)] = O_i[m, i, e]

    @cuda.jit(device=True, inline="always")
    def write_piece(out, lse, o_acc, lse_acc, floats, wscale, split, req, slot, hk, m0, q_rows,
                    group, v_scale, tid, status):
        """Merge the warps' partial results, as the combine merges splits, and write the rows."""
        for m in range(BLOCK_M):
            gr = m0 + m
            if gr < q_rows:
                t = gr // group
                h = hk * group + gr - t * group
                mx = NEG_INF
                for w in range(WARPS):
                    mx = max(mx, floats[uint64(STAT_OFF + 2 * (w * BLOCK_M + m))])
                base = mx if mx != NEG_INF else ZERO
                l = ZERO
                for w in range(WARPS):
                    at = STAT_OFF + 2 * (w * BLOCK_M + m)
                    wscale[w] = math.exp2(floats[uint64(at)] - base)
                    l += floats[uint64(at + 1)] * wscale[w]
                inv = ONE / l if l > ZERO else ZERO
                if DESCALES:
                    inv *= v_scale
                for j in range(OUT_STEPS):
                    col = tid + THREADS * j
                    if col < HEAD_DIM_V:
                        o = ZERO
                        for w in range(WARPS):
                            o += floats[uint64(O_OFF + O_STRIDE * (w * BLOCK_M + m)
                                               + col)] * wscale[w]
                        put(out, o_acc, split, req, slot, t, h, col, o * inv, status)
                if tid == 0:
                    put_lse(lse, lse_acc, split, req, slot, t, h, mx, l, status)

    return stage_q, start_rows, store_partials, write_piece


def make_narrow_kernel(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT, VEC,
                       SEPARATE_V, LEFTPAD, WINDOW=False, SOFTCAP=False, ALIBI=False,
                       CACHE=None, SPARSE=False):
    """The narrow variant (``narrow_lanes``): the warps split the keys."""
    DESCALES = CACHE == "e4m3"
    row_window, modified = make_row_modifiers(WINDOW, SOFTCAP, ALIBI)
    MOD_ROWS = BLOCK_M + 1  # each row's (alibi, rel0), then the cap's (cap_in, cap_out)
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, FMT, THREADS, SEPARATE_V)
    WARPS = THREADS // 32
    TPR = THREADS // BLOCK_N  # copy: threads per cache row
    LPK = narrow_lanes(BLOCK_M, HEAD_DIM)  # lanes per key,
    KPL = 32 // LPK  # keys a warp works on at once
    LOG_LPK = _log2(LPK)
    KPW = BLOCK_N // WARPS  # keys per warp of a tile
    assert KPW % KPL == 0, (KPW, KPL)
    KBW = narrow_batch(BLOCK_M, HEAD_DIM, KPW // KPL)  # keys per batch and lane group
    BATCHES = KPW // (KBW * KPL)
    DP, VP = HEAD_DIM // 2, _cdiv(HEAD_DIM_V, 2)  # pairs of a key row, of its value part
    NQ, NV = _cdiv(DP, LPK), _cdiv(VP, LPK)  # ... a lane holds
    Q_EXACT, V_EXACT = DP % LPK == 0, VP % LPK == 0
    ROW = narrow_row_stride(HEAD_DIM, HEAD_DIM_V, SEPARATE_V, LPK)
    RING_OFF, SLOT = lay.ring * 4 // _item(FMT), BLOCK_N * ROW  # storage elements
    RING_P, SLOT_P, ROW_P = RING_OFF // 2, SLOT // 2, ROW // 2  # in pairs
    V_P = DP if SEPARATE_V else 0  # first pair of V in a tile row
    SCRATCH = sync.scratch_size(THREADS)
    STORAGE = formats.storage_type(FMT)
    cta_work, piece_of, put, put_lse, first_key, ring_start, ring_next, pair = make_stream(
        HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, FMT, VEC, RING_OFF, ROW, SEPARATE_V,
        LEFTPAD, CACHE, SPARSE)
    stage_q, start_rows, store_partials, write_piece = make_narrow_piece_ends(
        HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT, SEPARATE_V, put, put_lse,
        DESCALES)

    @cuda.jit(device=True, inline="always")
    def score(words, floats, S, qv, rd, key, kq, ll, scratch, tid):
        """S of the batch's keys (tile rows key + k KPL + kq for the lane group kq): this lane's
        partial dot products, then the group's butterfly."""
        for m in range(BLOCK_M):
            for k in range(KBW):
                S[m, k] = ZERO
        for k in range(KBW):
            at = RING_P + rd * SLOT_P + (key + k * KPL + kq) * ROW_P + ll
            for i in range(NQ):
                if Q_EXACT or ll + LPK * i < DP:
                    x0, x1 = pair(words, floats, at + LPK * i)
                    for m in range(BLOCK_M):  # two FMAs
                        S[m, k] += qv[m, i, 0] * x0
                        S[m, k] += qv[m, i, 1] * x1
        for m in range(BLOCK_M):
            for k in range(KBW):
                for j in range(LOG_LPK):
                    S[m, k] += shfl_xor(S[m, k], 1 << j, scratch, tid)

    @cuda.jit(device=True, inline="always")
    def update(S, m_i, l_i, O_i, visible, begin, row_mods, n0, key, kq, scratch, tid):
        """Online softmax of the batch, row by row (the warp's lane groups share each row's
        maximum): S becomes P; l_i sums the group's own keys. ``begin``, ``row_mods``: each
        row's first key and (alibi, rel0) of its score modifiers, the cap's factors after them
        (``make_row_modifiers``)."""
        for m in range(BLOCK_M):
            mx = NEG_INF
            for k in range(KBW):
                j = n0 + key + k * KPL + kq
                if SOFTCAP or ALIBI:
                    mods = (row_mods[BLOCK_M, 0], row_mods[BLOCK_M, 1], row_mods[m, 0],
                            row_mods[m, 1])
                    S[m, k] = modified(S[m, k], mods, row_mods[m, 1] - float32(j))[0]
                if j >= visible[m] or (WINDOW and j < begin[m]):
                    S[m, k] = NEG_INF
                mx = max(mx, S[m, k])
            for j in range(LOG_LPK, 5):
                mx = max(mx, shfl_xor(mx, 1 << j, scratch, tid))
            m_new = max(m_i[m], mx)
            base = m_new if m_new != NEG_INF else ZERO  # nothing visible yet
            alpha = math.exp2(m_i[m] - base)
            m_i[m] = m_new
            row_sum = ZERO
            for k in range(KBW):
                S[m, k] = math.exp2(S[m, k] - base)
                row_sum += S[m, k]
            l_i[m] = l_i[m] * alpha + row_sum
            for i in range(NV):
                for e in range(2):
                    O_i[m, i, e] *= alpha

    @cuda.jit(device=True, inline="always")
    def accumulate(words, floats, S, O_i, rd, key, kq, ll):
        """O_i += P V, from the words the scores read (or, V in its own cache, those after
        them)."""
        for k in range(KBW):
            at = RING_P + rd * SLOT_P + (key + k * KPL + kq) * ROW_P + V_P + ll
            for i in range(NV):
                if V_EXACT or ll + LPK * i < VP:
                    x0, x1 = pair(words, floats, at + LPK * i)
                    for m in range(BLOCK_M):
                        O_i[m, i, 0] += S[m, k] * x0
                        O_i[m, i, 1] += S[m, k] * x1

    def mla_decode_narrow(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out,
                          lse, o_acc, lse_acc, status, s_q, group, page_size, scale_log2,
                          v_cache, key_start, window_left, window_right, softcap,
                          alibi_slopes, k_descale, v_descale):
        tile = cuda.shared.array(0, STORAGE, alignment=SHARED_ALIGN)
        words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)
        floats = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        kq = lane >> LOG_LPK  # the lane's key group,
        ll = lane & (LPK - 1)  # its lane in the group
        part, hk, m0, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        if begin_req >= cache_seqlens.shape[0]:
            return  # idle part
        num_pages = k_cache.shape[0]
        q_rows = s_q * group
        row = tid // TPR  # copy: this thread's row of every tile,
        rl = tid % TPR  # its lane in the row
        src = cuda.local.array((2, 1), int32)  # ... where that row lies (make_kv_ring),
        valid = cuda.local.array(1, types.boolean)  # ... and whether it is read

        qv = cuda.local.array((BLOCK_M, NQ, 2), float32)
        O_i = cuda.local.array((BLOCK_M, NV, 2), float32)
        m_i = cuda.local.array(BLOCK_M, float32)
        l_i = cuda.local.array(BLOCK_M, float32)
        visible = cuda.local.array(BLOCK_M, np.int32)
        begin = cuda.local.array(BLOCK_M, np.int32)  # (window) each row's first key
        row_mods = cuda.local.array((MOD_ROWS, 2), float32)  # (alibi, rel0); the cap's
        S = cuda.local.array((BLOCK_M, KBW), float32)
        wscale = cuda.local.array(WARPS, float32)

        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, split, slot = piece_of(metadata, cache_seqlens, num_splits,
                                                       part, req, begin_req, end_req, status)
            cuda.syncthreads()  # the previous piece's partial results are read
            key0 = first_key(key_start, req)
            ring_start(tile, k_cache, v_cache, block_table, num_pages, req, hk, key0, n_lo, n_hi,
                       row, rl, src, valid, page_size, status)
            # An FP8 cache's descales: k's joins the query's scale (S stays in base-2 units),
            # v's scales the finished rows.
            piece_scale, v_scale = scale_log2, ONE
            if DESCALES:
                piece_scale = scale_log2 * k_descale[req, hk]
                v_scale = v_descale[req, hk]
            stage_q(q, floats, visible, req, hk, m0, s_q, group, q_rows, seqlen, piece_scale, tid)
            if WINDOW or SOFTCAP or ALIBI:
                for m in range(BLOCK_M):
                    visible[m], begin[m], mods = row_window(
                        m0 + m, visible[m], hk, group, q_rows, seqlen, s_q, window_left,
                        window_right, softcap, alibi_slopes, req, piece_scale)
                    row_mods[m, 0], row_mods[m, 1] = mods[2], mods[3]
                    row_mods[BLOCK_M, 0], row_mods[BLOCK_M, 1] = mods[0], mods[1]
            cuda.syncthreads()  # the staged query rows are written
            start_rows(floats, qv, m_i, l_i, O_i, ll)

            rd = 0  # ring slot of the tile computed now
            for n0 in range(n_lo, n_hi, BLOCK_N):
                ring_next(tile, words, k_cache, v_cache, block_table, num_pages, req, hk, key0, n0,
                          n_hi, rd, row, rl, src, valid, page_size, status)
                for b in range(BATCHES):  # the warp's keys, KBW KPL at a time
                    key = warp * KPW + b * KBW * KPL  # first tile row of the batch
                    score(words, floats, S, qv, rd, key, kq, ll, scratch, tid)
                    update(S, m_i, l_i, O_i, visible, begin, row_mods, n0, key, kq, scratch, tid)
                    accumulate(words, floats, S, O_i, rd, key, kq, ll)
                rd = rd + 1 if rd + 1 < NSTAGES else 0

            memory.cp_async_wait_all()
            cuda.syncthreads()  # the ring is idle
            store_partials(floats, m_i, l_i, O_i, warp, lane, scratch, tid)
            cuda.syncthreads()  # the partial results are written
            write_piece(out, lse, o_acc, lse_acc, floats, wscale, split, req, slot, hk, m0,
                        q_rows, group, v_scale, tid, status)

    return mla_decode_narrow


# ----------------------------------------------------------------------------- wide

def make_wide_piece_ends(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, FMT, SEPARATE_V, put,
                         put_lse):
    """The wide variant's phases that open a piece (the query rows into shared memory) and close
    it (the rows written); ``put``, ``put_lse`` from the walk."""
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, FMT, THREADS, SEPARATE_V)
    th = wide_threads(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, THREADS, SEPARATE_V)
    SL, TMo, Co, TDo = th["SL"], th["TMo"], th["Co"], th["TDo"]
    LOG_SL = _log2(SL)
    WARPS = THREADS // 32
    COLS, COLS_EXACT = _cdiv(HEAD_DIM, 32), HEAD_DIM % 32 == 0  # query columns per lane and row
    Q_ROWS_PER_WARP = _cdiv(BLOCK_M, WARPS)
    Q_OFF = lay.q * 4 // _item(FMT)  # storage elements
    L_OFF, M_OFF = lay.l, lay.m  # words
    ZERO_BITS = np.float32(0) if FMT == "float32" else np.uint16(0)  # +0.0 in every format

    @cuda.jit(device=True, inline="always")
    def load_q(tile, q, req, hk, m0, group, q_rows, warp, lane):
        """Q_i -> shared as storage bits; padding rows are zeros."""
        for jr in range(Q_ROWS_PER_WARP):
            r = warp + WARPS * jr
            if r < BLOCK_M:
                gr = m0 + r
                t = gr // group
                h = hk * group + gr - t * group
                for ii in range(COLS):
                    d = lane + 32 * ii
                    if COLS_EXACT or d < HEAD_DIM:
                        x = ZERO_BITS
                        if gr < q_rows:
                            x = q[req, t, h, uint64(d)]
                        tile[uint64(Q_OFF + r * HEAD_DIM + d)] = x

    @cuda.jit(device=True, inline="always")
    def write_piece(out, lse, o_acc, lse_acc, floats, O_i, m_i, l_i, split, req, slot, hk, m0,
                    q_rows, group, srow, sl, o_row0, co, scratch, tid, status):
        """Full row sums, then O_i / l_i and the lse, final or partial."""
        for k in range(LOG_SL):
            l_i += shfl_xor(l_i, 1 << k, scratch, tid)
        if srow < BLOCK_M and sl == 0:
            floats[uint64(L_OFF + srow)] = l_i
            floats[uint64(M_OFF + srow)] = m_i
        cuda.syncthreads()
        for im in range(TMo):
            r = o_row0 + im
            gr = m0 + r
            if gr < q_rows:
                t = gr // group
                h = hk * group + gr - t * group
                l = floats[uint64(L_OFF + r)]
                inv = ONE / l if l > ZERO else ZERO
                for jd in range(TDo):
                    for e in range(2):
                        col = 2 * (co + Co * jd) + e
                        if col < HEAD_DIM_V:
                            put(out, o_acc, split, req, slot, t, h, col, O_i[im, jd, e] * inv,
                                status)
                if co == 0:
                    put_lse(lse, lse_acc, split, req, slot, t, h, floats[uint64(M_OFF + r)], l,
                            status)

    return load_q, write_piece


def make_wide_kernel(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, CAUSAL, FMT, VEC,
                     SEPARATE_V, LEFTPAD, WINDOW=False, SOFTCAP=False, ALIBI=False,
                     CACHE=None, SPARSE=False):
    """The wide variant: all threads share each tile (no descales: the KV-cache decode runs
    the narrow one)."""
    assert CACHE != "e4m3"
    row_window, modified = make_row_modifiers(WINDOW, SOFTCAP, ALIBI)
    lay = shared_layout(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, FMT, THREADS, SEPARATE_V)
    th = wide_threads(BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, THREADS, SEPARATE_V)
    TM, TN, C, DS, SL, TS = (th[k] for k in ("TM", "TN", "C", "DS", "SL", "TS"))
    TMo, Co, TDo = th["TMo"], th["Co"], th["TDo"]
    LOG_DS, LOG_SL = _log2(DS), _log2(SL)
    TPR = THREADS // BLOCK_N  # copy: threads per cache row
    DP, VP = HEAD_DIM // 2, _cdiv(HEAD_DIM_V, 2)  # pairs of a key row, of its value part
    D_STEPS, D_TAIL = DP // DS, DP % DS  # pair slice of a thread: ds + DS * i
    VP_EXACT = VP % Co == 0
    ELEMS = 4 // _item(FMT)  # storage elements per word
    KV_STRIDE, P_STRIDE, PLANE = th["kv_stride"], th["p_stride"], th["plane"]
    Q_OFF, RING_OFF, SLOT = lay.q * ELEMS, lay.ring * ELEMS, BLOCK_N * KV_STRIDE  # elements
    RING_P, SLOT_P, KV_PAIRS = RING_OFF // 2, SLOT // 2, KV_STRIDE // 2  # in pairs
    P_OFF, ALPHA_OFF = lay.p, lay.alpha  # words
    SCRATCH = sync.scratch_size(THREADS)
    STORAGE = formats.storage_type(FMT)
    V_P = DP if SEPARATE_V else 0  # first pair of V in a tile row
    cta_work, piece_of, put, put_lse, first_key, ring_start, ring_next, pair = make_stream(
        HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS, FMT, VEC, RING_OFF, KV_STRIDE,
        SEPARATE_V, LEFTPAD, CACHE, SPARSE)
    load_q, write_piece = make_wide_piece_ends(HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_N, THREADS,
                                               FMT, SEPARATE_V, put, put_lse)

    @cuda.jit(device=True, inline="always")
    def score(words, floats, S, kv, kv_at, q_at, k_at, part_at, ds):
        """S = Q K^T: the thread's micro-tile over its pair slice, one partial sum per d-lane ds,
        written to plane ds (the softmax adds the DS planes up)."""
        for im in range(TM):
            for jn in range(TN):
                S[im, jn] = ZERO
        for i in range(D_STEPS + (1 if D_TAIL else 0)):
            if i < D_STEPS or ds < D_TAIL:  # pair ds + DS * i
                for jn in range(TN):
                    kv[jn, 0], kv[jn, 1] = pair(words, floats,
                                                kv_at + k_at + C * KV_PAIRS * jn + DS * i)
                for im in range(TM):
                    a0, a1 = pair(words, floats, q_at + DP * im + DS * i)
                    for jn in range(TN):
                        S[im, jn] += a0 * kv[jn, 0]  # two FMAs
                        S[im, jn] += a1 * kv[jn, 1]
        for im in range(TM):
            for jn in range(TN):
                floats[uint64(part_at + P_STRIDE * im + C * jn)] = S[im, jn]

    @cuda.jit(device=True, inline="always")
    def update(floats, sv, n0, visible, begin, mods, srow, sl, p_at, m_i, l_i, scale_log2,
               scratch, tid):
        """Online softmax, SL lanes per row: the scores (scaled, masked), the new maximum,
        P = exp2(S - m_new) (over plane 0) and the rescale factor alpha; the new m_i, l_i."""
        mx = NEG_INF
        for j in range(TS):
            c = sl + SL * j
            s = NEG_INF
            if srow < BLOCK_M and c < BLOCK_N and n0 + c < visible and (
                    not WINDOW or n0 + c >= begin):
                s = ZERO
                for plane in range(DS):
                    s += floats[uint64(p_at + PLANE * plane + SL * j)]
                s *= scale_log2
                s = modified(s, mods, mods[3] - float32(n0 + c))[0]  # (make_row_modifiers)
            sv[j] = s
            mx = max(mx, s)
        for k in range(LOG_SL):
            mx = max(mx, shfl_xor(mx, 1 << k, scratch, tid))
        m_new = max(m_i, mx)
        base = m_new if m_new != NEG_INF else ZERO  # a row with nothing visible yet
        alpha = math.exp2(m_i - base)
        m_i = m_new
        row_sum = ZERO
        for j in range(TS):
            p = math.exp2(sv[j] - base)
            row_sum += p
            c = sl + SL * j
            if srow < BLOCK_M and c < BLOCK_N:
                floats[uint64(p_at + SL * j)] = p
        l_i = l_i * alpha + row_sum
        if srow < BLOCK_M and sl == 0:
            floats[uint64(ALPHA_OFF + srow)] = alpha
        return m_i, l_i

    @cuda.jit(device=True, inline="always")
    def accumulate(words, floats, O_i, vv, kv_at, o_row0, co):
        """O_i = alpha O_i + P V, V being the first HEAD_DIM_V columns of the same tile (or the
        columns after the keys, V in its own cache)."""
        for im in range(TMo):
            a = floats[uint64(ALPHA_OFF + o_row0 + im)]
            for jd in range(TDo):
                for e in range(2):
                    O_i[im, jd, e] *= a
        for c in range(BLOCK_N):
            for jd in range(TDo):
                u = co + Co * jd
                vv[jd, 0] = ZERO
                vv[jd, 1] = ZERO
                if VP_EXACT or u < VP:
                    vv[jd, 0], vv[jd, 1] = pair(words, floats, kv_at + c * KV_PAIRS + V_P + u)
            for im in range(TMo):
                p = floats[uint64(P_OFF + (o_row0 + im) * P_STRIDE + c)]
                for jd in range(TDo):
                    O_i[im, jd, 0] += p * vv[jd, 0]
                    O_i[im, jd, 1] += p * vv[jd, 1]

    def mla_decode_wide(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse,
                        o_acc, lse_acc, status, s_q, group, page_size, scale_log2, v_cache,
                        key_start, window_left, window_right, softcap, alibi_slopes, k_descale,
                        v_descale):
        tile = cuda.shared.array(0, STORAGE, alignment=SHARED_ALIGN)
        words = cuda.shared.array(0, uint32, alignment=SHARED_ALIGN)
        floats = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)
        scratch = cuda.shared.array(SCRATCH, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        part, hk, m0, begin_req, end_req = cta_work(metadata, cache_seqlens.shape[0], status)
        if begin_req >= cache_seqlens.shape[0]:
            return  # idle part
        num_pages = k_cache.shape[0]
        q_rows = s_q * group
        row = tid // TPR  # copy: this thread's row of every tile,
        rl = tid % TPR  # its lane in the row
        src = cuda.local.array((2, 1), int32)  # ... where that row lies (make_kv_ring),
        valid = cuda.local.array(1, types.boolean)  # ... and whether it is read

        # This thread's place in each layout (see the module docstring) and its first pair in
        # the shared tiles it reads in that layout.
        ds = tid & (DS - 1)  # S = QK^T: d-lane,
        kg = (tid >> LOG_DS) % C  # key group,
        s_row0 = (tid // (DS * C)) * TM  # first row of the micro-tile
        q_at = Q_OFF // 2 + s_row0 * DP + ds  # Q[s_row0, pair ds]
        k_at = kg * KV_PAIRS + ds  # K[kg, pair ds], from the slot's start
        part_at = P_OFF + ds * PLANE + s_row0 * P_STRIDE + kg  # plane ds, S[s_row0, kg]
        srow = tid >> LOG_SL  # softmax: row,
        sl = tid & (SL - 1)  # lane in the row
        p_at = P_OFF + srow * P_STRIDE + sl  # plane 0, S[srow, sl]
        o_row0 = (tid // Co) * TMo  # O += PV: first row of the micro-tile,
        co = tid % Co  # first pair

        S = cuda.local.array((TM, TN), float32)
        kv = cuda.local.array((TN, 2), float32)
        sv = cuda.local.array(TS, float32)
        O_i = cuda.local.array((TMo, TDo, 2), float32)
        vv = cuda.local.array((TDo, 2), float32)

        for req in range(begin_req, end_req + 1):
            n_lo, n_hi, seqlen, split, slot = piece_of(metadata, cache_seqlens, num_splits, part,
                                                       req, begin_req, end_req, status)
            cuda.syncthreads()  # the previous piece's Q tile and row statistics are read
            key0 = first_key(key_start, req)
            ring_start(tile, k_cache, v_cache, block_table, num_pages, req, hk, key0, n_lo, n_hi,
                       row, rl, src, valid, page_size, status)
            load_q(tile, q, req, hk, m0, group, q_rows, warp, lane)

            # Keys the softmax row may see: all, or (causal) those before its token's diagonal.
            visible = seqlen
            if CAUSAL:
                visible = min(seqlen - (s_q - 1 - (m0 + srow) // group), seqlen)
            visible, begin, mods = row_window(m0 + srow, visible, hk, group, q_rows, seqlen, s_q,
                                              window_left, window_right, softcap, alibi_slopes,
                                              req, scale_log2)
            m_i = NEG_INF
            l_i = ZERO  # partial: this lane's share of the row sum
            for im in range(TMo):
                for jd in range(TDo):
                    for e in range(2):
                        O_i[im, jd, e] = ZERO

            rd = 0  # ring slot of the tile computed now
            for n0 in range(n_lo, n_hi, BLOCK_N):
                # Tile n0 lands (the barrier also ends the previous tile's reads of P, alpha).
                ring_next(tile, words, k_cache, v_cache, block_table, num_pages, req, hk, key0, n0,
                          n_hi, rd, row, rl, src, valid, page_size, status)
                kv_at = RING_P + rd * SLOT_P  # the tile's first pair
                score(words, floats, S, kv, kv_at, q_at, k_at, part_at, ds)
                cuda.syncthreads()  # the S planes are written
                m_i, l_i = update(floats, sv, n0, visible, begin, mods, srow, sl, p_at, m_i, l_i,
                                  scale_log2, scratch, tid)
                cuda.syncthreads()  # P and alpha are written
                accumulate(words, floats, O_i, vv, kv_at, o_row0, co)
                rd = rd + 1 if rd + 1 < NSTAGES else 0

            write_piece(out, lse, o_acc, lse_acc, floats, O_i, m_i, l_i, split, req, slot, hk,
                        m0, q_rows, group, srow, sl, o_row0, co, scratch, tid, status)

    return mla_decode_wide


# ----------------------------------------------------------------------------- spec

# BLOCK_N (cache rows per tile) by BLOCK_M (packed query rows, a power of two up to 16). One or
# two rows run the narrow variant (warps split the keys): 32-row tiles, 4 keys per warp, a
# three-tile cp.async ring of 108 KiB in 16 bits. More rows are bound by arithmetic and need their
# registers for the O_i micro-tile (BLOCK_M * HEAD_DIM_V / 256 floats per thread) and the S
# micro-tile, so they take shallower tiles. 128 query rows (h_q = 128) run as eight tiles of 16:
# BLOCK_M = 32 (O_i of 64 floats per thread) spills on sm_80. While a configuration exceeds the
# device's shared memory (float32 tiles), BLOCK_N halves down to the warp count, but a wide tile
# never below BLOCK_M (float32 16 x 8 spills on sm_80), then BLOCK_M halves.
# Checked by the PTX test (HEAD_DIM 576): no spills on sm_80 / sm_90.
BLOCK_N_BY_ROWS = ((8, 32), (16, 16))
# Threads per CTA: 256 (8 warps) on a GPU. The simulator runs every thread as a Python thread and
# a barrier among 256 of them costs ~8x one among 64, so simulated runs use 64 (the layouts are
# parametric in it; one test runs the GPU's 256).
LAUNCH_THREADS = 64 if SIMULATOR else THREADS


class Spec(KVCacheDecodeSpec):
    name = "mla_decode"

    def entry(self, config, device):
        """(BLOCK_M, BLOCK_N, threads): see BLOCK_N_BY_ROWS."""
        def nbytes(bm, bn):
            return shared_layout(bm, bn, config.head_dim, config.head_dim_v, config.fmt,
                                 LAUNCH_THREADS, config.separate_v).bytes

        limit = device.shared_per_block
        bm = min(BLOCK_N_BY_ROWS[-1][0], 1 << (config.q_rows - 1).bit_length())
        if config.separate_v:
            # The KV-cache decode never takes the wide variant: rows past what the narrow one
            # holds run as several narrow tiles, each streaming the cache (the second mostly from
            # L2). On an H200, GQA groups of 8 at D 128 read 0.45 TB/s in one wide tile.
            while bm > 1 and not narrow_lanes(bm, config.head_dim):
                bm //= 2
        while True:
            bn = next(n for rows, n in BLOCK_N_BY_ROWS if bm <= rows)
            if config.head_dim <= SHORT_ROW and narrow_lanes(bm, config.head_dim):
                bn = SHORT_BLOCK_N
            least = max(LAUNCH_THREADS // 32, 1 if narrow_lanes(bm, config.head_dim) else bm)
            while nbytes(bm, bn) > limit and bn > least:
                bn //= 2
            if nbytes(bm, bn) <= limit or bm == 1:
                return bm, bn, LAUNCH_THREADS
            bm //= 2

    def tiles(self, config, entry):
        bm, bn, threads = entry
        return Tiles(bm, bn, threads, shared_layout(bm, bn, config.head_dim, config.head_dim_v,
                                                    config.fmt, threads, config.separate_v).bytes)

    def make(self, config, tiles):
        return make_mla_decode_kernel(config.head_dim, config.head_dim_v, tiles.BLOCK_M,
                                      tiles.BLOCK_N, tiles.threads, config.causal, config.fmt,
                                      config.vec, config.separate_v, config.leftpad,
                                      config.window, config.softcap, config.alibi,
                                      config.cache, config.sparse)

    def samples(self):
        """DeepSeek's head dims: 1 to 16 and 128 rows, causal or not, in bfloat16 under an
        H100's shared memory per block; three in float32 under an A100's; rows that are not in
        16-byte chunks once; and the KV-cache decode's: four with and without the masks and
        modifiers, rows not in 16-byte chunks, two with FP8 caches; three sparse decodes.
        (The SM count does not change the code.)"""
        h100 = Device(cc=SM90, sms=132, shared_per_block=227 * 1024)
        a100 = Device(cc=SM80, sms=132, shared_per_block=163 * 1024)
        cases = [(rows, causal, "bfloat16", True, h100) for rows in (1, 2, 4, 8, 16, 128)
                 for causal in (False, True)]
        cases += [(rows, causal, "float32", True, a100)
                  for rows, causal in ((1, False), (8, True), (128, False))]
        cases.append((16, False, "bfloat16", False, h100))
        mla = [Sample(f"simt mla q_rows={rows} causal={causal} {fmt} "
                      f"limit={dev.shared_per_block // 1024}K{'' if vec else ' unaligned'}",
                      (rows, 576, 512, causal, fmt, vec), device=dev, ccs=(dev.cc,))
               for rows, causal, fmt, vec, dev in cases]
        # flash_attn_with_kvcache's decode: V in its own cache (D 128), a GQA group of 4 query
        # heads (the wide variant) with left padding, and one head (the narrow one); each with a
        # window, a softcap and ALiBi.
        return mla + [Sample(f"simt kvcache q_rows={rows} d=128 leftpad={pad} bfloat16"
                             + (" window softcap alibi" if mods else ""),
                             (rows, 128, 128, mods, "bfloat16", True, False, True, pad,
                              mods, mods, mods), device=h100, ccs=(SM90,))
                      for rows, pad in ((4, True), (1, False)) for mods in (False, True)] + [
            Sample(f"simt kvcache q_rows=4 d=128{' fp8 cache' if fp8 else ''}"
                   f"{'' if vec else ' unaligned'} float16",
                   (4, 128, 128, False, "float16", vec, False, True, False, False, False,
                    False, "e4m3" if fp8 else None), device=h100,
                   ccs=(SM90,) if fp8 else (SM80, SM90))
            for vec, fp8 in ((False, False), (True, True), (False, True))] + [
            # DeepSeek-V3.2's sparse decode: 656-byte FP8 rows, one token of 2 and of 128 heads;
            # a bfloat16 cache's.
            Sample(f"simt sparse q_rows={rows} {cache or 'bfloat16'} cache",
                   (rows, 576, 512, False, "bfloat16", True, False, False, False, False, False,
                    False, cache, True), device=h100, ccs=(SM90,) if cache else (SM80, SM90))
            for rows, cache in ((2, "v32"), (128, "v32"), (16, None))]


SPEC = Spec()
