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
                     later_samples, nan_like, to_device, to_host, torch_device)
from kernels._fp8_cases import FP8_LSE_TOL, check_fp8, fp8_inputs
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


CASES = [
    (1, 5, 150, 2, 1, 32, False),   # two key tiles (the second ragged), GQA, D padded to 128 B
    (1, 20, 9, 1, 1, 16, True, "float16"),  # Sq > Sk: rows that see no key; float16 out
] if SIMULATOR else [
    (1, 500, 700, 4, 2, 128, False, "float16"),
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


@pytest.mark.parametrize("options", [dict(window_size=(20, 3)),
                                     dict(softcap=5.0, scale=3.0),
                                     dict(alibi=True, sink=True)],
                         ids=["window", "softcap", "alibi-sink"])
def test_fp8_forward_with_masks_and_modifiers(rng, options):
    shape = (1, 40, 140, 2, 1, 16, True) if SIMULATOR else (2, 700, 1500, 4, 2, 128, True)
    check_fp8(rng, *shape, **options)


def test_fp8_varlen_attends_each_sequence_with_its_descales(rng):
    """Packed sequences (one of them empty of keys past its queries: causal, Sq > Sk), each with
    its own descales; rows of no sequence are not written."""
    lens_q, lens_k, hq, hk, d = ((3, 9, 4), (5, 140, 2), 2, 1, 16) if SIMULATOR else \
        ((300, 1, 1000, 77), (512, 1500, 999, 3), 8, 2, 128)
    seqs = [(fp8_inputs(rng, (1, sq, hq, d), hk), fp8_inputs(rng, (1, sk, hk, d), hk),
             fp8_inputs(rng, (1, sk, hk, d), hk)) for sq, sk in zip(lens_q, lens_k)]

    def packed(i, part):  # input i (q, k, v) of every sequence: its e4m3 rows or descales
        return np.concatenate([s[i][part][0] if part == 0 else s[i][part] for s in seqs])
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lens_q, lens_k))
    total_q = int(cu_q[-1]) + 2  # two rows of no sequence
    q8 = np.concatenate([packed(0, 0), np.zeros((2, hq, d), packed(0, 0).dtype)])
    out = nan_like(np.zeros((total_q, hq, d), ref.ml_dtypes.bfloat16))
    o, lse = nf.flash_attn_varlen_fwd(
        to_device(q8), to_device(packed(1, 0)), to_device(packed(2, 0)), to_device(cu_q),
        to_device(cu_k), max(lens_q), max(lens_k), causal=True, backend="tc", out=out,
        q_descale=to_device(packed(0, 1)), k_descale=to_device(packed(1, 1)),
        v_descale=to_device(packed(2, 1)))
    o, lse = ref.to_float64(to_host(o)), to_host(lse)
    for i, ((_, _, q), (_, _, k), (_, _, v)) in enumerate(seqs):
        rows = slice(cu_q[i], cu_q[i + 1])
        ro, rl = ref.attention_fwd_ref(q, k, v, True)
        lowp = ref.attention_fp8_lowp(q, k, v, True)
        assert_close_rule(o[rows][None], ro, lowp, "bfloat16", what=f"sequence {i}")
        assert_lse(lse[:, rows][None], rl, FP8_LSE_TOL)
    assert np.isnan(o[cu_q[-1]:]).all(), "rows of no sequence were written"


def test_rotation_cuts_the_error_of_outlier_channels(rng):
    """FA3's incoherent processing: q and k with a few large channels in common (outlier
    features), quantized by quantize_fp8 as they are and after hadamard_rotate with one seed;
    the RMSE of the FP8 output against the exact attention of the unquantized inputs drops by
    at least 2x (FA3 reports 2.6x)."""
    B, S, H, D = (1, 64, 1, 64) if SIMULATOR else (2, 2048, 4, 128)
    q, k, v = (rng.standard_normal((B, S, H, D)) for _ in range(3))
    channels = rng.choice(D, 4, replace=False)
    q[..., channels] *= 20.0
    k[..., channels] *= 20.0
    q, k, v = (x.astype(ref.ml_dtypes.bfloat16) for x in (q, k, v))
    exact = ref.attention_fwd_ref(q, k, v)[0]

    def fp8_out(q, k):
        (q8, qd), (k8, kd), (v8, vd) = (nf.quantize_fp8(x) for x in (q, k, torch_device(v)))
        return to_host(nf.flash_attn_fwd(q8, k8, v8, backend="tc", q_descale=qd, k_descale=kd,
                                         v_descale=vd)[0])

    def rmse(out):
        return float(np.sqrt(np.mean((ref.to_float64(out) - exact) ** 2)))

    plain = rmse(fp8_out(torch_device(q), torch_device(k)))
    rotated = rmse(fp8_out(*(nf.hadamard_rotate(torch_device(x), seed=3) for x in (q, k))))
    assert plain >= 2.0 * rotated, f"RMSE {plain:.3g} as given, {rotated:.3g} rotated"


def test_compiles_for_sm90a_with_e4m3_wgmma_and_no_spills():
    """Every sample but the first (the registry's compile test builds that one), sm_90a."""
    assert_compiles_clean("tc.forward_wgmma_fp8", later_samples(forward_wgmma_fp8.SPEC),
                          ccs=((9, 0, "a"),),
                          must_contain=("k32.f32.e4m3.e4m3", "cvt.rn.satfinite.e4m3x2.f32",
                                        "cp.async.cg", "fence.proxy.async"))
