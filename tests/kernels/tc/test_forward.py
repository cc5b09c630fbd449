"""The mma.sync forward (kernels/tc/forward.py) against the float64 reference (simulator:
emulated mma.sync, tiny shapes). The backend runs it on every GPU but a Hopper (which runs
forward_wgmma.py, test_forward_wgmma.py); here it is selected everywhere."""

import pathlib
import sys

import numpy as np
import pytest

from helpers import SIMULATOR, assert_compiles_clean, check_forward

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _forward_cases import (CASES, check_growing_row_maxima, check_large_logits,  # noqa: E402
                            check_output_view_off_16_byte_alignment, use_tc_family)


@pytest.fixture(autouse=True)
def mma_family(request, monkeypatch):
    """The tc backend with the mma.sync kernel, whatever the device."""
    use_tc_family(request, monkeypatch, "mma")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case):
    check_forward(np.random.default_rng(), *case, backend="tc")


def test_large_logits_stay_finite():
    check_large_logits()


@pytest.mark.parametrize("causal", [True] if SIMULATOR else [False, True])
def test_row_maxima_that_keep_growing_rescale_correctly(causal):
    check_growing_row_maxima(causal)


def test_causal_query_tiles_of_a_head_in_any_order(monkeypatch):
    """The causal grid runs a head's query tiles from the last one (the longest first). With
    tiles of 32 rows (2 warps of 16) the simulator sees three of them per head."""
    from numba_flash import launch

    monkeypatch.setattr(launch, "_TC_FWD_TILES", ((256, ((32, 16, 2, 0),)),))
    check_forward(np.random.default_rng(), 1, 70, 75, 2, 1, 16, True, "float16", backend="tc")


def test_output_view_with_rows_off_16_byte_alignment():
    check_output_view_off_16_byte_alignment()


def test_every_specialization_compiles_to_mma_without_spills():
    from numba_flash import launch

    configs = [("tc", d, causal, fmt, tiles) for d, options in launch._TC_FWD_TILES
               for tiles in options for causal in (False, True)
               for fmt in ("float16", "bfloat16")] + [("tc", 8, True, "float16", None)]
    assert_compiles_clean("numba_flash.launch:forward_spec", configs,
                          must_contain=("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async",
                                        "st.global.v4.b32"))
