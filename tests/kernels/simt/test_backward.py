"""SIMT backward kernels (preprocess, dK/dV, dQ) against the float64 reference.

Simulator: tiny shapes, chosen to cross tile boundaries of both kernels; GPU: real ones. The PTX
check compiles the kernels for sm_80 and sm_90 without the simulator and asserts no spills.
"""

import pytest

import numba_flash as nf
from helpers import SIMULATOR, assert_compiles_clean, nan_like, randn, to_device, to_host
from kernels._backward_cases import WINDOW_CASES, check_window, window_id
from kernels._backward_cases import SOFTCAP_CASES, check_softcap, softcap_id
from kernels._backward_cases import MODIFIER_CASES, check_modifiers, library_backward, modifier_id
from kernels._backward_cases import check_bitwise_deterministic, check_large_logits
from kernels._backward_cases import check_gradients as _check
from kernels._backward_cases import check_rows_without_keys
from kernels._backward_cases import inputs as _inputs

# (B, Sq, Sk, Hq, Hk, D, causal, fmt): odd lengths, Sq != Sk both ways, GQA/MQA, head dims 8..256.
# dK/dV tiles (BLOCK_M, BLOCK_N) are (32, 64) up to D = 64, (32, 32) up to 128, (32, 16) above;
# dQ tiles (64, 32), (64, 32), (16, 32).
CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),
    (2, 9, 9, 2, 2, 8, True, "bfloat16"),
    (1, 37, 70, 2, 1, 24, True, "float32"),     # 2 query x 2 key tiles (dK/dV), 3 key tiles (dQ)
    (1, 70, 5, 1, 1, 32, True, "float16"),      # Sq > Sk: rows 0..64 see no key, skipped tiles
    (1, 3, 11, 4, 1, 40, False, "bfloat16"),    # MQA: one kv head sums four query heads
    (1, 6, 40, 1, 1, 128, True, "float16"),     # 2 key tiles: one unmasked, one ragged + diagonal
    (1, 3, 5, 1, 1, 200, False, "bfloat16"),
    (1, 20, 33, 1, 1, 256, True, "float32"),    # 3 key tiles (dK/dV), 2 query tiles (dQ)
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
    (1, 2048, 2048, 16, 1, 64, True, "bfloat16"),   # MQA: 16 query heads summed per CTA
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


_backward = library_backward("simt", "simt")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_backward_matches_reference(case, rng):
    B, Sq, Sk, Hq, Hk, D, causal, fmt = case
    dout, q, k, v = _inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt)
    buffers = dict(dq=nan_like(q), dk=nan_like(k), dv=nan_like(v))  # poisoned: all must be written
    grads = _backward(dout, q, k, v, causal, **buffers)
    assert all(g is buffers[n] for g, n in zip(grads, ("dq", "dk", "dv")))
    _check(grads, dout, q, k, v, causal, fmt)


@pytest.mark.parametrize("case", WINDOW_CASES, ids=window_id)
def test_sliding_window_matches_reference(case, rng):
    check_window(rng, _backward, case)


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=softcap_id)
def test_softcap_matches_reference(case, rng):
    check_softcap(rng, _backward, case)


def test_backward_is_bitwise_deterministic(rng):
    check_bitwise_deterministic(rng, _backward)


@pytest.mark.parametrize("sign", [1, -1])
def test_large_logits_stay_finite(sign, rng):
    check_large_logits(rng, _backward, sign)


def test_rows_without_keys_get_zero_dq(rng):
    check_rows_without_keys(rng, _backward)


def test_packed_qkv_views_need_no_copy(rng):
    """q, k, v (and dout, out) as strided views: honoured as they are, gradients correct."""
    B, S, H, D = (1, 6, 2, 16) if SIMULATOR else (2, 300, 4, 64)
    qkv = to_device(randn(rng, (B, S, 3, H, D), "float16"))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    dout_pair = to_device(randn(rng, (B, S, 2, H, D), "float16"))
    out, lse = nf.flash_attn_fwd(q, k, v, causal=True, backend="simt")
    grads = nf.flash_attn_bwd(dout_pair[:, :, 1], q, k, v, out, lse, causal=True)
    host = [to_host(x) for x in (dout_pair[:, :, 1], q, k, v)]
    _check(grads, *host, True, "float16")


def test_every_specialization_compiles_without_spills():
    """The largest head dim of each tile class (most registers) for both tiled kernels, one
    without causal masks in 32-bit storage, one with them in bfloat16; the preprocess once.
    (A sweep of head dims 8..256, all formats, both architectures: 127..207 registers.)"""
    for kernel, causal, fmt in (("DKDV", False, "float32"), ("DQ", True, "bfloat16")):
        assert_compiles_clean(f"simt.backward:{kernel}",
                              [((d, causal, fmt), None) for d in (64, 128, 256)])
    assert_compiles_clean("simt.backward:PREPROCESS", [((256, False, "float16"), None)])


@pytest.mark.parametrize("case", MODIFIER_CASES, ids=modifier_id)
def test_alibi_and_sinks_match_reference(case, rng):
    check_modifiers(rng, _backward, case)
