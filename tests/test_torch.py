"""numba_flash.torch: ``loss.backward()`` through the flash kernels (skipped without torch)."""

import numpy as np
import pytest

from numba_flash import reference as ref
from helpers import SIMULATOR, assert_close_rule, randn, to_host

torch = pytest.importorskip("torch")
from numba_flash.torch import flash_attn_func  # noqa: E402  (needs torch)

DEVICE = "cpu" if SIMULATOR else "cuda"  # the simulator takes CPU tensors


def _leaf(x):
    """A host array as a torch leaf tensor that requires grad (bfloat16 through its bits)."""
    t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16 if x.itemsize == 2 else x.dtype))
    if x.dtype.name == "bfloat16":
        t = t.view(torch.bfloat16)
    elif x.dtype == np.float16:
        t = t.view(torch.float16)
    return t.to(DEVICE).requires_grad_()


@pytest.mark.parametrize("B, Sq, Sk, Hq, Hk, D, causal, fmt", [
    (1, 5, 9, 2, 1, 16, True, "bfloat16"),
    (1, 6, 4, 1, 1, 8, False, "float32"),
] if SIMULATOR else [
    (2, 1000, 1000, 8, 2, 64, True, "bfloat16"),
    (1, 513, 777, 4, 4, 128, False, "float16"),
])
def test_loss_backward_matches_reference(B, Sq, Sk, Hq, Hk, D, causal, fmt, rng):
    host = [randn(rng, s, fmt) for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D))]
    dout = randn(rng, (B, Sq, Hq, D), "float32")
    q, k, v = (_leaf(x) for x in host)
    out = flash_attn_func(q, k, v, causal=causal, backend="simt")
    assert out.requires_grad and out.dtype == q.dtype and out.device == q.device
    (out.float() * torch.from_numpy(dout).to(DEVICE)).sum().backward()
    dout = dout.astype(host[0].dtype)  # the gradient reaching the kernel, in the inputs' dtype
    want = ref.attention_bwd_ref(dout, *host, causal)
    lowp = ref.attention_bwd_lowp(dout, *host, causal)
    for name, t, w, lp in zip(("dq", "dk", "dv"), (q, k, v), want, lowp):
        assert t.grad is not None and t.grad.dtype == t.dtype, name
        assert_close_rule(to_host(t.grad), w, lp, fmt, factor=3.0, what=name)


def test_sum_loss_has_zero_stride_gradient(rng):
    """``out.sum()`` hands backward ones expanded with zero strides: made contiguous first."""
    host = [randn(rng, (1, 4, 1, 8), "float32") for _ in range(3)]
    q, k, v = (_leaf(x) for x in host)
    flash_attn_func(q, k, v, backend="simt").sum().backward()
    want = ref.attention_bwd_ref(np.ones_like(host[0]), *host)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert_close_rule(to_host(t.grad), w, None, "float32", what=name)
