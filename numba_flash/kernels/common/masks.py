"""Sequence bounds, causal limits and masks: which keys a query row or tile sees, and which
tiles need a mask at all.

A kernel takes where its batch entry's queries and keys start, how many there are (a dense batch
or packed varlen sequences), and the causal offset ``diag = Sk - Sq`` from ``make_seqlen_info``;
everything below is per sequence. The mask is aligned bottom-right (FlashAttention's
convention): query row r sees keys j < Sk with j <= r + diag (``make_mask``, or as one limit per
row ``make_row_end``), so the last query row sees every key and, for Sq > Sk, the first Sq - Sk
rows see none (their lse is +inf). A query tile m0 .. m0 + BLOCK_M - 1 therefore needs no key
past ``m0 + BLOCK_M + diag`` (``make_kv_end``: the kernels stop their key loop there); keys from
n0 on are seen by no query tile before the one holding row ``n0 - diag`` (``make_q_begin``: the
backward's dK/dV kernels start their query loop there); and a key tile n0 .. n0 + BLOCK_N - 1
needs masking only where it crosses the ragged end of the keys or the diagonal of the tile's
first row (``make_needs_mask``); every other tile is computed unmasked.
"""

from numba import cuda

from .status import BAD_SEQLENS, report


def make_seqlen_info(VARLEN, PAGED=False):
    """Device function ``seqlen_info(b, seqlen_q, seqlen_k, total_q, total_k, cu_seqlens_q,
    cu_seqlens_k, seqused_k, status) -> (q0, k0, seqlen_q, seqlen_k, diag)``: where batch entry
    ``b``'s queries and keys start in their arrays, how many there are, and the causal offset
    ``diag = seqlen_k - seqlen_q`` (query r sees keys j <= r + diag). Every forward and backward
    kernel takes its bounds from here.

    Dense batches: every entry starts at row 0 of its own batch slice and has the lengths the
    kernel is given. Varlen (``VARLEN``, packed sequences): sequence b owns rows
    ``cu_seqlens[b] .. cu_seqlens[b + 1]`` of arrays ``total_q`` / ``total_k`` rows long, and
    uses its first ``seqused_k[b]`` keys when ``seqused_k`` is not empty; ``seqlen_q`` and
    ``seqlen_k`` are max_seqlen_q / max_seqlen_k, the bounds the grid was sized by. Paged K/V
    (``PAGED``, with VARLEN): the keys live behind the block table, each sequence's from its
    key 0 on (``k0 = 0``), ``cu_seqlens_k`` gives only their number, and ``total_k`` is the
    table's capacity (its width times the page size). Offsets are values only the device sees:
    each is clamped into its array and its bound, so no row outside the arrays is ever touched,
    and a clamp reports BAD_SEQLENS."""

    @cuda.jit(device=True, inline="always")
    def dense(b, seqlen_q, seqlen_k, total_q, total_k, cu_seqlens_q, cu_seqlens_k, seqused_k,
              status):
        return 0, 0, seqlen_q, seqlen_k, seqlen_k - seqlen_q

    @cuda.jit(device=True, inline="always")
    def varlen(b, seqlen_q, seqlen_k, total_q, total_k, cu_seqlens_q, cu_seqlens_k, seqused_k,
               status):
        q0 = min(max(cu_seqlens_q[b], 0), total_q)
        q1 = min(max(cu_seqlens_q[b + 1], q0), total_q)
        len_q = min(q1 - q0, seqlen_q)
        bad = q0 != cu_seqlens_q[b] or q1 != cu_seqlens_q[b + 1] or len_q != q1 - q0
        if PAGED:  # only the number of keys: they start at the table's first page
            k0 = 0
            keys = cu_seqlens_k[b + 1] - cu_seqlens_k[b]
            len_k = min(max(keys, 0), seqlen_k, total_k)
            bad = bad or len_k != keys
        else:
            k0 = min(max(cu_seqlens_k[b], 0), total_k)
            k1 = min(max(cu_seqlens_k[b + 1], k0), total_k)
            len_k = min(k1 - k0, seqlen_k)
            bad = bad or k0 != cu_seqlens_k[b] or k1 != cu_seqlens_k[b + 1] or len_k != k1 - k0
        if seqused_k.shape[0] > 0:
            used = seqused_k[b]
            bad = bad or used < 0 or used > len_k
            len_k = min(max(used, 0), len_k)
        if bad:
            report(status, BAD_SEQLENS)
        return q0, k0, len_q, len_k, len_k - len_q

    assert VARLEN or not PAGED
    return varlen if VARLEN else dense


def make_mask(CAUSAL, KEYS_IN_RANGE=False):
    """Device function ``masked_out(row, key, diag, seqlen_k)``: whether query ``row`` does not
    see ``key``: a key past the sequence (``key >= seqlen_k``) or, causal, past the row's
    diagonal (``key > row + diag``). ``KEYS_IN_RANGE``: the caller never tests a key past the
    sequence (it loops over the real keys only, or never stores the others), so only the
    diagonal is tested. The element test of every kernel that masks elements one by one;
    ``make_row_end`` is the same rule as one limit per row."""

    @cuda.jit(device=True, inline="always")
    def masked_out(row, key, diag, seqlen_k):
        past_end = not KEYS_IN_RANGE and key >= seqlen_k
        return past_end or (CAUSAL and key > row + diag)

    return masked_out


def make_row_end(CAUSAL):
    """Device function ``row_end(row, diag, seqlen_k)``: the end of the keys query ``row``
    sees, ``make_mask``'s rule as a limit: keys ``j < row_end`` are visible. A kernel whose
    thread holds a run of one row's keys compares each with this limit once computed."""

    @cuda.jit(device=True, inline="always")
    def row_end(row, diag, seqlen_k):
        end = seqlen_k
        if CAUSAL:
            end = min(end, row + diag + 1)
        return end

    return row_end


def make_kv_end(BLOCK_M, CAUSAL):
    """Device function ``kv_end(m0, diag, seqlen_k)``: the end of the keys that the query tile
    ``m0 .. m0 + BLOCK_M - 1`` may see: all of them, or (causal, query r sees keys j <= r + diag)
    those up to the diagonal of its last row. Key tiles from there on are skipped."""

    @cuda.jit(device=True, inline="always")
    def kv_end(m0, diag, seqlen_k):
        end = seqlen_k
        if CAUSAL:
            end = min(seqlen_k, m0 + BLOCK_M + diag)
        return end

    return kv_end


def make_q_begin(BLOCK_M, CAUSAL):
    """Device function ``q_begin(n0, diag)``: the first query tile (a multiple of BLOCK_M) with
    a row that may see key ``n0``: 0, or (causal, query r sees keys j <= r + diag) the tile of
    row ``n0 - diag``, the first to reach it. Query tiles before it see none of the keys ``n0``
    on and are skipped."""

    @cuda.jit(device=True, inline="always")
    def q_begin(n0, diag):
        m_begin = 0
        if CAUSAL:
            m_begin = max(0, n0 - diag) // BLOCK_M * BLOCK_M
        return m_begin

    return q_begin


def make_needs_mask(BLOCK_N, CAUSAL):
    """Device function ``needs_mask(n0, m0, diag, seqlen_k)``: whether the key tile ``n0 ..
    n0 + BLOCK_N - 1`` crosses the ragged end of the keys or (causal) the diagonal of query row
    ``m0``, the first of its tile."""

    @cuda.jit(device=True, inline="always")
    def needs_mask(n0, m0, diag, seqlen_k):
        crosses = n0 + BLOCK_N > seqlen_k
        if CAUSAL:
            crosses = crosses or n0 + BLOCK_N - 1 > m0 + diag
        return crosses

    return needs_mask


def make_window(BLOCK_M, BLOCK_N, WINDOW):
    """The sliding window of a forward query tile (flash-attn's ``window_size=(left, right)``:
    query r sees keys ``r + diag - left <= j <= r + diag + right``), as two device functions.

    ``key_window(m0, diag, seqlen_k, left, right, unit) -> (n_start, diag_hi, diag_lo)``: the
    first key the query tile ``m0 ..`` may see, rounded down to a multiple of ``unit``, and the
    two diagonals relative to it: the kernel views its keys from ``n_start`` on (the tiles
    before it are never visited, so the cost follows the visible pairs), and the causal rules
    of this module hold with ``diag_hi`` as the diagonal (right = 0 is causal). Without
    ``WINDOW``: (0, diag, 0). An unbounded side arrives as a bound past any sequence
    (``validate.window``). ``make_key_view`` applies it.

    ``query_window(n0, diag, seqlen_q, left, right) -> (q_end, diag_hi, diag_lo)``: the
    transposed view, for the key tile ``n0 ..`` of a dK/dV kernel: the queries from ``q_end`` on
    see none of its keys (they are past the window's left side: ``i > j - diag + left``), so the
    kernel's queries end there; the diagonals are absolute. Without ``WINDOW``: (seqlen_q,
    diag, 0).

    ``crosses_begin(n0, m0, diag_lo)``: whether the key tile ``n0 ..`` holds a key before the
    first one some row of the query tile ``m0 ..`` sees (``j < r + diag_lo``): the tiles whose
    elements need the lower test, besides those ``make_needs_mask`` names."""

    @cuda.jit(device=True, inline="always")
    def key_window(m0, diag, seqlen_k, left, right, unit):
        if WINDOW:
            diag_lo = diag - left
            n_start = min(max(0, m0 + diag_lo) // unit * unit, max(seqlen_k, 0))
            return n_start, diag + right - n_start, diag_lo - n_start
        return 0, diag, 0

    @cuda.jit(device=True, inline="always")
    def query_window(n0, diag, seqlen_q, left, right):
        if WINDOW:
            return min(seqlen_q, max(n0 + BLOCK_N + left - diag, 0)), diag + right, diag - left
        return seqlen_q, diag, 0

    @cuda.jit(device=True, inline="always")
    def crosses_begin(n0, m0, diag_lo):
        return WINDOW and n0 < m0 + BLOCK_M - 1 + diag_lo

    return key_window, query_window, crosses_begin


def make_key_view(BLOCK_M, BLOCK_N, WINDOW, PAGED=False):
    """Device function ``key_view(k, v, block_table, m0, diag, seqlen_k, left, right) -> (k, v,
    block_table, seqlen_k, rel0, diag_hi, diag_lo)``: the keys a forward or dQ query tile walks,
    viewed from the first one its window reaches (``make_window``'s ``key_window``), with the
    diagonals relative to that view and ``rel0 = diag - n_start``, which turns a row and a
    key of the view back into ``i + diag - j`` (``score_mods``). Dense and packed keys are
    sliced from the window's first tile on; paged ones (``PAGED``) from its first page, by
    slicing the block table (its columns are whole pages), so ``n_start`` is then a multiple
    of the page size. Without ``WINDOW``: everything as given, ``rel0 = diag``."""
    key_window = make_window(BLOCK_M, BLOCK_N, WINDOW)[0]

    @cuda.jit(device=True, inline="always")
    def key_view(k, v, block_table, m0, diag, seqlen_k, left, right):
        unit = k.shape[1] if PAGED else BLOCK_N  # a page, or a tile
        n_start, diag_hi, diag_lo = key_window(m0, diag, seqlen_k, left, right, unit)
        if WINDOW:
            if PAGED:
                block_table = block_table[:, n_start // unit:]
            else:
                k, v = k[:, n_start:], v[:, n_start:]
            seqlen_k -= n_start
        return k, v, block_table, seqlen_k, diag - n_start, diag_hi, diag_lo

    return key_view
