"""Before a KV-cache decode: the new keys and values appended to the caches (rotary applied), the
query rotated, and the per-sequence view of the cache that the paged decode reads.

What it computes
    ``flash_attn_with_kvcache`` (api.py) is this kernel, the paged decode of
    ``simt/mla_decode.py`` (with V in a cache of its own) and the split-KV combine. The decode
    reads a cache through a block table and one length per sequence, starting at key 0; this
    kernel turns flash-attn's description of the cache into that one. For sequence ``b`` with
    ``L = cache_seqlens[b]`` keys already cached (an array, one number for all, or the whole
    cache) and ``S_new`` new ones:

    append    row ``t`` of the new ``k``, ``v`` goes to cache position ``L + t`` of the
              sequence's cache (row ``cache_batch_idx[b]`` of a contiguous cache, or the page
              ``block_table[b, p // page_size]``, slot ``p % page_size`` of a paged one); with
              rotary tables, ``k`` is rotated at that position first.
    rotate q  with rotary tables, query row ``t`` is rotated at position ``L + t`` (causal: each
              token at its own place) or ``L`` (otherwise all of them at the first new place),
              into ``q_rot``, which the decode reads instead of ``q``.
    view      ``lengths[b] = L + S_new - leftpad`` (the keys the query sees, from cache position
              ``key_start[b] = cache_leftpad[b]`` on; with a sliding window (``WINDOW``) of
              left side ``left``, from the first key the first query token's window reaches,
              ``shift = L + S_new - leftpad - Sq - left`` keys further when positive: the
              decode's plan and its walk then cover the window alone, and its rules, read in
              the shifted view, are unchanged); a contiguous cache is a paged one with a
              page per sequence: ``table[b, 0] = cache_batch_idx[b]`` (or ``b``), page size the
              cache's length. With ``one_piece`` (``num_splits=1``) it also writes the scheduler
              plan that gives each sequence one CTA, whole: metadata row ``b`` = ``(b, b, 0,
              ceil(lengths[b] / 64), 0, 0, 0, 0)``, ``num_splits = 0, 1, .., B``
              (``scheduler.py``'s format); otherwise the device planner runs next on
              ``lengths``.

    FP8 caches (``FP8``): the caches hold float8_e4m3fn bytes and ``k_descale``, ``v_descale``
    (float32 (B, Hk)) the factors their values are multiplied by, so an appended (and rotated)
    element ``x`` of head ``h`` is stored as ``e4m3(x * (1 / k_descale[b, h]))``: nearest even,
    saturated to +-448 (``convert.f32_to_e4m3``), as ``quantize_fp8`` rounds.

    Rotary (flash-attn's rules, in float32, rounded once to the storage format): over the first
    ``rotary_dim`` columns, pairs ``(x1, x2)`` become ``(x1 cos - x2 sin, x1 sin + x2 cos)`` with
    ``cos, sin = rotary_cos[p, i], rotary_sin[p, i]``; the pairs are columns ``(2i, 2i + 1)``
    when interleaved (GPT-J), else ``(i, i + rotary_dim / 2)`` (GPT-NeoX). Columns past
    ``rotary_dim`` are copied.

Grid / block mapping
    grid = (B, min(rows, MAX_GRID_Y)), rows = max(S_new, Sq with rotary, 1); block = THREADS.
    CTA (b, y) handles rows ``y, y + gridDim.y, ..`` of sequence b: its THREADS threads sweep the
    row's heads x head dim (consecutive threads, consecutive columns). CTA (b, 0)'s thread 0
    writes the sequence's view. No shared memory.

Bad values only the device sees (reported in the status word, ``check_errors``)
    A negative length is read as 0; keys that would run past the cache are not written and
    the length is cut to the cache; a left padding outside ``[0, L + S_new]`` is clamped; a
    ``cache_batch_idx`` entry that is not a row of the cache gives the sequence no keys and
    writes nothing; a page the block table cannot place is not written (``paged_kv``'s lookup);
    a query whose rotary position lies past the tables is written as zeros. No access leaves
    its array.

Limits
    Any head dim, any even ``rotary_dim`` up to it, any page size; float16, bfloat16 or float32
    (FP8 caches: float16 or bfloat16 inputs, compute capability 8.9+).
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, types, uint64

from ...runtime.device import SIMULATOR
from ...runtime.spec import SM90, FixedSpec, Sample
from ..attention import tensor_type
from ..common import formats
from ..common.paged_kv import SCHED_BLOCK, make_page_lookup
from ..common.status import BAD_CACHE_INDEX, BAD_CACHE_LENGTH, NEGATIVE_LENGTH, report

THREADS = 32 if SIMULATOR else 128
ONE = float32(1.0)
MAX_GRID_Y = 4096  # rows per sequence past this loop in their CTAs
ROTARY = (None, "interleaved", "half")  # no rotary; GPT-J pairs (2i, 2i+1); NeoX (i, i+rd/2)


def make_prepare_kernel(FMT, ROTARY_MODE, CAUSAL, PAGED, WINDOW=False, FP8=False):
    load, store = formats.loader(FMT), formats.storer(FMT)
    to_fp8 = formats.storer("float8_e4m3fn")
    _, _, lookup = make_page_lookup(int32(0))
    INTERLEAVED = ROTARY_MODE == "interleaved"

    @cuda.jit(device=True, inline="always")
    def rotated(x, b, t, h, d, pos, cos, sin, rotary_dim):
        """Element d of row (b, t, h) of ``x`` rotated at position ``pos`` (float32)."""
        v = load(x[b, t, h, uint64(d)])
        if d < rotary_dim:
            if INTERLEAVED:
                i = d >> 1
                odd = (d & 1) == 1
                partner = d + 1 if not odd else d - 1
            else:
                half = rotary_dim >> 1
                odd = d >= half
                i = d - half if odd else d
                partner = d - half if odd else d + half
            c = load(cos[pos, uint64(i)])
            s = load(sin[pos, uint64(i)])
            y = load(x[b, t, h, uint64(partner)])
            v = v * c + y * s if odd else v * c - y * s
        return v

    def kvcache_prepare(q, k, v, k_cache, v_cache, block_table, cache_seqlens, cache_batch_idx,
                        cache_leftpad, rotary_cos, rotary_sin, q_rot, lengths, key_start, table,
                        metadata, num_splits, status, s_new, fixed_seqlen, capacity, rotary_dim,
                        one_piece, window_left, k_descale, v_descale):
        b = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        batch = q.shape[0]
        head = cuda.blockIdx.y == 0 and tid == 0  # writes the view and reports
        # The sequence's cache row (contiguous caches) and its lengths, bounded.
        cb = b
        row_ok = True
        if cache_batch_idx.shape[0] > 0:
            cb = cache_batch_idx[b]
            row_ok = cb >= 0 and cb < k_cache.shape[0]
            if not row_ok:
                cb = 0
                if head:
                    report(status, BAD_CACHE_INDEX)
        seqlen = fixed_seqlen
        if cache_seqlens.shape[0] > 0:
            seqlen = cache_seqlens[b]
        if seqlen < 0:
            seqlen = 0
            if head:
                report(status, NEGATIVE_LENGTH)
        total = seqlen + s_new
        if total > capacity:
            total = capacity
            if head:
                report(status, BAD_CACHE_LENGTH)
        pad = int32(0)
        if cache_leftpad.shape[0] > 0:
            pad = cache_leftpad[b]
            if pad < 0 or pad > total:
                pad = max(min(pad, total), 0)
                if head:
                    report(status, BAD_CACHE_LENGTH)
        if head:
            n = total - pad if row_ok else 0
            if WINDOW:  # keys before the first query token's window: never visited
                shift = min(max(n - q.shape[1] - window_left, 0), n)
                n -= shift
                pad += shift
            lengths[b] = n
            key_start[b] = pad
            if not PAGED:
                table[b, 0] = cb
            if one_piece:
                metadata[b, 0] = b
                metadata[b, 1] = b
                metadata[b, 2] = 0
                metadata[b, 3] = (n + SCHED_BLOCK - 1) // SCHED_BLOCK
                for c in range(4, 8):
                    metadata[b, c] = 0
                num_splits[b] = b
                if b == batch - 1:
                    num_splits[batch] = batch

        hk_cols = k_cache.shape[2] * k_cache.shape[3]
        hq_cols = q.shape[2] * q.shape[3]
        d_k = k_cache.shape[3]
        rows = max(s_new, q.shape[1] if ROTARY_MODE is not None else 0)
        for t in range(cuda.blockIdx.y, rows, cuda.gridDim.y):
            pos = seqlen + t
            if t < s_new and row_ok and pos < total:
                page, slot, ok = cb, pos, True
                if PAGED:
                    blk = pos // k_cache.shape[1]
                    page, ok = lookup(block_table, k_cache.shape[0], b, blk, status)
                    slot = pos - blk * k_cache.shape[1]
                if ok:
                    for i in range(tid, hk_cols, THREADS):
                        h = i // d_k
                        d = i - h * d_k
                        if FP8:
                            x = load(k[b, t, h, uint64(d)])
                            if ROTARY_MODE is not None:
                                x = rotated(k, b, t, h, d, pos, rotary_cos, rotary_sin,
                                            rotary_dim)
                            k_cache[page, slot, h, uint64(d)] = to_fp8(
                                x * (ONE / k_descale[b, h]))
                            v_cache[page, slot, h, uint64(d)] = to_fp8(
                                load(v[b, t, h, uint64(d)]) * (ONE / v_descale[b, h]))
                        else:
                            if ROTARY_MODE is None:
                                k_cache[page, slot, h, uint64(d)] = k[b, t, h, uint64(d)]
                            else:
                                k_cache[page, slot, h, uint64(d)] = store(
                                    rotated(k, b, t, h, d, pos, rotary_cos, rotary_sin,
                                            rotary_dim))
                            v_cache[page, slot, h, uint64(d)] = v[b, t, h, uint64(d)]
            if ROTARY_MODE is not None and t < q.shape[1]:
                qpos = seqlen + t if CAUSAL else seqlen
                inside = qpos < rotary_cos.shape[0]
                if not inside and tid == 0:
                    report(status, BAD_CACHE_LENGTH)
                for i in range(tid, hq_cols, THREADS):
                    h = i // q.shape[3]
                    d = i - h * q.shape[3]
                    x = float32(0.0)
                    if inside:
                        x = rotated(q, b, t, h, d, qpos, rotary_cos, rotary_sin, rotary_dim)
                    q_rot[b, t, h, uint64(d)] = store(x)

    return kvcache_prepare


# ----------------------------------------------------------------------------- spec

class Config(NamedTuple):
    fmt: str
    rotary: object = None  # one of ROTARY
    causal: bool = False   # rotary: each query token at its own position
    paged: bool = False    # the caches are pages behind block_table (else one row per sequence)
    window: bool = False   # a sliding window's left side bounds the keys (the module's "view")
    fp8: bool = False      # float8_e4m3fn caches: appends rounded with their descales


class Spec(FixedSpec):
    """(q, k, v, k_cache, v_cache, block_table, cache_seqlens, cache_batch_idx, cache_leftpad,
    rotary_cos, rotary_sin, q_rot, lengths, key_start, table, metadata, num_splits, status,
    s_new, fixed_seqlen, capacity, rotary_dim, one_piece, window_left, k_descale, v_descale);
    grid (B, min(rows, MAX_GRID_Y)). Absent optional arrays are empty ones (never read)."""

    name = "kvcache_prepare"
    Config = Config
    THREADS = THREADS

    def make(self, config, tiles):
        return make_prepare_kernel(config.fmt, config.rotary, config.causal, config.paged,
                                   config.window, config.fp8)

    def samples(self):
        return [Sample(f"simt kvcache prepare {fmt} rotary={rotary} paged={paged}",
                       (fmt, rotary, rotary is not None, paged))
                for fmt, rotary, paged in (("bfloat16", None, False), ("bfloat16", "half", True),
                                           ("float16", "interleaved", False),
                                           ("float32", "half", False))] + [
            Sample("simt kvcache prepare bfloat16 window", ("bfloat16", None, False, True, True)),
            Sample("simt kvcache prepare bfloat16 rotary=half fp8",
                   ("bfloat16", "half", True, True, False, True), ccs=(SM90,))]

    def signature(self, config):
        t, t2 = tensor_type(config.fmt), tensor_type(config.fmt, 2)
        cache = tensor_type("float8_e4m3fn") if config.fp8 else t
        i1, i2 = types.Array(types.int32, 1, "A"), types.Array(types.int32, 2, "A")
        I32, f2 = types.int32, types.Array(types.float32, 2, "A")
        return types.void(t, t, t, cache, cache, i2, i1, i1, i1, t2, t2, t, i1, i1, i2, i2, i1,
                          i1, I32, I32, I32, I32, I32, I32, f2, f2)

    def grid(self, config, tiles, p):
        rows = max(p["s_new"], p["q"].shape[1] if config.rotary is not None else 0, 1)
        return (p["q"].shape[0], min(rows, MAX_GRID_Y))

    def arguments(self, config, p):
        return tuple(p[name] for name in (
            "q", "k", "v", "k_cache", "v_cache", "block_table", "cache_seqlens",
            "cache_batch_idx", "cache_leftpad", "rotary_cos", "rotary_sin", "q_rot", "lengths",
            "key_start", "table", "metadata", "num_splits", "status")) + tuple(
            np.int32(p[name]) for name in ("s_new", "fixed_seqlen", "capacity", "rotary_dim",
                                           "one_piece", "window_left")) + (
            p["k_descale"], p["v_descale"])


SPEC = Spec()
