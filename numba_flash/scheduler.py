"""MLA tile scheduler: how paged decode work is dealt out to the SMs (FlashMLA semantics).

The problem. In decode every sequence of the batch contributes only ``s_q`` query tokens, but each
of them has to read that sequence's whole KV cache. The work per sequence is therefore proportional
to its cache length, and cache lengths in one batch can differ by orders of magnitude (a 20-token
chat next to a 100k-token document). Giving one CTA per sequence would leave most SMs idle while a
few grind through the long sequences, and with a small batch the GPU would not even be filled.

The idea. Cut the KV cache of every sequence into blocks of ``BLOCK_N = 64`` rows and measure all
work in blocks. Launch a fixed number of CTAs, the *SM parts* (about one per SM, fewer when the
query rows that share a KV head need several 64-row tiles), and give every part the same budget.
The sequences are laid end to end and the line is cut into ``num_sm_parts`` consecutive pieces of
(almost) equal length; a part therefore handles a run of consecutive requests, and a long request
may be cut so that its blocks are spread over several parts.

The fixed overhead. Starting on a request is not free: the part loads the request's query tile,
sets up its online-softmax state and, at the end, writes an output tile. The scheduler charges
``FIXED_OVERHEAD_BLOCKS = 5`` blocks for every (part, request) pair, so a part does not hop across
many tiny requests for free and a request is not cut into slivers whose setup would cost more than
their reading. A length-0 request still counts one block (plus the overhead): the kernel must
visit it once to write its ``out = 0``, ``lse = +inf``.

Split and combine. A request cut into ``n > 1`` pieces cannot be finished by any single part: each
part computes attention over its share of the keys only and writes a partial result into an
accumulator slot: float32 ``O_i`` (softmax-normalised over that share alone) and its log-sum-exp
``lse_i``. A second, tiny kernel (``combine``) then merges the ``n`` slots of every split
request with the log-sum-exp rule: ``lse = log sum exp(lse_i)``, ``out = sum exp(lse_i - lse)
O_i``. A request handled in one piece skips the accumulators and its part writes the final output
directly. Because every part contributes at most one cut, the number of slots is at most
``b + num_sm_parts - 1``: accumulators sized ``(b + num_sm_parts, ...)`` always suffice.

The algorithm (all counts in blocks)::

    num_sm_parts = max(num_sms // h_kv // ceil(num_q_tokens_per_head_k / 64), 1)
    nb[i]        = max(seqlen_i - 1, 0) // 64 + 1
    payload      = ceil(sum(nb[i] + 5) / num_sm_parts) + 5
    for each part, with `rem = payload`:
        while requests are left:
            left = blocks of the current request not yet given to any part
            if rem >= left + 5:   the part takes all of them; rem -= left + 5; next request
            elif rem - 5 > 0:     the part takes the next rem - 5 of them (a cut); stop
            else:                 stop (the request goes to the next part)

Each part then costs at most ``payload`` (blocks plus 5 per piece), and the greedy walk provably
finishes within ``num_sm_parts`` parts: every part uses up at least ``payload - 5 =
ceil(total / num_sm_parts)`` of the total.

Output conventions (the contract the decode and combine kernels rely on)
------------------------------------------------------------------------
``num_splits``: int32 ``(b + 1,)``, the exclusive prefix sum of the number of pieces of each
request: ``num_splits[0] = 0`` and request ``r`` has ``num_splits[r + 1] - num_splits[r] >= 1``
pieces, whose accumulator slots are ``num_splits[r] .. num_splits[r + 1] - 1`` in key order (piece
``k`` covers earlier keys than piece ``k + 1``). ``num_splits[b]`` is the total number of slots.

``metadata``: int32 ``(num_sm_parts, 8)``, one row per part (CTA ``blockIdx`` of the part axis)::

    col 0  BEGIN_REQ     first request of the part                                   (inclusive)
    col 1  END_REQ       last request of the part                                    (INCLUSIVE)
    col 2  BEGIN_BLOCK   first block of BEGIN_REQ handled here                       (inclusive)
    col 3  END_BLOCK     block bound of END_REQ handled here                         (EXCLUSIVE)
    col 4  BEGIN_SPLIT   index of this part's piece *within* BEGIN_REQ: how many pieces of that
                         request earlier parts already took (0 unless BEGIN_REQ was cut before).
                         It is a local index, NOT a slot: the slot is num_splits[req] + piece.
    col 5  FIRST_SPLIT   1 when BEGIN_REQ is cut into more than one piece, else 0
    col 6  LAST_SPLIT    1 when END_REQ is cut into more than one piece, else 0
    col 7  0             padding (FlashMLA's 32-byte row)

Blocks are in units of ``BLOCK_N = 64`` KV rows of the request (block ``j`` is rows ``64 j ..
64 j + 63`` of the sequence, whatever the page size of the cache); ``END_BLOCK`` of a request
taken to its end equals ``nb[END_REQ]``. When ``BEGIN_REQ == END_REQ`` the part holds one piece of
one request: its block range is ``[BEGIN_BLOCK, END_BLOCK)`` and ``FIRST_SPLIT == LAST_SPLIT``.
Requests strictly between ``BEGIN_REQ`` and ``END_REQ`` are whole and never split. In every case
the flag of a request equals ``num_splits[r + 1] - num_splits[r] > 1``.

A part that ends on a length-0 request has ``END_BLOCK = 0`` (its empty block is visited, no key
is read) and that request is never flagged as cut (FlashMLA's rule).

An idle part (no work left when its turn came; parts are filled in order, so idle parts are the
last rows) has ``BEGIN_REQ == b``; its row is ``[b, b - 1, nb[0] - 1, END_BLOCK of request b -
1, 0, 0, 0, 0]`` (``[0, -1, 0, 0, 0, 0, 0, 0]`` for an empty batch). The odd BEGIN_BLOCK is
FlashMLA's: its planner reads the first block of request ``b``, one past its per-request array,
and finds the next array's first word, request 0's last block. Kernels never read it, and
writing the same value keeps the metadata identical to FlashMLA's for every input. The
inclusive request loop below is empty for an idle part anyway, but a kernel should test
``BEGIN_REQ >= b`` first and exit.

How a decode kernel walks its row (``part_pieces`` below does exactly this on the host)::

    row = metadata[part]
    if row[0] >= b: return                                   # idle part
    for req in range(row[0], row[1] + 1):                    # END_REQ inclusive
        first, last = req == row[0], req == row[1]
        blk_lo = row[2] if first else 0
        blk_hi = row[3] if last else nb[req]                 # exclusive
        keys   = [blk_lo * 64, min(blk_hi * 64, seqlen[req]))  # may be empty (seqlen 0)
        piece  = row[4] if first else 0
        split  = row[5] if first else (row[6] if last else 0)
        if split: write float32 O and lse to accumulator slot num_splits[req] + piece
        else:     write the final out / lse of request `req` directly

(Under causal masking with ``s_q > 1`` a query token sees fewer keys than ``seqlen``; the schedule
does not change, the kernel just masks. A piece can then hold no visible key for some query row:
its partial for that row is ``O_i = 0`` with ``lse_i = -inf`` (weight 0 in the combine), and a row
with no visible key in any piece must come out as ``out = 0``, ``lse = +inf``.)
"""

import numpy as np

BLOCK_N = 64  # KV rows per scheduling block (FlashMLA's block_size_n)
TILE_M = 64  # query rows (s_q * h_q / h_kv packed) per CTA tile (FlashMLA's block_size_m)
FIXED_OVERHEAD_BLOCKS = 5  # cost of one (part, request) pair, in blocks
METADATA_SIZE = 8  # int32 fields per metadata row

# Column indices of a metadata row.
BEGIN_REQ = 0
END_REQ = 1
BEGIN_BLOCK = 2
END_BLOCK = 3
BEGIN_SPLIT = 4
FIRST_SPLIT = 5
LAST_SPLIT = 6


def _ceil_div(a, b):
    return -(-a // b)


def num_sm_parts(num_sms, num_heads_k, num_q_tokens_per_head_k):
    """Number of SM parts (CTAs along the part axis of the decode grid).

    FlashMLA's grid has one CTA per (part, KV head, 64-row query tile), and the parts are sized
    so that it holds about ``num_sms`` CTAs, one wave: ``max(num_sms // h_kv // ceil(q_rows /
    64), 1)`` (sequential integer divisions, as FlashMLA does). The SIMT decode kernel keeps
    this count (the metadata format is FlashMLA's) but its query tiles are smaller
    (``kernels/simt/mla_decode.py``'s spec), so its grid ``(num_sm_parts, h_kv, ceil(q_rows / BLOCK_M))``
    can hold several waves for many heads.
    """
    for name, value in (("num_sms", num_sms), ("num_heads_k", num_heads_k),
                        ("num_q_tokens_per_head_k", num_q_tokens_per_head_k)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    m_tiles = _ceil_div(int(num_q_tokens_per_head_k), TILE_M)
    return max(int(num_sms) // int(num_heads_k) // m_tiles, 1)


def num_blocks(cache_seqlens):
    """Blocks of ``BLOCK_N`` KV rows per request: ``max(seqlen - 1, 0) // 64 + 1``, int64 array.

    Equal to ``ceil(seqlen / 64)`` except that a length-0 request counts one (empty) block, so
    that some part visits it and writes its ``out = 0``, ``lse = +inf``.
    """
    s = np.asarray(cache_seqlens).astype(np.int64)
    return np.maximum(s - 1, 0) // BLOCK_N + 1


def payload(nb, parts):
    """Block budget of one part: ``ceil(sum(nb + 5) / parts) + 5``."""
    total = int(np.sum(np.asarray(nb, dtype=np.int64) + FIXED_OVERHEAD_BLOCKS))
    return _ceil_div(total, parts) + FIXED_OVERHEAD_BLOCKS


def _check_seqlens(cache_seqlens):
    s = np.asarray(cache_seqlens)
    if s.ndim != 1:
        raise ValueError(f"cache_seqlens: expected a 1-D array of shape (b,), got shape {s.shape}")
    if s.size and not np.issubdtype(s.dtype, np.integer):
        raise TypeError(f"cache_seqlens: expected an integer (int32) array, got dtype {s.dtype}")
    if s.size and int(s.min()) < 0:
        raise ValueError(f"cache_seqlens: expected lengths >= 0, got a minimum of {int(s.min())}")
    if s.size and int(s.max()) > np.iinfo(np.int32).max:
        raise ValueError(f"cache_seqlens: expected lengths that fit int32, got {int(s.max())}")
    return s.astype(np.int64)


def plan_mla(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_sms):
    """FlashMLA's ``get_mla_metadata`` on the host.

    Parameters: ``cache_seqlens`` (b,) integer array of KV lengths; ``num_q_tokens_per_head_k =
    s_q * h_q // h_kv`` (query rows packed against one KV head); ``num_heads_k = h_kv``;
    ``num_sms``: SMs of the device.

    Returns ``(metadata, num_splits)``: int32 ``(num_sm_parts, 8)`` and int32 ``(b + 1,)``, with
    the conventions of the module docstring (END_REQ inclusive, END_BLOCK exclusive, BEGIN_SPLIT a
    piece index within BEGIN_REQ, idle rows with BEGIN_REQ == b).
    """
    seqlens = _check_seqlens(cache_seqlens)
    parts = num_sm_parts(num_sms, num_heads_k, num_q_tokens_per_head_k)
    b = int(seqlens.shape[0])
    nb = [int(x) for x in num_blocks(seqlens)]
    ov = FIXED_OVERHEAD_BLOCKS
    budget = payload(nb, parts)

    metadata = np.zeros((parts, METADATA_SIZE), dtype=np.int32)
    num_splits = np.zeros(b + 1, dtype=np.int32)

    req = 0  # first request with blocks not yet given to a part
    blk = 0  # first block of `req` not yet given to a part
    piece = 0  # pieces of `req` already given to earlier parts
    slots = 0  # pieces of all requests before `req`
    for p in range(parts):
        row = metadata[p]
        row[BEGIN_REQ] = req
        row[BEGIN_BLOCK] = blk
        row[BEGIN_SPLIT] = piece
        first_cut = blk != 0  # this part starts inside a request cut by an earlier part
        rem = budget
        while req < b:
            left = nb[req] - blk
            if rem >= left + ov:  # the rest of the request fits: take it and move on
                rem -= left + ov
                slots += piece + 1
                num_splits[req + 1] = slots
                req, blk, piece = req + 1, 0, 0
            else:
                if rem - ov > 0:  # take what the budget allows, the next part continues
                    blk += rem - ov
                    piece += 1
                break  # (otherwise too little is left even to start the request)
        if row[BEGIN_REQ] == b and b > 0:  # idle: FlashMLA's begin_block (see below)
            row[BEGIN_BLOCK] = nb[0] - 1
        if blk > 0:  # the part stopped inside `req`
            end_req, end_blk = req, blk
        else:  # the part ended on a request boundary (or is idle); a length-0 request ends at 0
            end_req = req - 1
            end_blk = (nb[end_req] if seqlens[end_req] > 0 else 0) if end_req >= 0 else 0
        last_cut = end_req >= 0 and end_blk != nb[end_req] and seqlens[end_req] > 0
        if row[BEGIN_REQ] == end_req:  # one piece of one request: both flags say "is it cut"
            first_cut = last_cut = first_cut or last_cut
        row[END_REQ] = end_req
        row[END_BLOCK] = end_blk
        row[FIRST_SPLIT] = int(first_cut)
        row[LAST_SPLIT] = int(last_cut)
    if not (req == b and blk == 0 and piece == 0):
        raise AssertionError("MLA scheduler left work unassigned (cannot happen)")
    return metadata, num_splits


def part_pieces(row, cache_seqlens, num_splits):
    """The pieces of work of one metadata row, in the order a decode kernel does them.

    Returns a list of ``(req, blk_lo, blk_hi, slot, is_split)``: blocks ``[blk_lo, blk_hi)`` of
    request ``req`` (keys ``[64 blk_lo, min(64 blk_hi, seqlen))``); when ``is_split`` the result
    goes to accumulator slot ``slot = num_splits[req] + piece``, otherwise it is the final output
    of ``req`` (``slot`` is then ``num_splits[req]``, unused). Empty for an idle part.
    """
    nb = num_blocks(cache_seqlens)
    b = len(nb)
    begin_req, end_req = int(row[BEGIN_REQ]), int(row[END_REQ])
    if begin_req >= b:
        return []
    out = []
    for req in range(begin_req, end_req + 1):
        first, last = req == begin_req, req == end_req
        blk_lo = int(row[BEGIN_BLOCK]) if first else 0
        blk_hi = int(row[END_BLOCK]) if last else int(nb[req])
        piece = int(row[BEGIN_SPLIT]) if first else 0
        split = bool(row[FIRST_SPLIT]) if first else (bool(row[LAST_SPLIT]) if last else False)
        out.append((req, blk_lo, blk_hi, int(num_splits[req]) + piece, split))
    return out
