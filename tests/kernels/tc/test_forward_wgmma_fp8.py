"""The FP8 wgmma forward (kernels/tc/forward_wgmma_fp8.py) against float64 references on the
dequantized inputs, by FlashAttention-3's rule: its error may be twice that of the same attention
rounded where the kernel rounds (P to e4m3 for P V, out to 16 bits; ``reference.
attention_fp8_lowp``). Simulator: emulated e4m3 wgmma, one warpgroup, tiny shapes; GPU: the
device's tiles on a Hopper."""

import numpy as np
import pytest
from numba import cuda

import numba_flash as nf
from numba_flash import reference as ref
from numba_flash.kernels.tc import forward_wgmma_fp8
from helpers import (SIMULATOR, assert_close_rule, assert_compiles_clean, assert_lse,
                     later_samples, nan_like, to_device, to_host)
from kernels.tc._forward_cases import planned_for_family

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="the FP8 wgmma forward runs on compute capability 9.0 only")


@pytest.fixture(autouse=True)
def wgmma_family():
    with planned_for_family("wgmma"):
        if SIMULATOR:
            with forward_wgmma_fp8.SPEC.forcing((64, 4, 0)):
                yield
        else:
            yield


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
              softcap=0.0, alibi=False, sink=False, scale=1.0):
    (q8, qd, q), (k8, kd, k), (v8, vd, v) = (
        fp8_inputs(rng, (B, Sq, Hq, D), Hk, scale), fp8_inputs(rng, (B, Sk, Hk, D), Hk, scale),
        fp8_inputs(rng, (B, Sk, Hk, D), Hk))
    slopes = rng.uniform(0.0, 0.3, (Hq,)).astype(np.float32) if alibi else None
    logits = rng.standard_normal(Hq).astype(np.float32) if sink else None
    out_fmt = out_dtype or "bfloat16"
    out = nan_like(np.zeros((B, Sq, Hq, D), dict(bfloat16=ref.ml_dtypes.bfloat16,
                                                  float16=np.float16)[out_fmt]))
    o, lse = nf.flash_attn_fwd(to_device(q8), to_device(k8), to_device(v8), causal=causal,
                               backend="tc", out=out, window_size=window_size, softcap=softcap,
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
    assert_lse(lse, rl)


CASES = [
    (1, 5, 150, 2, 1, 32, False),   # two key tiles (the second ragged), GQA, D padded to 128 B
    (1, 20, 9, 1, 1, 16, True),     # Sq > Sk: rows that see no key
] if SIMULATOR else [
    (2, 1000, 1000, 8, 2, 128, False),
    (2, 1000, 1000, 8, 2, 128, True),
    (1, 777, 1531, 4, 4, 64, True),
    (3, 257, 513, 6, 3, 96, False),
    (1, 300, 300, 2, 1, 256, True),
    (1, 1, 4097, 2, 2, 128, False),
    (1, 4096, 4096, 2, 1, 256, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_fp8_forward_within_twice_fa3s_rounding(case, rng):
    check_fp8(rng, *case)


def test_fp8_forward_writes_float16_on_request(rng):
    shape = (1, 9, 40, 2, 2, 16, False) if SIMULATOR else (1, 500, 700, 4, 2, 128, False)
    check_fp8(rng, *shape, out_dtype="float16")


@pytest.mark.parametrize("options", [dict(window_size=(20, 3)),
                                     dict(softcap=5.0, scale=3.0),
                                     dict(alibi=True, sink=True)],
                         ids=["window", "softcap", "alibi-sink"])
def test_fp8_forward_with_masks_and_modifiers(rng, options):
    shape = (1, 40, 140, 2, 1, 16, True) if SIMULATOR else (2, 700, 1500, 4, 2, 128, True)
    check_fp8(rng, *shape, **options)


def test_compiles_for_sm90a_with_e4m3_wgmma_and_no_spills():
    """Every sample but the first (the registry's compile test builds that one), sm_90a."""
    assert_compiles_clean("tc.forward_wgmma_fp8", later_samples(forward_wgmma_fp8.SPEC),
                          ccs=((9, 0, "a"),),
                          must_contain=("k32.f32.e4m3.e4m3", "cvt.rn.satfinite.e4m3x2.f32",
                                        "cp.async.cg", "fence.proxy.async"))
