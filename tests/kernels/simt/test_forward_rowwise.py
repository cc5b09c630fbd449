"""The one-thread-per-row teaching forward against the float64 reference (simulator: tiny
shapes; GPU: real ones). It is launched through its spec (``forward_rowwise.run``): no API call
reaches it."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import reference as ref
from numba_flash.kernels.simt import forward_rowwise
from helpers import (SIMULATOR, assert_close_rule, assert_compiles_clean, assert_lse, nan_like,
                     randn, to_device, to_host)

# (B, Sq, Sk, Hq, Hk, D, causal, fmt): odd lengths, Sq != Sk both ways, GQA/MQA, both tile
# entries (BLOCK_N = 32 up to D = 64, 16 above).
CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),
    (2, 9, 9, 2, 2, 8, True, "bfloat16"),
    (1, 13, 70, 2, 1, 24, True, "float32"),    # Sk spans three KV tiles, ragged
    (1, 20, 6, 1, 1, 32, True, "float16"),     # Sq > Sk: early rows see no key
    (1, 3, 11, 4, 1, 40, False, "bfloat16"),   # MQA
    (1, 4, 37, 1, 1, 128, True, "float16"),    # BLOCK_N = 16: three tiles
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16"),
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16"),
    (1, 777, 1531, 4, 4, 128, True, "float16"),
    (1, 1531, 777, 4, 1, 128, True, "float32"),
    (3, 257, 513, 6, 3, 72, False, "bfloat16"),
    (1, 129, 129, 2, 2, 8, True, "bfloat16"),
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


def check(rng, B, Sq, Sk, Hq, Hk, D, causal, fmt, scale=1.0, softmax_scale=None):
    """``check_forward`` (tests/helpers.py) for this kernel: fresh inputs, out poisoned with NaN,
    out and lse against the float64 reference by the tolerance rule of docs/design.md."""
    q, k, v = (randn(rng, s, fmt, scale) for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    out = nan_like(q)
    o, lse = forward_rowwise.run(to_device(q), to_device(k), to_device(v), causal, softmax_scale,
                                 out=out)
    assert o is out
    ro, rl = ref.attention_fwd_ref(q, k, v, causal, softmax_scale)
    assert to_host(o).dtype == q.dtype
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, causal, softmax_scale), fmt)
    assert_lse(lse, rl)
    return to_host(o), to_host(lse)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case, rng):
    check(rng, *case)


def test_large_logits_stay_finite(rng):
    """Scores in the hundreds: without the running max m_i, exp would overflow float32."""
    B, S, H, D = (1, 9, 1, 16) if SIMULATOR else (1, 600, 2, 64)
    check(rng, B, S, S, H, H, D, True, "float32", scale=8.0, softmax_scale=1.0)


def test_rows_without_keys_give_zero_and_inf(rng):
    B, Sq, Sk, H, D = (1, 6, 2, 1, 8) if SIMULATOR else (1, 300, 100, 2, 64)
    o, lse = check(rng, B, Sq, Sk, H, H, D, True, "float16")
    empty = Sq - Sk  # rows 0 .. Sq-Sk-1 see no key
    assert (o[:, :empty].astype(np.float32) == 0).all()
    assert np.isposinf(lse[:, :, :empty]).all() and np.isfinite(lse[:, :, empty:]).all()


def test_auto_never_runs_it(rng):
    """backend="auto" (and "simt") keep to the other kernels: this spec compiles nothing."""
    compiled = dict(forward_rowwise.SPEC._kernels)
    q, k, v = (to_device(randn(rng, (1, 3, 1, 8), "float32")) for _ in range(3))
    for backend in ("auto", "simt"):
        nf.flash_attn_fwd(q, k, v, backend=backend)
    assert forward_rowwise.SPEC._kernels == compiled


def test_head_dims_past_128_are_refused():
    with pytest.raises(ValueError, match="head_dim 136"):
        forward_rowwise.SPEC.choose(forward_rowwise.SPEC.Config(136, False, "float16"), None)


def test_every_specialization_compiles_without_spills():
    """Both tile entries at their largest head dim, causal or not, 16- and 32-bit storage, and
    the smallest head dim once."""
    configs = [(128, True, "float16"), (128, False, "float32"), (64, True, "bfloat16"),
               (64, False, "float16"), (8, True, "float32")]
    assert_compiles_clean("simt.forward_rowwise", [(config, None) for config in configs])
