"""The seesaw decode (kernels/tc/mla_decode_seesaw.py) against the float64 reference on the
adversarial caches of kernels/_decode_cases.py. Simulator: emulated wgmma, named barriers and TMA,
head dims with a rope block past the V columns (192 / 64); GPU: DeepSeek's sizes at page sizes
that take TMA. Both: bad block-table entries and lengths in the seesaw's own table walk, and a
negative length."""

import pytest
from numba import cuda

from numba_flash import backends
from numba_flash.kernels.tc import mla_decode_seesaw
from numba_flash.runtime import device
from helpers import SIMULATOR, assert_compiles_clean, decode_problem, later_samples
from kernels._decode_cases import (DEEPSEEK_CASES, TC_NEGATIVE_LENGTH_ON_A_GPU,
                                   check_bad_table_walk, check_negative_length, run_case)

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="wgmma runs on compute capability 9.0 only")

# (seqlens, s_q, h_q, h_kv, d, dv, page, causal, fmt, num_sms, splits): one pair with a ragged
# second tile; three tiles (a pair and a lone tile), an empty and a one-key request on two parts;
# causal s_q = 2 with 6 packed rows; split requests combined, 16 rows (a pair, then a lone tile
# of two keys, each a piece); a ragged tile in the middle of a 128-row page. Short requests: each
# tile is seconds of emulation.
CASES_SIM = [
    ([70], 1, 4, 1, 192, 64, 64, False, "bfloat16", 4, None),
    ([130, 0, 1, 70], 1, 4, 1, 192, 64, 64, False, "bfloat16", 2, None),
    ([150, 64, 5], 2, 3, 1, 192, 64, 64, True, "float16", 2, None),
    ([130, 70], 1, 16, 1, 192, 64, 64, False, "bfloat16", 8, True),
    ([200], 1, 8, 1, 192, 48, 128, False, "float16", 4, None),
]
CASES_GPU = [c for c in DEEPSEEK_CASES if c[6] % 64 == 0]
CASES = CASES_SIM if SIMULATOR else CASES_GPU


@pytest.mark.slow  # its first case compiles for over a minute on a fresh GPU machine
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[1:])))
def test_decode_matches_reference(case, rng):
    run_case(rng, *case, backend="tc")


@pytest.mark.slow  # its first case compiles for over a minute on a fresh GPU machine
@pytest.mark.parametrize("causal", [True] if SIMULATOR else [False, True])
def test_a_maximum_that_keeps_moving_matches_reference(causal, rng):
    """Keys that grow along the sequence: both warpgroups move the shared maximum at tile after
    tile, so warpgroup 1 rescales O_R between its two chains (waiting for the first) and
    warpgroup 0 moves O_L on to warpgroup 1's maximum, on every pair."""
    d, dv = (192, 64) if SIMULATOR else (576, 512)
    seqlens = [200, 129] if SIMULATOR else [4000, 1500, 129]  # simulator: two pairs, then one
    run_case(rng, seqlens, 2 if causal else 1, 4, 1, d, dv, 64, causal, "bfloat16", 2,
             backend="tc", growth=1 / 16)


def test_bad_table_entries_and_lengths_are_bounded_and_reported(rng):
    """The seesaw's own walk (it reads the entries of tiles a + 2, a + 3 at the top of each pair
    and checks them where it issues their boxes) with bad entries before and inside the tile
    loop and a length past the table."""
    spec, _ = backends.decode_spec("tc", decode_problem(192, 64, rows=4), device.current())
    assert spec is mla_decode_seesaw.SPEC  # the shapes check_bad_table_walk decodes
    check_bad_table_walk(rng, "tc", page=64, d=192, dv=64)


@TC_NEGATIVE_LENGTH_ON_A_GPU
def test_a_negative_length_is_read_as_zero_and_reported(rng):
    spec, _ = backends.decode_spec("tc", decode_problem(192, 64, rows=4), device.current())
    assert spec is mla_decode_seesaw.SPEC  # the shapes check_negative_length decodes
    check_negative_length(rng, "tc", page=64, d=192, dv=64)


def test_tma_decodes_with_a_rope_block_take_the_seesaw():
    problem = decode_problem(192, 64, rows=8, fmt="float16")
    spec, config = backends.decode_spec("tc", problem, device.current())
    assert spec is mla_decode_seesaw.SPEC and config.tma
    assert not mla_decode_seesaw.supports(64, 64)  # no block of Q past V: the lockstep kernel


def test_compiles_to_asynchronous_wgmma_without_spills():
    """The kernel's samples after the first (test_registry.py compiles that one)."""
    assert_compiles_clean("tc.mla_decode_seesaw", later_samples(mla_decode_seesaw.SPEC),
                          ccs=((9, 0, "a"),),
                          must_contain=("wgmma.mma_async.sync.aligned", "bar.arrive",
                                        "cp.async.bulk.tensor.4d",
                                        "griddepcontrol.launch_dependents"),
                          must_not_log=("C7509", "C7510", "C7514", "C7515", "C7517"))
