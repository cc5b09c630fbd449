"""SIMT forward kernel against the float64 reference (simulator: tiny shapes; GPU: real ones)."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import reference as ref
from helpers import (SIMULATOR, assert_close_rule, assert_compiles_clean, assert_lse, check_forward,
                     randn, to_device, to_host)
from kernels._fp8_cases import check_fp8
from kernels._window_cases import CASES as WINDOW_CASES, case_id as window_id
from kernels._window_cases import SOFTCAP_CASES, softcap_id
from kernels._window_cases import MODIFIER_CASES, modifier_id, modifier_options

# (B, Sq, Sk, Hq, Hk, D, causal, fmt): odd lengths, Sq != Sk both ways, GQA/MQA, head dims 8..256.
CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),
    (2, 9, 9, 2, 2, 8, True, "bfloat16"),
    (1, 13, 70, 2, 1, 24, True, "float32"),     # Sk spans two KV tiles, ragged
    (1, 70, 5, 1, 1, 32, True, "float16"),      # Sq > Sk: early rows see no key
    (1, 3, 11, 4, 1, 40, False, "bfloat16"),    # MQA
    (1, 4, 6, 1, 1, 128, True, "float16"),
    (1, 3, 5, 1, 1, 200, False, "bfloat16"),
    (1, 2, 33, 1, 1, 256, True, "float32"),
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16"),
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16"),
    (1, 777, 1531, 4, 4, 128, True, "float16"),
    (1, 1531, 777, 4, 1, 128, True, "float32"),
    (3, 257, 513, 6, 3, 72, False, "bfloat16"),
    (1, 300, 300, 2, 1, 256, True, "float16"),
    (1, 1, 4097, 2, 2, 96, False, "float16"),
    (1, 129, 129, 2, 2, 8, True, "bfloat16"),
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case, rng):
    check_forward(rng, *case, backend="simt")


@pytest.mark.parametrize("case", WINDOW_CASES, ids=window_id)
def test_sliding_window_matches_reference(case, rng):
    *shape, window_size = case
    check_forward(rng, *shape, backend="simt", window_size=window_size)


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=softcap_id)
def test_softcap_matches_reference(case, rng):
    *shape, softcap, scale = case
    check_forward(rng, *shape, backend="simt", softcap=softcap, scale=scale)


@pytest.mark.parametrize("case", MODIFIER_CASES, ids=modifier_id)
def test_alibi_and_sinks_match_reference(case, rng):
    check_forward(rng, *case[:-1], backend="simt", **modifier_options(rng, case))


def test_large_logits_stay_finite(rng):
    """Scores in the hundreds: without the running max, exp would overflow float32."""
    B, S, H, D = (1, 9, 1, 16) if SIMULATOR else (1, 600, 2, 64)
    check_forward(rng, B, S, S, H, H, D, True, "float32", backend="simt",
                  scale=8.0, softmax_scale=1.0)


def test_packed_qkv_views_need_no_copy(rng):
    """q, k, v sliced out of one (B, S, 3, H, D) tensor: strided views, honoured as they are."""
    B, S, H, D = (1, 6, 2, 16) if SIMULATOR else (2, 300, 4, 64)
    qkv = to_device(randn(rng, (B, S, 3, H, D), "float16"))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o, lse = nf.flash_attn_fwd(q, k, v, causal=True, backend="simt")
    hq, hk, hv = (to_host(x) for x in (q, k, v))
    ro, rl = ref.attention_fwd_ref(hq, hk, hv, True)
    assert_close_rule(o, ro, ref.attention_lowp(hq, hk, hv, True), "float16")
    assert_lse(lse, rl)


def test_fully_masked_rows_give_zero_and_inf(rng):
    B, Sq, Sk, H, D = (1, 6, 2, 1, 8) if SIMULATOR else (1, 300, 100, 2, 64)
    q, k, v = randn(rng, (B, Sq, H, D), "float16"), randn(rng, (B, Sk, H, D), "float16"), \
        randn(rng, (B, Sk, H, D), "float16")
    o, lse = nf.flash_attn_fwd(to_device(q), to_device(k), to_device(v), causal=True)
    empty = Sq - Sk  # rows 0 .. Sq-Sk-1 see no key
    assert (to_host(o)[:, :empty].astype(np.float32) == 0).all()
    assert np.isposinf(to_host(lse)[:, :, :empty]).all()
    assert np.isfinite(to_host(lse)[:, :, empty:]).all()


def test_flash_attn_func_returns_out_or_out_and_lse(rng):
    q, k, v = (randn(rng, (1, 4, 1, 8), "float32") for _ in range(3))
    out = nf.flash_attn_func(to_device(q), to_device(k), to_device(v))
    out2, lse = nf.flash_attn_func(to_device(q), to_device(k), to_device(v), return_lse=True)
    np.testing.assert_array_equal(to_host(out), to_host(out2))
    assert to_host(lse).shape == (1, 1, 4)


@pytest.mark.parametrize("case", [(1, 20, 40, 2, 1, 24, True)]
                         if SIMULATOR else [(2, 1000, 1000, 8, 2, 128, True),
                                            (1, 300, 700, 4, 4, 72, False)],
                         ids=lambda c: "-".join(map(str, c)))
def test_fp8_inputs_within_twice_fa3s_rounding(case, rng):
    """FP8 q, k, v with their descales (compute capability 8.9 and up): the readable FP8
    forward, held to the tensor-core kernel's rule (it keeps P in float32, more exact)."""
    check_fp8(rng, *case, backend="simt")


def test_every_specialization_compiles_without_spills():
    """The largest head dim of each tile class (most registers), causal or not, 16- and 32-bit
    storage; bfloat16 (which differs from float16 only in its conversions) and the smallest
    head dims once; paged varlen K/V once."""
    configs = [(d, causal, fmt) for d in (64, 128, 256) for causal in (False, True)
               for fmt in ("float16", "float32")] + [(8, True, "bfloat16"), (72, False, "bfloat16")]
    configs.append((128, True, "bfloat16", True, True))
    assert_compiles_clean("simt.forward", [(config, None) for config in configs])
