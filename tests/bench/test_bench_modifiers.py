"""bench/bench_modifiers.py: the options it times and the float32 reference it checks them
against, which must agree with numba_flash.reference's definitions (the timed run itself needs a
GPU)."""

import numpy as np
import pytest

from numba_flash import reference as ref

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["plain", "softcap", "alibi", "sink"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_check_is_the_definition(bench_module, rng, name, causal):
    bm = bench_module("bench_modifiers")
    q, k, v = (rng.standard_normal((2, 9, 4, 16)).astype(np.float32) * 3 for _ in range(3))
    kw = bm.option_kwargs(name, 4, "cpu")
    got = bm.reference_out(*(torch.from_numpy(x) for x in (q, k, v)), causal, kw)
    host = {key: val.numpy() if hasattr(val, "numpy") else val for key, val in kw.items()}
    bias = ref.alibi_bias(host["alibi_slopes"], 9, 9) if "alibi_slopes" in host else None
    want, _ = ref.attention_fwd_ref(q[:1], k[:1], v[:1], causal, softcap=host.get("softcap"),
                                    bias=bias, sink=host.get("learnable_sink"))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


def test_parse_args(bench_module):
    a = bench_module("bench_modifiers").parse_args([])
    assert (a.modes, a.seqlens, a.head_dims, a.dtypes, a.causal) == (
        "fwd,bwd", "4096,16384", "64,128", "bfloat16", "1")
    assert (a.tokens, a.hidden, a.repeats) == (32768, 2048, 3)
