"""Paged MLA decode in Triton: split-KV attention over a block table, then a combine kernel.

What it computes
    ``out, lse = mla_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, ...)`` with the
    arguments and results of ``numba_flash.flash_mla_with_kvcache`` (docs/api.md), torch CUDA tensors:
    q (b, s_q, h_q, d), k_cache (num_blocks, page, h_kv, d) with V = k_cache[..., :head_dim_v],
    block_table (b, max_blocks) int32, cache_seqlens (b,) int32; out (b, s_q, h_q, head_dim_v),
    lse (b, h_q, s_q) float32 natural log; a sequence of length 0 (or a causal row that sees no
    key) gives out 0, lse +inf. Causal (s_q > 1): query token t sees keys < seqlen - (s_q-1-t).

Grid / program (kernel 1, split)
    The s_q * h_q / h_kv query rows that share a kv head are packed into the M dimension of the
    tiles (row r: token r // group, head hk * group + r % group) and cut into blocks of BLOCK_H.
    grid (ceil(rows / BLOCK_H), num_splits, b * h_kv), head blocks fastest so that the programs
    reading the same cache pages run together and share them through L2. Each sequence is cut
    into ``num_splits`` equal runs of keys (a whole number of BLOCK_N); a program streams its
    run BLOCK_N keys at a time: the page of each key comes from the block table, the 576-wide
    rows are loaded as the 512 latent columns (also V) and the 64 rope columns, S = q_nope
    k_nope^T + q_pe k_pe^T, online softmax in base 2, O += P V with V the latent tile already
    loaded. With one split the program writes the final out and lse; otherwise it writes an
    fp32 partial O (normalised) and its base-2 lse.
Kernel 2 (combine), grid (rows, b * h_kv)
    M = max_s lse_s, w_s = 2^(lse_s - M), out = sum w_s O_s / sum w_s, lse = M + log2(sum w_s).

Limits
    head_dim_v and d - head_dim_v powers of two (DeepSeek: 512 and 64), float16 / bfloat16.
    ``num_splits`` is fixed per call (default: enough programs for two waves on the GPU), not
    balanced per sequence as FlashMLA's tile scheduler does; with variable lengths the splits
    of long sequences are longer.
"""

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # used inside kernels: a compile-time constant
BLOCK_N = 32


@triton.jit
def _mla_split_kernel(Q, KV, BLOCK_TABLE, SEQLENS, O_PART, LSE_PART, OUT, LSE,
                      stride_qb, stride_qt, stride_qh, stride_kvb, stride_kvp, stride_kvh,
                      stride_bt, stride_ob, stride_ot, stride_oh,
                      s_q, n_heads_q, n_heads_k, group, rows, n_splits, scale_log2,
                      PAGE: tl.constexpr, D_NOPE: tl.constexpr, D_PE: tl.constexpr,
                      CAUSAL: tl.constexpr, DIRECT: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    split = tl.program_id(1)
    bk = tl.program_id(2)
    b = bk // n_heads_k
    hk = bk % n_heads_k
    offs_r = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = offs_r < rows
    tok = offs_r // group
    head = hk * group + offs_r % group
    offs_c = tl.arange(0, D_NOPE)
    offs_p = D_NOPE + tl.arange(0, D_PE)

    q_rows = Q + b.to(tl.int64) * stride_qb + tok * stride_qt + head * stride_qh
    q_nope = tl.load(q_rows[:, None] + offs_c[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_rows[:, None] + offs_p[None, :], mask=row_ok[:, None], other=0.0)

    seqlen = tl.load(SEQLENS + b)
    chunk = tl.cdiv(tl.cdiv(seqlen, n_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(seqlen, start + chunk)
    visible = seqlen + 0 * tok  # per row: keys < visible
    if CAUSAL:
        visible -= s_q - 1 - tok

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_NOPE], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_ok = pos < end  # slots past the sequence are never read (they may hold NaN)
        page = tl.load(BLOCK_TABLE + b.to(tl.int64) * stride_bt + pos // PAGE, mask=pos_ok, other=0)
        kv_rows = KV + page.to(tl.int64) * stride_kvb + (pos % PAGE) * stride_kvp + hk * stride_kvh
        kv = tl.load(kv_rows[:, None] + offs_c[None, :], mask=pos_ok[:, None], other=0.0)
        k_pe = tl.load(kv_rows[:, None] + offs_p[None, :], mask=pos_ok[:, None], other=0.0)
        s = (tl.dot(q_nope, tl.trans(kv)) + tl.dot(q_pe, tl.trans(k_pe))) * scale_log2
        s = tl.where(pos_ok[None, :] & (pos[None, :] < visible[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - base)
        p = tl.math.exp2(s - base[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m_i = m_new

    seen = l_i > 0.0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse2 = tl.where(seen, m_i + tl.math.log2(l_i), float("-inf"))
    if DIRECT:
        o_rows = OUT + b.to(tl.int64) * stride_ob + tok * stride_ot + head * stride_oh
        tl.store(o_rows[:, None] + offs_c[None, :], acc.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None])
        lse = tl.where(seen, lse2 * LN2, float("inf"))
        tl.store(LSE + (b.to(tl.int64) * n_heads_q + head) * s_q + tok, lse, mask=row_ok)
    else:
        part = (bk.to(tl.int64) * n_splits + split) * rows + offs_r  # O_PART (b*h_kv, splits, rows, dv)
        tl.store(O_PART + part[:, None] * D_NOPE + offs_c[None, :], acc, mask=row_ok[:, None])
        tl.store(LSE_PART + part, lse2, mask=row_ok)


@triton.jit
def _mla_combine_kernel(O_PART, LSE_PART, OUT, LSE, stride_ob, stride_ot, stride_oh,
                        s_q, n_heads_q, n_heads_k, group, rows, n_splits,
                        D_NOPE: tl.constexpr, BLOCK_S: tl.constexpr):
    r = tl.program_id(0)
    bk = tl.program_id(1)
    b = bk // n_heads_k
    tok = r // group
    head = (bk % n_heads_k) * group + r % group
    splits = tl.arange(0, BLOCK_S)
    ok = splits < n_splits
    part = (bk.to(tl.int64) * n_splits + splits) * rows + r
    lse_s = tl.load(LSE_PART + part, mask=ok, other=float("-inf"))
    big = tl.max(lse_s, 0)
    w = tl.math.exp2(lse_s - tl.where(big == float("-inf"), 0.0, big))
    total = tl.sum(w, 0)
    offs_c = tl.arange(0, D_NOPE)
    o = tl.load(O_PART + part[:, None] * D_NOPE + offs_c[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(OUT + b.to(tl.int64) * stride_ob + tok * stride_ot + head * stride_oh + offs_c,
             out.to(OUT.dtype.element_ty))
    lse = tl.where(total > 0.0, (big + tl.math.log2(total)) * LN2, float("inf"))
    tl.store(LSE + (b.to(tl.int64) * n_heads_q + head) * s_q + tok, lse)


def block_h(rows):
    """Query rows per program: 16 (the smallest tl.dot M) or 32. With BLOCK_N = 32 and 8 warps
    Triton 3.6 compiles both for sm_90 without spilling in the loop (32 rows spill ~150 bytes in
    the direct-store epilogue)."""
    return 16 if rows <= 16 else 32


def default_splits(batch, h_kv, rows, device):
    """Enough splits that the split kernel fills the GPU about twice (no host sync needed)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    programs = batch * h_kv * triton.cdiv(rows, block_h(rows))
    return max(1, min(64, triton.cdiv(2 * sms, programs)))


def mla_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None,
               causal=False, num_splits=None):
    """Returns ``(out, lse)``; ``num_splits`` defaults to ``default_splits``."""
    b, s_q, h_q, d = q.shape
    num_blocks, page, h_kv, _ = k_cache.shape
    d_pe = d - head_dim_v
    if k_cache.shape[3] != d or h_q % h_kv:
        raise ValueError(f"k_cache: shape {tuple(k_cache.shape)} does not fit q {tuple(q.shape)}")
    if head_dim_v != triton.next_power_of_2(head_dim_v) or d_pe != triton.next_power_of_2(d_pe) \
            or d_pe < 16:
        raise ValueError(f"head_dim_v ({head_dim_v}) and d - head_dim_v ({d_pe}) must be "
                         "powers of two, the latter >= 16")
    if q.dtype not in (torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache: expected one dtype, float16 or bfloat16, got {q.dtype}, "
                        f"{k_cache.dtype}")
    if block_table.dtype != torch.int32 or cache_seqlens.dtype != torch.int32:
        raise TypeError("block_table, cache_seqlens: expected int32")
    if q.stride(3) != 1 or k_cache.stride(3) != 1 or block_table.stride(1) != 1:
        raise ValueError("q, k_cache, block_table: the last dimension must be contiguous")
    group = h_q // h_kv
    rows = s_q * group
    bh = block_h(rows)
    splits = num_splits or default_splits(b, h_kv, rows, q.device)
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.empty((b, s_q, h_q, head_dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    direct = splits == 1
    if direct:
        o_part = lse_part = lse  # unused
    else:
        o_part = torch.empty((b * h_kv, splits, rows, head_dim_v), dtype=torch.float32,
                             device=q.device)
        lse_part = torch.empty((b * h_kv, splits, rows), dtype=torch.float32, device=q.device)
    _mla_split_kernel[(triton.cdiv(rows, bh), splits, b * h_kv)](
        q, k_cache, block_table, cache_seqlens, o_part, lse_part, out, lse,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_table.stride(0), out.stride(0), out.stride(1), out.stride(2),
        s_q, h_q, h_kv, group, rows, splits, scale * LOG2E,
        PAGE=page, D_NOPE=head_dim_v, D_PE=d_pe, CAUSAL=bool(causal), DIRECT=direct,
        BLOCK_H=bh, BLOCK_N=BLOCK_N, num_warps=8, num_stages=2)
    if not direct:
        _mla_combine_kernel[(rows, b * h_kv)](
            o_part, lse_part, out, lse, out.stride(0), out.stride(1), out.stride(2),
            s_q, h_q, h_kv, group, rows, splits,
            D_NOPE=head_dim_v, BLOCK_S=max(2, triton.next_power_of_2(splits)), num_warps=4)
    return out, lse
