"""What the FP8 forwards (tc/forward_wgmma_fp8.py, simt/forward.py with FP8 inputs) are tested
on: e4m3 inputs with FA3's descales and the check by FA3's accuracy rule."""

import numpy as np

import numba_flash as nf
from numba_flash import reference as ref
from helpers import assert_close_rule, assert_lse, nan_like, to_device, to_host


# Hopper's FP8 tensor cores keep about 14 bits of a running sum of products (DeepSeek-V3's
# report; the GPU test of wgmma's e4m3 chain sees errors of 2^-12.6 of the magnitudes), so the
# scores, and with them the lse, are a few parts in 10^4 off where 16-bit inputs are exact.
FP8_LSE_TOL = 1e-3


def fp8_inputs(rng, shape, hk, scale=1.0):
    """Random (B, S, H, D) values quantized to e4m3 with FA3's descales: (B, hk), each the amax
    of its group of H / hk heads over 448. Returns the e4m3 array, the descales and the values
    they stand for (float64, (B, S, H, D))."""
    b, s, h, d = shape
    x = rng.standard_normal(shape) * scale
    amax = np.abs(x).reshape(b, s, hk, h // hk, d).max(axis=(1, 3, 4))
    descale = np.maximum(amax / 448.0, 1e-12).astype(np.float32)
    per_head = np.repeat(descale, h // hk, axis=1)
    x8 = ref.quantize_e4m3(x, per_head[:, None, :, None])
    return x8, descale, ref.dequantize_e4m3(x8, per_head)


def check_fp8(rng, B, Sq, Sk, Hq, Hk, D, causal, out_dtype=None, window_size=(-1, -1),
              softcap=0.0, alibi=False, sink=False, scale=1.0, backend="tc"):
    """flash_attn_fwd on fresh e4m3 inputs (out poisoned) against the float64 attention of the
    dequantized values, by FA3's rule (docs/design.md, "Tolerance rule")."""
    (q8, qd, q), (k8, kd, k), (v8, vd, v) = (
        fp8_inputs(rng, (B, Sq, Hq, D), Hk, scale), fp8_inputs(rng, (B, Sk, Hk, D), Hk, scale),
        fp8_inputs(rng, (B, Sk, Hk, D), Hk))
    slopes = rng.uniform(0.0, 0.3, (Hq,)).astype(np.float32) if alibi else None
    logits = rng.standard_normal(Hq).astype(np.float32) if sink else None
    out_fmt = out_dtype or "bfloat16"
    out = nan_like(np.zeros((B, Sq, Hq, D), dict(bfloat16=ref.ml_dtypes.bfloat16,
                                                  float16=np.float16)[out_fmt]))
    o, lse = nf.flash_attn_fwd(to_device(q8), to_device(k8), to_device(v8), causal=causal,
                               backend=backend, out=out, window_size=window_size, softcap=softcap,
                               alibi_slopes=None if slopes is None else to_device(slopes),
                               learnable_sink=None if logits is None else to_device(logits),
                               q_descale=to_device(qd), k_descale=to_device(kd),
                               v_descale=to_device(vd), out_dtype=out_dtype)
    assert o is out
    mask = None if tuple(window_size) == (-1, -1) else ref.window_mask(Sq, Sk, window_size, causal)
    bias = None if slopes is None else ref.alibi_bias(slopes, Sq, Sk)
    ro, rl = ref.attention_fwd_ref(q, k, v, causal, None, mask, softcap or None, bias, logits)
    lowp = ref.attention_fp8_lowp(q, k, v, causal, None, mask, softcap or None, bias, logits)
    assert_close_rule(to_host(o), ro, lowp, "bfloat16")
    assert_lse(lse, rl, FP8_LSE_TOL)
