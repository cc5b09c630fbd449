"""torch_plans.py: a forward on torch tensors whose signature was seen runs from its plan."""

import numpy as np
import pytest

import numba_flash as nf
from helpers import SIMULATOR, randn


@pytest.mark.skipif(SIMULATOR, reason="forward plans serve torch CUDA tensors on a GPU")
def test_a_seen_forward_signature_runs_from_its_plan_with_the_same_results(rng, monkeypatch):
    """The second call of a torch signature is served by its plan (no checks run): bitwise what
    the first call gave, right for new data at new addresses; a view off 16 bytes under
    ``auto`` is a new signature (the CUDA-core kernel), and a forced tile entry is planned
    again."""
    torch = pytest.importorskip("torch")
    from numba_flash import backends, torch_plans, validate
    from numba_flash.runtime import device
    from numba_flash import reference as ref

    checked = []
    check = validate.attention
    monkeypatch.setattr(validate, "attention", lambda *a: checked.append(1) or check(*a))

    def inputs(offset=0):
        x = [torch.from_numpy(randn(rng, (2, 70, 4, 64 + offset), "float32")).half().cuda()
             for _ in range(3)]
        return [t[..., offset:] for t in x]

    def expect(o, lse, q, k, v):
        want, want_lse = ref.attention_fwd_ref(*(t.cpu().numpy() for t in (q, k, v)),
                                               causal=True)
        np.testing.assert_allclose(o.float().cpu().numpy(), want, atol=2e-3)
        np.testing.assert_allclose(lse.cpu().numpy(), want_lse, atol=1e-3)

    torch_plans._plans.clear()
    q, k, v = inputs()
    first = nf.flash_attn_fwd(q, k, v, causal=True)
    again = nf.flash_attn_fwd(q.clone(), k.clone(), v.clone(), causal=True)
    assert len(checked) == 1 and len(torch_plans._plans) == 1
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    q2, k2, v2 = inputs()
    expect(*nf.flash_attn_fwd(q2, k2, v2, causal=True), q2, k2, v2)
    assert len(checked) == 1
    qo, ko, vo = inputs(offset=1)  # 2 bytes into wider rows: not 16-byte aligned
    expect(*nf.flash_attn_fwd(qo, ko, vo, causal=True), qo, ko, vo)
    assert len(checked) == 2 and len(torch_plans._plans) == 2
    spec = backends.forward_spec("tc", device.current())
    entry = spec.entry(spec.Config(64, True, "float16"), device.current())
    with spec.forcing(entry):  # the table's entry, but forced: planned again
        expect(*nf.flash_attn_fwd(q2, k2, v2, causal=True), q2, k2, v2)
    assert len(checked) == 3
