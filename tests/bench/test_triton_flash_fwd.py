"""bench/triton_kernels/flash_fwd.py against the float64 reference (GPU; else Triton's interpreter on the
CPU with tiny shapes, float16 only: the interpreter computes tl.dot on bfloat16 wrongly)."""

import pytest

from numba_flash import reference as ref
from helpers import assert_close_rule, assert_lse, to_host
from triton_cases import ATTENTION_GPU, pick

# (B, Sq, Sk, Hq, Hk, D, causal, dtype, config) as in triton_cases.ATTENTION_GPU.
CASES_CPU = [
    (1, 5, 7, 2, 1, 16, False, "float16", None),
    (2, 70, 33, 2, 2, 24, True, "float16", (32, 16, 4, 1)),    # Sq > Sk: rows with no key
    (1, 33, 130, 2, 1, 64, True, "float16", (32, 32, 4, 1)),   # full, diagonal and skipped tiles
    (1, 130, 130, 1, 1, 40, True, "float16", None),
    (1, 20, 140, 1, 1, 72, False, "float16", None),             # the D <= 128 tiles, padded D
]
CASES = pick(CASES_CPU, ATTENTION_GPU + [(1, 1, 4097, 2, 2, 96, False, "float16", None)])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_flash_fwd_matches_reference(triton_kernels, torch_device, case):
    torch, device = torch_device
    B, Sq, Sk, Hq, Hk, D, causal, dtype, config = case
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(s, device=device).to(dt)
               for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    out, lse = triton_kernels("flash_fwd").flash_fwd(q, k, v, causal=causal, config=config)
    hq, hk, hv = to_host(q), to_host(k), to_host(v)
    ro, rl = ref.attention_fwd_ref(hq, hk, hv, causal)
    assert out.dtype == dt and tuple(out.shape) == (B, Sq, Hq, D)
    assert_close_rule(to_host(out), ro, ref.attention_lowp(hq, hk, hv, causal), dtype)
    assert_lse(to_host(lse), rl)


def test_packed_qkv_views(triton_kernels, torch_device):
    torch, device = torch_device
    fwd = triton_kernels("flash_fwd")
    qkv = torch.randn(2, 40, 3, 2, 32, device=device).half()
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out, lse = fwd.flash_fwd(q, k, v, causal=True, softmax_scale=0.2)
    hq, hk, hv = to_host(q), to_host(k), to_host(v)
    ro, rl = ref.attention_fwd_ref(hq, hk, hv, True, 0.2)
    assert_close_rule(to_host(out), ro, ref.attention_lowp(hq, hk, hv, True, 0.2), "float16")
    assert_lse(to_host(lse), rl)


def test_bad_inputs_are_refused(triton_kernels, torch_device):
    torch, device = torch_device
    fwd = triton_kernels("flash_fwd")
    q = torch.randn(1, 4, 2, 16, device=device).half()
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        fwd.flash_fwd(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="head dim"):
        fwd.flash_fwd(q[..., :12], q[..., :12], q[..., :12])
    with pytest.raises(ValueError, match="k: shape"):
        fwd.flash_fwd(q, q[:, :, :1].expand(1, 4, 3, 16), q[:, :, :1].expand(1, 4, 3, 16))
