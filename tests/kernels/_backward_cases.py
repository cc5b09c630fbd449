"""What every backward is tested with: fresh inputs and the 3x tolerance rule of docs/design.md
against the float64 reference and a same-dtype naive backward (tests/kernels/simt and tc)."""

import numpy as np

import numba_flash as nf
from numba_flash import reference as ref
from helpers import SIMULATOR, assert_close_rule, randn, to_device, to_host
from kernels._window_cases import modifier_options


def inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt, scale=1.0):
    """Fresh host dout, q, k, v."""
    shapes = ((B, Sq, Hq, D), (B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D))
    return [randn(rng, s, fmt, scale) for s in shapes]


def library_backward(backend, forward_backend="auto"):
    """``backward(dout, q, k, v, causal, softmax_scale=None, dq=None, dk=None, dv=None,
    **options)``: host inputs through the library's forward (``forward_backend``) and backward
    (``backend``), with ``options`` (window_size, softcap, alibi_slopes, learnable_sink; host
    arrays moved to the device) in both; returns what the backward returns."""

    def backward(dout, q, k, v, causal, softmax_scale=None, dq=None, dk=None, dv=None,
                 **options):
        dev = [to_device(x) for x in (dout, q, k, v)]
        options = {name: to_device(x) if isinstance(x, np.ndarray) else x
                   for name, x in options.items()}
        out, lse = nf.flash_attn_fwd(*dev[1:], causal=causal, softmax_scale=softmax_scale,
                                     backend=forward_backend, **options)
        return nf.flash_attn_bwd(*dev, out, lse, causal=causal, softmax_scale=softmax_scale,
                                 backend=backend, dq=dq, dk=dk, dv=dv, **options)

    return backward


def check_gradients(grads, dout, q, k, v, causal, fmt, softmax_scale=None, mask=None,
                    softcap=None, bias=None, sink=None):
    """dq, dk, dv against the reference: shapes, dtypes and the 3x rule (``mask``: the keys
    each query sees, in place of ``causal``; ``softcap``: the scores' cap; ``bias``: ALiBi's;
    ``sink``: the sinks, whose gradient ``grads`` then holds fourth)."""
    want = ref.attention_bwd_ref(dout, q, k, v, causal, softmax_scale, mask, softcap, bias, sink)
    lowp = ref.attention_bwd_lowp(dout, q, k, v, causal, softmax_scale, mask, softcap, bias,
                                  sink)
    assert len(grads) == (3 if sink is None else 4)
    if sink is not None:
        check_sink_gradient(grads[3], want[3], dout, q, k, v, causal, softmax_scale, mask,
                            softcap, bias, sink)
    for name, got, w, lp, like in zip(("dq", "dk", "dv"), grads, want, lowp, (q, k, v)):
        assert to_host(got).shape == like.shape and to_host(got).dtype == like.dtype, name
        assert_close_rule(got, w, lp, fmt, factor=3.0, what=name)


# Sliding windows, (B, Sq, Sk, Hq, Hk, D, causal, fmt, window_size): both sides across several
# tiles of both kernels, causal with a left side, a right side alone; rows whose window holds no
# key (Sq > Sk) and GQA.
WINDOW_CASES_SIM = [
    (1, 37, 45, 2, 1, 16, False, "bfloat16", (5, 3)),
    (1, 20, 33, 1, 1, 16, True, "float16", (4, -1)),
    (1, 40, 9, 1, 1, 16, False, "bfloat16", (-1, 2)),
]
WINDOW_CASES_GPU = [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", (256, -1)),
    (1, 777, 1531, 4, 4, 128, False, "float16", (100, 50)),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16", (0, -1)),
]
WINDOW_CASES = WINDOW_CASES_SIM if SIMULATOR else WINDOW_CASES_GPU


def window_id(case):
    return "-".join(map(str, case[:-1])) + f"-w{case[-1][0]},{case[-1][1]}"


def check_window(rng, backward, case):
    """A windowed forward and backward (``backward`` takes ``window_size``) against the
    reference masked by ``reference.window_mask``."""
    B, Sq, Sk, Hq, Hk, D, causal, fmt, window = case
    dout, q, k, v = inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt)
    grads = backward(dout, q, k, v, causal, window_size=window)
    check_gradients(grads, dout, q, k, v, causal, fmt,
                    mask=ref.window_mask(Sq, Sk, window, causal))


# Softcaps, (B, Sq, Sk, Hq, Hk, D, causal, fmt, softcap, scale): inputs times ``scale`` so
# that the scores pass the cap (tanh near saturation: the 1 - tanh^2 of the chain rule small).
SOFTCAP_CASES = [
    (1, 37, 45, 2, 1, 16, True, "bfloat16", 5.0, 1.0),
    (1, 9, 23, 1, 1, 16, False, "float16", 2.0, 3.0),
] if SIMULATOR else [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", 30.0, 4.0),
    (1, 777, 1531, 4, 4, 128, False, "float16", 50.0, 1.0),
]


def softcap_id(case):
    return "-".join(map(str, case[:-2])) + f"-cap{case[-2]}x{case[-1]}"


def check_softcap(rng, backward, case):
    """A capped forward and backward (``backward`` takes ``softcap``) against the reference."""
    B, Sq, Sk, Hq, Hk, D, causal, fmt, softcap, scale = case
    dout, q, k, v = inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt, scale)
    grads = backward(dout, q, k, v, causal, softcap=softcap)
    check_gradients(grads, dout, q, k, v, causal, fmt, softcap=softcap)


def check_sink_gradient(got, want, dout, q, k, v, causal, softmax_scale, mask, softcap, bias,
                        sink):
    """dsink against the float64 one. It sums ``P_sink D_i`` over every row, and D_i = rowsum(dO
    O) comes from the stored (rounded) out: the bound is 3x what the rows' terms move by when
    out is the textbook one in the inputs' dtype (``reference.attention_lowp``), summed without
    cancellation, plus float32's rounding of the sum."""
    got = to_host(got)
    assert got.shape == want.shape and got.dtype == np.float32
    o, lse = ref.attention_fwd_ref(q, k, v, causal, softmax_scale, mask, softcap, bias, sink)
    o_low = ref.attention_lowp(q, k, v, causal, softmax_scale, mask, softcap, bias, sink)
    p_sink = np.exp(sink.astype(np.float64)[None, :, None] - lse)

    def terms(out):
        return p_sink * (ref.to_float64(dout) * out).sum(axis=-1).transpose(0, 2, 1)

    lowp_err = np.abs(terms(o_low) - terms(o)).sum(axis=(0, 2))
    bound = 3 * lowp_err + 1e-5 * np.abs(terms(o)).sum(axis=(0, 2)) + 1e-6
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"dsink: error {err} over the bound {bound}"


# Masks and modifiers together, (B, Sq, Sk, Hq, Hk, D, causal, fmt, options): ALiBi (per head
# and per batch entry) and sinks (kernels/_window_cases.modifier_options), alone and with a
# window and a softcap; the sink's gradient (flash_attn_bwd's fourth output) with them.
MODIFIER_CASES = [
    (2, 37, 45, 2, 1, 16, True, "bfloat16", "alibi batched"),
    (1, 20, 33, 2, 1, 16, False, "float16", "sink"),
    (1, 33, 20, 2, 2, 16, True, "bfloat16", "all"),
] if SIMULATOR else [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16", "alibi"),
    (1, 777, 1531, 4, 4, 128, False, "float16", "sink"),
    (1, 1531, 777, 4, 1, 128, True, "bfloat16", "all"),
]


def modifier_id(case):
    return "-".join(map(str, case[:-1])) + "-" + case[-1].replace(" ", "-")


def check_modifiers(rng, backward, case):
    """The forward and backward of ``case``'s options against the reference."""
    B, Sq, Sk, Hq, Hk, D, causal, fmt, _ = case
    options = modifier_options(rng, case)
    dout, q, k, v = inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt)
    grads = backward(dout, q, k, v, causal, **options)
    window = options.get("window_size", (-1, -1))
    slopes = options.get("alibi_slopes")
    check_gradients(grads, dout, q, k, v, causal, fmt,
                    mask=ref.window_mask(Sq, Sk, window, causal),
                    softcap=options.get("softcap"),
                    bias=None if slopes is None else ref.alibi_bias(slopes, Sq, Sk),
                    sink=options.get("learnable_sink"))


# Checks every backward family runs; ``backward(dout, q, k, v, causal, softmax_scale=None)``
# is the family's forward-then-backward through the library, returning (dq, dk, dv).

def check_bitwise_deterministic(rng, backward):
    B, Sq, Sk, Hq, Hk, D = (1, 9, 23, 2, 1, 16) if SIMULATOR else (2, 1000, 1200, 16, 2, 64)
    dout, q, k, v = inputs(rng, B, Sq, Sk, Hq, Hk, D, "bfloat16")
    first = [to_host(g) for g in backward(dout, q, k, v, True)]
    second = [to_host(g) for g in backward(dout, q, k, v, True)]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def check_large_logits(rng, backward, sign):
    """Scores around +-100, past float32's exp range: P must be recomputed as exp(S - lse), and
    at -100 (lse ~ -100) the zero-padded keys past Sk must be masked, not computed as
    exp(0 - lse) = inf (not causal: only the ragged-end mask hides them). The scores share one
    large offset, so the softmax is not saturated. float16 and the 3x rule: dq = dS K cancels
    that offset (rows of dS sum to 0), which no float32 kernel can match to the 1e-4 relative
    bound of float32 inputs."""
    B, Sq, Sk, H, D = (1, 9, 13, 1, 16) if SIMULATOR else (1, 600, 700, 2, 64)
    dout, q, k, v = inputs(rng, B, Sq, Sk, H, H, D, "float16")
    offset = rng.standard_normal(D)
    offset *= 10 / np.linalg.norm(offset)  # q . k = sign * 100 + O(3)
    q = (sign * offset + 0.2 * q.astype(np.float64)).astype(np.float16)
    k = (offset + 0.2 * k.astype(np.float64)).astype(np.float16)
    grads = backward(dout, q, k, v, False, softmax_scale=1.0)
    check_gradients(grads, dout, q, k, v, False, "float16", softmax_scale=1.0)


def check_rows_without_keys(rng, backward):
    """Causal with Sq > Sk: the first Sq - Sk queries see no key (lse = +inf): zero dq."""
    B, Sq, Sk, H, D = (1, 7, 3, 1, 8) if SIMULATOR else (1, 300, 100, 2, 64)
    dout, q, k, v = inputs(rng, B, Sq, Sk, H, H, D, "float16")
    grads = backward(dout, q, k, v, True)
    assert (to_host(grads[0])[:, :Sq - Sk].astype(np.float32) == 0).all()
    check_gradients(grads, dout, q, k, v, True, "float16")
