"""The mma.sync paged MLA decode (kernels/tc/mla_decode_mma.py, the tc decode of sm_80-sm_89)
against the float64 reference, on the adversarial caches of kernels/_decode_cases.py, planned for
an 8.x device (``device.plan_for``; on a Hopper the sm_80 PTX runs). Simulator: emulated
mma.sync, tiny head dims, both tile entries; GPU: DeepSeek's sizes on an sm_80-like (163 KiB per
block) and an sm_86-like (99 KiB) plan, each of which takes its own entry."""

import dataclasses

import pytest
from numba import cuda

from numba_flash.kernels.tc import mla_decode_mma
from numba_flash.runtime import device
from numba_flash.runtime.device import Device
from helpers import SIMULATOR, assert_compiles_clean, decode_problem, later_samples
from kernels._decode_cases import (DEEPSEEK_CASES, check_bad_device_values, check_nan_query_row,
                                   TC_NEGATIVE_LENGTH_ON_A_GPU, check_negative_length,
                                   run_case, run_sparse_case)

A100 = Device(cc=(8, 0), sms=8, shared_per_block=166912)
SM86 = Device(cc=(8, 6), sms=8, shared_per_block=101376)

pytestmark = pytest.mark.skipif(
    not SIMULATOR and not (cuda.is_available()
                           and cuda.get_current_device().compute_capability >= (8, 0)),
    reason="mma.sync needs compute capability 8.0 or newer")


def planned(dev):
    """A plan for ``dev``'s tile choice; on a GPU with the real SM count."""
    if not SIMULATOR:
        dev = dataclasses.replace(dev, sms=device.current().sms)
    return device.plan_for(dev)


# (seqlens, s_q, h_q, h_kv, d, dv, page, causal, fmt, num_sms, splits, plan): ragged tiles (4,
# 3 x 2 and 20 rows of 32 or 16), three tiles of packed rows (20 x 2 in 16), h_kv = 2, page sizes 1 /
# 16 / 64, lengths 0 and 1 and off the tile grid, causal s_q = 2 and 3, head_dim_v odd and below
# one warp's 16 columns, requests cut into pieces (combined), both formats, both entries.
# Short requests, each tile being seconds of emulation: at least three tiles (a buffer reused)
# where a request spans several.
CASES_SIM = [
    ([70, 0, 5], 1, 4, 1, 32, 32, 16, False, "bfloat16", 4, None, SM86),
    ([70, 1, 0, 64], 3, 2, 1, 48, 23, 1, True, "float16", 2, None, A100),
    ([130, 17], 1, 40, 2, 32, 32, 64, False, "bfloat16", 16, True, A100),
    ([70], 2, 20, 1, 16, 16, 64, True, "float16", 2, None, SM86),
]
# DeepSeek sizes (kernels/_decode_cases.py) on both plans.
CASES_GPU = [(*c, plan) for plan in (A100, SM86) for c in DEEPSEEK_CASES]
CASES = CASES_SIM if SIMULATOR else CASES_GPU
ADA = Device(cc=(8, 9), sms=8, shared_per_block=101376)  # FP8 conversions, 99 KiB per block

SPARSE_CASES = [  # (b, s_q, h_q, h_kv, d, dv, page, topk, fp8, plan): V3.2's rows on Ada's
    (1, 2, 2, 1, 576, 512, 8, 40, True, ADA),    # tiles, two of them
] if SIMULATOR else [(2, 2, 128, 1, 576, 512, 64, 2048, True, ADA),
                     (1, 2, 8, 2, 64, 32, 16, 500, False, A100)]


@pytest.mark.parametrize("case", SPARSE_CASES, ids=lambda c: "-".join(map(str, c[:-1])))
def test_sparse_decode_matches_reference(rng, case):
    """DeepSeek-V3.2's sparse decode (``indices``) on mma.sync: the packed rows' walk, V3.2's FP8
    rows widened in the padded tile rows; with a sink and indices past the cache reported."""
    *args, plan = case
    with planned(plan):
        run_sparse_case(rng, *args, backend="tc", sink=True, bad_index=True)


def _id(case):
    return "-".join(map(str, case[1:-1])) + ("-sm80" if case[-1] is A100 else "-sm86")


@pytest.mark.slow  # its first case compiles for over a minute on a fresh GPU machine
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_decode_matches_reference(case, rng):
    *args, plan = case
    with planned(plan):
        run_case(rng, *args, backend="tc")


def test_the_plans_take_different_entries():
    """DeepSeek's dims: 32 x 32 tiles where 163 KiB allow, 16 x 32 in 99 KiB; small dims fit
    the first entry everywhere."""
    deepseek = mla_decode_mma.SPEC.Config(128, 576, 512, False, "bfloat16", True)
    small = mla_decode_mma.SPEC.Config(8, 48, 23, True, "float16", True)
    spec = mla_decode_mma.SPEC
    assert spec.entry(deepseek, A100) == mla_decode_mma.TILES[0]
    assert spec.entry(deepseek, SM86) == mla_decode_mma.TILES[1]
    assert spec.entry(small, SM86) == mla_decode_mma.TILES[0]
    for plan, entry in ((A100, mla_decode_mma.TILES[0]), (SM86, mla_decode_mma.TILES[1])):
        tiles = spec.tiles(deepseek, entry)
        assert tiles.shared_bytes + mla_decode_mma.static_bytes(entry[0], entry[2]) \
            <= plan.shared_per_block


def test_the_layout_keeps_the_padded_rows():
    """Q, the two cache tiles and P in rows padded by 8 elements; 112 KiB at 32 x 32 tiles."""
    lay = mla_decode_mma.shared_layout(32, 32, 4, 576, 512)
    stride = 576 + mla_decode_mma.PAD
    assert (lay.q, lay.k, lay.p) == (0, 32 * stride, 96 * stride)
    assert lay.bytes == 2 * (96 * stride + 32 * (32 + 8)) == 112 * 1024


def test_bad_device_values_are_bounded_and_reported(rng):
    with planned(SM86):
        check_bad_device_values(rng, "tc")


@TC_NEGATIVE_LENGTH_ON_A_GPU
def test_a_negative_length_is_read_as_zero_and_reported(rng):
    with planned(A100):
        check_negative_length(rng, "tc")


def test_a_nan_query_row_gives_a_nan_lse(rng):
    with planned(A100):
        check_nan_query_row(rng, "tc")


def test_decode_spec_takes_mma_on_8x_and_wgmma_on_9_0():
    from numba_flash import backends
    from numba_flash.kernels.tc import mla_decode_wgmma

    problem = decode_problem(64, 64, 16, page=16, fmt="float16")
    for dev, spec in ((A100, mla_decode_mma.SPEC), (SM86, mla_decode_mma.SPEC),
                      (dataclasses.replace(A100, cc=(8, 9)), mla_decode_mma.SPEC),
                      (dataclasses.replace(A100, cc=(9, 0)), mla_decode_wgmma.SPEC)):
        for backend in ("tc", "auto"):
            assert backends.decode_spec(backend, problem, dev)[0] is spec, (dev, backend)
    with pytest.raises(ValueError, match="^backend: .*head_dim_v up to 512"):
        backends.decode_spec("tc", decode_problem(576, 576, 16, page=16, fmt="float16"), A100)


def test_every_entry_compiles_to_mma_sync_without_spills():
    """Both tile entries: the kernel's samples after the first (test_registry.py compiles that
    one)."""
    samples = later_samples(mla_decode_mma.SPEC)
    fp8 = [s for s in samples if mla_decode_mma.SPEC.Config(*s[0]).cache]  # e4m3: sm_89
    for configs, cc in (([s for s in samples if s not in fp8], (8, 0)), (fp8, (8, 9))):
        assert_compiles_clean("tc.mla_decode_mma", configs, ccs=(cc,),
                              must_contain=("mma.sync.aligned.m16n8k16", "cp.async", "ldmatrix"),
                              must_not_log=("C7509",))
