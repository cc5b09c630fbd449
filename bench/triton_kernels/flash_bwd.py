"""FlashAttention backward in Triton, the two-kernel scheme of chapter 9.4.5.

What it computes
    ``dq, dk, dv = flash_bwd(dout, q, k, v, out, lse, causal, softmax_scale)``: the gradients of
    ``sum(out * dout)`` for the forward of flash_fwd.py (same layouts, GQA, bottom-right causal
    mask, natural-log lse from that forward). P is never stored: each kernel recomputes
    ``P_ij = exp(S_ij - lse_i)`` from Q_i, K_j and the saved lse. With ``dS_ij = P_ij * (dP_ij - D_i)``:

        preprocess  D_i = rowsum(dO_i * O_i)                      grid (ceil(Sq / 64), B * Hq)
        dK/dV       for one KV tile K_j, V_j (held), stream the Q tiles of every query head
                    of its group: dV_j += P_ij^T dO_i, dK_j += dS_ij^T Q_i * scale
                                                                  grid (ceil(Sk / BLOCK_N), B * Hk)
        dQ          for one Q tile (held), stream the KV tiles: dQ_i += dS_ij K_j * scale
                                                                  grid (ceil(Sq / BLOCK_M), B * Hq)

    dQ and dK/dV accumulate along different directions, hence two kernels and no atomics: the
    result is deterministic, and dK, dV of a kv head sum its query heads in a fixed order. The
    kernels work in the transposed orientation where it saves a transpose (dK/dV computes
    S^T = K Q^T). Ragged ends need only masked loads (a query row past Sq loads lse = +inf, so
    its P is 0; a key past Sk loads K = V = 0, so it adds nothing to dQ and its dK, dV rows are
    not stored); the causal mask is applied only on the tiles that cross the diagonal.

Limits
    As flash_fwd.py: float16 / bfloat16, D a multiple of 8 up to 256, fixed tiles per head dim.
"""

import torch
import triton
import triton.language as tl

from flash_fwd import LOG2E, block_d, check_inputs

# head dim limit -> ((BLOCK_M, BLOCK_N, num_warps, num_stages) of dK/dV, the same of dQ); picked
# so that Triton 3.6 compiles them for sm_90 with no (or a few bytes of) register spills.
CONFIGS = ((64, ((32, 128, 8, 2), (128, 64, 8, 2))), (128, ((32, 64, 8, 2), (128, 64, 8, 2))),
           (256, ((32, 32, 8, 1), (32, 32, 8, 1))))
PRE_BLOCK = 64


@triton.jit
def _preprocess_kernel(O, DO, DELTA, stride_ob, stride_on, stride_oh, stride_db, stride_dn,
                       stride_dh, seqlen_q, n_heads_q,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(1)
    b = (bh // n_heads_q).to(tl.int64)
    h = bh % n_heads_q
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=mask, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dn + offs_d[None, :],
                 mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn, stride_dn,
                start, stop, offs_n, offs_d, seqlen_q, diag, scale_log2,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr):
    """Accumulate dK_j, dV_j over the Q tiles [start, stop) of one query head."""
    for start_m in range(start, stop, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < seqlen_q
        mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
        q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :], mask=mask, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dn + offs_d[None, :], mask=mask, other=0.0)
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * scale_log2 - lse2[None, :])  # P^T: [keys, rows]
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + diag, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                 stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
                 stride_vb, stride_vn, stride_vh, stride_db, stride_dn, stride_dh,
                 stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                 seqlen_q, seqlen_k, n_heads_k, group, scale, scale_log2,
                 HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bhk = tl.program_id(1)
    b = (bhk // n_heads_k).to(tl.int64)
    hk = bhk % n_heads_k
    n0 = tl.program_id(0) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=kv_mask, other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Query rows that see some key of this tile start at n0 - diag; from row n0 + BLOCK_N - 1 -
    # diag on they see all of it (no mask). Both bounds rounded to whole Q tiles.
    diag = seqlen_k - seqlen_q
    start = 0
    mid = 0
    if CAUSAL:
        first = n0 - diag
        if first > 0:
            start = first // BLOCK_M * BLOCK_M
        mid = start
        unmasked_from = n0 + BLOCK_N - 1 - diag
        if unmasked_from > start:
            mid = start + (unmasked_from - start + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    for g in range(0, group):
        h = (hk * group + g).to(tl.int64)
        bh = b * n_heads_k * group + h
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_db + h * stride_dh
        lse_base = LSE + bh * seqlen_q
        delta_base = DELTA + bh * seqlen_q
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn,
                             stride_dn, start, mid, offs_n, offs_d, seqlen_q, diag, scale_log2,
                             HEAD_DIM, BLOCK_M, True)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn,
                             stride_dn, mid, seqlen_q, offs_n, offs_d, seqlen_q, diag, scale_log2,
                             HEAD_DIM, BLOCK_M, False)

    dk = dk * scale
    tl.store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, start, stop, offs_m,
              offs_d, seqlen_k, diag, scale_log2,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Accumulate dQ_i over the KV tiles [start, stop)."""
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=mask, other=0.0)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse2[:, None])
        if MASKED:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
               stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
               stride_vb, stride_vn, stride_vh, stride_db, stride_dn, stride_dh,
               stride_dqb, stride_dqn, stride_dqh,
               seqlen_q, seqlen_k, n_heads_q, group, scale, scale_log2,
               HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(1)
    b = (bh // n_heads_q).to(tl.int64)
    h = bh % n_heads_q
    hk = h // group
    m0 = tl.program_id(0) * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen_q
    mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=mask, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dn + offs_d[None, :],
                 mask=mask, other=0.0)
    lse2 = tl.load(LSE + bh.to(tl.int64) * seqlen_q + offs_m, mask=row_ok,
                   other=float("inf")) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * seqlen_q + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh

    # As in the forward: keys [0, full) are seen by every row of the tile, [full, hi) by some.
    diag = seqlen_k - seqlen_q
    hi = seqlen_k
    full = seqlen_k
    if CAUSAL:
        if m0 + BLOCK_M + diag < hi:
            hi = m0 + BLOCK_M + diag
        full = 0
        if m0 + diag + 1 > 0:
            full = (m0 + diag + 1) // BLOCK_N * BLOCK_N
        if full > hi:
            full = hi
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, 0, full, offs_m,
                   offs_d, seqlen_k, diag, scale_log2, HEAD_DIM, BLOCK_N, False)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, full, hi, offs_m,
                   offs_d, seqlen_k, diag, scale_log2, HEAD_DIM, BLOCK_N, True)
    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=mask)


def flash_bwd(dout, q, k, v, out, lse, causal=False, softmax_scale=None, config=None):
    """Returns ``(dq, dk, dv)`` shaped like q, k, v; ``config`` overrides ``CONFIGS``."""
    check_inputs(q, k, v)
    if dout.shape != q.shape or out.shape != q.shape or dout.stride(3) != 1 or out.stride(3) != 1:
        raise ValueError("dout, out: expected q's shape with a contiguous last dimension")
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = hq // hk
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    (kv_m, kv_n, kv_w, kv_s), (q_m, q_n, q_w, q_s) = config or next(
        c for lim, c in CONFIGS if d <= lim)
    bd = block_d(d)
    lse = lse.contiguous()
    delta = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    dq = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, sk, hk, d), dtype=q.dtype, device=q.device)
    dv = torch.empty((b, sk, hk, d), dtype=q.dtype, device=q.device)
    strides = lambda t: (t.stride(0), t.stride(1), t.stride(2))  # noqa: E731

    _preprocess_kernel[(triton.cdiv(sq, PRE_BLOCK), b * hq)](
        out, dout, delta, *strides(out), *strides(dout), sq, hq,
        HEAD_DIM=d, BLOCK_M=PRE_BLOCK, BLOCK_D=bd)
    common = dict(HEAD_DIM=d, CAUSAL=bool(causal), BLOCK_D=bd)
    _dkdv_kernel[(triton.cdiv(sk, kv_n), b * hk)](
        q, k, v, dout, lse, delta, dk, dv, *strides(q), *strides(k), *strides(v),
        *strides(dout), *strides(dk), *strides(dv), sq, sk, hk, group, scale, scale * LOG2E,
        BLOCK_M=kv_m, BLOCK_N=kv_n, num_warps=kv_w, num_stages=kv_s, **common)
    _dq_kernel[(triton.cdiv(sq, q_m), b * hq)](
        q, k, v, dout, lse, delta, dq, *strides(q), *strides(k), *strides(v), *strides(dout),
        *strides(dq), sq, sk, hq, group, scale, scale * LOG2E,
        BLOCK_M=q_m, BLOCK_N=q_n, num_warps=q_w, num_stages=q_s, **common)
    return dq, dk, dv
