"""validate.py, through the public calls that run its checks: bad input is refused before any
launch, with an error naming the argument, and nothing is written."""

import ml_dtypes
import numpy as np
import pytest

import numba_flash as nf
from helpers import (SIMULATOR, int32_array, mla_arguments, nan_like, qkv, randn, to_device,
                     to_host, torch_device)


# ----------------------------------------------------------------------------- flash_attn_fwd

def _bad_forward_inputs(rng):
    q, k, v = qkv(rng)
    good = dict(q=q, k=k, v=v)
    cases = {
        "rank": (dict(good, q=q[0]), ValueError, "q"),
        "batch": (dict(good, k=qkv(rng, B=2)[1], v=qkv(rng, B=2)[2]), ValueError, "batch"),
        "kv shapes differ": (dict(good, v=qkv(rng, Sk=7)[2]), ValueError, "v"),
        "head dim differs": (dict(good, k=qkv(rng, D=24)[1], v=qkv(rng, D=24)[2]), ValueError, "head dim"),
        "heads not a multiple": (dict(good, q=qkv(rng, Hq=3, Hk=2)[0], k=qkv(rng, Hk=2)[1],
                                      v=qkv(rng, Hk=2)[2]), ValueError, "multiple"),
        "head dim not /8": tuple([dict(zip("qkv", qkv(rng, D=12))), ValueError, "multiple of 8"]),
        "head dim > 256": tuple([dict(zip("qkv", qkv(rng, D=264))), ValueError, "256"]),
        "dtype mismatch": (dict(good, k=qkv(rng, fmt="float32")[1]), TypeError, "k"),
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
    q, k, v = qkv(rng)
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(q, k, v, **kwargs)


BAD_MODIFIERS = {
    "window type": (lambda: dict(window_size=(4.0, 0)), TypeError, "^window_size"),
    "window side": (lambda: dict(window_size=(-2, 0)), ValueError, "^window_size"),
    "softcap": (lambda: dict(softcap=float("inf")), ValueError, "^softcap"),
    "alibi dtype": (lambda: dict(alibi_slopes=to_device(np.zeros(2, np.float16))), TypeError,
                    "^alibi_slopes: expected float32"),
    "alibi shape": (lambda: dict(alibi_slopes=to_device(np.zeros((2, 2), np.float32))),
                    ValueError, r"^alibi_slopes: expected shape \(2,\) or \(1, 2\)"),
    "sink shape": (lambda: dict(learnable_sink=to_device(np.zeros((1, 2), np.float32))),
                   ValueError, r"^learnable_sink: expected shape \(2,\)"),
    "sink not an array": (lambda: dict(learnable_sink=[0.5, 0.5]), TypeError, "^learnable_sink"),
    "dropout": (lambda: dict(dropout_p=0.1), NotImplementedError, "^dropout_p: not implemented"),
    "dropout type": (lambda: dict(dropout_p="0.1"), TypeError, "^dropout_p"),
}


@pytest.mark.parametrize("case", list(BAD_MODIFIERS))
def test_masks_and_modifiers_are_refused_before_launch(case, rng):
    """Forward and backward name the argument and write nothing."""
    make, exc, words = BAD_MODIFIERS[case]
    q, k, v = qkv(rng)
    out = nan_like(randn(rng, (1, 5, 2, 16), "float16"))
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(q, k, v, out=out, **make())
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"
    o, lse = nf.flash_attn_fwd(q, k, v)
    dq = nan_like(randn(rng, (1, 5, 2, 16), "float16"))
    with pytest.raises(exc, match=words):
        nf.flash_attn_bwd(o, q, k, v, o, lse, dq=dq, **make())
    assert np.isnan(to_host(dq).astype(np.float32)).all(), "a refused call wrote to dq"


def test_forward_refuses_wrong_out_buffer(rng):
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match="out"):
        nf.flash_attn_fwd(q, k, v, out=nan_like(randn(rng, (1, 5, 2, 8), "float16")))
    with pytest.raises(ValueError, match="out"):
        nf.flash_attn_fwd(q, k, v, out=nan_like(randn(rng, (1, 5, 2, 16), "float32")))


@pytest.mark.skipif(SIMULATOR, reason="host arrays are the accepted input under the simulator")
def test_host_array_on_a_gpu_is_a_type_error(rng):
    q, k, v = qkv(rng)
    with pytest.raises(TypeError, match="q: got a host NumPy array"):
        nf.flash_attn_fwd(randn(rng, (1, 5, 2, 16), "float16"), k, v)


# ----------------------------------------------------------------------------- FP8 attention

def fp8_arguments(rng):
    """e4m3 q (1, 5, 2, 16), k, v (1, 5, 1, 16) and their (1, 1) descales."""
    def e4m3(shape):
        return torch_device(randn(rng, shape, "float32").astype(ml_dtypes.float8_e4m3fn))
    ones = np.ones((1, 1), np.float32)
    return dict(q=e4m3((1, 5, 2, 16)), k=e4m3((1, 5, 1, 16)), v=e4m3((1, 5, 1, 16)),
                q_descale=torch_device(ones), k_descale=torch_device(ones),
                v_descale=torch_device(ones))


FP8_REFUSALS = {
    "a descale missing": (lambda a, rng: a.update(v_descale=None), ValueError,
                          "^v_descale: FP8 attention takes q_descale, k_descale and v_descale"),
    "descale shape": (lambda a, rng: a.update(k_descale=torch_device(np.ones((2, 1), np.float32))),
                      ValueError, r"^k_descale: expected shape \(1, 1\)"),
    "descale dtype": (lambda a, rng: a.update(q_descale=torch_device(np.ones((1, 1), np.float16))),
                      TypeError, "^q_descale: expected float32"),
    "float32 out": (lambda a, rng: a.update(out_dtype="float32"), ValueError,
                    "^out_dtype: FP8 attention writes bfloat16 or float16"),
    "out_dtype not a dtype": (lambda a, rng: a.update(out_dtype="half-ish"), TypeError,
                              "^out_dtype: expected a dtype"),
    "mixed dtypes": (lambda a, rng: a.update(k=torch_device(randn(rng, (1, 5, 1, 16), "bfloat16"))),
                     TypeError, "^k: dtype bfloat16 differs"),
    "descales with 16-bit inputs": (
        lambda a, rng: a.update(**{n: torch_device(randn(rng, a[n].shape, "bfloat16"))
                                   for n in "qkv"}),
        ValueError, "^q_descale: descales go with float8_e4m3fn q, k, v"),
}


@pytest.mark.parametrize("case", list(FP8_REFUSALS))
def test_fp8_attention_refusals_name_the_argument_and_write_nothing(case, rng):
    change, exc, words = FP8_REFUSALS[case]
    args = fp8_arguments(rng)
    change(args, rng)
    out = torch_device(np.full((1, 5, 2, 16), np.nan, np.float32).astype(ml_dtypes.bfloat16))
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(**args, out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


def test_fp8_attention_is_forward_only_and_needs_compute_capability_8_9(rng):
    import dataclasses

    from numba_flash.runtime import device

    args = fp8_arguments(rng)
    o = torch_device(np.zeros((1, 5, 2, 16), ml_dtypes.bfloat16))
    lse = torch_device(np.zeros((1, 2, 5), np.float32))
    with pytest.raises(NotImplementedError, match="^q: this call takes no FP8"):
        nf.flash_attn_bwd(o, args["q"], args["k"], args["v"], o, lse)
    with device.plan_for(dataclasses.replace(device.current(), cc=(8, 0))):
        with pytest.raises(ValueError, match="^q: FP8 needs compute capability 8.9"):
            nf.flash_attn_fwd(**args)


# ----------------------------------------------------------------------------- flash_attn_bwd

def _rand(rng, shape, fmt="float16"):
    return to_device(randn(rng, shape, fmt))


def test_outputs_that_overlap_inputs_or_repeat_elements_are_refused(rng):
    """An output may share no memory with an input or another output (the kernels read the
    inputs while they write), and may not repeat elements through a zero stride."""
    q, k, v = qkv(rng)
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
    q, k, v = qkv(rng)
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

# name -> (arguments replacing good ones, exception, message pattern)
BAD_MLA = {
    "q rank": (lambda rng: dict(q=_rand(rng, (2, 2, 16))), ValueError, "^q"),
    "q integer": (lambda rng: dict(q=int32_array(np.ones((2, 1, 2, 16)))), TypeError, "^q"),
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
    "block_table dtype": (lambda rng: dict(block_table=int32_array([[0, 1], [2, 3]], np.int64)),
                          TypeError, "^block_table: expected int32"),
    "block_table batch": (lambda rng: dict(block_table=int32_array([[0, 1], [2, 3], [0, 0]])),
                          ValueError, r"^block_table: expected shape \(2, n\)"),
    "block_table rank": (lambda rng: dict(block_table=int32_array([0, 1])), ValueError, "^block_table"),
    "cache_seqlens dtype": (lambda rng: dict(cache_seqlens=_rand(rng, (2,), "float32")),
                            TypeError, "^cache_seqlens"),
    "cache_seqlens batch": (lambda rng: dict(cache_seqlens=int32_array([5, 3, 1])), ValueError,
                            r"^cache_seqlens: expected shape \(2,\)"),
    "metadata columns": (lambda rng: dict(tile_scheduler_metadata=int32_array(np.zeros((2, 7)))),
                         ValueError, r"^tile_scheduler_metadata: expected shape \(n, 8\)"),
    "metadata dtype": (lambda rng: dict(tile_scheduler_metadata=int32_array(np.zeros((2, 8)), np.int64)),
                       TypeError, "^tile_scheduler_metadata"),
    "metadata empty": (lambda rng: dict(tile_scheduler_metadata=int32_array(np.zeros((0, 8)))),
                       ValueError, "^tile_scheduler_metadata"),
    "num_splits of another batch": (lambda rng: dict(num_splits=int32_array([0, 1])), ValueError,
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
    "topk_length without indices": (lambda rng: dict(topk_length=int32_array([1, 1])),
                                    NotImplementedError, "^topk_length"),
    "attention sink shape": (lambda rng: dict(attn_sink=_rand(rng, (3,), "float32")),
                             ValueError, r"^attn_sink: expected shape \(2,\)"),
    "attention sink dtype": (lambda rng: dict(attn_sink=_rand(rng, (2,))), TypeError,
                             "^attn_sink: expected float32"),
    "metadata without num_splits": (lambda rng: dict(num_splits=None), ValueError,
                                    "^tile_scheduler_metadata, num_splits"),
}


@pytest.mark.parametrize("case", list(BAD_MLA))
def test_mla_decode_refuses_bad_input_before_launch(case, rng):
    good = mla_arguments(rng)
    out = nan_like(randn(rng, (2, 1, 2, 8), "float16"))
    make, exc, words = BAD_MLA[case]
    with pytest.raises(exc, match=words):
        nf.flash_mla_with_kvcache(**{**good, **make(rng)}, out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


def test_mla_decode_refuses_wrong_out_buffer(rng):
    with pytest.raises(ValueError, match="^out"):
        nf.flash_mla_with_kvcache(**mla_arguments(rng), out=nan_like(randn(rng, (2, 1, 2, 16),
                                                                       "float16")))


@pytest.mark.parametrize("args, exc, words", [
    ((int32_array([5, 3], np.int64), 2, 1), TypeError, "^cache_seqlens: expected int32"),
    ((int32_array([[5, 3]]), 2, 1), ValueError, "^cache_seqlens"),
    ((int32_array([5, 3]), 0, 1), ValueError, "^num_q_tokens_per_head_k"),
    ((int32_array([5, 3]), 2, 0), ValueError, "^num_heads_k"),
    ((int32_array([5, 3]), 2, 2, 3), ValueError, "^num_heads_q"),
    ((int32_array([5, 3]), 2, 2, None, True), NotImplementedError, "^is_fp8_kvcache"),
    ((int32_array([5, 3]), 2, 2, None, False, 64), ValueError, "^num_heads_q: required"),
    ((int32_array([5, 3]), 3, 1, 2, False, 64), ValueError, "^num_q_tokens_per_head_k"),
    ((int32_array([5, 3]), 2, 1, 2, False, 0), ValueError, "^topk"),
])
def test_mla_metadata_refuses_bad_input(args, exc, words):
    with pytest.raises(exc, match=words):
        nf.get_mla_metadata(*args)


def sparse_arguments(rng, fp8=False):
    """Good arguments of a small sparse decode: b 2, s_q 2, h_q 2, h_kv 1, topk 5; d 16 and
    head_dim_v 8 in float16, or DeepSeek-V3.2's FP8 rows."""
    if fp8:
        q = to_device(randn(rng, (2, 2, 2, 576), "bfloat16"))
        k_cache = to_device(np.zeros((4, 4, 1, 656), np.uint8).view(ml_dtypes.float8_e4m3fn))
    else:
        q, k_cache = (to_device(randn(rng, s, "float16")) for s in ((2, 2, 2, 16), (4, 4, 1, 16)))
    return dict(q=q, k_cache=k_cache, block_table=None, cache_seqlens=None,
                head_dim_v=512 if fp8 else 8, is_fp8_kvcache=fp8,
                indices=int32_array(rng.integers(-1, 16, (2, 2, 5))))


BAD_SPARSE = {
    "causal": (False, dict(causal=True), ValueError, "^causal: a sparse decode"),
    "indices shape": (False, lambda a: dict(indices=int32_array(np.zeros((2, 1, 5)))), ValueError,
                      r"^indices: expected shape \(2, 2, n\)"),
    "indices dtype": (False, lambda a: dict(indices=int32_array(np.zeros((2, 2, 5)), np.int64)),
                      TypeError, "^indices: expected int32"),
    "topk_length shape": (False, lambda a: dict(topk_length=int32_array([1, 2, 3])), ValueError,
                          r"^topk_length: expected shape \(2,\)"),
    "num_splits of the batch": (False, lambda a: dict(tile_scheduler_metadata=int32_array(
        np.zeros((2, 8))), num_splits=int32_array([0, 1, 2])), ValueError,
        r"^num_splits: expected shape \(5,\)"),
    "a 16-bit cache as FP8": (False, dict(is_fp8_kvcache=True), TypeError,
                              "^k_cache: is_fp8_kvcache takes float8_e4m3fn"),
    "is_fp8_kvcache not a bool": (False, dict(is_fp8_kvcache=1), TypeError, "^is_fp8_kvcache"),
    "FP8 rows with float16 q": (True, lambda a: dict(q=to_device(np.zeros((2, 2, 2, 576),
                                                                          np.float16))),
                                ValueError, "^q: DeepSeek-V3.2's FP8 cache is read with bfloat16"),
    "FP8 rows of 576 bytes": (True, lambda a: dict(k_cache=to_device(np.zeros(
        (4, 4, 1, 576), np.uint8).view(ml_dtypes.float8_e4m3fn))), ValueError,
        "^k_cache: expected rows of one kv head of 656 bytes"),
    "FP8 head_dim_v": (True, dict(head_dim_v=500), ValueError, "^head_dim_v: DeepSeek-V3.2"),
    "backend tc, head dim not /16": (
        False, lambda a: dict(q=to_device(np.zeros((2, 2, 2, 24), np.float16)),
                              k_cache=to_device(np.zeros((4, 4, 1, 24), np.float16)),
                              backend="tc"), ValueError, "^backend: .*multiples of 16"),
}


@pytest.mark.parametrize("case", list(BAD_SPARSE))
def test_sparse_decode_refuses_bad_input_before_launch(case, rng):
    fp8, change, exc, words = BAD_SPARSE[case]
    good = sparse_arguments(rng, fp8)
    out = nan_like(randn(rng, (2, 2, 2, good["head_dim_v"]), "bfloat16" if fp8 else "float16"))
    with pytest.raises(exc, match=words):
        nf.flash_mla_with_kvcache(**{**good, **(change(good) if callable(change) else change)},
                                  out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


def test_window_size_as_the_kernels_take_it():
    from numba_flash.validate import WINDOW_UNBOUNDED as BIG, window

    assert window((-1, -1), False) is None and window((-1, -1), True) is None
    assert window((-1, 7), True) is None  # causal already bounds the right side
    assert window((4, 2), False) == (4, 2)
    assert window((4, 2), True) == (4, 0)  # causal is right = 0
    assert window((-1, 3), False) == (BIG, 3)
    assert window((5, -1), False) == (5, BIG)
    assert window((np.int64(0), 0), False) == (0, 0)
    assert window((1 << 40, 0), False) == (BIG, 0)
    for bad, exc in (((1, 2, 3), TypeError), ((1.0, 2), TypeError), ((True, 2), TypeError),
                     (7, TypeError), ((-2, 0), ValueError)):
        with pytest.raises(exc, match="^window_size"):
            window(bad, False)
