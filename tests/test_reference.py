"""The float64 references against straightforward dense computations."""

import ml_dtypes
import numpy as np

from numba_flash.reference import mla_decode_ref


def _dense_mla(q, kv_dense, seqlens, dv, scale, causal):
    """Decode over contiguous caches ``kv_dense (b, L, h_kv, d)``: a full-length score matrix with
    an explicit visibility mask, softmax by plain exp (inputs are small), no max subtraction."""
    b, s_q, h_q, d = q.shape
    h_kv = kv_dense.shape[2]
    big_l = kv_dense.shape[1]
    k = np.repeat(kv_dense, h_q // h_kv, axis=2)  # (b, L, h_q, d)
    out = np.zeros((b, s_q, h_q, dv))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        for t in range(s_q):
            limit = seqlens[i] - (s_q - 1 - t) if causal else seqlens[i]
            mask = np.arange(big_l) < limit
            if not mask.any():
                continue
            for h in range(h_q):
                kk = np.where(mask[:, None], k[i, :, h], 0.0)  # NaN-free stand-ins past limit
                e = np.where(mask, np.exp(kk @ q[i, t, h] * scale), 0.0)
                lse[i, h, t] = np.log(e.sum())
                out[i, t, h] = (e / e.sum()) @ kk[:, :dv]
    return out, lse


def test_mla_decode_ref_paged_vs_dense():
    rng = np.random.default_rng(7)
    b, s_q, h_q, h_kv, d, dv, page = 4, 2, 4, 2, 24, 16, 5
    seqlens = np.array([13, 0, 1, 10], dtype=np.int32)  # 13: 3 pages, the last one partial
    max_pages = 4
    big_l = max_pages * page
    q = rng.standard_normal((b, s_q, h_q, d)).astype(np.float32)
    kv_dense = rng.standard_normal((b, big_l, h_kv, d)).astype(np.float32)

    # scatter each sequence into shuffled physical pages; poison everything that must be ignored
    used = [-(-int(n) // page) for n in seqlens]
    num_blocks = sum(used) + 3
    perm = rng.permutation(num_blocks)
    k_cache = np.full((num_blocks, page, h_kv, d), np.nan, dtype=np.float32)
    block_table = np.full((b, max_pages), 2 ** 30, dtype=np.int32)  # sentinel: never read
    nxt = 0
    for i in range(b):
        for j in range(used[i]):
            blk = perm[nxt]
            nxt += 1
            block_table[i, j] = blk
            rows = min(page, int(seqlens[i]) - j * page)
            k_cache[blk, :rows] = kv_dense[i, j * page:j * page + rows]

    qd = q.astype(np.float64)
    kd = kv_dense.astype(np.float64)
    for causal in (False, True):
        for scale in (None, 0.3):
            out, lse = mla_decode_ref(q, k_cache, block_table, seqlens, dv, softmax_scale=scale,
                                      causal=causal)
            want_out, want_lse = _dense_mla(qd, kd, seqlens, dv, d ** -0.5 if scale is None else
                                            scale, causal)
            assert out.dtype == np.float64 and out.shape == (b, s_q, h_q, dv)
            assert lse.dtype == np.float64 and lse.shape == (b, h_q, s_q)
            assert np.isfinite(out).all()
            np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
            fin = np.isfinite(want_lse)
            np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12, atol=1e-12)
            # seqlen 0: no key for any row
            assert (out[1] == 0).all() and (lse[1] == np.inf).all()
            if causal:  # seqlen 1 with s_q = 2: token 0 sees no key, token 1 sees key 0
                assert (out[2, 0] == 0).all() and (lse[2, :, 0] == np.inf).all()
                np.testing.assert_allclose(out[2, 1], np.repeat(kd[2, 0, :, :dv], 2, axis=0))
            else:  # without the mask both tokens see the whole sequence
                assert np.isfinite(lse[2]).all()

    # 16-bit inputs are upcast exactly: same result as their float64 values
    for dt in (np.float16, ml_dtypes.bfloat16):
        q16, c16 = q.astype(dt), k_cache.astype(dt)
        out, lse = mla_decode_ref(q16, c16, block_table, seqlens, dv, causal=True)
        ref_out, ref_lse = mla_decode_ref(q16.astype(np.float64), c16.astype(np.float64),
                                          block_table, seqlens, dv, causal=True)
        np.testing.assert_array_equal(out, ref_out)
        np.testing.assert_array_equal(lse, ref_lse)


def test_attention_bwd_ref_matches_finite_differences():
    """dq, dk, dv of sum(out * dout) against central differences of attention_fwd_ref, with GQA
    and a causal mask leaving the first query row without keys."""
    from numba_flash.reference import attention_bwd_ref, attention_fwd_ref

    rng = np.random.default_rng(3)
    # float32 values (the references read inputs through float32) and a step of 2^-12
    q, dout = rng.standard_normal((2, 1, 4, 2, 8)).astype(np.float32).astype(np.float64)
    k, v = rng.standard_normal((2, 1, 3, 1, 8)).astype(np.float32).astype(np.float64)
    grads = attention_bwd_ref(dout, q, k, v, causal=True, softmax_scale=0.4)
    h = 2.0 ** -12
    for x, g in zip((q, k, v), grads):
        assert g.shape == x.shape
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            x0 = x[idx]
            x[idx] = x0 + h
            hi = (attention_fwd_ref(q, k, v, True, 0.4)[0] * dout).sum()
            x[idx] = x0 - h
            lo = (attention_fwd_ref(q, k, v, True, 0.4)[0] * dout).sum()
            x[idx] = x0
            num[idx] = (hi - lo) / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-6)
    assert (grads[0][:, 0] == 0).all()  # query 0 sees no key (Sq - Sk = 1)


def test_attention_bwd_lowp_rounds_like_its_dtype():
    """float32: the exact gradients to float32 precision; float16: visibly rounded, not wrong."""
    from numba_flash.reference import attention_bwd_lowp, attention_bwd_ref

    rng = np.random.default_rng(5)
    for dt, lo, hi in ((np.float32, 0, 1e-5), (np.float16, 1e-5, 1e-2)):
        q, dout = rng.standard_normal((2, 1, 6, 4, 16)).astype(dt)
        k, v = rng.standard_normal((2, 1, 9, 2, 16)).astype(dt)
        for got, want in zip(attention_bwd_lowp(dout, q, k, v, True),
                             attention_bwd_ref(dout, q, k, v, True)):
            err = np.abs(got - want).max() / np.abs(want).max()
            assert lo <= err <= hi, (dt, err)
