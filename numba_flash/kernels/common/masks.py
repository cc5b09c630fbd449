"""Sequence bounds, causal limits and masks: which keys a query row or tile sees, and which
tiles need a mask at all.

A kernel takes the numbers of queries and keys of its batch entry, and the causal offset
``diag = Sk - Sq``, from ``seqlen_info``. The mask is aligned bottom-right (FlashAttention's
convention): query row r sees keys j < Sk with j <= r + diag (``make_mask``), so the last query
row sees every key and, for Sq > Sk, the first Sq - Sk rows see none (their lse is +inf). A query
tile m0 .. m0 + BLOCK_M - 1 therefore needs no key past ``m0 + BLOCK_M + diag`` (``make_kv_end``:
the kernels stop their key loop there); keys from n0 on are seen by no query tile before the one
holding row ``n0 - diag`` (``make_q_begin``: the backward's dK/dV kernels start their query loop
there); and a key tile n0 .. n0 + BLOCK_N - 1 needs masking only where it crosses the ragged end
of the keys or the diagonal of the tile's first row (``make_needs_mask``); every other tile is
computed unmasked.
"""

from numba import cuda


@cuda.jit(device=True, inline="always")
def seqlen_info(b, seqlen_q, seqlen_k):
    """``(seqlen_q, seqlen_k, diag)`` of batch entry ``b``: its numbers of queries and keys and
    the causal offset ``diag = seqlen_k - seqlen_q`` (query r sees keys j <= r + diag). Dense
    batches: every entry has the lengths the kernel is given. Every forward and backward kernel
    takes its bounds from here: per-sequence lengths belong in this function."""
    return seqlen_q, seqlen_k, seqlen_k - seqlen_q


def make_mask(CAUSAL):
    """Device function ``masked_out(row, key, diag, seqlen_k)``: whether query ``row`` does not
    see ``key``: a key past the sequence (``key >= seqlen_k``) or, causal, past the row's
    diagonal (``key > row + diag``)."""

    @cuda.jit(device=True, inline="always")
    def masked_out(row, key, diag, seqlen_k):
        return key >= seqlen_k or (CAUSAL and key > row + diag)

    return masked_out


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
