"""The wgmma backward (kernels/tc/backward_wgmma.py: dK/dV and dQ on Hopper's warpgroup tensor
cores) against the float64 reference with the 3x rule. Simulator: emulated wgmma, tiny shapes,
one-warpgroup tiles forced through the specs so that both kernels cross tiles; GPU (a Hopper):
the tile table at real sizes. The PTX check compiles every table entry for sm_90a."""

import pytest
from numba import cuda

import numba_flash as nf
from helpers import (FMTS, SIMULATOR, assert_compiles_clean, attention_problem, nan_like,
                     to_device)
from kernels._backward_cases import WINDOW_CASES, check_window, window_id
from kernels._backward_cases import SOFTCAP_CASES, check_softcap, softcap_id
from kernels._backward_cases import MODIFIER_CASES, check_modifiers, library_backward, modifier_id
from kernels._backward_cases import (check_bitwise_deterministic, check_gradients,
                                     check_large_logits, check_rows_without_keys, inputs)
from kernels.tc._forward_cases import planned_for_family
from numba_flash.kernels.tc import backward_wgmma

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability != (9, 0),
    reason="wgmma runs on compute capability 9.0 only")

# (B, Sq, Sk, Hq, Hk, D, causal, fmt): odd lengths, Sq != Sk both ways, GQA/MQA, head dims to 128.
CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),
    (1, 37, 70, 1, 1, 24, True, "bfloat16"),    # 3 query x 2 key tiles, padded head dim
    (1, 40, 5, 1, 1, 8, True, "float16"),       # Sq > Sk: rows 0..34 see no key
    (1, 3, 11, 4, 1, 40, False, "bfloat16"),    # MQA: one kv head sums four query heads
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16"),
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16"),
    (1, 777, 1531, 4, 4, 128, True, "float16"),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16"),
    (3, 257, 513, 6, 3, 72, False, "bfloat16"),
    (1, 1, 4097, 2, 2, 96, False, "float16"),
    (1, 129, 129, 2, 2, 8, True, "bfloat16"),
    (1, 2048, 2048, 16, 1, 64, True, "bfloat16"),   # MQA: 16 query heads summed per CTA
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU
# Simulator tiles: dK/dV 64 keys x 16 queries, dQ 64 queries x 16 keys (one warpgroup each).
SIM_TILES = ((16, 64), (64, 16))


_backward = library_backward("tc")


@pytest.fixture(autouse=True)
def wgmma_family():
    """The tc backend with the wgmma kernels; under the simulator with one-warpgroup tiles."""
    with planned_for_family("wgmma"):
        if SIMULATOR:
            with backward_wgmma.DKDV.forcing(SIM_TILES[0]), \
                    backward_wgmma.DQ.forcing(SIM_TILES[1]):
                yield
        else:
            yield


def test_hopper_runs_these_kernels_up_to_their_head_dim():
    from numba_flash import backends
    from numba_flash.runtime import device

    dev = device.current()
    assert backends.backward_specs("tc", attention_problem(128), dev) == (
        backward_wgmma.DKDV, backward_wgmma.DQ)
    assert backward_wgmma.DKDV not in backends.backward_specs("tc", attention_problem(136), dev)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_backward_matches_reference(case, rng):
    B, Sq, Sk, Hq, Hk, D, causal, fmt = case
    dout, q, k, v = inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt)
    buffers = dict(dq=nan_like(q), dk=nan_like(k), dv=nan_like(v))  # poisoned: all must be written
    grads = _backward(dout, q, k, v, causal, **buffers)
    assert all(g is buffers[n] for g, n in zip(grads, ("dq", "dk", "dv")))
    check_gradients(grads, dout, q, k, v, causal, fmt)


@pytest.mark.parametrize("case", WINDOW_CASES, ids=window_id)
def test_sliding_window_matches_reference(case, rng):
    check_window(rng, _backward, case)


def test_a_softcap_runs_here_but_on_varlen_batches(rng):
    """A dense softcap runs on this pair (64-key dK/dV tiles at D <= 64, where the cap's
    registers would spill the 128-key tile); a varlen one on the mma.sync pair."""
    from numba_flash import backends, validate
    from numba_flash.kernels.attention import config_of
    from numba_flash.kernels.tc import backward_mma
    from numba_flash.runtime import device

    _, q, k, v = inputs(rng, 1, 5, 7, 2, 1, 16, "bfloat16")
    problem = validate.attention(*(to_device(x) for x in (q, k, v)), True, None, softcap=5.0)
    hopper = device.current()  # (the fixture's plan: a Hopper)
    assert backends.backward_specs("tc", problem, hopper) == (backward_wgmma.DKDV,
                                                              backward_wgmma.DQ)
    # (a stand-in for the offsets: the choice reads only that there are some)
    packed = problem._replace(cu_seqlens_q=problem.q, cu_seqlens_k=problem.q)
    assert backends.backward_specs("tc", packed, hopper) == (backward_mma.DKDV, backward_mma.DQ)
    assert backward_wgmma.DKDV.entry(config_of(problem), hopper) == backward_wgmma.SOFTCAP_DKDV
    assert backward_wgmma.DKDV.entry(config_of(problem._replace(softcap=None)), hopper) != \
        backward_wgmma.SOFTCAP_DKDV


@pytest.mark.parametrize("case", SOFTCAP_CASES[:1] if SIMULATOR else SOFTCAP_CASES, ids=softcap_id)
def test_softcap_matches_reference(case, rng):
    check_softcap(rng, _backward, case)


def test_two_warpgroups_on_both_kernels(rng):
    """128 keys (dK/dV) and 128 queries (dQ) per CTA: the second warpgroup's operands start 64
    rows into the held tiles."""
    B, Sq, Sk, H, D = (1, 20, 130, 1, 16) if SIMULATOR else (2, 1000, 1100, 4, 128)
    dout, q, k, v = inputs(rng, B, Sq, Sk, H, H, D, "float16")
    with backward_wgmma.DKDV.forcing((16, 128)), backward_wgmma.DQ.forcing((128, 16)):
        grads = _backward(dout, q, k, v, True)
    check_gradients(grads, dout, q, k, v, True, "float16")


def test_backward_is_bitwise_deterministic(rng):
    check_bitwise_deterministic(rng, _backward)


@pytest.mark.parametrize("sign", [1, -1])
def test_large_logits_stay_finite(sign, rng):
    check_large_logits(rng, _backward, sign)


def test_rows_without_keys_get_zero_dq(rng):
    check_rows_without_keys(rng, _backward)


def test_an_unaligned_out_is_refused_by_tc_and_run_by_auto(rng):
    """The dQ kernel copies ``out`` for D_i in 16-byte chunks: a view 2 bytes into wider rows
    is refused by ``tc`` before any launch (naming out) and run by ``auto`` on CUDA cores."""
    import numpy as np

    from helpers import to_host

    B, S, H, D = (1, 5, 1, 16) if SIMULATOR else (1, 200, 2, 64)
    dout, q, k, v = inputs(rng, B, S, S, H, H, D, "float16")
    dev = [to_device(x) for x in (dout, q, k, v)]
    out, lse = nf.flash_attn_fwd(*dev[1:])
    wide = np.zeros((B, S, H, D + 1), np.float16)
    wide[..., 1:] = to_host(out)
    out_view = to_device(wide)[..., 1:]
    dq = nan_like(q)
    with pytest.raises(ValueError, match="16-byte") as err:
        nf.flash_attn_bwd(*dev, out_view, lse, backend="tc", dq=dq)
    assert "out" in str(err.value)
    assert np.isnan(to_host(dq).astype(np.float32)).all()  # nothing written
    grads = nf.flash_attn_bwd(*dev, out_view, lse)
    check_gradients(grads, dout, q, k, v, False, "float16")


def test_caller_buffers_of_odd_alignment(rng):
    """dq, dk and dv given as views 2 bytes into wider rows: right gradients, and the column
    before each view keeps its NaN."""
    import numpy as np

    from helpers import to_host

    B, Sq, Sk, H, D = (1, 21, 37, 1, 16) if SIMULATOR else (2, 300, 257, 2, 64)
    dout, q, k, v = inputs(rng, B, Sq, Sk, H, H, D, "float16")
    wide = [to_device(np.full(x.shape[:-1] + (D + 1,), np.nan, np.float16)) for x in (q, k, v)]
    dq, dk, dv = (w[..., 1:] for w in wide)
    grads = _backward(dout, q, k, v, True, dq=dq, dk=dk, dv=dv)
    check_gradients(grads, dout, q, k, v, True, "float16")
    for w in wide:
        assert np.isnan(to_host(w)[..., 0].astype(np.float32)).all()


def test_every_specialization_compiles_to_wgmma_without_spills():
    """Every tile entry, causal and not, each in one 16-bit format (``helpers.FMTS``)."""
    for name, column in (("DKDV", 1), ("DQ", 2)):
        configs = [((row[0], causal, FMTS[causal]), row[column][int(causal)])
                   for row in backward_wgmma.TILES for causal in (False, True)]
        configs.append(((8, True, "float16"), None))
        configs.append(((72, False, "bfloat16"), None))
        # varlen: bounds read from memory must reach the wgmma as warp-uniform (no C7519)
        configs += [((128, True, "bfloat16", True), None), ((64, False, "float16", True), None)]
        assert_compiles_clean(f"tc.backward_wgmma:{name}", configs, ccs=((9, 0, "a"),),
                              must_contain=("wgmma.mma_async.sync.aligned", "cp.async"),
                              must_not_log=("C7509", "C7510", "C7511", "C7514", "C7515",
                                            "C7517"))


def test_tiles_fit_the_shared_memory_of_a_hopper():
    for d in (8, 64, 72, 128):
        for causal in (False, True):
            for spec in (backward_wgmma.DKDV, backward_wgmma.DQ):
                tiles = spec.tiles(spec.Config(d, causal, "float16"),
                                   spec.entry(spec.Config(d, causal, "float16"), None))
                assert tiles.shared_bytes <= 227 * 1024 and tiles.threads % 128 == 0


@pytest.mark.parametrize("case", MODIFIER_CASES, ids=modifier_id)
def test_alibi_and_sinks_match_reference(case, rng):
    check_modifiers(rng, _backward, case)
