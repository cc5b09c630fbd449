"""The warp-specialized wgmma forward (kernels/tc/forward_wgmma_ws.py, the tc backend's forward
on a Hopper for dense and varlen batches) against the float64 reference: the tc forward cases,
the masks and score modifiers, and what is its own: a ring of stages that wraps many times
(the producer waits on each stage's EMPTY barriers), consumer warpgroups that disagree on which
tiles they mask, and the register split. Simulator: emulated TMA, mbarriers and wgmma, tiny
shapes, small forced tiles; GPU: the table's tiles, where the device is a Hopper."""

import numpy as np
import pytest
from numba import cuda

from helpers import FMTS, SIMULATOR, assert_compiles_clean, check_forward
from numba_flash.kernels import registry
from numba_flash.kernels.tc import forward_wgmma_ws
from numba_flash.runtime import device
from kernels.tc._forward_cases import (CASES, check_growing_row_maxima, check_large_logits,
                                       planned_for_family)
from kernels._window_cases import CASES as WINDOW_CASES, case_id as window_id
from kernels._window_cases import MODIFIER_CASES, modifier_id, modifier_options

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="wgmma runs on compute capability 9.0 only")

SIM_TILES = (64, 32)  # one consumer warpgroup: 256 threads in the simulator


@pytest.fixture(autouse=True)
def ws_kernel():
    """The tc backend on a Hopper with this kernel (the cp.async one set aside); small tiles
    under the simulator."""
    with planned_for_family("wgmma"), registry.setting_aside("tc.forward_wgmma"):
        if SIMULATOR:
            with forward_wgmma_ws.SPEC.forcing(SIM_TILES):
                yield
        else:
            yield


def test_the_registry_runs_it_for_dense_and_varlen_but_not_paged_batches():
    """Paged K/V (any page size, through a row table) stays with the cp.async kernel; entries
    set aside are passed over (their reason names it), and naming an unknown one is an
    error."""
    entry = registry.choose("forward", "tc", None, device.SIMULATED)
    assert entry.specs == (forward_wgmma_ws.SPEC,)
    assert "block_table" not in entry.honours and "cu_seqlens_q" in entry.honours
    with registry.setting_aside("tc.forward_wgmma_ws"):
        assert registry.set_aside() == {"tc.forward_wgmma", "tc.forward_wgmma_ws"}
        assert registry.choose("forward", "tc", None, device.SIMULATED).name == "tc.forward_mma"
        with registry.setting_aside("tc.forward_mma"):
            with pytest.raises(ValueError, match="tc.forward_wgmma_ws: set aside"):
                registry.choose("forward", "tc", None, device.SIMULATED)
    assert registry.set_aside() == {"tc.forward_wgmma"}  # the fixture's, as it was
    with pytest.raises(ValueError, match="no registry entries"):
        with registry.setting_aside("tc.forward_nope"):
            pass


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(case, rng):
    check_forward(rng, *case, backend="tc")


@pytest.mark.parametrize("case", WINDOW_CASES[:2], ids=window_id)
def test_sliding_window_matches_reference(case, rng):
    *shape, window_size = case
    check_forward(rng, *shape, backend="tc", window_size=window_size)


@pytest.mark.parametrize("case", MODIFIER_CASES[-1:], ids=modifier_id)
def test_alibi_sinks_and_softcap_match_reference(case, rng):
    check_forward(rng, *case[:-1], backend="tc", **modifier_options(rng, case))


def test_the_stage_ring_wraps_and_query_tiles_disagree_on_masks(rng):
    """More key tiles than stages (each stage refilled twice), two consumer warpgroups whose
    rows see different key tiles (causal, Sq > Sk: the first rows see none), a padded head dim
    (72 -> 128: two boxes per tile, zeros past the array's columns)."""
    B, Sq, Sk, Hq, Hk, D = (1, 140, 100, 1, 1, 72) if SIMULATOR else (2, 1500, 1300, 8, 2, 72)
    entry = (128, 32) if SIMULATOR else None
    with forward_wgmma_ws.SPEC.forcing(entry) if entry else planned_for_family("wgmma"):
        check_forward(rng, B, Sq, Sk, Hq, Hk, D, True, "bfloat16", backend="tc")


def test_large_logits_stay_finite(rng):
    check_large_logits(rng)


def test_row_maxima_that_keep_growing_rescale_correctly(rng):
    """The rescale of O_i waits for the product in flight on it: maxima that move on every
    tile catch a rescale applied too early or twice."""
    check_growing_row_maxima(rng, False)


def test_register_split_spends_the_whole_file():
    """The producer's 24 registers and the consumers' rise use the 64K registers the launch
    took, in whole 8s (setmaxnreg's rule)."""
    for consumers, split in ((1, (256, 24, 256)), (2, (168, 24, 240)), (3, (128, 24, 160))):
        assert forward_wgmma_ws.register_split(consumers) == split
        launch, producer, consumer = split
        assert producer + consumers * consumer <= (consumers + 1) * launch
        assert launch * (consumers + 1) * 128 <= 65536


def test_tiles_fit_a_hopper_block():
    spec = forward_wgmma_ws.SPEC
    for d in (8, 64, 96, 128, 200, 256):
        for causal in (False, True):
            config = spec.Config(d, causal, "float16")
            t = spec.tiles(config, spec.entry(config, device.SIMULATED))
            assert t.threads == 2 * t.BLOCK_M + 128 and t.shared_bytes <= 227 * 1024
            assert t.max_registers * t.threads <= 65536


def test_every_specialization_compiles_with_setmaxnreg_and_no_spills():
    """Every tile entry, causal and not, compiled as the runtime compiles it (whole program:
    ptxas would otherwise ignore setmaxnreg, C7504) for sm_90a; varlen with every modifier at
    head dim 128."""
    configs = [((d, causal, FMTS[causal]), None) for d, _ in forward_wgmma_ws.TILES
               for causal in (False, True)]
    configs += [((128, True, "bfloat16", True, False, True, True, True, True), None)]
    assert_compiles_clean("tc.forward_wgmma_ws", configs, ccs=((9, 0, "a"),),
                          must_contain=("wgmma.mma_async.sync.aligned", "setmaxnreg.inc",
                                        "setmaxnreg.dec", "cp.async.bulk.tensor",
                                        "mbarrier.try_wait", "mbarrier.arrive"),
                          must_not_log=("C7504",))


def test_packed_rows_get_a_map_of_one_batch_entry():
    """A varlen batch reaches the kernels as a stride-0 batch of its packed rows; its tensor
    map describes the rows once."""
    from numba_flash.runtime import arrays

    t = arrays.adapt(cuda.to_device(np.zeros((10, 2, 64), np.float16)), "q")
    packed = forward_wgmma_ws._packed(arrays.batched(t, 3))
    assert packed.shape == (1, 10, 2, 64) and packed.strides == (1280, 128, 64, 1)
    assert forward_wgmma_ws._packed(t) is t


@pytest.mark.skipif(SIMULATOR, reason="forward plans serve torch CUDA tensors on a GPU")
def test_a_plan_reads_the_tensor_maps_of_its_new_inputs(rng):
    """A torch signature seen before runs from its plan, whose TMA maps must be those of the
    new q, k, v (``Spec.pointer_tail``), not of the first call's."""
    torch = pytest.importorskip("torch")
    from numba_flash import reference as ref
    from numba_flash import torch_plans
    import numba_flash as nf

    torch_plans._plans.clear()
    for _ in range(3):  # the first call plans, the others run from the plan at new addresses
        host = [rng.standard_normal((2, 300, 4, 64)).astype(np.float16) for _ in range(3)]
        q, k, v = (torch.from_numpy(x).cuda() for x in host)
        o, lse = nf.flash_attn_fwd(q, k, v, causal=True, backend="tc")
        want, want_lse = ref.attention_fwd_ref(*host, causal=True)
        np.testing.assert_allclose(o.float().cpu().numpy(), want, atol=4e-3)
        np.testing.assert_allclose(lse.cpu().numpy(), want_lse, atol=1e-3)
    assert len(torch_plans._plans) == 1


def test_packed_sequences_match_the_packed_reference(rng):
    """Varlen: sequences of several lengths (one longer in keys than in queries, one with no
    query, one cut inside a key tile), causal, GQA; the boxes of a sequence reach into the next
    one's rows, which its mask must hide; the rows of no sequence stay untouched."""
    import numba_flash as nf
    from helpers import (assert_close_rule, assert_lse, int32_array, nan_like, randn, to_device,
                         to_host)
    from numba_flash import reference as ref

    lq, lk = ([5, 0, 37], [9, 3, 30]) if SIMULATOR else ([500, 0, 1700], [900, 30, 1500])
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lq, lk))
    d = 16 if SIMULATOR else 128
    q = randn(rng, (cu_q[-1] + 1, 2, d), "bfloat16")
    k, v = (randn(rng, (cu_k[-1] + 1, 1, d), "bfloat16") for _ in range(2))
    out = nan_like(q)
    o, lse = nf.flash_attn_varlen_fwd(to_device(q), to_device(k), to_device(v),
                                      int32_array(cu_q), int32_array(cu_k), max(lq), max(lk),
                                      causal=True, backend="tc", out=out)
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), True)
    want, want_lse = ref.attention_fwd_ref(q[None], k[None], v[None], mask=mask)
    lowp = ref.attention_lowp(q[None], k[None], v[None], mask=mask)[0]
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[0][rows], lowp[rows], "bfloat16")
    assert_lse(to_host(lse)[:, rows], want_lse[0][:, rows])
    assert np.isnan(to_host(o)[cu_q[-1]:].astype(np.float32)).all()
    nf.check_errors()
