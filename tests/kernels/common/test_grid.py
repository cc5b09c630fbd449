"""kernels/common/grid.py: rows of CTAs past 65535 folded into grid y and z, and every attention
kernel run on such a grid (a small fold limit under the simulator; B * H = 70000 on a GPU)."""

import pytest

import numba_flash as nf
from numba_flash import api, reference as ref
from numba_flash.kernels.common import grid
from numba_flash.kernels.tc import backward_wgmma, forward_wgmma
from numba_flash.runtime import launcher
from helpers import SIMULATOR, assert_close_rule, assert_lse, nan_like, randn, to_device
from kernels._backward_cases import check_gradients


@pytest.mark.parametrize("n", [1, 7, 65535, 65536, 70000, 131071, 2**31 - 1])
def test_fold_covers_the_rows_within_the_limits_with_fewer_idle_ctas_than_slices(n):
    y, z = grid.fold(n)
    assert y <= 65535 and z <= 65535
    assert y * z >= n and y * z - n < z
    assert z == -(-n // 65535) and y == -(-n // z)  # identity (z = 1) up to 65535 rows


def test_a_grid_past_the_limits_is_refused_naming_the_kernel_and_axis():
    launcher.check_grid("k", (2**31 - 1, 65535, 65535))
    with pytest.raises(ValueError, match="^k: .* 65536 CTAs in grid y"):
        launcher.check_grid("k", (1, 65536))
    with pytest.raises(ValueError, match="grid z"):
        launcher.check_grid("k", (1, 1, 70000))


def _run_everything(rng, B, S, H, D, fmt="float16"):
    """Forward (simt, tc), backward (simt, tc) and the naive baseline on B * H (batch, head)
    rows, causal, each against the float64 reference."""
    q, k, v, dout = (randn(rng, (B, S, H, D), fmt) for _ in range(4))
    want_o, want_lse = ref.attention_fwd_ref(q, k, v, True)
    lowp_o = ref.attention_lowp(q, k, v, True)
    dq_, k_, v_ = (to_device(x) for x in (q, k, v))
    for backend in ("simt", "tc"):
        out = nan_like(q)
        o, lse = nf.flash_attn_fwd(dq_, k_, v_, causal=True, backend=backend, out=out)
        assert_close_rule(o, want_o, lowp_o, fmt, what=f"{backend} out")
        assert_lse(lse, want_lse)
        grads = nf.flash_attn_bwd(to_device(dout), dq_, k_, v_, o, lse, causal=True,
                                  backend=backend)
        check_gradients(grads, dout, q, k, v, True, fmt)
    o, lse = api.naive_attention(dq_, k_, v_, causal=True)
    assert_close_rule(o, want_o, lowp_o, fmt, what="naive out")
    assert_lse(lse, want_lse)


@pytest.mark.skipif(not SIMULATOR, reason="the small fold limit is for the simulator")
def test_every_attention_kernel_runs_a_folded_grid(rng, monkeypatch):
    """A fold limit of 2 rows: B * H = 3 runs on y = 2, z = 2 with one idle CTA, which must
    return before touching memory (the simulator raises on any out-of-range index)."""
    monkeypatch.setattr(grid, "MAX_GRID", (2**31 - 1, 2, 2))
    assert grid.fold(3) == (2, 2)
    # one-warpgroup tiles for the wgmma kernels the simulated Hopper runs: the table's take
    # twice the emulated threads for the same check
    with forward_wgmma.SPEC.forcing((64, 64, 4, 0)), backward_wgmma.DKDV.forcing((16, 64)), \
            backward_wgmma.DQ.forcing((64, 16)):
        _run_everything(rng, B=3, S=5, H=1, D=16)


@pytest.mark.slow  # it compiles for over a minute on a fresh GPU machine
@pytest.mark.skipif(SIMULATOR, reason="70000 (batch, head) rows: GPU only")
def test_every_attention_kernel_runs_seventy_thousand_batch_heads(rng):
    _run_everything(rng, B=1000, S=9, H=70, D=64)
