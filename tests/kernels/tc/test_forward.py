"""The mma.sync forward (kernels/tc/forward_mma.py) against the float64 reference (simulator:
emulated mma.sync, tiny shapes). The backend runs it on every GPU but a Hopper (which runs
forward_wgmma.py, test_forward_wgmma.py); here it is selected everywhere."""

import pytest

from helpers import FMTS, SIMULATOR, assert_compiles_clean, check_forward
from numba_flash.kernels.tc import forward_mma
from numba_flash.runtime.device import SHARED_RESERVED_PER_BLOCK, Device
from kernels.tc._forward_cases import (CASES, check_growing_row_maxima, check_large_logits,
                                       check_output_view_off_16_byte_alignment,
                                       planned_for_family)
from kernels._window_cases import CASES as WINDOW_CASES, case_id as window_id
from kernels._window_cases import SOFTCAP_CASES, softcap_id
from kernels._window_cases import MODIFIER_CASES, modifier_id, modifier_options


@pytest.fixture(autouse=True)
def mma_family():
    """The tc backend with the mma.sync kernel, whatever the device."""
    with planned_for_family("mma"):
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


def test_causal_query_tiles_of_a_head_in_any_order(rng):
    """The causal grid runs a head's query tiles from the last one (the longest first). With
    tiles of 32 rows (2 warps of 16) the simulator sees three of them per head."""
    with forward_mma.SPEC.forcing((32, 16, 2, 0)):
        check_forward(rng, 1, 70, 75, 2, 1, 16, True, "float16", backend="tc")


def test_three_warps_copy_every_row(rng):
    """A block of 3 warps (96 threads, no power of two): every thread's copy slot must be its
    own, so that all 48 query rows and every key row arrive."""
    with forward_mma.SPEC.forcing((48, 16, 3, 0)):
        check_forward(rng, 1, 50, 37, 1, 1, 16, True, "bfloat16", backend="tc")


def test_output_view_with_rows_off_16_byte_alignment(rng):
    check_output_view_off_16_byte_alignment(rng)


def test_every_specialization_compiles_to_mma_without_spills():
    """Every tile entry, causal and not, each in one 16-bit format (``helpers.FMTS``); paged
    varlen K/V at head dim 128 (its table lookups add registers)."""
    configs = [((d, causal, FMTS[causal]), tiles) for d, options in forward_mma.TILES
               for tiles in options for causal in (False, True)] + [((8, True, "float16"), None)]
    configs.append(((128, True, "bfloat16", True, True), None))
    assert_compiles_clean("tc.forward_mma", configs,
                          must_contain=("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async",
                                        "st.global.v4.b32"))


def test_takes_the_first_tiles_of_which_two_blocks_fit_an_sm():
    """D = 128: 64-key blocks (102 KiB) where two fit (a Hopper's 228 KiB per SM), 32-key
    blocks (68 KiB) on an A100 (164 KiB) or an sm_86 part (100 KiB); the first entry when the
    device does not say."""
    kib = 1024
    spec, config = forward_mma.SPEC, forward_mma.SPEC.Config(128, False, "float16")

    def pick(per_sm):
        return spec.choose(config, Device(cc=(8, 0), sms=108, shared_per_block=227 * kib,
                                          shared_per_sm=per_sm))

    hopper, a100, sm86 = pick(228 * kib), pick(164 * kib), pick(100 * kib)
    assert (hopper.BLOCK_M, hopper.BLOCK_N, hopper.threads) == (128, 64, 128)
    assert hopper.shared_bytes == 2 * (128 + 4 * 64) * (128 + 8)
    assert (a100.BLOCK_N, sm86.BLOCK_N) == (32, 32)
    assert 2 * (a100.shared_bytes + SHARED_RESERVED_PER_BLOCK) <= 164 * kib
    assert pick(None) == hopper
    d64 = spec.choose(config._replace(head_dim=64),
                      Device(cc=(8, 6), sms=84, shared_per_block=99 * kib, shared_per_sm=100 * kib))
    assert (d64.BLOCK_M, d64.BLOCK_N, d64.threads) == (128, 64, 128)  # no other
