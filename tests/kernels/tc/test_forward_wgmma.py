"""The cp.async wgmma forward (kernels/tc/forward_wgmma.py, the tc backend's forward on a Hopper
for paged K/V, and for every batch with forward_wgmma_ws.py set aside) against the
float64 reference: the mma.sync kernel's cases (test_forward.py) plus the warpgroup layout.
Simulator: emulated wgmma, tiny shapes, 64-row tiles of one warpgroup (and one test with two);
GPU: the device's tiles, where the device is a Hopper."""

import pytest
from numba import cuda

from helpers import FMTS, SIMULATOR, assert_compiles_clean, check_forward
from numba_flash.kernels import registry
from numba_flash.kernels.tc import forward_wgmma
from numba_flash.runtime import device
from kernels.tc._forward_cases import (CASES, check_growing_row_maxima, check_large_logits,
                                       check_output_view_off_16_byte_alignment,
                                       planned_for_family)
from kernels._window_cases import CASES as WINDOW_CASES, case_id as window_id
from kernels._window_cases import SOFTCAP_CASES, softcap_id
from kernels._window_cases import MODIFIER_CASES, modifier_id, modifier_options

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="wgmma runs on compute capability 9.0 only")


@pytest.fixture(autouse=True)
def wgmma_family():
    """The tc backend with this wgmma kernel (the warp-specialized one set aside: it runs the
    paged batches alone otherwise); under the simulator with one-warpgroup tiles."""
    with planned_for_family("wgmma"), registry.setting_aside("tc.forward_wgmma_ws"):
        if SIMULATOR:
            with forward_wgmma.SPEC.forcing((64, 64, 4, 0)):
                yield
        else:
            yield


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case, rng):
    check_forward(rng, *case, backend="tc")


@pytest.mark.parametrize("case", WINDOW_CASES, ids=window_id)
def test_sliding_window_matches_reference(case, rng):
    *shape, window_size = case
    check_forward(rng, *shape, backend="tc", window_size=window_size)


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=softcap_id)
def test_softcap_matches_reference(case, rng):
    *shape, softcap, scale = case
    check_forward(rng, *shape, backend="tc", softcap=softcap, scale=scale)


@pytest.mark.parametrize("case", MODIFIER_CASES, ids=modifier_id)
def test_alibi_and_sinks_match_reference(case, rng):
    check_forward(rng, *case[:-1], backend="tc", **modifier_options(rng, case))


def test_large_logits_stay_finite(rng):
    check_large_logits(rng)


@pytest.mark.parametrize("causal", [True] if SIMULATOR else [False, True])
def test_row_maxima_that_keep_growing_rescale_correctly(causal, rng):
    check_growing_row_maxima(rng, causal)


def test_output_view_with_rows_off_16_byte_alignment(rng):
    check_output_view_off_16_byte_alignment(rng)


def test_three_warpgroups_and_causal_tiles_in_any_order(rng):
    """192-row tiles (warpgroups 0, 1, 2 own rows 0-63, 64-127, 128-191; a block of 384 threads
    is no power of two) over two query tiles of a head, run from the last; ragged key tiles."""
    B, Sq, Sk, H, D = (1, 200, 40, 1, 8) if SIMULATOR else (2, 1000, 1100, 4, 128)
    with forward_wgmma.SPEC.forcing((192, 32, 12, 0)):
        check_forward(rng, B, Sq, Sk, H, H, D, True, "bfloat16", backend="tc")


def test_every_specialization_compiles_to_wgmma_without_spills():
    """Every tile entry, causal and not, each in one 16-bit format (``helpers.FMTS``); paged
    varlen K/V at head dim 128 (its table lookups add registers)."""
    configs = [((d, causal, FMTS[causal]), None) for d, _ in forward_wgmma.TILES
               for causal in (False, True)]
    configs += [((8, True, "float16"), None), ((128, True, "bfloat16", True, True), None)]
    assert_compiles_clean("tc.forward_wgmma", configs, ccs=((9, 0, "a"),),
                          must_contain=("wgmma.mma_async.sync.aligned", "cp.async",
                                        "fence.proxy.async", "st.global.v4.b32"),
                          must_not_log=("C7509",))


def test_tiles_are_whole_warpgroups_that_fit_a_hopper_block():
    """Every wgmma tile is whole warpgroups (64 rows, 128 threads each) and fits the 227 KiB a
    Hopper block may have, alignment reserve included."""
    spec = forward_wgmma.SPEC
    for d in (8, 64, 96, 128, 200, 256):
        for causal in (False, True):
            config = spec.Config(d, causal, "float16")
            t = spec.tiles(config, spec.entry(config, device.SIMULATED))
            assert t.BLOCK_M % 64 == 0 and t.threads == 2 * t.BLOCK_M and t.BLOCK_N % 16 == 0
            dpad = -(-d // 64) * 64
            assert t.shared_bytes == 2 * (t.BLOCK_M + 4 * t.BLOCK_N) * dpad + 1024
            assert t.shared_bytes <= 227 * 1024
    assert spec.entry(spec.Config(64, False, "float16"), None) == (128, 64, 8, 0)
    assert spec.entry(spec.Config(128, True, "float16"), None) == (128, 128, 8, 0)
