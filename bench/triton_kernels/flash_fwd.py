"""FlashAttention forward in Triton, written from chapter 9.4.5: the comparison point for the
numba kernels (tensor cores through ``tl.dot``, software pipelining by the Triton compiler).

What it computes
    ``out, lse = flash_fwd(q, k, v, causal, softmax_scale)`` for torch CUDA tensors
    q (B, Sq, Hq, D), k, v (B, Sk, Hk, D) in float16 / bfloat16 (any strides with a contiguous
    last dimension), the conventions of numba_flash: GQA (query head h reads kv head
    h // (Hq // Hk)), bottom-right causal mask (query i sees keys j <= i + Sk - Sq), lse
    (B, Hq, Sq) float32 natural log, rows with no visible key -> out 0, lse +inf.

Grid / program
    grid (ceil(Sq / BLOCK_M), B * Hq): one program holds one tile Q_i in registers and streams
    the K_j, V_j tiles (FA2 loop order). Per tile: S = Q_i K_j^T with ``tl.dot``, the online
    softmax in base 2 (the scale is multiplied by log2(e) so each exp is one ex2), the rescale of
    O_i and l_i, and O_i += P V_j with P rounded to the input dtype. The loop is split in two:
    tiles every row of Q_i sees in full (no mask), then the tiles crossing the end of the
    sequence or the causal diagonal (masked); causal tiles wholly above the diagonal are skipped.

Limits
    D a multiple of 8 up to 256 (padded to a power of two inside the kernel); float32 inputs
    are refused (``tl.dot`` would round them to tf32). Tile sizes are fixed per head dim
    (``CONFIGS``), chosen for Hopper-class GPUs, not autotuned.
"""

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # used inside kernels: a compile-time constant

# head dim limit -> (BLOCK_M, BLOCK_N, num_warps, num_stages)
CONFIGS = ((64, (128, 64, 4, 3)), (128, (128, 128, 8, 2)), (256, (128, 32, 8, 2)))


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, start, stop,
            offs_m, offs_n, offs_d, seqlen_k, diag, scale_log2,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
            MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Online softmax over the KV tiles [start, stop): returns the updated (acc, l_i, m_i)."""
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = offs_d[None, :] < HEAD_DIM
        if MASKED:
            kv_mask = kv_mask & (cols[:, None] < seqlen_k)
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
        if MASKED or HEAD_DIM != BLOCK_D:
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, tl.trans(k)) * scale_log2
        if MASKED:
            keep = cols[None, :] < seqlen_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + diag)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen no key yet
        alpha = tl.math.exp2(m_i - base)
        p = tl.math.exp2(s - base[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED or HEAD_DIM != BLOCK_D:
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE,
                      stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                      stride_vb, stride_vn, stride_vh, stride_ob, stride_on, stride_oh,
                      seqlen_q, seqlen_k, n_heads_q, group, scale_log2,
                      HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_heads_q).to(tl.int64)
    h = bh % n_heads_q
    hk = h // group
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # Q_i stays in registers for the whole loop.
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Keys [0, hi) are visible to some row of the tile; [0, full) to every row, unmasked.
    diag = seqlen_k - seqlen_q  # query r sees keys j <= r + diag
    hi = seqlen_k
    full = seqlen_k // BLOCK_N * BLOCK_N
    if CAUSAL:
        if m0 + BLOCK_M + diag < hi:
            hi = m0 + BLOCK_M + diag
        first_row_sees = m0 + diag + 1  # keys the tile's first row sees (may be <= 0)
        if first_row_sees < full:
            full = first_row_sees // BLOCK_N * BLOCK_N
        if full < 0:
            full = 0
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, 0, full,
                            offs_m, offs_n, offs_d, seqlen_k, diag, scale_log2,
                            HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, full, hi,
                            offs_m, offs_n, offs_d, seqlen_k, diag, scale_log2,
                            HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL)

    # Epilogue: O_i / l_i and lse = m_i + log(l_i), back from base 2.
    seen = l_i > 0.0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_i)) * LN2, float("inf"))
    row_ok = offs_m < seqlen_q
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)


def check_inputs(q, k, v):
    """Shapes and dtypes the Triton kernels take; ``ValueError``/``TypeError`` otherwise."""
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q, k, v: expected (B, S, H, D) with k and v alike, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, _, hq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or hq % k.shape[2]:
        raise ValueError(f"k: shape {tuple(k.shape)} does not match q's {tuple(q.shape)}")
    if d % 8 or d > 256:
        raise ValueError(f"q: head dim must be a multiple of 8 up to 256, got {d}")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v: expected one dtype, float16 or bfloat16, got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("q, k, v: the last dimension must be contiguous")


def block_d(head_dim):
    return max(16, triton.next_power_of_2(head_dim))


def flash_fwd(q, k, v, causal=False, softmax_scale=None, config=None):
    """Returns ``(out, lse)``; ``config`` overrides (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    check_inputs(q, k, v)
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    bm, bn, warps, stages = config or next(c for limit, c in CONFIGS if d <= limit)
    out = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(sq, bm), b * hq)
    _flash_fwd_kernel[grid](
        q, k, v, out, lse, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1),
        out.stride(2), sq, sk, hq, hq // hk, scale * LOG2E,
        HEAD_DIM=d, CAUSAL=bool(causal), BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d(d),
        num_warps=warps, num_stages=stages)
    return out, lse
