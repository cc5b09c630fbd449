"""kernels/problem.py: what validation records of a call, the sizes read from its arrays, the
options it carries, and the configs the specs derive from it."""

import pytest
from helpers import attention_problem, decode_problem

from numba_flash.kernels import naive, problem
from numba_flash.kernels.attention import AttentionConfig
from numba_flash.kernels.simt import backward as simt_backward
from numba_flash.kernels.tc import backward_wgmma, forward_wgmma


def test_an_attention_problem_reads_its_sizes_from_its_arrays_and_carries_no_option():
    p = attention_problem(40, "bfloat16", causal=True)
    assert isinstance(p, problem.Attention)
    assert (p.fmt, p.head_dim, p.causal, p.scale) == ("bfloat16", 40, True, 40 ** -0.5)
    assert p.options() == frozenset() and p.aligned()
    assert not attention_problem(40, offset=1).aligned()
    every = p._replace(**{name: 1 for name in problem.Attention.OPTIONS})
    assert every.options() == set(problem.Attention.OPTIONS)


def test_each_attention_spec_derives_its_config_from_the_problem():
    p = attention_problem(72, "float16", causal=True)
    want = AttentionConfig(72, True, "float16")
    for spec in (forward_wgmma.SPEC, backward_wgmma.DKDV, backward_wgmma.DQ, simt_backward.DQ):
        assert spec.config(p) == want, spec.name
    assert simt_backward.PREPROCESS.config(p) == want._replace(causal=False)
    assert naive.SOFTMAX.config(p) == naive.Config(True, "float16")


@pytest.mark.parametrize("rows, page, offset", [(64, 64, 0), (3, 16, 1)])
def test_a_decode_problem_reads_rows_pages_and_alignment(rows, page, offset):
    p = decode_problem(d=64, dv=32, rows=rows, page=page, offset=offset)
    assert isinstance(p, problem.Decode)
    assert (p.q_rows, p.head_dim, p.head_dim_v, p.page) == (rows, 64, 32, page)
    assert p.aligned == p.cache_aligned == (offset == 0)
    assert not p.masked and not p._replace(causal=True).masked  # one query token
    assert p.options() == frozenset()
    assert p._replace(attn_sink=1, indices=1).options() == {"attn_sink", "indices"}
