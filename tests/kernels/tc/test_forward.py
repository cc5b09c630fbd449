"""The mma.sync forward (kernels/tc/forward.py) against the float64 reference (simulator:
emulated mma.sync, tiny shapes). The backend runs it on every GPU but a Hopper (which runs
forward_wgmma.py, test_forward_wgmma.py); here it is selected everywhere."""

import pathlib
import sys

import numpy as np
import pytest

from helpers import (DTYPES, SIMULATOR, assert_close_rule, assert_compiles_clean, assert_lse,
                     check_forward, nan_like, randn, to_device, to_host)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _forward_cases import CASES  # noqa: E402  (beside this file)



@pytest.fixture(autouse=True)
def mma_family(monkeypatch):
    """The tc backend with the mma.sync kernel, whatever the device."""
    from numba_flash import launch

    monkeypatch.setattr(launch, "tc_family", lambda cc: "mma")
    launch.forward_kernel.cache_clear()
    yield
    launch.forward_kernel.cache_clear()


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case):
    check_forward(np.random.default_rng(), *case, backend="tc")


def test_large_logits_stay_finite():
    B, S, H, D = (1, 9, 1, 16) if SIMULATOR else (1, 600, 2, 64)
    check_forward(np.random.default_rng(), B, S, S, H, H, D, True, "bfloat16", backend="tc",
                  scale=8.0, softmax_scale=1.0)


@pytest.mark.parametrize("causal", [True] if SIMULATOR else [False, True])
def test_row_maxima_that_keep_growing_rescale_correctly(causal):
    """Scores that rise from key tile to key tile by far more than the lazy-rescale threshold
    (2^8 in P): m_i must move, and O_i and l_i be rescaled, on every tile; and a last tile that
    falls back leaves them alone."""
    import numba_flash as nf
    from numba_flash import reference as ref

    rng = np.random.default_rng()
    Sq, Sk, D = (5, 140, 16) if SIMULATOR else (300, 1000, 64)
    fmt = "float16"
    q = np.abs(randn(rng, (1, Sq, 1, D), fmt)) + DTYPES[fmt](1)
    ramp = np.linspace(0.0, 12.0, Sk)  # the score of key j grows ~ j: 12 * sum(q) at the end
    ramp[-Sk // 8:] = 0.0
    k = (randn(rng, (1, Sk, 1, D), fmt, 0.1) + ramp[None, :, None, None]).astype(DTYPES[fmt])
    v = randn(rng, (1, Sk, 1, D), fmt)
    out = nan_like(q)
    o, lse = nf.flash_attn_fwd(to_device(q), to_device(k), to_device(v), causal=causal,
                               softmax_scale=1.0 / D, backend="tc", out=out)
    ro, rl = ref.attention_fwd_ref(q, k, v, causal, 1.0 / D)
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, causal, 1.0 / D), fmt)
    assert_lse(lse, rl)


def test_causal_query_tiles_of_a_head_in_any_order(monkeypatch):
    """The causal grid runs a head's query tiles from the last one (the longest first). With
    tiles of 32 rows (2 warps of 16) the simulator sees three of them per head."""
    from numba_flash import launch

    monkeypatch.setattr(launch, "_TC_FWD_TILES", ((256, ((32, 16, 2, 0),)),))
    check_forward(np.random.default_rng(), 1, 70, 75, 2, 1, 16, True, "float16", backend="tc")


def test_output_view_with_rows_off_16_byte_alignment():
    """The epilogue stores 16-byte chunks of output rows where the rows are 16-byte aligned
    (every other test) and each chunk as eight 16-bit stores where they are not: here an
    ``out=`` view starting 8 bytes into each row of a wider buffer. The columns outside the view
    stay untouched."""
    import numba_flash as nf
    from numba_flash import reference as ref

    rng = np.random.default_rng()
    offset = 4
    B, S, H, D = (1, 6, 1, 16) if SIMULATOR else (2, 300, 4, 64)
    fmt = "float16"
    q, k, v = (randn(rng, (B, S, H, D), fmt) for _ in range(3))
    wide = nan_like(np.empty((B, S, H, D + 8), DTYPES[fmt]))
    o, lse = nf.flash_attn_fwd(to_device(q), to_device(k), to_device(v), backend="tc",
                               out=wide[..., offset:offset + D])
    ro, rl = ref.attention_fwd_ref(q, k, v, False, None)
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, False, None), fmt)
    assert_lse(lse, rl)
    host = to_host(wide).astype(np.float32)
    assert np.isnan(host[..., :offset]).all() and np.isnan(host[..., offset + D:]).all()


def test_every_specialization_compiles_to_mma_without_spills():
    from numba_flash import launch

    configs = [("tc", d, causal, fmt, tiles) for d, options in launch._TC_FWD_TILES
               for tiles in options for causal in (False, True)
               for fmt in ("float16", "bfloat16")] + [("tc", 8, True, "float16", None)]
    assert_compiles_clean("numba_flash.launch:forward_spec", configs,
                          must_contain=("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async",
                                        "st.global.v4.b32"))
