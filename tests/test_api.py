"""api.py: how a call runs its kernels (alignment refused or routed before any launch, the combine
behind the decode, planning without metadata), threads, warmup, and what every call says where
the CUDA libraries are missing. Which kernel a backend picks: tests/test_backends.py."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import scheduler
from helpers import (SIMULATOR, int32_array, mla_arguments, nan_like, qkv, randn, run_without,
                     to_device, to_host, user_traceback)


# ----------------------------------------------------------------------------- attention

@pytest.mark.parametrize("backend", ["simt", "tc"])
def test_a_nan_in_a_query_row_gives_that_row_a_nan_lse(backend, rng):
    """NaN propagates: +inf stays the marker of a row that sees no key."""
    q = randn(rng, (1, 5, 2, 16), "float16")
    q[0, 2, 1, 3] = np.nan
    _, k, v = qkv(rng)
    _, lse = nf.flash_attn_fwd(to_device(q), k, v, backend=backend)
    lse = to_host(lse)
    assert np.isnan(lse[0, 1, 2])
    lse[0, 1, 2] = 0.0
    assert np.isfinite(lse).all()


def test_a_device_that_lacks_the_shared_memory_refuses_before_launch(rng):
    """Tiles that need more shared memory per block than the device has are never launched: on
    a 99 KiB-per-block GPU (sm_86, sm_89) the simt forward's D = 256 tiles are refused."""
    from numba_flash.runtime import device

    q, k, v = (to_device(randn(rng, (1, 5, 2, 256), "float16")) for _ in range(3))
    out = nan_like(randn(rng, (1, 5, 2, 256), "float16"))
    small = device.Device(cc=(8, 6), sms=8, shared_per_block=99 * 1024, shared_per_sm=100 * 1024)
    with device.plan_for(small), pytest.raises(ValueError, match="shared memory per block"):
        nf.flash_attn_fwd(q, k, v, backend="simt", out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


def test_tc_forward_refuses_views_off_16_bytes_and_auto_runs_them(rng):
    """q as a view 2 bytes into wider rows: the tc forward's 16-byte copies cannot read it
    (on a GPU: a misaligned-address fault that kills the context). ``tc`` says so before any
    launch, with ``out`` untouched; ``auto`` runs the CUDA-core kernel."""
    from numba_flash import reference as ref

    wide = randn(rng, (1, 5, 2, 17), "float16")
    q = to_device(wide)[..., 1:]
    _, k, v = qkv(rng)
    out = nan_like(randn(rng, (1, 5, 2, 16), "float16"))
    with pytest.raises(ValueError, match="16-byte"):
        nf.flash_attn_fwd(q, k, v, backend="tc", out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all()
    o, _ = nf.flash_attn_fwd(q, k, v)
    want, _ = ref.attention_fwd_ref(wide[..., 1:], to_host(k), to_host(v))
    np.testing.assert_allclose(to_host(o).astype(np.float64), want, atol=2e-3)


def test_calls_from_four_threads_give_the_serial_results(rng):
    """Launches from several host threads: the simulator serializes them, the device-view cache
    is locked; every thread gets what a serial call gives."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = [qkv(rng, Sq=7, Sk=9) for _ in range(4)]
    serial = [to_host(nf.flash_attn_fwd(*args, backend="simt")[0]) for args in inputs]
    for _ in range(1 if SIMULATOR else 20):
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(
                lambda args: to_host(nf.flash_attn_fwd(*args, backend="simt")[0]), inputs))
        for got, want in zip(results, serial):
            np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- paged MLA decode

def test_mla_metadata_reads_negative_device_lengths_as_zero():
    """Lengths on the device are not copied to the host to be checked: the planner reads a
    negative one as 0 (and the decode sees no key there)."""
    got = nf.get_mla_metadata(int32_array([5, -1, 70]), 2, 1, num_sms=4)
    for g, want in zip(got, scheduler.plan_mla(np.array([5, 0, 70]), 2, 1, 4)):
        np.testing.assert_array_equal(to_host(g), want)


def test_mla_metadata_takes_flashmla_positional_order_and_num_sms_by_keyword():
    seqlens = int32_array([1000, 10, 0, 300])
    with pytest.raises(ValueError, match="^num_sms"):
        nf.get_mla_metadata(seqlens, 128, 1, num_sms=0)
    metadata, num_splits = nf.get_mla_metadata(seqlens, 128, 1, 128, False, None, num_sms=132)
    assert to_host(num_splits).tolist() == [0, 16, 17, 18, 23]


def test_mla_decode_plans_itself_without_metadata(rng):
    good = mla_arguments(rng)
    planned, planned_lse = nf.flash_mla_with_kvcache(**good)
    del good["tile_scheduler_metadata"], good["num_splits"]
    itself, itself_lse = nf.flash_mla_with_kvcache(**good)
    np.testing.assert_array_equal(to_host(itself), to_host(planned))
    np.testing.assert_array_equal(to_host(itself_lse), to_host(planned_lse))


@pytest.mark.parametrize("backend, cc, dependent", [
    ("tc", (9, 0), True),     # the lockstep wgmma decode allows its dependents
    ("simt", (9, 0), False),  # the SIMT decode never signals: an ordinary launch
    ("tc", (8, 0), False),    # mma.sync decode; sm_80 has no grid dependency control
])
def test_the_combine_starts_alongside_only_decodes_that_allow_it(monkeypatch, rng, backend,
                                                                 cc, dependent):
    from numba_flash.runtime import device, launcher

    good = mla_arguments(rng)
    launches = []
    monkeypatch.setattr(launcher, "launch", lambda *args, dependent=False:
                        launches.append(dependent))
    planned = device.Device(cc=cc, sms=8, shared_per_block=163 * 1024, shared_per_sm=None)
    with device.plan_for(planned):
        nf.flash_mla_with_kvcache(**good, backend=backend)
    assert launches == [False, dependent]  # the decode, then the combine


# ----------------------------------------------------------------------------- warmup

def test_warmup_compiles_a_kvcache_step():
    from numba_flash.kernels.simt import kvcache_prepare, mla_decode

    for spec in (kvcache_prepare.SPEC, mla_decode.SPEC):
        spec.forget()
    nf.warmup([dict(call="flash_attn_with_kvcache", head_dim=8, dtype="float32", num_heads_q=4,
                    num_heads_k=1, rotary="neox", paged=True, causal=True)])
    assert [key[0] for key in kvcache_prepare.SPEC._kernels] == [
        kvcache_prepare.SPEC.Config("float32", "half", True, True)]
    (config, *_), = mla_decode.SPEC._kernels
    assert (config.head_dim, config.separate_v, config.leftpad) == (8, True, False)
    with pytest.raises(ValueError, match=r"configs\[0\]\['rotary'\]"):
        nf.warmup([dict(call="flash_attn_with_kvcache", head_dim=8, dtype="float32",
                        num_heads_q=1, num_heads_k=1, rotary="yes")])


def test_warmup_compiles_the_kernels_a_call_picks():
    from numba_flash.kernels.simt import combine, forward, mla_decode, mla_metadata

    for spec in (forward.SPEC, mla_decode.SPEC, combine.SPEC, mla_metadata.SPEC):
        spec.forget()
    nf.warmup([dict(call="flash_attn_func", head_dim=8, dtype=np.float32, causal=True),
               dict(call="flash_attn_varlen_func", head_dim=8, dtype=np.float32),
               dict(call="flash_attn_varlen_fwd", head_dim=8, dtype=np.float32, paged=True),
               dict(call="flash_mla_with_kvcache", head_dim=16, head_dim_v=8, num_heads_q=1,
                    num_heads_k=1, dtype="float32")])
    assert [key[0] for key in forward.SPEC._kernels] == [
        forward.SPEC.Config(8, True, "float32"), forward.SPEC.Config(8, False, "float32", True),
        forward.SPEC.Config(8, False, "float32", True, True)]
    assert len(mla_decode.SPEC._kernels) == len(combine.SPEC._kernels) == 1
    assert len(mla_metadata.SPEC._kernels) == 1


@pytest.mark.parametrize("config, exc, words", [
    (dict(call="flash_attn", head_dim=8, dtype="float16"), ValueError, r"configs\[0\]: 'call'"),
    (dict(call="flash_attn_fwd", dtype="float16"), ValueError, r"configs\[0\]\['head_dim'\]"),
    (dict(call="flash_attn_fwd", head_dim=8, dtype="int8"), TypeError, r"configs\[0\]\['dtype'\]"),
    (dict(call="flash_attn_fwd", head_dim=8, dtype="float16", heads=2), ValueError,
     r"configs\[0\]: unknown keys \['heads'\]"),
    (dict(call="flash_attn_varlen_bwd", head_dim=8, dtype="float16", paged=True), ValueError,
     r"configs\[0\]: unknown keys \['paged'\]"),
    (dict(call="flash_attn_bwd", head_dim=12, dtype="float16"), ValueError, "^q: head dim"),
    (dict(call="flash_attn_fwd", head_dim=8, dtype="float32", backend="tc"), ValueError,
     "^backend"),
    (dict(call="flash_mla_with_kvcache", head_dim=16, dtype="float16", num_heads_q=2,
          num_heads_k=1), ValueError, "^head_dim_v"),
    ("flash_attn_fwd", TypeError, r"configs\[0\]: expected a dict"),
])
def test_warmup_refuses_bad_configurations_by_name(config, exc, words):
    with pytest.raises(exc, match=words):
        nf.warmup([config])


# ----------------------------------------------------------------------------- CUDA libraries

EVERY_CALL = """
import numpy as np
import numba_flash as nf
from numba_flash.runtime.env import CudaSetupError

q = np.ones((1, 8, 1, 16), np.float16)
lse = np.zeros((1, 1, 8), np.float32)
packed, cu = q[0], np.array([0, 8], np.int32)
lengths, table = np.ones(1, np.int32), np.zeros((1, 1), np.int32)
out, dq, dk, dv, mla_out = (np.full(s, 7, np.float16) for s in [q.shape] * 4 + [(1, 8, 1, 8)])
calls = {
    "flash_attn_fwd": lambda: nf.flash_attn_fwd(q, q, q, out=out),
    "flash_attn_bwd": lambda: nf.flash_attn_bwd(q, q, q, q, q, lse, dq=dq, dk=dk, dv=dv),
    "flash_attn_varlen_fwd": lambda: nf.flash_attn_varlen_fwd(packed, packed, packed, cu, cu, 8,
                                                              8, out=out[0]),
    "flash_attn_varlen_bwd": lambda: nf.flash_attn_varlen_bwd(
        packed, packed, packed, packed, packed, lse[0], cu, cu, 8, 8, dq=dq[0], dk=dk[0],
        dv=dv[0]),
    "get_mla_metadata": lambda: nf.get_mla_metadata(lengths, 1, 1),
    "flash_mla_with_kvcache": lambda: nf.flash_mla_with_kvcache(q, q, table, lengths, 8,
                                                                out=mla_out),
    "flash_attn_with_kvcache": lambda: nf.flash_attn_with_kvcache(q, out, dq, q, q,
                                                                  cache_seqlens=0),
    "warmup": lambda: nf.warmup([dict(call="flash_attn_fwd", head_dim=16, dtype="float16")]),
    "check_errors": nf.check_errors,
}
for name, call in calls.items():
    try:
        call()
        print(name, "returned")
    except CudaSetupError as e:
        print(name, str(e).split(" (")[0])
print("untouched", all((b == 7).all() for b in (out, dq, dk, dv, mla_out)))
nf.flash_attn_func(q, q, q)
"""


def test_without_a_driver_every_call_says_how_to_use_the_simulator_and_writes_nothing():
    """A script run without NUMBA_ENABLE_CUDASIM where no driver loads (hidden on a GPU): each
    public call raises one short CudaSetupError, and no out= buffer is written."""
    run = run_without(["cuda"], EVERY_CALL, timeout=120)
    assert run.stdout.splitlines() == [
        f"{name} no CUDA driver found" for name in (
            "flash_attn_fwd", "flash_attn_bwd", "flash_attn_varlen_fwd", "flash_attn_varlen_bwd",
            "get_mla_metadata", "flash_mla_with_kvcache", "flash_attn_with_kvcache", "warmup",
            "check_errors")
    ] + ["untouched True"], run.stdout + run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("numba_flash.runtime.env.CudaSetupError: no CUDA driver found")
    assert "NUMBA_ENABLE_CUDASIM=1" in last and "NumPy arrays" in last
    assert "DynamicLibNotFoundError" not in run.stderr
    # the script's line, flash_attn_func, flash_attn_fwd, device.current, device.context
    assert len(user_traceback(run.stderr)) <= 5, run.stderr


def test_without_the_cuda_runtime_library_the_first_call_names_the_extras():
    """numba-cuda loads the CUDA runtime as it is imported (simulator or not): the first call,
    which imports it, says which toolkit library is missing and which extra brings it."""
    run = run_without(["cudart"], "import numba_flash as nf\nnf.flash_attn_func", timeout=120)
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("numba_flash.runtime.env.CudaSetupError: the CUDA toolkit library "
                           "'libcudart"), run.stderr
    assert 'pip install "numba_flash[cu13]"' in last and '"numba_flash[cu12]"' in last
    assert "DynamicLibNotFoundError" not in run.stderr
    assert len(user_traceback(run.stderr)) <= 3, run.stderr
