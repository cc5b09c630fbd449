"""Naive three-kernel attention against the float64 reference (simulator: tiny shapes)."""

import numpy as np
import pytest

from numba_flash import api
from numba_flash import reference as ref
from numba_flash.runtime import arrays, launcher, ptxcheck
from helpers import DTYPES, SIMULATOR, assert_close_rule, assert_lse, randn, to_device, to_host

# (B, Sq, Sk, Hq, Hk, D, causal, fmt)
CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),      # GQA
    (1, 3, 70, 1, 1, 24, True, "bfloat16"),     # Sk spans two tiles; D not a multiple of 16
    (1, 9, 4, 1, 1, 8, True, "float32"),        # Sq > Sk: the first rows see no key
    (1, 2, 6, 1, 1, 72, False, "bfloat16"),     # D spans two output tiles
    (2, 2, 5, 2, 1, 16, True, "float16"),       # MQA, two batches
    (1, 2, 300, 1, 1, 8, True, "float32"),      # > 128 keys: each softmax thread sees several
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16"),
    (1, 777, 1531, 4, 4, 128, True, "bfloat16"),
    (1, 1531, 777, 4, 1, 128, True, "float32"),
    (3, 257, 513, 6, 3, 72, False, "bfloat16"),
    (1, 300, 300, 2, 1, 256, True, "float16"),
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


@pytest.fixture
def poisoned(monkeypatch):
    """Every array the naive path allocates (out, lse and the S/P scratch) starts as NaN, so an
    element left unwritten by any of the three kernels shows up in the result."""
    real_empty = arrays.empty

    def empty(like, shape, fmt, name):
        t = real_empty(like, shape, fmt, name)
        nan = np.full(shape, np.nan, dtype=np.float32).astype(DTYPES[fmt])
        t.view.copy_to_device(nan if fmt == "float32" else nan.view(np.uint16))
        return t

    monkeypatch.setattr(arrays, "empty", empty)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_naive_matches_reference(case, poisoned, rng):
    B, Sq, Sk, Hq, Hk, D, causal, fmt = case
    q, k, v = (randn(rng, s, fmt) for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    o, lse = api.naive_attention(to_device(q), to_device(k), to_device(v), causal=causal)
    ro, rl = ref.attention_fwd_ref(q, k, v, causal)
    assert to_host(o).dtype == q.dtype and to_host(o).shape == q.shape
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, causal), fmt)
    assert_lse(lse, rl)


def test_packed_qkv_views_and_scale(poisoned, rng):
    """Strided q, k, v sliced out of one (B, S, 3, H, D) tensor, and an explicit scale."""
    B, S, H, D = (1, 6, 2, 16) if SIMULATOR else (2, 300, 4, 64)
    qkv = to_device(randn(rng, (B, S, 3, H, D), "float16"))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o, lse = api.naive_attention(q, k, v, causal=True, softmax_scale=0.3)
    hq, hk, hv = (to_host(x) for x in (q, k, v))
    ro, rl = ref.attention_fwd_ref(hq, hk, hv, True, 0.3)
    assert_close_rule(o, ro, ref.attention_lowp(hq, hk, hv, True, 0.3), "float16")
    assert_lse(lse, rl)


def test_bad_input_is_refused_before_launch(monkeypatch, rng):
    def no_launch(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(launcher, "launch", no_launch)
    q = to_device(randn(rng, (1, 4, 2, 16), "float16"))
    k32 = to_device(randn(rng, (1, 4, 2, 16), "float32"))
    with pytest.raises(TypeError, match="k"):
        api.naive_attention(q, k32, k32)
    k3 = to_device(randn(rng, (1, 4, 3, 16), "float16"))
    with pytest.raises(ValueError, match="k"):
        api.naive_attention(q, k3, k3)
    with pytest.raises(ValueError, match="softmax_scale"):
        api.naive_attention(q, q, q, softmax_scale=float("nan"))


def test_ptx_compiles_without_spills():
    """The three kernels compile for sm_80 and sm_90 with no local memory at all."""
    build = "numba_flash.runtime.ptxcheck:spec_build"
    jobs = [(build, cc, (f"numba_flash.kernels.naive:{kernel}", [causal, fmt]))
            for kernel, cc, causal, fmt in (("SCORES", (8, 0), False, "bfloat16"),
                                            ("SCORES", (9, 0), False, "float16"),
                                            ("SOFTMAX", (8, 0), True, "float16"),
                                            ("SOFTMAX", (9, 0), False, "float16"),
                                            ("OUTPUT", (8, 0), False, "float16"),
                                            ("OUTPUT", (9, 0), False, "float32"))]
    for (_, cc, args), (text, report) in zip(jobs, ptxcheck.compile_reports_isolated(jobs)):
        what = f"{args} at sm_{cc[0]}{cc[1]}"
        assert "ld.local" not in text and "st.local" not in text, what
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (what, report["log"])
        assert report["stack"] == 0, (what, report["log"])
        assert 0 < report["registers"] <= 128, (what, report["registers"])
