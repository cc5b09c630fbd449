"""Float64 NumPy references: the ground truth every kernel is tested against.

They compute the same functions as the kernels, densely and in double precision, with the
conventions of docs/api.md: bottom-right causal alignment, GQA head mapping, natural-log lse, and
rows with no key to attend giving ``out = 0`` and ``lse = +inf``. The score modifiers enter as
flash-attn defines them: ``softcap`` caps the scaled scores, an additive ``bias`` (ALiBi's,
``alibi_bias``) follows the cap, and a ``sink`` (Hq,) joins every row's sum as ``exp(sink)``.
"""

import ml_dtypes
import numpy as np


def _einsum(spec, *operands):
    """np.einsum through BLAS (optimize=True): the GPU tests' references are large."""
    return np.einsum(spec, *operands, optimize=True)


def to_float64(x):
    """Any NumPy float array (float16, ml_dtypes.bfloat16, float32, ...) as float64."""
    return np.asarray(x).astype(np.float32).astype(np.float64)


def causal_mask(sq, sk):
    """Boolean (sq, sk) mask of allowed keys: query i sees keys j <= i + sk - sq."""
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)


def window_mask(sq, sk, window_size, causal=False):
    """Boolean (sq, sk) mask of flash-attn's ``window_size=(left, right)``: query i sees key j
    iff ``i + sk - sq - left <= j <= i + sk - sq + right``, a side of -1 unbounded, ``causal``
    as ``right = 0``."""
    left, right = window_size
    right = 0 if causal else right
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    allowed = np.ones((sq, sk), bool)
    if left >= 0:
        allowed &= j >= i + sk - sq - left
    if right >= 0:
        allowed &= j <= i + sk - sq + right
    return allowed


def alibi_bias(slopes, sq, sk):
    """flash-attn's ALiBi bias ``-slope * |i + sk - sq - j|``, float64 (B or 1, Hq, sq, sk),
    from ``slopes`` (Hq,) or (B, Hq)."""
    slopes = np.asarray(slopes, np.float64)
    slopes = slopes[None] if slopes.ndim == 1 else slopes
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    return -slopes[:, :, None, None] * np.abs(i + sk - sq - j)


def varlen_alibi_bias(slopes, cu_seqlens_q, cu_seqlens_k, total_q, total_k, seqused_k=None):
    """``alibi_bias`` of packed rows: (1, Hq, total_q, total_k), each sequence's block from its
    own lengths (``seqused_k`` as in ``varlen_mask``), 0 elsewhere (those pairs are masked).
    ``slopes`` (Hq,) or (B, Hq)."""
    slopes = np.asarray(slopes, np.float64)
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    bias = np.zeros((1, slopes.shape[-1], total_q, total_k))
    for b in range(len(cu_q) - 1):
        len_q, len_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        if seqused_k is not None:
            len_k = min(int(seqused_k[b]), len_k)
        row = slopes if slopes.ndim == 1 else slopes[b]
        bias[0, :, cu_q[b]:cu_q[b] + len_q, cu_k[b]:cu_k[b] + len_k] = \
            alibi_bias(row, len_q, len_k)[0]
    return bias


def _expand_kv(x, hq):
    """(B, Sk, Hk, D) -> (B, Sk, Hq, D): query head h reads kv head h // (Hq // Hk)."""
    return np.repeat(x, hq // x.shape[2], axis=2)


def varlen_mask(cu_seqlens_q, cu_seqlens_k, total_q, total_k, causal, seqused_k=None,
                window_size=(-1, -1)):
    """Boolean (total_q, total_k) mask of packed rows: query row i sees key row j iff both lie
    in the same sequence b (rows cu_seqlens[b] .. cu_seqlens[b + 1]), j is among its first
    ``seqused_k[b]`` keys, (causal) j's position is at most i's + len_k - len_q, and j lies in
    the sequence's ``window_size`` (``window_mask``). Rows of no sequence see nothing. Written
    from the definition, per row, with no kernel's tiling."""
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    allowed = np.zeros((total_q, total_k), bool)
    for b in range(len(cu_q) - 1):
        len_q, len_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        if seqused_k is not None:
            len_k = min(int(seqused_k[b]), len_k)
        local = window_mask(len_q, len_k, window_size, causal)
        for i in range(len_q):
            for j in range(len_k):
                if (not causal or j <= i + len_k - len_q) and local[i, j]:
                    allowed[cu_q[b] + i, cu_k[b] + j] = True
    return allowed


def _allowed(sq, sk, causal, mask):
    """The (sq, sk) keys each query sees: ``mask`` when given, else all or (causal) those up to
    the bottom-right diagonal; None when every key is seen."""
    if mask is not None:
        return mask
    return causal_mask(sq, sk) if causal else None


def _scores(q, k, causal, softmax_scale, mask=None, softcap=None, bias=None):
    """Scaled scores (B, Hq, Sq, Sk) in float64 (``softcap``: ``softcap * tanh(s / softcap)``,
    then ``bias`` added), masked keys at -inf."""
    hq, d = q.shape[2], q.shape[3]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    s = _einsum("bqhd,bkhd->bhqk", to_float64(q), to_float64(_expand_kv(k, hq))) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    allowed = _allowed(q.shape[1], k.shape[1], causal, mask)
    return s if allowed is None else np.where(allowed, s, -np.inf)


def _softmax(s, sink=None):
    """Row softmax of float64 scores and its natural-log lse; rows with no key give 0 and +inf.
    ``sink`` (Hq,): ``exp(sink)`` joins each row's sum (so such rows give 0 and the sink)."""
    if sink is not None:  # a key of value 0 that every row sees
        column = np.broadcast_to(np.asarray(sink, np.float64)[None, :, None, None],
                                 s.shape[:-1] + (1,))
        s = np.concatenate([s, column], axis=-1)
    m = s.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(m)
    p = np.exp(s - np.where(empty, 0.0, m))
    l = np.where(empty, 1.0, p.sum(axis=-1, keepdims=True))
    probs = np.where(empty, 0.0, p / l)
    lse = np.where(empty, np.inf, m + np.log(l))[..., 0]
    return (probs if sink is None else probs[..., :-1]), lse


def attention_fwd_ref(q, k, v, causal=False, softmax_scale=None, mask=None, softcap=None,
                      bias=None, sink=None):
    """Exact attention. Returns ``out (B, Sq, Hq, D)`` and ``lse (B, Hq, Sq)``, both float64.
    ``mask`` (Sq, Sk), when given, says which keys each query sees (in place of ``causal``);
    ``softcap`` caps the scaled scores (flash-attn's softcap), ``bias`` (broadcast to (B, Hq,
    Sq, Sk)) is added after it, ``sink`` (Hq,) joins each row's sum."""
    p, lse = _softmax(_scores(q, k, causal, softmax_scale, mask, softcap, bias), sink)
    out = _einsum("bhqk,bkhd->bqhd", p, to_float64(_expand_kv(v, q.shape[2])))
    return out, lse


def attention_bwd_ref(dout, q, k, v, causal=False, softmax_scale=None, mask=None, softcap=None,
                      bias=None, sink=None):
    """Gradients of ``sum(out * dout)`` for exact attention: ``dq, dk, dv`` (float64), and
    ``dsink`` (Hq,) fourth when ``sink`` is given.

    dk and dv have k's shape: a kv head sums the gradients of every query head of its group.
    ``softcap``: the scores' cap ``c tanh(s / c)``, whose derivative ``1 - tanh^2`` the
    gradient of the scaled scores takes; ``bias`` is a constant (no gradient). A sink moves a
    row's output by ``-P_sink out`` per unit, ``P_sink = exp(sink - lse)``: ``dsink = -sum over
    the rows of P_sink rowsum(P dP)``.
    """
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    p, lse = _softmax(_scores(q, k, causal, softmax_scale, mask, softcap, bias), sink)
    do = to_float64(dout)
    ke, ve = to_float64(_expand_kv(k, hq)), to_float64(_expand_kv(v, hq))
    dv = _einsum("bhqk,bqhd->bkhd", p, do)
    dp = _einsum("bqhd,bkhd->bhqk", do, ve)
    D = (p * dp).sum(axis=-1, keepdims=True)
    ds = p * (dp - D) * _cap_slope(q, k, scale, softcap)
    dq = _einsum("bhqk,bkhd->bqhd", ds, ke) * scale
    dk = _einsum("bhqk,bqhd->bkhd", ds, to_float64(q)) * scale
    group = hq // hk
    grads = (dq, dk.reshape(b, sk, hk, group, d).sum(axis=3),
             dv.reshape(b, sk, hk, group, v.shape[-1]).sum(axis=3))
    if sink is None:
        return grads
    p_sink = np.exp(np.asarray(sink, np.float64)[None, :, None] - lse)
    return (*grads, -(p_sink * D[..., 0]).sum(axis=(0, 2)))


def attention_lowp(q, k, v, causal=False, softmax_scale=None, mask=None, softcap=None,
                   bias=None, sink=None):
    """Plain three-step attention with S, P and O each rounded to the inputs' dtype (float64 out).

    The tolerance rule of docs/design.md compares a kernel's error with this one's: a flash kernel must be
    no worse than twice what the textbook algorithm loses in the same precision.
    """
    p = _probs_lowp(q, k, causal, softmax_scale, mask, softcap, bias, sink)
    out = _einsum("bhqk,bkhd->bqhd", p, to_float64(_expand_kv(v, q.shape[2])))
    return _round(out, q)


def attention_bwd_lowp(dout, q, k, v, causal=False, softmax_scale=None, mask=None,
                       softcap=None, bias=None, sink=None):
    """Plain attention backward with P, dV, dP, dS, dQ, dK each rounded to the inputs' dtype:
    the low-precision counterpart of ``attention_bwd_ref`` for the tolerance rule (float64 out).
    Like every FlashAttention backward it takes D_i = rowsum(dO_i * O_i) from the forward's
    output as stored (rounded to the dtype), not from the exact softmax."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    p = _probs_lowp(q, k, causal, softmax_scale, mask, softcap, bias, sink)
    do = to_float64(dout)
    o = attention_lowp(q, k, v, causal, softmax_scale, mask, softcap, bias, sink)
    D = (do * o).sum(axis=-1).transpose(0, 2, 1)
    dv = _round(_einsum("bhqk,bqhd->bkhd", p, do), q)
    dp = _round(_einsum("bqhd,bkhd->bhqk", do, to_float64(_expand_kv(v, hq))), q)
    ds = _round(p * (dp - D[..., None]) * _cap_slope(q, k, scale, softcap), q)
    dq = _einsum("bhqk,bkhd->bqhd", ds, to_float64(_expand_kv(k, hq))) * scale
    dk = _round(_einsum("bhqk,bqhd->bkhd", ds, to_float64(q)) * scale, q)
    group = hq // hk
    return (_round(dq, q), _round(dk.reshape(b, sk, hk, group, d).sum(axis=3), q),
            _round(dv.reshape(b, sk, hk, group, v.shape[-1]).sum(axis=3), q))


def _cap_slope(q, k, scale, softcap):
    """d(c tanh(s / c)) / ds = 1 - tanh(s / c)^2 at the scaled scores s (B, Hq, Sq, Sk), or 1."""
    if not softcap:
        return 1.0
    s = _einsum("bqhd,bkhd->bhqk", to_float64(q), to_float64(_expand_kv(k, q.shape[2]))) * scale
    return 1.0 - np.tanh(s / softcap) ** 2


def _round(x, like):
    """float64 ``x`` rounded to ``like``'s dtype, back as float64."""
    return to_float64(x.astype(np.asarray(like).dtype))


def _probs_lowp(q, k, causal, softmax_scale, mask=None, softcap=None, bias=None, sink=None):
    """Softmax probabilities with S and P rounded to q's dtype (float64 out)."""
    s = _round(_scores(q, k, False, softmax_scale, softcap=softcap, bias=bias), q)
    allowed = _allowed(q.shape[1], k.shape[1], causal, mask)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    p, _ = _softmax(s, sink)
    return _round(p, q)


def mla_decode_ref(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None,
                   causal=False, attn_sink=None):
    """Exact paged MLA decode (FlashMLA's ``flash_mla_with_kvcache``) in float64.

    ``q (b, s_q, h_q, d)``; ``k_cache (num_blocks, page_block_size, h_kv, d)``, V being
    ``k_cache[..., :head_dim_v]``; ``block_table (b, max_blocks_per_seq)``; ``cache_seqlens (b,)``.
    Sequence ``i`` is the first ``cache_seqlens[i]`` rows of its pages
    ``block_table[i, :ceil(seqlen / page_block_size)]`` laid end to end: later table entries and
    later slots of the last page are never read (they may hold garbage or NaN). Query head ``h``
    reads kv head ``h // (h_q // h_kv)``. With ``causal`` (meaningful for ``s_q > 1``) query token
    ``t`` sees keys ``< seqlen - (s_q - 1 - t)``. A row with no key gets ``out = 0``,
    ``lse = +inf``. Returns ``out (b, s_q, h_q, head_dim_v)`` and natural-log ``lse (b, h_q, s_q)``,
    both float64. ``attn_sink`` (h_q,): FlashMLA's, an ``exp(sink)`` more in each row's sum and
    nothing in its output, which shrinks by ``1 / (1 + exp(sink - lse))``; lse stays the keys'.
    """
    q64 = to_float64(q)
    if q64.ndim != 4:
        raise ValueError(f"q: expected shape (b, s_q, h_q, d), got {q64.shape}")
    b, s_q, h_q, d = q64.shape
    kc = np.asarray(k_cache)
    if kc.ndim != 4 or kc.shape[3] != d:
        raise ValueError(f"k_cache: expected shape (num_blocks, page_block_size, h_kv, {d}), "
                         f"got {kc.shape}")
    num_blocks, page, h_kv = kc.shape[:3]
    if h_kv < 1 or h_q % h_kv:
        raise ValueError(f"k_cache: h_kv = {h_kv} must divide h_q = {h_q}")
    if not 1 <= head_dim_v <= d:
        raise ValueError(f"head_dim_v: expected 1 <= head_dim_v <= {d}, got {head_dim_v}")
    table = np.asarray(block_table)
    seqlens = np.asarray(cache_seqlens)
    if seqlens.shape != (b,):
        raise ValueError(f"cache_seqlens: expected shape ({b},), got {seqlens.shape}")
    if table.ndim != 2 or table.shape[0] != b:
        raise ValueError(f"block_table: expected shape ({b}, max_blocks_per_seq), "
                         f"got {table.shape}")
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    group = h_q // h_kv

    out = np.zeros((b, s_q, h_q, head_dim_v))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        n = int(seqlens[i])
        if n < 0:
            raise ValueError(f"cache_seqlens: expected lengths >= 0, got {n} at index {i}")
        if n == 0:
            continue
        used = -(-n // page)
        if used > table.shape[1]:
            raise ValueError(f"block_table: sequence {i} of length {n} needs {used} pages, "
                             f"the table has {table.shape[1]} columns")
        pages = table[i, :used].astype(np.int64)
        if pages.min() < 0 or pages.max() >= num_blocks:
            raise ValueError(f"block_table: row {i} points outside k_cache's {num_blocks} blocks")
        kv = to_float64(kc[pages]).reshape(used * page, h_kv, d)[:n]  # (n, h_kv, d), only real rows
        kv = np.repeat(kv, group, axis=1)  # (n, h_q, d): query head h reads kv head h // group
        s = _einsum("thd,nhd->htn", q64[i], kv) * scale  # (h_q, s_q, n)
        for t in range(s_q):
            visible = n - (s_q - 1 - t) if causal else n
            if visible <= 0:
                continue  # no key: out stays 0, lse stays +inf
            st = s[:, t, :visible]
            m = st.max(axis=-1, keepdims=True)
            p = np.exp(st - m)
            l = p.sum(axis=-1, keepdims=True)
            lse[i, :, t] = (m + np.log(l))[:, 0]
            out[i, t] = _einsum("hn,nhd->hd", p / l, kv[:visible, :, :head_dim_v])
            if attn_sink is not None:
                sink = np.asarray(attn_sink, np.float64)
                out[i, t] /= (1 + np.exp(sink - lse[i, :, t]))[:, None]
    return out, lse


# DeepSeek-V3.2's FP8 cache row: 512 e4m3 latent values, a float32 scale per 128 of them, 64
# bfloat16 rope values (656 bytes).
V32_LATENT, V32_BLOCK, V32_ROPE = 512, 128, 64


def quantize_v32(kv):
    """Rows ``kv (..., 576)`` (latent, then rope) as V3.2's 656-byte rows (uint8): each block
    of 128 latent values divided by its scale, the smallest power of two at least its
    ``amax / 448`` (1 for a block of zeros), and rounded to e4m3; the rope values as bfloat16."""
    kv = np.asarray(kv).astype(np.float32)
    lead = kv.shape[:-1]
    blocks = kv[..., :V32_LATENT].reshape(*lead, V32_LATENT // V32_BLOCK, V32_BLOCK)
    amax = np.abs(blocks).max(axis=-1)
    scale = np.where(amax > 0, 2.0 ** np.ceil(np.log2(np.maximum(amax, 1e-30) / 448.0)), 1.0)
    scale = scale.astype(np.float32)
    latent = (blocks / scale[..., None]).astype(ml_dtypes.float8_e4m3fn).reshape(*lead, -1)
    rope = kv[..., V32_LATENT:].astype(ml_dtypes.bfloat16)
    return np.concatenate([latent.view(np.uint8), scale.view(np.uint8).reshape(*lead, -1),
                           rope.view(np.uint8).reshape(*lead, -1)], axis=-1)


def dequantize_v32(rows):
    """V3.2's 656-byte rows (..., 656) as the 576 bfloat16 values FlashMLA's decode reads:
    latent value ``x`` of block ``k`` is ``bf16(x * bf16(scale_k))`` (exact for the
    power-of-two scales of ``quantize_v32``), the rope values as stored."""
    rows = np.ascontiguousarray(np.asarray(rows).view(np.uint8))
    lead = rows.shape[:-1]
    n_blocks = V32_LATENT // V32_BLOCK
    latent = rows[..., :V32_LATENT].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scale = rows[..., V32_LATENT:V32_LATENT + 4 * n_blocks].copy().view(np.float32)
    scale = scale.astype(ml_dtypes.bfloat16).astype(np.float32)
    latent = latent.reshape(*lead, n_blocks, V32_BLOCK) * scale[..., None]
    rope = rows[..., V32_LATENT + 4 * n_blocks:].copy().view(ml_dtypes.bfloat16)
    return np.concatenate([latent.reshape(*lead, V32_LATENT).astype(ml_dtypes.bfloat16), rope],
                          axis=-1)


def sparse_mla_ref(q, k_cache, indices, head_dim_v, softmax_scale=None, topk_length=None,
                   attn_sink=None, is_fp8_kvcache=False):
    """FlashMLA's sparse decode in float64: query token ``t`` of request ``b`` attends the
    cache rows ``indices[b, t, :n]`` (``n = topk_length[b]`` or all; row = ``page *
    page_block_size + slot``), -1 and any other value outside the cache naming no row; a token
    with none gets ``out = 0``, ``lse = +inf``. ``k_cache`` (num_blocks, page, h_kv, d) in q's
    dtype, or with ``is_fp8_kvcache`` V3.2's rows (num_blocks, page, 1, 656), read through
    ``dequantize_v32``. ``attn_sink`` as in ``mla_decode_ref``. Returns ``out (b, s_q, h_q,
    head_dim_v)`` and ``lse (b, h_q, s_q)``."""
    q64 = to_float64(q)
    b, s_q, h_q, d = q64.shape
    kc = np.asarray(k_cache)
    if is_fp8_kvcache:
        kc = dequantize_v32(kc.reshape(kc.shape[0], kc.shape[1], 1, -1))
    rows = to_float64(kc).reshape(kc.shape[0] * kc.shape[1], kc.shape[2], -1)  # (rows, h_kv, d)
    group = h_q // rows.shape[1]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    idx = np.asarray(indices)
    out = np.zeros((b, s_q, h_q, head_dim_v))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        n = idx.shape[2] if topk_length is None else min(max(int(topk_length[i]), 0), idx.shape[2])
        for t in range(s_q):
            chosen = [int(r) for r in idx[i, t, :n] if 0 <= r < rows.shape[0]]
            if not chosen:
                continue
            keys = rows[chosen]  # (n, h_kv, d)
            for h in range(h_q):
                k = keys[:, h // group]
                s = k @ q64[i, t, h] * scale
                m = s.max()
                p = np.exp(s - m)
                lse[i, h, t] = m + np.log(p.sum())
                out[i, t, h] = p @ k[:, :head_dim_v] / p.sum()
    if attn_sink is not None:
        sink = np.asarray(attn_sink, np.float64)
        out /= (1 + np.exp(sink[None, :, None] - lse)).transpose(0, 2, 1)[..., None]
    return out, lse


def quantize_e4m3(x, descale):
    """``x`` stored as float8_e4m3fn with ``descale`` (broadcast against x): multiplied by
    ``1 / descale`` in float32, then rounded to the nearest even e4m3, saturating at +-448 (NaN
    stays NaN): ``quantize_fp8``'s rule. An ml_dtypes float8_e4m3fn array."""
    inv = np.float32(1.0) / np.asarray(descale, np.float32)
    scaled = np.asarray(x).astype(np.float32) * inv
    scaled = np.where(np.isnan(scaled), scaled, np.clip(scaled, -448.0, 448.0))
    return scaled.astype(np.float32).astype(ml_dtypes.float8_e4m3fn)


def dequantize_e4m3(x8, descale):
    """Stored e4m3 values ``x8 (B, S, H, D)`` times their ``descale (B, H)``, in float64: the
    values FP8 attention attends with."""
    return to_float64(x8) * np.asarray(descale, np.float64)[:, None, :, None]


def attention_fp8_lowp(q, k, v, causal=False, softmax_scale=None, mask=None, softcap=None,
                       bias=None, sink=None):
    """FP8 attention as FlashAttention-3 rounds it, on dequantized float64 ``q, k, v``: P (each
    row's exp relative to its maximum) rounded to e4m3 for the product with V, the row sums
    taken of P unrounded, then the output rounded to bfloat16. The accuracy test's baseline:
    a kernel's error may be twice this one's (FA3's rule)."""
    s = _scores(q, k, causal, softmax_scale, mask, softcap, bias)
    if sink is not None:
        s = np.concatenate([s, np.broadcast_to(np.asarray(sink, np.float64)[None, :, None, None],
                                               s.shape[:-1] + (1,))], axis=-1)
    m = s.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(m)
    p = np.exp(s - np.where(empty, 0.0, m))
    l = np.where(empty, 1.0, p.sum(axis=-1, keepdims=True))
    p8 = to_float64(p.astype(np.float32).astype(ml_dtypes.float8_e4m3fn))
    if sink is not None:
        p8 = p8[..., :-1]
    out = _einsum("bhqk,bkhd->bqhd", np.where(empty, 0.0, p8 / l),
                  to_float64(_expand_kv(v, q.shape[2])))
    return to_float64(out.astype(ml_dtypes.bfloat16))


def rotary_ref(x, cos, sin, positions, interleaved):
    """flash-attn's rotary embedding of ``x (S, H, D)`` in float64, row ``s`` at position
    ``positions[s]``: over the first ``rotary_dim = 2 * cos.shape[1]`` columns, pairs ``(x1,
    x2)`` -> ``(x1 cos - x2 sin, x1 sin + x2 cos)``, the pairs being columns ``(2i, 2i + 1)``
    (interleaved) or ``(i, i + rotary_dim / 2)``; the other columns unchanged."""
    x = to_float64(x).copy()
    half = cos.shape[1]
    c = to_float64(cos)[positions][:, None, :]  # (S, 1, half)
    s = to_float64(sin)[positions][:, None, :]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


def kvcache_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                softmax_scale=None, causal=False, rotary_interleaved=True, window_size=(-1, -1),
                softcap=None, alibi_slopes=None, k_descale=None, v_descale=None):
    """flash-attn's ``flash_attn_with_kvcache`` on host arrays, from its definition.

    Returns ``(out, lse, k_cache, v_cache, q_used)``: out (B, Sq, Hq, D) and lse (B, Hq, Sq) in
    float64 (the attention of ``attention_fwd_ref``), the caches after the append (new copies, in
    their dtype: rotated keys rounded to it) and the query the attention used (rotated and
    rounded, as flash-attn does, or q itself). Sequence ``b`` appends ``k[b], v[b]`` at
    positions ``L + t`` (``L = cache_seqlens[b]``, an int for all, or the whole cache when None)
    of cache row ``cache_batch_idx[b]`` (or ``b``), or of its pages ``block_table[b]``; the
    query then attends the keys at positions ``cache_leftpad[b] .. L + S_new - 1``, causal
    bottom-right. Rotary: keys at their positions, queries at ``L + t`` (causal) or ``L``.
    ``window_size``, ``softcap`` and ``alibi_slopes`` ((Hq,) or (B, Hq)) as in
    ``attention_fwd_ref``, over those keys (``Sk`` of them: the window and the distances from
    the sequence's own ``Sq``, ``Sk``). FP8 caches (float8_e4m3fn, with ``k_descale``,
    ``v_descale`` (B, Hk)): sequence ``b``'s stored values times ``descale[b, h]`` are its keys
    and values, and new ones are stored as ``quantize_e4m3(x, descale[b])``.
    """
    q = np.asarray(q)
    fp8 = k_descale is not None
    b, sq, hq, d = q.shape
    kc, vc = np.array(k_cache), np.array(v_cache)
    paged = block_table is not None
    capacity = np.asarray(block_table).shape[1] * kc.shape[1] if paged else kc.shape[1]
    s_new = 0 if k is None else np.asarray(k).shape[1]
    out = np.zeros((b, sq, hq, d))
    lse = np.full((b, hq, sq), np.inf)
    q_used = q.copy()
    for i in range(b):
        if cache_seqlens is None:
            n_cached = capacity
        elif np.ndim(cache_seqlens) == 0:
            n_cached = int(cache_seqlens)
        else:
            n_cached = int(np.asarray(cache_seqlens)[i])
        if paged:
            pages = np.asarray(block_table)[i].astype(np.int64)
            rows = [(pages[p // kc.shape[1]], p % kc.shape[1]) for p in range(capacity)]
        else:
            row = i if cache_batch_idx is None else int(np.asarray(cache_batch_idx)[i])
            rows = [(row, p) for p in range(capacity)]
        if s_new:
            new_pos = np.arange(n_cached, n_cached + s_new)
            kn = np.asarray(k)[i]
            if rotary_cos is not None:
                kn = rotary_ref(kn, rotary_cos, rotary_sin, new_pos, rotary_interleaved)
            for t, p in enumerate(new_pos):
                if fp8:
                    kc[rows[p]] = quantize_e4m3(kn[t], np.asarray(k_descale)[i][:, None])
                    vc[rows[p]] = quantize_e4m3(np.asarray(v)[i, t],
                                                np.asarray(v_descale)[i][:, None])
                else:
                    kc[rows[p]] = np.asarray(kn[t]).astype(kc.dtype)
                    vc[rows[p]] = np.asarray(v)[i, t]
        if rotary_cos is not None and s_new:
            q_pos = n_cached + (np.arange(sq) if causal else np.zeros(sq, np.int64))
            q_used[i] = rotary_ref(q[i], rotary_cos, rotary_sin, q_pos,
                                   rotary_interleaved).astype(q.dtype)
        start = 0 if cache_leftpad is None else int(np.asarray(cache_leftpad)[i])
        used = rows[start:n_cached + s_new]
        if not used:
            continue
        keys = np.stack([kc[r] for r in used])[None]
        vals = np.stack([vc[r] for r in used])[None]
        if fp8:
            keys = to_float64(keys) * np.asarray(k_descale, np.float64)[i][:, None]
            vals = to_float64(vals) * np.asarray(v_descale, np.float64)[i][:, None]
        n = len(used)
        mask = None if tuple(window_size) == (-1, -1) else window_mask(sq, n, window_size, causal)
        bias = None
        if alibi_slopes is not None:
            slopes = np.asarray(alibi_slopes)
            bias = alibi_bias(slopes if slopes.ndim == 1 else slopes[i], sq, n)
        o, l = attention_fwd_ref(q_used[i:i + 1], keys, vals, causal, softmax_scale, mask,
                                 softcap, bias)
        out[i], lse[i] = o[0], l[0]
    return out, lse, kc, vc, q_used
