"""The simt paged MLA decode (scheduler + split-KV decode kernel + combine) against the float64
reference, on the adversarial caches of kernels/_decode_cases.py."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import scheduler
from numba_flash.kernels.simt import mla_decode
from numba_flash.runtime import device, ptxcheck
from helpers import SIMULATOR, to_device, to_host
from kernels._decode_cases import (check_bad_device_values, check_nan_query_row,
                                   check_negative_length, run_case, run_sparse_case)

# (seqlens, s_q, h_q, h_kv, d, dv, page, causal, fmt, num_sms, splits): page sizes 1 / 16 / 64,
# lengths 0 and off the page and tile grid, s_q 1 and 2, causal, h_kv = 2, odd head_dim_v, both
# variants (narrow: 1 and 2 rows; wide: 4 and 8 rows in 32-row tiles, 16 in 16-row tiles, 24 and
# 20 rows as several 16-row tiles) in every format, requests cut into pieces (and, with causal,
# a last piece that token 0 cannot see at all). The cut requests are short (each tile is seconds
# of emulation): 70 keys over 32 parts, 130 over 20, each cut into whole tiles and a ragged piece.
CASES_SIM = [
    ([0, 37, 70, 16], 1, 1, 1, 72, 64, 16, False, "bfloat16", 32, True),
    ([64, 1, 130], 1, 2, 2, 40, 23, 64, False, "float32", 20, True),
    ([90, 5], 1, 1, 1, 24, 17, 1, False, "float16", 4, None),
    ([0, 37, 70, 16], 1, 2, 1, 72, 64, 16, False, "bfloat16", 32, True),
    ([330, 5], 2, 2, 1, 72, 64, 1, True, "float16", 4, True),
    ([64, 1, 130], 1, 32, 2, 40, 24, 64, False, "float32", 20, True),
    ([1, 129], 2, 2, 1, 16, 8, 16, True, "bfloat16", 8, True),
    ([1, 0, 70], 2, 1, 1, 24, 24, 16, True, "float16", 1, False),
    ([0, 200, 17], 1, 20, 1, 16, 16, 16, False, "bfloat16", 8, True),
    ([70, 3], 2, 12, 1, 16, 16, 1, True, "float16", 2, False),
]
# DeepSeek sizes (d 576 = 512 + 64, dv 512, page 64, h_kv 1), run by the lead on the H200. The
# float64 reference repeats the cache over the heads and runs on the host (~1 s per request at
# seqlen 2048, h_q 128, s_q 2), so long sequences use h_q = 16 and large batches short ones.
CASES_GPU = [
    ([1 + 37 * i for i in range(128)], 1, 1, 1, 576, 512, 64, False, "bfloat16", None, None),
    ([32768, 3, 0, 4095], 2, 1, 1, 576, 512, 64, True, "float16", None, True),
    ([1 + 13 * i for i in range(128)], 1, 16, 1, 576, 512, 64, False, "bfloat16", None, None),
    ([32768, 1, 0, 5000, 777], 1, 16, 1, 576, 512, 64, False, "bfloat16", None, True),
    ([2048, 1500], 2, 128, 1, 576, 512, 64, True, "float16", None, None),
    ([1000, 10, 0, 300], 1, 128, 1, 576, 512, 64, False, "bfloat16", 132, True),
    ([200] * 128, 1, 128, 1, 576, 512, 64, False, "bfloat16", None, None),
    ([4097, 63, 64, 65, 0, 1], 2, 16, 1, 576, 512, 64, True, "bfloat16", 132, True),
    ([3000, 2000], 1, 32, 4, 576, 512, 64, False, "float32", 132, None),
    ([5000, 50], 1, 16, 1, 576, 512, 16, True, "bfloat16", 132, True),
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU
# A cache view whose rows are not 16-byte aligned (one column sliced off the front), for the
# element-copy variant (VEC = False): (seqlens, s_q, h_q, h_kv, d, dv, page, causal, fmt, num_sms).
CASES_UNALIGNED = [
    ([0, 200, 17], 1, 1, 1, 16, 16, 16, False, "bfloat16", 8),
    ([70, 3], 2, 4, 1, 24, 8, 1, True, "float16", 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[1:])))
def test_decode_matches_reference(case, rng):
    run_case(rng, *case, backend="simt")


# FlashMLA's attn_sink on split requests (merged by the combine) and whole ones (scaled by it
# after the decode): the first cases of CASES.
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "-".join(map(str, c[1:])))
def test_attention_sink_shrinks_every_row(case, rng):
    run_case(rng, *case, backend="simt", sink=True)


@pytest.mark.parametrize("case", CASES_UNALIGNED, ids=lambda c: "-".join(map(str, c[1:])))
def test_unaligned_cache_copies_elements(case, rng):
    """A cache view whose rows are not 16-byte aligned: the API picks the element-copy kernel
    (VEC = False), which must give the same results as the 16-byte copies of the other tests."""
    run_case(rng, *case, unaligned=True, backend="simt")


def test_bad_device_values_are_bounded_and_reported(rng):
    check_bad_device_values(rng, "simt")


@pytest.mark.parametrize("h_q", [2] if SIMULATOR else [1, 2],
                         ids=lambda h_q: "narrow" if h_q == 1 else "wide")
def test_a_negative_length_is_read_as_zero_and_reported(rng, h_q):
    """Both variants on a GPU; under the simulator, where the narrow one is slow, the wide one
    (both read the lengths through the walk they share)."""
    check_negative_length(rng, "simt", h_q=h_q)


def test_a_nan_query_row_gives_a_nan_lse(rng):
    check_nan_query_row(rng, "simt")


@pytest.mark.skipif(not SIMULATOR, reason="a GPU runs these layouts in every case")
@pytest.mark.parametrize("h_q, seqlens, num_sms, splits, tiles",
                         [(2, [45, 0, 70], 20, True, (2, 32, 256)),
                          (8, [45, 0, 70], 8, None, (8, 32, 256))])
def test_gpu_thread_count_under_the_simulator(h_q, seqlens, num_sms, splits, tiles, rng):
    """The GPU's 256 threads (8 warps; wide: 32-wide d-lanes) rather than the simulator's 64, in
    both variants (the tiles the table gives these rows, with 256 threads). Short requests (a
    tile of 256 emulated threads costs seconds): a whole one of two tiles, the last ragged, a
    length-0 one and, in the narrow case, one cut into a piece of two whole tiles and a ragged
    piece (20 parts: the plan cuts 70 keys)."""
    with mla_decode.SPEC.forcing(tiles):
        run_case(rng, seqlens, 1, h_q, 1, 72, 64, 16, False, "float16", num_sms,
                 splits, backend="simt")


def test_metadata_is_the_plan_in_the_callers_library():
    seqlens = np.array([1000, 10, 0, 300], np.int32)
    metadata, num_splits = nf.get_mla_metadata(to_device(seqlens), 128, 1, num_sms=132)
    assert type(metadata) is type(to_device(seqlens)) and type(num_splits) is type(metadata)
    want = scheduler.plan_mla(seqlens, 128, 1, 132)
    for got, expected in zip((metadata, num_splits), want):
        assert to_host(got).dtype == np.int32
        np.testing.assert_array_equal(to_host(got), expected)
    default, _ = nf.get_mla_metadata(to_device(seqlens), 16, 1)  # the device's SM count
    assert to_host(default).shape[0] == device.current().sms


# ----------------------------------------------------------------------------- sparse (V3.2)

def test_sparse_gqa_decode_with_a_given_plan_splits_and_a_sink(rng):
    # two tokens of up to 200 keys, 16 SMs: the plan of get_mla_metadata(topk=200) cuts them
    run_sparse_case(rng, b=1, s_q=2, h_q=4, h_kv=2, d=32, dv=16, page=8, topk=200, fp8=False,
                    backend="simt", num_sms=16, sink=True, splits=True)


def test_sparse_wide_decode_with_topk_length_and_bad_indices(rng):
    run_sparse_case(rng, b=2, s_q=1, h_q=8, h_kv=1, d=24, dv=24, page=5, topk=40, fp8=False,
                    backend="simt", topk_length=[30, 40], bad_index=True)


def test_fp8_sparse_decode_of_deepseek_v32_rows(rng):
    run_sparse_case(rng, b=1, s_q=2, h_q=2, h_kv=1, d=576, dv=512, page=8, topk=8, fp8=True)


@pytest.mark.skipif(SIMULATOR, reason="DeepSeek-V3.2's sizes: GPU only")
@pytest.mark.parametrize("h_q, s_q", [(64, 2), (128, 1)])
def test_fp8_sparse_decode_at_deepseek_sizes(rng, h_q, s_q):
    run_sparse_case(rng, b=3, s_q=s_q, h_q=h_q, h_kv=1, d=576, dv=512, page=64, topk=2048,
                    fp8=True, num_sms=132, sink=True)


# ----------------------------------------------------------------------------- PTX (no simulator)

# (config, cc): both variants and each tile tier of mla_decode.BLOCK_N_BY_ROWS (narrow BLOCK_M 1,
# 2; wide 8, 16) in the DeepSeek decode shapes (h_q 1, 16, 128) in bfloat16 on sm_90, and at
# their most registers (float32, sm_80's ptxas) on sm_80; the KV-cache decode's short rows (V in
# its own cache, left padding; D 128, a GQA group of 4) at its most registers, on sm_80, and
# copied element by element (rows not in 16-byte chunks); with FP8 caches (sm_89+) both ways;
# DeepSeek-V3.2's sparse decode of FP8 rows, both variants.
def _mla(q_rows, fmt, causal):
    return [q_rows, 576, 512, causal, fmt, True]


PTX_SPECS = [(_mla(1, "bfloat16", False), (9, 0)), (_mla(2, "bfloat16", True), (9, 0)),
             (_mla(16, "bfloat16", True), (9, 0)), (_mla(128, "bfloat16", True), (9, 0)),
             (_mla(1, "float32", False), (8, 0)), (_mla(8, "float32", True), (8, 0)),
             (_mla(128, "float32", False), (8, 0)),
             ([4, 128, 128, False, "bfloat16", True, False, True, True], (8, 0)),
             ([4, 128, 128, False, "float16", False, False, True, False], (8, 0)),
             ([4, 128, 128, False, "float16", True, False, True, False, False, False, False,
               "e4m3"], (9, 0)),
             ([4, 128, 128, False, "bfloat16", False, False, True, True, False, False, False,
               "e4m3"], (9, 0)),
             (_mla(2, "bfloat16", False) + [False] * 6 + ["v32", True], (9, 0)),
             (_mla(128, "bfloat16", False) + [False] * 6 + ["v32", True], (9, 0))]
A100_SHARED, H100_SHARED = 163 * 1024, 227 * 1024


def test_decode_kernel_compiles_without_spills():
    def report(spec):
        config, cc = spec
        gpu = {"cc": list(cc), "sms": 132,
               "shared_per_block": H100_SHARED if cc >= (9, 0) else A100_SHARED}
        ptx, rep = ptxcheck.compile_report_isolated(
            "numba_flash.runtime.ptxcheck:spec_build", cc=cc,
            args=("numba_flash.kernels.simt.mla_decode", config, None, gpu))
        return spec, ptx, rep

    with ThreadPoolExecutor(max_workers=3) as pool:
        for spec, ptx, rep in pool.map(report, PTX_SPECS):
            assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0, (spec, rep["log"])
            assert "ld.local" not in ptx, spec
            assert rep["registers"] <= 255, spec
            if mla_decode.SPEC.Config(*spec[0]).cache:  # widened by cvt ... e4m3x2
                assert "e4m3x2" in ptx, spec


# ----------------------------------------------------------------------------- layout rules

def test_short_rows_share_a_warp_among_keys_and_mla_rows_do_not():
    """MLA's rows keep a warp per key in the narrow variant (1 or 2 rows); rows of up to 256
    columns take 8 lanes per key while BLOCK_M x HEAD_DIM <= 512, else the wide variant."""
    lanes = mla_decode.narrow_lanes
    assert [lanes(m, 576) for m in (1, 2, 4)] == [32, 32, None]
    assert [lanes(m, 128) for m in (1, 2, 4, 8)] == [8, 8, 8, None]
    assert [lanes(m, 256) for m in (1, 2, 4)] == [8, 8, None]
    assert lanes(16, 16) is None  # more rows than one ring slot stages


@pytest.mark.parametrize("d, dv, separate", [(128, 128, True), (64, 64, True), (576, 512, False)])
def test_a_warps_rows_start_on_different_banks(d, dv, separate):
    """The 32 / LPK tile rows a warp reads at once start LPK banks apart (16-byte chunks stay
    aligned); a tile row holds K, then V when V has its own cache."""
    assert mla_decode.kv_row(d, dv, separate) == d + (dv if separate else 0)
    lpk = mla_decode.narrow_lanes(1, d)
    stride = mla_decode.narrow_row_stride(d, dv, separate, lpk)  # storage elements
    assert stride % 8 == 0 and stride >= mla_decode.kv_row(d, dv, separate)
    banks = [(k * stride // 2) % 32 for k in range(32 // lpk)]  # first word of each row
    assert sorted(b // lpk for b in banks) == list(range(32 // lpk))
