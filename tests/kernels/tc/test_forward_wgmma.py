"""The wgmma forward (kernels/tc/forward_wgmma.py, the tc backend on a Hopper) against the
float64 reference: the mma.sync kernel's cases (test_forward.py) plus the warpgroup layout.
Simulator: emulated wgmma, tiny shapes, 64-row tiles of one warpgroup (and one test with two);
GPU: the device's tiles, where the device is a Hopper."""

import pathlib
import sys

import numpy as np
import pytest
from numba import cuda

from helpers import SIMULATOR, assert_compiles_clean, check_forward

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _forward_cases import (CASES, check_growing_row_maxima, check_large_logits,  # noqa: E402
                            check_output_view_off_16_byte_alignment, use_tc_family)

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="wgmma runs on compute capability 9.0 only")


@pytest.fixture(autouse=True)
def wgmma_family(request, monkeypatch):
    """The tc backend with the wgmma kernel; under the simulator with one-warpgroup tiles."""
    from numba_flash import launch

    if SIMULATOR:
        monkeypatch.setattr(launch, "_TC_WGMMA_FWD_TILES", ((256, ((64, 64, 4, 0),) * 2),))
    use_tc_family(request, monkeypatch, "wgmma")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case):
    check_forward(np.random.default_rng(), *case, backend="tc")


def test_large_logits_stay_finite():
    check_large_logits()


@pytest.mark.parametrize("causal", [True] if SIMULATOR else [False, True])
def test_row_maxima_that_keep_growing_rescale_correctly(causal):
    check_growing_row_maxima(causal)


def test_output_view_with_rows_off_16_byte_alignment():
    check_output_view_off_16_byte_alignment()


def test_three_warpgroups_and_causal_tiles_in_any_order(monkeypatch):
    """192-row tiles (warpgroups 0, 1, 2 own rows 0-63, 64-127, 128-191; a block of 384 threads
    is no power of two) over two query tiles of a head, run from the last; ragged key tiles."""
    from numba_flash import launch

    monkeypatch.setattr(launch, "_TC_WGMMA_FWD_TILES", ((256, ((192, 32, 12, 0),) * 2),))
    B, Sq, Sk, H, D = (1, 200, 40, 1, 8) if SIMULATOR else (2, 1000, 1100, 4, 128)
    check_forward(np.random.default_rng(), B, Sq, Sk, H, H, D, True, "bfloat16", backend="tc")


def test_every_specialization_compiles_to_wgmma_without_spills():
    from numba_flash import launch

    configs = [("tc", d, causal, fmt, None, "wgmma") for d, _ in launch._TC_WGMMA_FWD_TILES
               for causal in (False, True) for fmt in ("float16", "bfloat16")]
    configs.append(("tc", 8, True, "float16", None, "wgmma"))
    assert_compiles_clean("numba_flash.launch:forward_spec", configs, ccs=((9, 0, "a"),),
                          must_contain=("wgmma.mma_async.sync.aligned", "cp.async",
                                        "fence.proxy.async", "st.global.v4.b32"),
                          must_not_log=("C7509",))
