"""The mma.sync backward (kernels/tc/backward_mma.py: dK/dV and dQ on tensor cores) against the
float64 reference with the 3x rule. Simulator: emulated mma.sync, tiny shapes and small tiles
forced through the specs so that both kernels cross tiles (and the dK/dV kernel splits the head
dim between warps once); GPU: the tile tables at real sizes. The PTX check compiles every table
entry for sm_80 and sm_90."""

import numpy as np
import pytest

import numba_flash as nf
from helpers import FMTS, SIMULATOR, assert_compiles_clean, nan_like, to_device, to_host
from kernels._backward_cases import WINDOW_CASES, check_window, window_id
from kernels._backward_cases import SOFTCAP_CASES, check_softcap, softcap_id
from kernels._backward_cases import MODIFIER_CASES, check_modifiers, library_backward, modifier_id
from kernels._backward_cases import (check_bitwise_deterministic, check_gradients,
                                     check_large_logits, check_rows_without_keys, inputs)
from kernels.tc._forward_cases import planned_for_family
from numba_flash.kernels.tc import backward_mma
from numba_flash.runtime.device import Device

# (B, Sq, Sk, Hq, Hk, D, causal, fmt): odd lengths, Sq != Sk both ways, GQA/MQA, head dims 8..256.
CASES_SIM = [
    (1, 5, 7, 2, 1, 16, False, "float16"),
    (1, 37, 45, 2, 1, 24, True, "bfloat16"),    # 3 query x 2 key tiles, padded head dim
    (1, 40, 5, 1, 1, 32, True, "float16"),      # Sq > Sk: rows 0..34 see no key
    (1, 3, 11, 4, 1, 16, False, "bfloat16"),    # MQA: one kv head sums four query heads
    (1, 20, 33, 1, 1, 8, True, "float16"),
]
CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, False, "float16"),
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16"),
    (1, 777, 1531, 4, 4, 128, True, "float16"),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16"),
    (3, 257, 513, 6, 3, 72, False, "bfloat16"),
    (1, 300, 300, 2, 1, 256, True, "float16"),
    (1, 1, 4097, 2, 2, 96, False, "float16"),
    (1, 129, 129, 2, 2, 8, True, "bfloat16"),
    (1, 2048, 2048, 16, 1, 64, True, "bfloat16"),   # MQA: 16 query heads summed per CTA
]
CASES = CASES_SIM if SIMULATOR else CASES_GPU
# Simulator tiles: dK/dV 16 queries x 32 keys (2 warps), dQ 32 queries x 16 keys (2 warps).
SIM_TILES = ((16, 32, 2), (32, 16, 2))


_backward = library_backward("tc")


@pytest.fixture(autouse=True)
def mma_family():
    """The tc backend with the mma.sync kernels (a Hopper runs them compiled for sm_80), under
    the simulator with small tiles."""
    with planned_for_family("mma"):
        if SIMULATOR:
            with backward_mma.DKDV.forcing(SIM_TILES[0]), backward_mma.DQ.forcing(SIM_TILES[1]):
                yield
        else:
            yield


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


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=softcap_id)
def test_softcap_matches_reference(case, rng):
    check_softcap(rng, _backward, case)


@pytest.mark.skipif(not SIMULATOR, reason="the GPU cases run the table's head-dim splits")
def test_warps_that_split_the_head_dim(rng):
    """dK/dV with 2 warps on the same 16 keys, each accumulating half of the head dim (the
    table's layout at D = 256), D = 40 padded to 64: the second half holds 8 real columns."""
    dout, q, k, v = inputs(rng, 1, 21, 19, 1, 1, 40, "bfloat16")
    with backward_mma.DKDV.forcing((16, 16, 2)):
        grads = _backward(dout, q, k, v, True)
    check_gradients(grads, dout, q, k, v, True, "bfloat16")


def test_backward_is_bitwise_deterministic(rng):
    check_bitwise_deterministic(rng, _backward)


@pytest.mark.parametrize("sign", [1, -1])
def test_large_logits_stay_finite(sign, rng):
    check_large_logits(rng, _backward, sign)


def test_rows_without_keys_get_zero_dq(rng):
    check_rows_without_keys(rng, _backward)


def test_unaligned_views_are_refused_by_tc_and_run_by_auto(rng):
    """q as a view 2 bytes into wider rows: no 16-byte copies. ``tc`` says so before any
    launch; ``auto`` runs the CUDA-core backward."""
    B, S, H, D = (1, 5, 1, 16) if SIMULATOR else (1, 200, 2, 64)
    dout, q, k, v = inputs(rng, B, S, S, H, H, D, "float16")
    wide = np.zeros((B, S, H, D + 1), np.float16)
    wide[..., 1:] = q
    dq_view = to_device(wide)[..., 1:]
    dev = [to_device(x) for x in (dout, k, v)]
    out, lse = nf.flash_attn_fwd(dq_view, dev[1], dev[2], backend="simt")
    dq = nan_like(q)
    with pytest.raises(ValueError, match="16-byte"):
        nf.flash_attn_bwd(dev[0], dq_view, dev[1], dev[2], out, lse, backend="tc", dq=dq)
    assert np.isnan(to_host(dq).astype(np.float32)).all()  # nothing written
    grads = nf.flash_attn_bwd(dev[0], dq_view, dev[1], dev[2], out, lse)
    check_gradients(grads, dout, q, k, v, False, "float16")


def test_every_specialization_compiles_to_mma_without_spills():
    """Every tile entry, causal and not, each in one 16-bit format (``helpers.FMTS``)."""
    for name, column in (("DKDV", 1), ("DQ", 2)):
        configs = [((row[0], causal, FMTS[causal]), row[column][int(causal)])
                   for row in backward_mma.TILES for causal in (False, True)]
        configs += [((row[0], True, "bfloat16"), row[column]) for row in backward_mma.SMALL_TILES]
        configs.append(((8, True, "float16"), None))
        configs.append(((72, False, "bfloat16"), None))
        assert_compiles_clean(f"tc.backward_mma:{name}", configs,
                              must_contain=("mma.sync.aligned.m16n8k16", "ldmatrix",
                                            "cp.async"))


def test_tiles_fit_the_shared_memory_of_the_device():
    """Every head dim and mode gets tiles within a block's shared memory: the table's on a
    Hopper (227 KiB) or an A100 (163 KiB), smaller ones on sm_86 / sm_89 (99 KiB)."""
    kib = 1024
    for per_block in (227 * kib, 163 * kib, 99 * kib):
        dev = Device(cc=(8, 6), sms=84, shared_per_block=per_block)
        for d in (8, 64, 72, 128, 136, 200, 256):
            for causal in (False, True):
                for spec in (backward_mma.DKDV, backward_mma.DQ):
                    tiles = spec.choose(spec.Config(d, causal, "float16"), dev)
                    assert tiles.shared_bytes <= per_block, (per_block, d, causal, spec.name)


@pytest.mark.parametrize("case", MODIFIER_CASES, ids=modifier_id)
def test_alibi_and_sinks_match_reference(case, rng):
    check_modifiers(rng, _backward, case)
