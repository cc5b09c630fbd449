"""bench/triton_kernels/mla_decode.py against numba_flash.reference.mla_decode_ref on adversarial paged
data (shuffled block table, NaN in every unused cache slot, a huge sentinel in unused table
entries, lengths 0 and not multiples of the page). GPU; else Triton's interpreter on the CPU,
float16 only, with small latent widths."""

import numpy as np
import pytest

from numba_flash import reference as ref
from helpers import to_host
from triton_cases import pick

SENTINEL = 1 << 30

# (s_q, h_q, h_kv, d, dv, page, seqlens, causal, num_splits, dtype)
CASES_CPU = [
    (2, 8, 2, 80, 64, 16, [0, 1, 37, 100], True, 3, "float16"),   # split + combine, GQA
    (1, 8, 1, 80, 64, 16, [5, 0, 64, 100], False, 1, "float16"),  # one split: direct store
    (2, 4, 1, 80, 64, 7, [3, 50], True, None, "float16"),         # page 7, default splits
    (1, 16, 1, 576, 512, 64, [70, 129], False, 2, "float16"),     # DeepSeek's widths
]
CASES_GPU = [
    (1, 128, 1, 576, 512, 64, [4096, 0, 1, 777, 3000, 64, 65, 10000], False, None, "bfloat16"),
    (2, 16, 1, 576, 512, 64, [4096, 0, 1, 777, 3000, 64, 65, 10000], True, None, "bfloat16"),
    (2, 128, 1, 576, 512, 64, [513, 2, 300, 4000], True, 7, "float16"),
    (1, 16, 1, 576, 512, 64, [5000, 33], False, 1, "bfloat16"),
    (2, 32, 2, 576, 512, 16, [200, 1000, 0], True, 4, "float16"),
]

CASES = pick(CASES_CPU, CASES_GPU)


def paged_inputs(torch, device, b, s_q, h_q, h_kv, d, page, seqlens, dt):
    """Pages in shuffled order with two spare pages; slots past a sequence's end and every
    page no sequence uses hold NaN; table entries past a sequence's pages hold SENTINEL."""
    used = [-(-n // page) for n in seqlens]
    width = max(max(used), 1) + 1
    n_blocks = sum(used) + 2
    k_cache = torch.randn(n_blocks, page, h_kv, d).to(dt)
    table = torch.full((b, width), SENTINEL, dtype=torch.int32)
    order = torch.randperm(n_blocks).to(torch.int32)
    taken = 0
    live = torch.zeros(n_blocks, page, dtype=torch.bool)
    for i, (n, u) in enumerate(zip(seqlens, used)):
        table[i, :u] = order[taken:taken + u]
        for j in range(u):
            live[order[taken + j], :min(page, n - j * page)] = True
        taken += u
    k_cache[~live] = float("nan")
    q = torch.randn(b, s_q, h_q, d).to(dt)
    lens = torch.tensor(seqlens, dtype=torch.int32)
    return (x.to(device) for x in (q, k_cache, table, lens))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:6] + c[7:])))
def test_mla_decode_matches_reference(triton_kernels, torch_device, case):
    torch, device = torch_device
    s_q, h_q, h_kv, d, dv, page, seqlens, causal, splits, dtype = case
    mla = triton_kernels("mla_decode")
    dt = getattr(torch, dtype)
    q, k_cache, table, lens = paged_inputs(torch, device, len(seqlens), s_q, h_q, h_kv, d, page,
                                           seqlens, dt)
    out, lse = mla.mla_decode(q, k_cache, table, lens, dv, causal=causal, num_splits=splits)
    host = lambda t: to_host(t).astype(np.float32)  # noqa: E731
    ref_out, ref_lse = ref.mla_decode_ref(host(q), host(k_cache), to_host(table), to_host(lens), dv,
                                          causal=causal)
    assert out.dtype == dt and tuple(out.shape) == (len(seqlens), s_q, h_q, dv)
    got = host(out)
    assert not np.isnan(got).any()
    assert np.abs(got - ref_out).max() < (2e-2 if dtype == "bfloat16" else 3e-3)
    got_lse = to_host(lse)
    assert np.array_equal(np.isposinf(got_lse), np.isposinf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(got_lse[fin] - ref_lse[fin]).max() < 1e-3


def test_bad_inputs_are_refused(triton_kernels, torch_device):
    torch, device = torch_device
    mla = triton_kernels("mla_decode")
    q, k_cache, table, lens = paged_inputs(torch, device, 1, 1, 4, 1, 80, 16, [5], torch.float16)
    with pytest.raises(ValueError, match="powers of two"):
        mla.mla_decode(q, k_cache, table, lens, 48)
    with pytest.raises(TypeError, match="int32"):
        mla.mla_decode(q, k_cache, table.long(), lens, 64)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        mla.mla_decode(q.float(), k_cache.float(), table, lens, 64)
