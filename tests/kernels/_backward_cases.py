"""What every backward is tested with: fresh inputs and the 3x tolerance rule of docs/design.md
against the float64 reference and a same-dtype naive backward (tests/kernels/simt and tc)."""

from numba_flash import reference as ref
from helpers import assert_close_rule, randn, to_host


def inputs(rng, B, Sq, Sk, Hq, Hk, D, fmt, scale=1.0):
    """Fresh host dout, q, k, v."""
    shapes = ((B, Sq, Hq, D), (B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D))
    return [randn(rng, s, fmt, scale) for s in shapes]


def check_gradients(grads, dout, q, k, v, causal, fmt, softmax_scale=None):
    """dq, dk, dv against the reference: shapes, dtypes and the 3x rule."""
    want = ref.attention_bwd_ref(dout, q, k, v, causal, softmax_scale)
    lowp = ref.attention_bwd_lowp(dout, q, k, v, causal, softmax_scale)
    for name, got, w, lp, like in zip(("dq", "dk", "dv"), grads, want, lowp, (q, k, v)):
        assert to_host(got).shape == like.shape and to_host(got).dtype == like.dtype, name
        assert_close_rule(got, w, lp, fmt, factor=3.0, what=name)
