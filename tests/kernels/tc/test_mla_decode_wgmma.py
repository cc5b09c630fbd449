"""The tensor-core paged MLA decode (kernels/tc/mla_decode_wgmma.py) against the float64
reference, on the adversarial caches of kernels/_decode_cases.py. Simulator: emulated wgmma, tiny
head dims; GPU: DeepSeek's sizes, where the device is a Hopper."""

import pytest
from numba import cuda

import numba_flash as nf
from numba_flash.kernels.tc import decode_tiles, mla_decode_wgmma
from helpers import SIMULATOR, assert_compiles_clean, decode_problem, later_samples
from kernels._decode_cases import (DEEPSEEK_CASES, check_bad_device_values, check_nan_query_row,
                                   TC_NEGATIVE_LENGTH_ON_A_GPU, check_negative_length,
                                   run_case, run_sparse_case)

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="wgmma runs on compute capability 9.0 only")

# (seqlens, s_q, h_q, h_kv, d, dv, page, causal, fmt, num_sms, splits): a ragged 64-row tile
# (4 and 3 x 2 rows), two tiles of packed rows (40 x 2), h_kv = 2, page sizes 1 / 16 (cp.async) and
# 64 / 128 (TMA, a tile in the middle of a page, ragged last tiles), lengths 0 and 1 and off the
# tile grid, causal s_q = 2 and 3, head_dim_v odd and below a warpgroup's 64 columns, requests cut
# into pieces (combined), both formats. The page-128 case on five parts: a part that ends a cut
# request (two keys, mid-page) and takes a whole one, and one that takes a whole request and
# starts a cut one (the fewest keys that plan so: each TMA tile is seconds of emulation).
CASES_SIM = [
    ([70, 0, 5], 1, 4, 1, 32, 32, 16, False, "bfloat16", 4, None),
    ([330, 1, 0, 64], 3, 2, 1, 48, 23, 1, True, "float16", 2, None),
    ([200, 17], 1, 40, 2, 64, 64, 16, False, "bfloat16", 16, True),
    ([70], 2, 40, 1, 16, 16, 64, True, "float16", 2, None),
    ([450, 64, 0, 70], 1, 8, 1, 32, 32, 128, False, "bfloat16", 5, True),
]
CASES_GPU = DEEPSEEK_CASES  # kernels/_decode_cases.py
CASES = CASES_SIM if SIMULATOR else CASES_GPU


@pytest.mark.slow  # its first case compiles for over a minute on a fresh GPU machine
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[1:])))
def test_decode_matches_reference(case, rng):
    run_case(rng, *case, backend="tc")


@pytest.mark.slow
def test_attention_sink_behind_the_overlapping_combine(rng):
    """FlashMLA's attn_sink with the sm_90 combine launched as the decode's programmatic
    dependent: the rows it merges and the rows the decode wrote whole both shrink."""
    case = CASES[2] if SIMULATOR else DEEPSEEK_CASES[3]
    run_case(rng, *case, backend="tc", sink=True)


SPARSE_CASES = [  # (b, s_q, h_q, h_kv, d, dv, page, topk, fp8): V3.2's rows over two tiles of
    (1, 2, 2, 1, 576, 512, 8, 70, True),   # keys; on a GPU also a bfloat16 GQA cache
] if SIMULATOR else [(3, 2, 128, 1, 576, 512, 64, 2048, True), (4, 1, 64, 1, 576, 512, 1, 2048, True),
                     (2, 2, 8, 2, 64, 32, 16, 500, False)]


@pytest.mark.parametrize("case", SPARSE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_sparse_decode_matches_reference(rng, case):
    """DeepSeek-V3.2's sparse decode (``indices``) on the tensor cores: each token's packed
    rows gathered by cp.async, V3.2's FP8 rows widened in the swizzled tiles by the threads that
    copied them; with a sink, and indices past the cache skipped and reported."""
    run_sparse_case(rng, *case, backend="tc", sink=True, bad_index=True)


@pytest.mark.parametrize("page", [16, 64], ids=["cp.async", "tma"])
def test_bad_device_values_are_bounded_and_reported(rng, page):
    check_bad_device_values(rng, "tc", page)


@TC_NEGATIVE_LENGTH_ON_A_GPU
@pytest.mark.parametrize("page", [16, 64], ids=["cp.async", "tma"])
def test_a_negative_length_is_read_as_zero_and_reported(rng, page):
    check_negative_length(rng, "tc", page)


def test_a_nan_query_row_gives_a_nan_lse(rng):
    check_nan_query_row(rng, "tc")


def test_auto_takes_the_tensor_cores_above_one_row():
    """auto: the simt decode's narrow variant up to SIMT_DECODE_ROWS packed rows, tc above."""
    from numba_flash import backends
    from numba_flash.kernels.simt import mla_decode as simt_mla_decode
    from numba_flash.runtime import device

    dev = device.current()
    for rows, spec in ((backends.SIMT_DECODE_ROWS, simt_mla_decode.SPEC),
                       (backends.SIMT_DECODE_ROWS + 1, mla_decode_wgmma.SPEC)):
        problem = decode_problem(64, 64, rows, page=16, fmt="float16")
        assert backends.decode_spec("auto", problem, dev)[0] is spec
    with pytest.raises(ValueError, match="^backend: .*head_dim_v up to 512"):
        backends.decode_spec("tc", decode_problem(576, 576, 16, page=16, fmt="float16"), dev)


def test_pages_of_whole_tiles_take_the_tma_copies():
    """A page size that is a multiple of 64 keeps each 64-key tile in one page: TMA boxes; any
    other page size copies rows with cp.async."""
    from numba_flash import backends
    from numba_flash.runtime import device

    for page, tma in ((16, False), (96, False), (64, True), (192, True)):
        problem = decode_problem(64, 64, 8, page=page, fmt="float16")
        spec, config = backends.decode_spec("tc", problem, device.current())
        assert spec is mla_decode_wgmma.SPEC and config.tma is tma, page


def test_every_specialization_compiles_to_wgmma_without_spills():
    """Both ways of filling the cache buffers: cp.async, and TMA boxes on mbarriers; the
    kernel's samples after the first (test_registry.py compiles that one)."""
    samples = later_samples(mla_decode_wgmma.SPEC)
    for tma, copy in ((False, "cp.async.cg.shared.global"), (True, "cp.async.bulk.tensor.4d")):
        configs = [(config, entry) for config, entry in samples
                   if mla_decode_wgmma.SPEC.Config(*config).tma == tma]
        assert_compiles_clean("tc.mla_decode_wgmma", configs, ccs=((9, 0, "a"),),
                              must_contain=("wgmma.mma_async.sync.aligned", copy,
                                            "fence.proxy.async",
                                            "griddepcontrol.launch_dependents"),
                              must_not_log=("C7509",))


def test_deepseek_tiles_fit_a_hopper_block():
    assert decode_tiles.shared_layout(576, 512).bytes + 4 * mla_decode_wgmma.XCHG <= 227 * 1024


@pytest.mark.slow  # it compiles for over a minute on a fresh GPU machine
@pytest.mark.skipif(SIMULATOR, reason="CUDA graphs need a GPU")
def test_planning_and_decode_replay_from_a_cuda_graph():
    """get_mla_metadata (on the device) and the decode captured in one torch CUDA graph; the
    replay with new lengths and queries gives what eager calls give."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s_q, h_q, d, dv, page = 16, 1, 64, 576, 512, 64
    k_cache = torch.randn(b * 40, page, 1, d, generator=gen, device="cuda").bfloat16()
    table = torch.randperm(b * 40, generator=gen, device="cuda").int().reshape(b, 40)
    q = torch.randn(b, s_q, h_q, d, generator=gen, device="cuda").bfloat16()
    lens = torch.randint(1, 40 * page, (b,), generator=gen, device="cuda").int()

    def step():
        meta, splits = nf.get_mla_metadata(lens, s_q * h_q, 1)
        return nf.flash_mla_with_kvcache(q, k_cache, table, lens, dv, meta, splits)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    lens.copy_(torch.randint(0, 40 * page, (b,), generator=gen, device="cuda").int())
    q.copy_(torch.randn(b, s_q, h_q, d, generator=gen, device="cuda").bfloat16())
    graph.replay()
    want, want_lse = step()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
