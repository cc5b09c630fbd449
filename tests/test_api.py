"""Bad input is refused before any launch, with an error naming the argument; nothing is written."""

import numpy as np
import pytest

import numba_flash as nf
from helpers import SIMULATOR, nan_like, randn, to_device, to_host


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
    }
    return good, cases


@pytest.mark.parametrize("case", ["rank", "batch", "kv shapes differ", "head dim differs",
                                  "heads not a multiple", "head dim not /8", "head dim > 256",
                                  "dtype mismatch", "integer dtype", "strided last dim", "not an array"])
def test_forward_refuses_bad_input_before_launch(case):
    rng = np.random.default_rng()
    good, cases = _bad_forward_inputs(rng)
    kwargs, exc, words = cases[case]
    out = nan_like(randn(rng, (1, 5, 2, 16), "float16"))
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(kwargs["q"], kwargs["k"], kwargs["v"], out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all(), "a refused call wrote to out"


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(softmax_scale="0.1"), ValueError, "softmax_scale"),
    (dict(causal="yes"), TypeError, "causal"),
])
def test_forward_refuses_bad_options(kwargs, exc, words):
    q, k, v = _qkv(np.random.default_rng())
    with pytest.raises(exc, match=words):
        nf.flash_attn_fwd(q, k, v, **kwargs)


def test_forward_refuses_wrong_out_buffer():
    rng = np.random.default_rng()
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="out"):
        nf.flash_attn_fwd(q, k, v, out=nan_like(randn(rng, (1, 5, 2, 8), "float16")))
    with pytest.raises(ValueError, match="out"):
        nf.flash_attn_fwd(q, k, v, out=nan_like(randn(rng, (1, 5, 2, 16), "float32")))


@pytest.mark.skipif(SIMULATOR, reason="host arrays are the accepted input under the simulator")
def test_host_array_on_a_gpu_is_a_type_error():
    rng = np.random.default_rng()
    q, k, v = _qkv(rng)
    with pytest.raises(TypeError, match="q: got a host NumPy array"):
        nf.flash_attn_fwd(randn(rng, (1, 5, 2, 16), "float16"), k, v)
