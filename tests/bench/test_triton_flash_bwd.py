"""bench/triton_kernels/flash_bwd.py against the float64 reference gradients (GPU; else Triton's
interpreter on the CPU with tiny shapes, float16 only)."""

import pytest

from numba_flash import reference as ref
from helpers import assert_close_rule, to_host
from triton_cases import ATTENTION_GPU, pick

# (B, Sq, Sk, Hq, Hk, D, causal, dtype, config) as in triton_cases.ATTENTION_GPU; a config is the
# tiles of the dK/dV and of the dQ kernel.
CASES_CPU = [
    (1, 5, 7, 2, 1, 16, False, "float16", None),
    (2, 70, 33, 2, 2, 24, True, "float16", ((16, 32, 4, 1), (32, 16, 4, 1))),  # rows with no key
    (1, 33, 130, 2, 1, 64, True, "float16", ((32, 32, 4, 1), (16, 64, 4, 1))),
    (1, 130, 40, 4, 2, 40, True, "float16", ((16, 16, 4, 1), (32, 32, 4, 1))),  # GQA: dK, dV sum
]
CASES = pick(CASES_CPU, ATTENTION_GPU)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_flash_bwd_matches_reference(triton_kernels, torch_device, case):
    torch, device = torch_device
    B, Sq, Sk, Hq, Hk, D, causal, dtype, config = case
    fwd, bwd = triton_kernels("flash_fwd"), triton_kernels("flash_bwd")
    dt = getattr(torch, dtype)
    q, dout = (torch.randn(B, Sq, Hq, D, device=device).to(dt) for _ in range(2))
    k, v = (torch.randn(B, Sk, Hk, D, device=device).to(dt) for _ in range(2))
    out, lse = fwd.flash_fwd(q, k, v, causal=causal)
    grads = bwd.flash_bwd(dout, q, k, v, out, lse, causal=causal, config=config)
    hd, hq, hk, hv = (to_host(x) for x in (dout, q, k, v))
    refs = ref.attention_bwd_ref(hd, hq, hk, hv, causal)
    lowps = ref.attention_bwd_lowp(hd, hq, hk, hv, causal)
    for name, g, r, lp, like in zip(("dq", "dk", "dv"), grads, refs, lowps, (q, k, v)):
        assert g.dtype == dt and g.shape == like.shape, name
        assert_close_rule(to_host(g), r, lp, dtype, factor=3.0, what=name)


def test_deterministic(triton_kernels, torch_device):
    torch, device = torch_device
    fwd, bwd = triton_kernels("flash_fwd"), triton_kernels("flash_bwd")
    q, k, v, dout = (torch.randn(1, 40, 4, 32, device=device).half() for _ in range(4))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: dk, dv sum two query heads
    out, lse = fwd.flash_fwd(q, k, v, causal=True)
    first = bwd.flash_bwd(dout, q, k, v, out, lse, causal=True)
    second = bwd.flash_bwd(dout, q, k, v, out, lse, causal=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
