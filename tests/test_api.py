"""Bad input is refused before any launch, with an error naming the argument; nothing is written."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import scheduler
from helpers import SIMULATOR, nan_like, randn, run_without, to_device, to_host, user_traceback


def _qkv(rng, B=1, Sq=5, Sk=6, Hq=2, Hk=1, D=16, fmt="float16"):
    return (to_device(randn(rng, (B, Sq, Hq, D), fmt)), to_device(randn(rng, (B, Sk, Hk, D), fmt)),
            to_device(randn(rng, (B, Sk, Hk, D), fmt)))


def _bad_forward_inputs(rng):
    q, k, v = _qkv(rng)
    good = dict(q=q, k=k, v=v)
    cases = {
        "rank": (dict(good, q=q[0]), ValueError, "q"),
        "batch": (dict(good, k=_qkv(rng, B=2)[1], v=_qkv(rng, B=2)[2]), ValueError, "batch"),
        "kv shapes differ": (dict(good, v=_qkv(rng, Sk=7)[2]), ValueError, "v"),
        "head dim differs": (dict(good, k=_qkv(rng, D=24)[1], v=_qkv(rng, D=24)[2]), ValueError, "head dim"),
        "heads not a multiple": (dict(good, q=_qkv(rng, Hq=3, Hk=2)[0], k=_qkv(rng, Hk=2)[1],
                                      v=_qkv(rng, Hk=2)[2]), ValueError, "multiple"),
        "head dim not /8": tuple([dict(zip("qkv", _qkv(rng, D=12))), ValueError, "multiple of 8"]),
        "head dim > 256": tuple([dict(zip("qkv", _qkv(rng, D=264))), ValueError, "256"]),
        "dtype mismatch": (dict(good, k=_qkv(rng, fmt="float32")[1]), TypeError, "k"),
        "integer dtype": (dict(good, q=to_device(np.ones((1, 5, 2, 16), np.int32))), TypeError, "q"),
        "strided last dim": (dict(good, q=to_device(randn(rng, (1, 5, 2, 32), "float16"))[..., ::2]),
                             ValueError, "contiguous"),
        "not an array": (dict(good, q=[[1.0]]), TypeError, "q"),
        "no queries": (dict(good, q=to_device(randn(rng, (1, 0, 2, 16), "float16"))), ValueError,
                       "^q: empty"),
    }
    return good, cases


@pytest.mark.parametrize("case", ["rank", "batch", "kv shapes differ", "head dim differs",
                                  "heads not a multiple", "head dim not /8", "head dim > 256",
                                  "dtype mismatch", "integer dtype", "strided last dim", "not an array",
                                  "no queries"])
def test_forward_refuses_bad_input_before_launch(case, rng):
    good, cases = _bad_forward_inputs(rng)
    kwargs, exc, words = cases[case]
    out = nan_like(randn(rng, (1, 5, 2, 16), "float16"))
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(kwargs["q"], kwargs["k"], kwargs["v"], out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(softmax_scale=-0.5), ValueError, "softmax_scale"),
    (dict(softmax_scale="0.1"), ValueError, "softmax_scale"),
    (dict(softmax_scale=1e38), ValueError, "softmax_scale: .*up to"),
    (dict(causal="yes"), TypeError, "causal"),
])
def test_forward_refuses_bad_options(kwargs, exc, words, rng):
    q, k, v = _qkv(rng)
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(q, k, v, **kwargs)


def test_forward_refuses_wrong_out_buffer(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="out"):
        nf.flash_attn_fwd(q, k, v, out=nan_like(randn(rng, (1, 5, 2, 8), "float16")))
    with pytest.raises(ValueError, match="out"):
        nf.flash_attn_fwd(q, k, v, out=nan_like(randn(rng, (1, 5, 2, 16), "float32")))


@pytest.mark.skipif(SIMULATOR, reason="host arrays are the accepted input under the simulator")
def test_host_array_on_a_gpu_is_a_type_error(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(TypeError, match="q: got a host NumPy array"):
        nf.flash_attn_fwd(randn(rng, (1, 5, 2, 16), "float16"), k, v)


# ----------------------------------------------------------------------------- flash_attn_bwd

def _rand(rng, shape, fmt="float16"):
    return to_device(randn(rng, shape, fmt))


def test_outputs_that_overlap_inputs_or_repeat_elements_are_refused(rng):
    """An output may share no memory with an input or another output (the kernels read the
    inputs while they write), and may not repeat elements through a zero stride."""
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="^out: overlaps q"):
        nf.flash_attn_fwd(q, k, v, out=q)
    xp = np if SIMULATOR else __import__("cupy")
    repeated = xp.broadcast_to(to_device(randn(rng, (1, 1, 2, 16), "float16")), (1, 5, 2, 16))
    with pytest.raises(ValueError, match="^out: a zero stride"):
        nf.flash_attn_fwd(q, k, v, out=repeated)
    dout, out = _rand(rng, (1, 5, 2, 16)), _rand(rng, (1, 5, 2, 16))
    lse = _rand(rng, (1, 2, 5), "float32")
    with pytest.raises(ValueError, match="^dk: overlaps k"):
        nf.flash_attn_bwd(dout, q, k, v, out, lse, dk=k)
    dk = nan_like(randn(rng, (1, 6, 1, 16), "float16"))
    with pytest.raises(ValueError, match="^dv: overlaps dk"):
        nf.flash_attn_bwd(dout, q, k, v, out, lse, dk=dk, dv=dk)
    assert np.isnan(to_host(dk).astype(np.float32)).all(), "a refused call wrote to dk"


@pytest.mark.parametrize("backend", ["simt", "tc"])
def test_a_nan_in_a_query_row_gives_that_row_a_nan_lse(backend, rng):
    """NaN propagates: +inf stays the marker of a row that sees no key."""
    q = randn(rng, (1, 5, 2, 16), "float16")
    q[0, 2, 1, 3] = np.nan
    _, k, v = _qkv(rng)
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


# name -> (arguments replacing good ones, exception, message pattern). Good arguments: q, dout,
# out (1, 5, 2, 16) float16, k, v (1, 6, 1, 16), lse (1, 2, 5) float32.
BAD_BACKWARD = {
    "dout shape": (lambda rng: dict(dout=_rand(rng, (1, 4, 2, 16))), ValueError, "^dout: shape"),
    "out shape": (lambda rng: dict(out=_rand(rng, (1, 5, 1, 16))), ValueError, "^out: shape"),
    "dout dtype": (lambda rng: dict(dout=_rand(rng, (1, 5, 2, 16), "float32")), TypeError, "^dout"),
    "out dtype": (lambda rng: dict(out=_rand(rng, (1, 5, 2, 16), "bfloat16")), TypeError, "^out"),
    "dout rank": (lambda rng: dict(dout=_rand(rng, (5, 2, 16))), ValueError, "^dout"),
    "lse shape": (lambda rng: dict(lse=_rand(rng, (1, 5, 2), "float32")), ValueError, "^lse"),
    "lse dtype": (lambda rng: dict(lse=_rand(rng, (1, 2, 5))), ValueError, "^lse.*float32"),
    "lse not an array": (lambda rng: dict(lse=1.0), TypeError, "^lse"),
    "dq buffer shape": (lambda rng: dict(dq=_rand(rng, (1, 5, 2, 8))), ValueError, "^dq"),
    "dk buffer dtype": (lambda rng: dict(dk=_rand(rng, (1, 6, 1, 16), "float32")), ValueError,
                        "^dk"),
    "dv buffer shape": (lambda rng: dict(dv=_rand(rng, (1, 6, 2, 16))), ValueError, "^dv"),
    "q rank": (lambda rng: dict(q=_rand(rng, (5, 2, 16))), ValueError, "^q"),
    "k, v shapes differ": (lambda rng: dict(k=_rand(rng, (1, 6, 2, 16))), ValueError, "^v: shape"),
    "causal": (lambda rng: dict(causal=1), TypeError, "^causal"),
    "softmax_scale": (lambda rng: dict(softmax_scale=float("inf")), ValueError, "^softmax_scale"),
    "backend unknown": (lambda rng: dict(backend="cuda"), ValueError, "^backend"),
}


@pytest.mark.parametrize("case", list(BAD_BACKWARD))
def test_backward_refuses_bad_input_before_launch(case, rng):
    q, k, v = _qkv(rng)
    good = dict(dout=_rand(rng, (1, 5, 2, 16)), q=q, k=k, v=v, out=_rand(rng, (1, 5, 2, 16)),
                lse=_rand(rng, (1, 2, 5), "float32"))
    buffers = dict(dq=nan_like(randn(rng, (1, 5, 2, 16), "float16")),
                   dk=nan_like(randn(rng, (1, 6, 1, 16), "float16")),
                   dv=nan_like(randn(rng, (1, 6, 1, 16), "float16")))
    make, exc, words = BAD_BACKWARD[case]
    bad = make(rng)
    with pytest.raises(exc, match=words):
        nf.flash_attn_bwd(**{**good, **buffers, **bad})
    for name, buf in buffers.items():
        if name not in bad:
            assert np.isnan(to_host(buf).astype(np.float32)).all(), f"a refused call wrote {name}"


# ----------------------------------------------------------------------------- paged MLA decode

def _int32(x, dtype=np.int32):
    return to_device(np.asarray(x, dtype))


def _mla_good(rng):
    """b 2, s_q 1, h_q 2, h_kv 1, d 16, head_dim_v 8, pages of 4 rows."""
    seqlens = _int32([5, 3])
    metadata, num_splits = nf.get_mla_metadata(seqlens, 2, 1, num_sms=2)
    return dict(q=_rand(rng, (2, 1, 2, 16)), k_cache=_rand(rng, (4, 4, 1, 16)),
                block_table=_int32([[0, 1], [2, 3]]), cache_seqlens=seqlens, head_dim_v=8,
                tile_scheduler_metadata=metadata, num_splits=num_splits)


# name -> (arguments replacing good ones, exception, message pattern)
BAD_MLA = {
    "q rank": (lambda rng: dict(q=_rand(rng, (2, 2, 16))), ValueError, "^q"),
    "q integer": (lambda rng: dict(q=_int32(np.ones((2, 1, 2, 16)))), TypeError, "^q"),
    "k_cache dtype": (lambda rng: dict(k_cache=_rand(rng, (4, 4, 1, 16), "float32")), TypeError,
                      "^k_cache"),
    "k_cache not an array": (lambda rng: dict(k_cache=[[1.0]]), TypeError, "^k_cache"),
    "k_cache head dim": (lambda rng: dict(k_cache=_rand(rng, (4, 4, 1, 24))), ValueError,
                         "^k_cache: head dim"),
    "head dim not /8": (lambda rng: dict(q=_rand(rng, (2, 1, 2, 12)),
                                         k_cache=_rand(rng, (4, 4, 1, 12))), ValueError,
                        "^q: head dim.*multiple of 8"),
    "head dim > 576": (lambda rng: dict(q=_rand(rng, (2, 1, 2, 584)),
                                        k_cache=_rand(rng, (4, 4, 1, 584))), ValueError, "576"),
    "heads not a multiple": (lambda rng: dict(q=_rand(rng, (2, 1, 3, 16)),
                                              k_cache=_rand(rng, (4, 4, 2, 16))), ValueError,
                             "^k_cache: query heads"),
    "head_dim_v > d": (lambda rng: dict(head_dim_v=24), ValueError, "^head_dim_v"),
    "head_dim_v 0": (lambda rng: dict(head_dim_v=0), ValueError, "^head_dim_v"),
    "head_dim_v float": (lambda rng: dict(head_dim_v=8.0), ValueError, "^head_dim_v"),
    "block_table dtype": (lambda rng: dict(block_table=_int32([[0, 1], [2, 3]], np.int64)),
                          TypeError, "^block_table: expected int32"),
    "block_table batch": (lambda rng: dict(block_table=_int32([[0, 1], [2, 3], [0, 0]])),
                          ValueError, r"^block_table: expected shape \(2, n\)"),
    "block_table rank": (lambda rng: dict(block_table=_int32([0, 1])), ValueError, "^block_table"),
    "cache_seqlens dtype": (lambda rng: dict(cache_seqlens=_rand(rng, (2,), "float32")),
                            TypeError, "^cache_seqlens"),
    "cache_seqlens batch": (lambda rng: dict(cache_seqlens=_int32([5, 3, 1])), ValueError,
                            r"^cache_seqlens: expected shape \(2,\)"),
    "metadata columns": (lambda rng: dict(tile_scheduler_metadata=_int32(np.zeros((2, 7)))),
                         ValueError, r"^tile_scheduler_metadata: expected shape \(n, 8\)"),
    "metadata dtype": (lambda rng: dict(tile_scheduler_metadata=_int32(np.zeros((2, 8)), np.int64)),
                       TypeError, "^tile_scheduler_metadata"),
    "metadata empty": (lambda rng: dict(tile_scheduler_metadata=_int32(np.zeros((0, 8)))),
                       ValueError, "^tile_scheduler_metadata"),
    "num_splits of another batch": (lambda rng: dict(num_splits=_int32([0, 1])), ValueError,
                                    r"^num_splits: expected shape \(3,\)"),
    "causal": (lambda rng: dict(causal=1), TypeError, "^causal"),
    "softmax_scale": (lambda rng: dict(softmax_scale=float("nan")), ValueError, "^softmax_scale"),
    "backend unknown": (lambda rng: dict(backend="cuda"), ValueError, "^backend"),
    "backend tc on float32": (lambda rng: dict(q=_rand(rng, (2, 1, 2, 16), "float32"),
                                               k_cache=_rand(rng, (4, 4, 1, 16), "float32"),
                                               backend="tc"), ValueError, "^backend"),
    "backend tc, head dim not /16": (lambda rng: dict(q=_rand(rng, (2, 1, 2, 24)),
                                                      k_cache=_rand(rng, (4, 4, 1, 24)),
                                                      backend="tc"), ValueError,
                                     "^backend: .*multiples of 16"),
    "fp8 cache": (lambda rng: dict(is_fp8_kvcache=True), NotImplementedError, "^is_fp8_kvcache"),
    "indices": (lambda rng: dict(indices=_int32([[0]])), NotImplementedError, "^indices"),
    "attention sink": (lambda rng: dict(attn_sink=_rand(rng, (2,), "float32")),
                       NotImplementedError, "^attn_sink"),
    "metadata without num_splits": (lambda rng: dict(num_splits=None), ValueError,
                                    "^tile_scheduler_metadata, num_splits"),
}


@pytest.mark.parametrize("case", list(BAD_MLA))
def test_mla_decode_refuses_bad_input_before_launch(case, rng):
    good = _mla_good(rng)
    out = nan_like(randn(rng, (2, 1, 2, 8), "float16"))
    make, exc, words = BAD_MLA[case]
    with pytest.raises(exc, match=words):
        nf.flash_mla_with_kvcache(**{**good, **make(rng)}, out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


def test_mla_decode_refuses_wrong_out_buffer(rng):
    with pytest.raises(ValueError, match="^out"):
        nf.flash_mla_with_kvcache(**_mla_good(rng), out=nan_like(randn(rng, (2, 1, 2, 16),
                                                                       "float16")))


@pytest.mark.parametrize("args, exc, words", [
    ((_int32([5, 3], np.int64), 2, 1), TypeError, "^cache_seqlens: expected int32"),
    ((_int32([[5, 3]]), 2, 1), ValueError, "^cache_seqlens"),
    ((_int32([5, 3]), 0, 1), ValueError, "^num_q_tokens_per_head_k"),
    ((_int32([5, 3]), 2, 0), ValueError, "^num_heads_k"),
    ((_int32([5, 3]), 2, 2, 3), ValueError, "^num_heads_q"),
    ((_int32([5, 3]), 2, 2, None, True), NotImplementedError, "^is_fp8_kvcache"),
    ((_int32([5, 3]), 2, 2, None, False, 64), NotImplementedError, "^topk"),
])
def test_mla_metadata_refuses_bad_input(args, exc, words):
    with pytest.raises(exc, match=words):
        nf.get_mla_metadata(*args)


def test_mla_metadata_reads_negative_device_lengths_as_zero():
    """Lengths on the device are not copied to the host to be checked: the planner reads a
    negative one as 0 (and the decode sees no key there)."""
    got = nf.get_mla_metadata(_int32([5, -1, 70]), 2, 1, num_sms=4)
    for g, want in zip(got, scheduler.plan_mla(np.array([5, 0, 70]), 2, 1, 4)):
        np.testing.assert_array_equal(to_host(g), want)


def test_mla_metadata_takes_flashmla_positional_order_and_num_sms_by_keyword():
    seqlens = _int32([1000, 10, 0, 300])
    with pytest.raises(ValueError, match="^num_sms"):
        nf.get_mla_metadata(seqlens, 128, 1, num_sms=0)
    metadata, num_splits = nf.get_mla_metadata(seqlens, 128, 1, 128, False, None, num_sms=132)
    assert to_host(num_splits).tolist() == [0, 16, 17, 18, 23]


def test_mla_decode_plans_itself_without_metadata(rng):
    good = _mla_good(rng)
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

    good = _mla_good(rng)
    launches = []
    monkeypatch.setattr(launcher, "launch", lambda *args, dependent=False:
                        launches.append(dependent))
    planned = device.Device(cc=cc, sms=8, shared_per_block=163 * 1024, shared_per_sm=None)
    with device.plan_for(planned):
        nf.flash_mla_with_kvcache(**good, backend=backend)
    assert launches == [False, dependent]  # the decode, then the combine


def test_hopper_runs_the_wgmma_forward_and_every_other_gpu_the_mma_one():
    from numba_flash import api
    from numba_flash.kernels.tc import forward_mma, forward_wgmma
    from numba_flash.runtime.device import SIMULATED

    assert api.tc_family((9, 0)) == "wgmma"
    assert {api.tc_family(cc) for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0))} == {"mma"}
    assert api._forward_spec("tc", SIMULATED) is forward_wgmma.SPEC
    assert api._forward_spec("tc", SIMULATED.__class__(cc=(8, 0), sms=108,
                                                         shared_per_block=163 * 1024)) \
        is forward_mma.SPEC


def test_tc_forward_refuses_views_off_16_bytes_and_auto_runs_them(rng):
    """q as a view 2 bytes into wider rows: the tc forward's 16-byte copies cannot read it
    (on a GPU: a misaligned-address fault that kills the context). ``tc`` says so before any
    launch, with ``out`` untouched; ``auto`` runs the CUDA-core kernel."""
    from numba_flash import reference as ref

    wide = randn(rng, (1, 5, 2, 17), "float16")
    q = to_device(wide)[..., 1:]
    _, k, v = _qkv(rng)
    out = nan_like(randn(rng, (1, 5, 2, 16), "float16"))
    with pytest.raises(ValueError, match="16-byte"):
        nf.flash_attn_fwd(q, k, v, backend="tc", out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all()
    o, _ = nf.flash_attn_fwd(q, k, v)
    want, _ = ref.attention_fwd_ref(wide[..., 1:], to_host(k), to_host(v))
    np.testing.assert_allclose(to_host(o).astype(np.float64), want, atol=2e-3)


@pytest.mark.skipif(SIMULATOR, reason="forward plans serve torch CUDA tensors on a GPU")
def test_a_seen_forward_signature_runs_from_its_plan_with_the_same_results(rng, monkeypatch):
    """The second call of a torch signature is served by its plan (no checks run): bitwise what
    the first call gave, right for new data at new addresses; a view off 16 bytes under
    ``auto`` is a new signature (the CUDA-core kernel), and a forced tile entry is planned
    again."""
    torch = pytest.importorskip("torch")
    from numba_flash import api
    from numba_flash import reference as ref

    checked = []
    check = api._check_attention
    monkeypatch.setattr(api, "_check_attention", lambda *a: checked.append(1) or check(*a))

    def inputs(offset=0):
        x = [torch.from_numpy(randn(rng, (2, 70, 4, 64 + offset), "float32")).half().cuda()
             for _ in range(3)]
        return [t[..., offset:] for t in x]

    def expect(o, lse, q, k, v):
        want, want_lse = ref.attention_fwd_ref(*(t.cpu().numpy() for t in (q, k, v)),
                                               causal=True)
        np.testing.assert_allclose(o.float().cpu().numpy(), want, atol=2e-3)
        np.testing.assert_allclose(lse.cpu().numpy(), want_lse, atol=1e-3)

    api._forward_plans.clear()
    q, k, v = inputs()
    first = nf.flash_attn_fwd(q, k, v, causal=True)
    again = nf.flash_attn_fwd(q.clone(), k.clone(), v.clone(), causal=True)
    assert len(checked) == 1 and len(api._forward_plans) == 1
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    q2, k2, v2 = inputs()
    expect(*nf.flash_attn_fwd(q2, k2, v2, causal=True), q2, k2, v2)
    assert len(checked) == 1
    qo, ko, vo = inputs(offset=1)  # 2 bytes into wider rows: not 16-byte aligned
    expect(*nf.flash_attn_fwd(qo, ko, vo, causal=True), qo, ko, vo)
    assert len(checked) == 2 and len(api._forward_plans) == 2
    spec = api._forward_spec("tc", api.device.current())
    entry = spec.entry(spec.Config(64, True, "float16"), api.device.current())
    with spec.forcing(entry):  # the table's entry, but forced: planned again
        expect(*nf.flash_attn_fwd(q2, k2, v2, causal=True), q2, k2, v2)
    assert len(checked) == 3


def test_calls_from_four_threads_give_the_serial_results(rng):
    """Launches from several host threads: the simulator serializes them, the device-view cache
    is locked; every thread gets what a serial call gives."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = [_qkv(rng, Sq=7, Sk=9) for _ in range(4)]
    serial = [to_host(nf.flash_attn_fwd(*qkv, backend="simt")[0]) for qkv in inputs]
    for _ in range(1 if SIMULATOR else 20):
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda qkv: to_host(nf.flash_attn_fwd(*qkv, backend="simt")[0]),
                                    inputs))
        for got, want in zip(results, serial):
            np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- warmup

def test_warmup_compiles_the_kernels_a_call_picks():
    from numba_flash.kernels.simt import combine, forward, mla_decode, mla_metadata

    for spec in (forward.SPEC, mla_decode.SPEC, combine.SPEC, mla_metadata.SPEC):
        spec.forget()
    nf.warmup([dict(call="flash_attn_func", head_dim=8, dtype=np.float32, causal=True),
               dict(call="flash_mla_with_kvcache", head_dim=16, head_dim_v=8, num_heads_q=1,
                    num_heads_k=1, dtype="float32")])
    assert [key[0] for key in forward.SPEC._kernels] == [forward.SPEC.Config(8, True, "float32")]
    assert len(mla_decode.SPEC._kernels) == len(combine.SPEC._kernels) == 1
    assert len(mla_metadata.SPEC._kernels) == 1


@pytest.mark.parametrize("config, exc, words", [
    (dict(call="flash_attn", head_dim=8, dtype="float16"), ValueError, r"configs\[0\]: 'call'"),
    (dict(call="flash_attn_fwd", dtype="float16"), ValueError, r"configs\[0\]\['head_dim'\]"),
    (dict(call="flash_attn_fwd", head_dim=8, dtype="int8"), TypeError, r"configs\[0\]\['dtype'\]"),
    (dict(call="flash_attn_fwd", head_dim=8, dtype="float16", heads=2), ValueError,
     r"configs\[0\]: unknown keys \['heads'\]"),
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
lengths, table = np.ones(1, np.int32), np.zeros((1, 1), np.int32)
out, dq, dk, dv, mla_out = (np.full(s, 7, np.float16) for s in [q.shape] * 4 + [(1, 8, 1, 8)])
calls = {
    "flash_attn_fwd": lambda: nf.flash_attn_fwd(q, q, q, out=out),
    "flash_attn_bwd": lambda: nf.flash_attn_bwd(q, q, q, q, q, lse, dq=dq, dk=dk, dv=dv),
    "get_mla_metadata": lambda: nf.get_mla_metadata(lengths, 1, 1),
    "flash_mla_with_kvcache": lambda: nf.flash_mla_with_kvcache(q, q, table, lengths, 8,
                                                                out=mla_out),
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
        f"{name} no CUDA driver found" for name in ("flash_attn_fwd", "flash_attn_bwd",
                                                    "get_mla_metadata", "flash_mla_with_kvcache",
                                                    "warmup", "check_errors")
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
