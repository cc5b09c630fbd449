"""numba_flash.torch: ``loss.backward()`` through the flash kernels, the ``torch.library``
operations (opcheck, their results against the float64 references) and a toy transformer trained
eagerly and under ``torch.compile(fullgraph=True)`` (skipped without torch).

The compiled runs use the ``aot_eager`` backend: it traces the fake implementations and the
registered autograd as Inductor does, but runs the graph without generating C++, which CI's
machine would have to compile for the CPU. Graph breaks are counted by ``torch._dynamo.explain``.
"""

import copy
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

from numba_flash import reference as ref
from numba_flash import scheduler
from helpers import (SIMULATOR, assert_close_rule, assert_lse, randn, run_without, to_host,
                     user_traceback)

torch = pytest.importorskip("torch")
import numba_flash.torch as nft  # noqa: E402  (needs torch)
from numba_flash.torch import flash_attn_func  # noqa: E402
from kernels._backward_cases import check_sink_gradient  # noqa: E402

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


def test_return_lse_matches_reference_and_out_keeps_its_gradient(rng):
    """``return_lse=True``: ``(out, lse)`` as ``numba_flash.flash_attn_func`` returns them; lse is
    not differentiable, and the gradients through ``out`` still match the reference (float32,
    causal GQA: the backward runs the CUDA-core kernels, quick on the simulator)."""
    B, Sq, Sk, Hq, Hk, D = 1, 5, 7, 2, 1, 8
    host = [randn(rng, s, "float32") for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D))]
    dout = randn(rng, (B, Sq, Hq, D), "float32")
    q, k, v = (_leaf(x) for x in host)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True, backend="simt")
    assert out.requires_grad and not lse.requires_grad and lse.shape == (B, Hq, Sq)
    want_out, want_lse = ref.attention_fwd_ref(*host, True)
    assert_close_rule(to_host(out), want_out, None, "float32")
    assert_lse(lse, want_lse)
    (out * _tensor(dout)).sum().backward()
    want = ref.attention_bwd_ref(dout, *host, True)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert_close_rule(to_host(t.grad), w, None, "float32", what=name)


def _varlen_inputs(rng, fmt="float32"):
    """Packed q (9 rows: sequences of 3 and 5, one row of none), k, v (7 rows), offsets."""
    host = [randn(rng, (rows, 2, 8), fmt) for rows in (9, 7, 7)]
    return host, np.array([0, 3, 8], np.int32), np.array([0, 4, 7], np.int32)


def _paged(packed, cu_k):
    """k and v of ``_varlen_inputs`` in pages of 2 keys, the table naming them in reverse."""
    keys = [(0, 2), (2, 4), (4, 6), (6, 7)]  # sequence 0: keys 0..3, sequence 1: keys 4..6
    pages = []
    for x in packed[1:]:
        p = np.zeros((4, 2, *x.shape[1:]), x.dtype)
        for i, (lo, hi) in enumerate(keys):
            p[3 - i, :hi - lo] = x[lo:hi]
        pages.append(_tensor(p))
    return pages, _tensor(np.array([[3, 2], [1, 0]], np.int32))


def test_paged_varlen_runs_forward_only_and_matches_the_packed_call(rng):
    packed, cu_q, cu_k = _varlen_inputs(rng)
    (k_pages, v_pages), table = _paged(packed, cu_k)
    q, k, v = (_leaf(x) for x in packed)
    cu = [_tensor(c) for c in (cu_q, cu_k)]
    with pytest.raises(NotImplementedError, match="^block_table: the backward"):
        nft.flash_attn_varlen_func(q, k_pages, v_pages, *cu, 5, 4, block_table=table)
    with torch.no_grad():
        paged = nft.flash_attn_varlen_func(q, k_pages, v_pages, *cu, 5, 4, causal=True,
                                           block_table=table, backend="simt")
    want = nft.flash_attn_varlen_func(q, k, v, *cu, 5, 4, causal=True, backend="simt")
    assert torch.equal(paged, want.detach())


def test_a_sliding_window_and_softcap_loss_backward_matches_reference(rng):
    host = [randn(rng, s, "bfloat16") for s in ((1, 9, 2, 16), (1, 12, 1, 16), (1, 12, 1, 16))]
    dout = randn(rng, (1, 9, 2, 16), "bfloat16")
    q, k, v = (_leaf(x) for x in host)
    out = flash_attn_func(q, k, v, causal=True, window_size=(3, -1), softcap=1.5,
                          backend="simt")
    (out.float() * torch.from_numpy(dout.astype(np.float32)).to(DEVICE)).sum().backward()
    mask = ref.window_mask(9, 12, (3, -1), causal=True)
    want = ref.attention_bwd_ref(dout, *host, mask=mask, softcap=1.5)
    lowp = ref.attention_bwd_lowp(dout, *host, mask=mask, softcap=1.5)
    for name, t, w, lp in zip(("dq", "dk", "dv"), (q, k, v), want, lowp):
        assert_close_rule(to_host(t.grad), w, lp, "bfloat16", factor=3.0, what=name)
    with pytest.raises(ValueError, match="^window_size"):
        flash_attn_func(q, k, v, window_size=(-3, 0))
    with pytest.raises(ValueError, match="^softcap"):
        flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(NotImplementedError, match="^dropout_p"):
        flash_attn_func(q, k, v, dropout_p=0.1)
    assert flash_attn_func(q, k, v, dropout_p=0.0).shape == q.shape


def test_alibi_and_a_learned_sink_train_through_autograd(rng):
    """gpt-oss's sinks as a leaf tensor: its gradient, with q's, k's and v's, from one loss."""
    host = [randn(rng, s, "float16") for s in ((1, 9, 2, 16), (1, 12, 1, 16), (1, 12, 1, 16))]
    dout = randn(rng, (1, 9, 2, 16), "float16")
    slopes = np.array([0.25, 0.0625], np.float32)
    sink_host = np.array([0.5, -1.0], np.float32)
    q, k, v = (_leaf(x) for x in host)
    sink = torch.from_numpy(sink_host).to(DEVICE).requires_grad_()
    out = flash_attn_func(q, k, v, causal=True, alibi_slopes=_tensor(slopes),
                          learnable_sink=sink, backend="simt")
    (out.float() * torch.from_numpy(dout.astype(np.float32)).to(DEVICE)).sum().backward()
    bias = ref.alibi_bias(slopes, 9, 12)
    want = ref.attention_bwd_ref(dout, *host, True, bias=bias, sink=sink_host)
    lowp = ref.attention_bwd_lowp(dout, *host, True, bias=bias, sink=sink_host)
    for name, t, w, lp in zip(("dq", "dk", "dv"), (q, k, v), want, lowp):
        assert_close_rule(to_host(t.grad), w, lp, "float16", factor=3.0, what=name)
    check_sink_gradient(sink.grad, want[3], dout, *host, True, None, None, None, bias,
                        sink_host)
    with pytest.raises(ValueError, match="^learnable_sink: expected shape"):
        flash_attn_func(q, k, v, learnable_sink=sink[:1])


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_loss_backward_matches_the_packed_reference(causal, rng):
    host, cu_q, cu_k = _varlen_inputs(rng)
    dout = randn(rng, host[0].shape, "float32")
    q, k, v = (_leaf(x) for x in host)
    cu = [torch.from_numpy(c).to(DEVICE) for c in (cu_q, cu_k)]
    window = (1, 0) if causal else (-1, -1)  # causal: a window of two keys, through autograd
    out = nft.flash_attn_varlen_func(q, k, v, *cu, 5, 4, causal=causal, window_size=window,
                                     backend="simt")
    (out[:8] * torch.from_numpy(dout[:8]).to(DEVICE)).sum().backward()
    mask = ref.varlen_mask(cu_q, cu_k, 9, 7, causal, window_size=window)
    dout[8:] = 0  # the loss reads no row of no sequence
    want = ref.attention_bwd_ref(dout[None], *(x[None] for x in host), mask=mask)
    for name, t, w in zip(("dq", "dk", "dv"), (q, k, v), want):
        assert_close_rule(to_host(t.grad), w[0], None, "float32", what=name)
    assert not to_host(q.grad)[8:].any()  # a row of no sequence: zero, not unwritten


def test_public_names_are_the_documented_ones():
    """``__all__`` is docs/api.md's ``numba_flash.torch`` names, each a function."""
    table = (pathlib.Path(__file__).parents[1] / "docs" / "api.md").read_text()
    documented = set(re.findall(r"`numba_flash\.torch\.(\w+)`", table.split("\n## ")[1]))
    assert set(nft.__all__) == documented == {"flash_attn_func", "flash_attn_varlen_func",
                                              "get_mla_metadata", "flash_mla_with_kvcache",
                                              "flash_attn_with_kvcache"}
    assert all(callable(getattr(nft, name)) for name in nft.__all__)


def test_flash_attn_func_keeps_its_positional_order():
    """``backend`` stays the sixth positional argument; ``return_lse`` is keyword-only."""
    import inspect

    params = inspect.signature(nft.flash_attn_func).parameters
    assert list(params)[:6] == ["q", "k", "v", "causal", "softmax_scale", "backend"]
    assert params["return_lse"].kind is inspect.Parameter.KEYWORD_ONLY


def _tensor(x):
    """A host array as a tensor on DEVICE, without grad."""
    floating = x.dtype.kind == "f" or x.dtype.name == "bfloat16"
    return _leaf(x).detach() if floating else torch.from_numpy(x).to(DEVICE)


# ----------------------------------------------------------------------------- the operations

def _mla_inputs(rng):
    """b 1, s_q 2, h_q 2, h_kv 1, d 16, head_dim_v 8, pages of 4 rows, length 6 (two pages)."""
    return dict(q=randn(rng, (1, 2, 2, 16), "float32"),
                k_cache=randn(rng, (2, 4, 1, 16), "float32"),
                block_table=np.array([[1, 0]], np.int32), cache_seqlens=np.array([6], np.int32))


def _opcheck_cases(rng):
    """(operation, arguments) for every operation, inputs as small as the kernels take."""
    host = [randn(rng, (1, 3, 1, 8), "float32") for _ in range(4)]
    q, k, v = (_leaf(x) for x in host[:3])
    slopes = _tensor(np.array([0.25], np.float32))
    sink = torch.tensor([0.5], device=DEVICE, requires_grad=True)
    ops = torch.ops.numba_flash
    out, lse = ops.flash_attn_fwd(*(t.detach() for t in (q, k, v)), True, None, "simt", 1, 0,
                                  2.5, slopes, sink.detach())
    mla = {name: _tensor(x) for name, x in _mla_inputs(rng).items()}
    packed, cu_q, cu_k = _varlen_inputs(rng)
    pq, pk, pv = (_leaf(x) for x in packed)
    cu = (_tensor(cu_q), _tensor(cu_k))
    p_out, p_lse = ops.flash_attn_varlen_fwd(pq.detach(), pk.detach(), pv.detach(), *cu, 5, 4,
                                             None, True, None, None, "simt", -1, -1, 0.0, None,
                                             None)
    hq = packed[0].shape[1]
    p_slopes = _tensor(np.full((len(cu_q) - 1, hq), 0.125, np.float32))
    p_sink = torch.zeros(hq, device=DEVICE, requires_grad=True)
    pages, table = _paged(packed, cu_k)
    return {
        "flash_attn_varlen_fwd": (ops.flash_attn_varlen_fwd.default,
                                  (pq, pk, pv, *cu, 5, 4, None, True, None, None, "simt", 2,
                                   0, 3.0, p_slopes, p_sink)),
        "flash_attn_varlen_fwd paged": (ops.flash_attn_varlen_fwd.default,
                                        (pq.detach(), *pages, *cu, 5, 4, None, True, None,
                                         table, "simt", -1, -1, 0.0, None, None)),
        "flash_attn_varlen_bwd": (ops.flash_attn_varlen_bwd.default,
                                  (_tensor(packed[0]), pq.detach(), pk.detach(), pv.detach(),
                                   p_out, p_lse, *cu, 5, 4, None, True, None, -1, -1, 0.0,
                                   None, None)),
        "flash_attn_fwd": (ops.flash_attn_fwd.default,
                           (q, k, v, True, None, "simt", 1, 0, 2.5, slopes, sink)),
        "flash_attn_bwd": (ops.flash_attn_bwd.default,
                           (_tensor(host[3]), q.detach(), k.detach(), v.detach(), out, lse, True,
                            None, "simt", 1, 0, 2.5, slopes, sink.detach())),
        "get_mla_metadata": (ops.get_mla_metadata.default,
                             (mla["cache_seqlens"], 4, 1, 2, False, None, 2)),
        "get_mla_metadata sparse": (ops.get_mla_metadata.default,
                                    (mla["cache_seqlens"], 4, 1, 2, True, 64, 2)),
        "flash_mla_with_kvcache": (ops.flash_mla_with_kvcache.default,
                                   (mla["q"], mla["k_cache"], mla["block_table"],
                                    mla["cache_seqlens"], 8, None, None, None, True, False, None,
                                    "auto", _tensor(np.array([0.5, -1.0], np.float32)), None)),
        "flash_mla_with_kvcache sparse": (ops.flash_mla_with_kvcache.default,
                                          (mla["q"], mla["k_cache"], None, None, 8, None, None,
                                           None, False, False, _tensor(np.array(
                                               [[[5, -1, 0], [1, 2, 7]]], np.int32)), "auto",
                                           None, _tensor(np.array([2], np.int32)))),
        "flash_attn_with_kvcache": (ops.flash_attn_with_kvcache.default,
                                    _kvcache_inputs(rng) + (None, None, None, 3, None, None,
                                                            None, None, True, True, 1, "auto",
                                                            2, 0, 5.0, None, None, None)),
    }


def _kvcache_inputs(rng):
    """q (1, 1, 4, 8), caches (1, 6, 1, 8), one new key and value: a GQA decode step."""
    return tuple(_tensor(randn(rng, shape, "float32")) for shape in (
        (1, 1, 4, 8), (1, 6, 1, 8), (1, 6, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8)))


def _fp8_kvcache_inputs(rng):
    """q (1, 1, 4, 16) bfloat16, float8_e4m3fn caches (1, 6, 1, 16), one new key and value."""
    q, k, v = (_tensor(randn(rng, shape, "bfloat16"))
               for shape in ((1, 1, 4, 16), (1, 1, 1, 16), (1, 1, 1, 16)))
    caches = (_tensor(randn(rng, (1, 6, 1, 16), "float32")).to(torch.float8_e4m3fn)
              for _ in range(2))
    return (q, *caches, k, v)


@pytest.mark.parametrize("name", ["flash_attn_fwd", "flash_attn_bwd", "flash_attn_varlen_fwd",
                                  "flash_attn_varlen_fwd paged", "flash_attn_varlen_bwd", "get_mla_metadata",
                                  "get_mla_metadata sparse",
                                  "flash_mla_with_kvcache", "flash_mla_with_kvcache sparse",
                                  "flash_attn_with_kvcache"])
def test_operation_passes_opcheck(name, rng):
    """Schema, fake implementation (shapes, dtypes, strides), autograd registration and AOT
    dispatch with dynamic shapes: ``torch.library.opcheck``'s every test."""
    op, args = _opcheck_cases(rng)[name]
    torch.library.opcheck(op, args)


def test_mla_operations_match_the_reference(rng):
    host = _mla_inputs(rng)
    t = {name: _tensor(x) for name, x in host.items()}
    metadata, num_splits = nft.get_mla_metadata(t["cache_seqlens"], 4, 1, num_sms=2)
    want_metadata, want_splits = scheduler.plan_mla(host["cache_seqlens"], 4, 1, 2)
    np.testing.assert_array_equal(to_host(metadata), want_metadata)
    np.testing.assert_array_equal(to_host(num_splits), want_splits)
    out, lse = nft.flash_mla_with_kvcache(t["q"], t["k_cache"], t["block_table"],
                                          t["cache_seqlens"], 8, metadata, num_splits,
                                          causal=True)
    want_out, want_lse = ref.mla_decode_ref(host["q"], host["k_cache"], host["block_table"],
                                            host["cache_seqlens"], 8, causal=True)
    assert out.shape == (1, 2, 2, 8) and out.dtype == torch.float32
    assert_close_rule(to_host(out), want_out, None, "float32")
    assert_lse(lse, want_lse)
    sink = np.array([0.5, -1.0], np.float32)
    out, lse = nft.flash_mla_with_kvcache(t["q"], t["k_cache"], t["block_table"],
                                          t["cache_seqlens"], 8, metadata, num_splits,
                                          causal=True, attn_sink=_tensor(sink))
    want_out, _ = ref.mla_decode_ref(host["q"], host["k_cache"], host["block_table"],
                                     host["cache_seqlens"], 8, causal=True, attn_sink=sink)
    assert_close_rule(to_host(out), want_out, None, "float32")
    assert_lse(lse, want_lse)  # FlashMLA's: the keys' alone


# ----------------------------------------------------------------------------- a compiled model

def _reference_attention(q, k, v, causal):
    """Exact attention in float64 (the reference model's)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.from_numpy(ref.causal_mask(q.shape[1], k.shape[1])).to(scores.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


class _Block(torch.nn.Module):
    """Pre-norm transformer block: causal attention on q, k, v sliced out of one packed
    projection (strided views, as models produce them), then an MLP."""

    def __init__(self, dim, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        x = x + self.proj(self.attention(q, k, v, causal=True).reshape(b, s, dim))
        return x + self.mlp(self.norm2(x))


def _train(model, x, target, steps):
    """Losses of ``steps`` plain SGD steps on a mean-squared error."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses)


def test_toy_transformer_trains_the_same_eager_and_compiled(rng):
    """Two blocks trained a few steps: with the flash operations eagerly, and under
    ``torch.compile(fullgraph=True)`` (one graph, no break, the attention as the numba_flash
    operation), losses equal; both follow a float64 model with exact attention."""
    dim, heads, seq, steps = 16, 2, 5, 2
    torch.manual_seed(int(rng.integers(2**31)))
    blocks = [_Block(dim, heads, flash_attn_func) for _ in range(2)]
    eager = torch.nn.Sequential(*blocks).to(DEVICE)
    x = torch.from_numpy(randn(rng, (1, seq, dim), "float32")).to(DEVICE)
    target = torch.from_numpy(randn(rng, (1, seq, dim), "float32")).to(DEVICE)

    compiled_model = copy.deepcopy(eager)
    explained = torch._dynamo.explain(compiled_model)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    calls = [n.target for n in explained.graphs[0].graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.numba_flash.flash_attn_fwd.default) == 2
    torch._dynamo.reset()

    reference = copy.deepcopy(eager).double()
    for block in reference:
        block.attention = _reference_attention
    want = _train(reference, x.double(), target.double(), steps)
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    got_eager = _train(eager, x, target, steps)
    got_compiled = _train(compiled, x, target, steps)
    np.testing.assert_allclose(got_compiled, got_eager, rtol=1e-6)
    np.testing.assert_allclose(got_eager, want, rtol=1e-4)
    assert want[-1] < want[0]  # the steps train: the comparison is not of constants


def test_a_varlen_step_compiles_whole_and_gives_the_eager_gradients(rng):
    """``torch.compile(fullgraph=True)`` keeps a varlen attention with its backward as the
    numba_flash operations, in one graph, and gives eager's loss and gradients."""
    host, cu_q, cu_k = _varlen_inputs(rng)
    cu = [torch.from_numpy(c).to(DEVICE) for c in (cu_q, cu_k)]

    def step(q, k, v):
        out = nft.flash_attn_varlen_func(q, k, v, *cu, 5, 4, causal=True, backend="simt")
        return (out[:8].float() ** 2).sum()

    explained = torch._dynamo.explain(step)(*(_leaf(x) for x in host))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    torch._dynamo.reset()
    grads = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        leaves = [_leaf(x) for x in host]
        loss = fn(*leaves)
        loss.backward()
        grads.append([loss.detach()] + [t.grad for t in leaves])
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)


def test_a_decode_step_on_fp8_caches_passes_the_descales(rng):
    """FP8 caches through the torch operation: the appended key and value rounded with their
    descales, the attention of the dequantized caches."""
    q, k, v = (randn(rng, shape, "bfloat16") for shape in ((1, 1, 4, 16), (1, 1, 1, 16),
                                                            (1, 1, 1, 16)))
    k_cache, v_cache = ((rng.standard_normal((1, 6, 1, 16)) * 8).astype(np.float32)
                        .astype(ml_dtypes.float8_e4m3fn) for _ in range(2))
    k_descale, v_descale = (np.full((1, 1), s, np.float32) for s in (0.05, 0.02))
    caches = [torch.from_numpy(c.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(DEVICE)
              for c in (k_cache, v_cache)]
    out = nft.flash_attn_with_kvcache(_tensor(q), *caches, _tensor(k), _tensor(v),
                                      cache_seqlens=3, k_descale=_tensor(k_descale),
                                      v_descale=_tensor(v_descale))
    want, _, want_k, want_v, _ = ref.kvcache_ref(q, k_cache, v_cache, k, v, cache_seqlens=3,
                                                 k_descale=k_descale, v_descale=v_descale)
    assert np.array_equal(to_host(caches[0]), want_k) and np.array_equal(to_host(caches[1]), want_v)
    keys, values = (want_c[:, :4].astype(np.float64) * s for want_c, s in
                    ((want_k, 0.05), (want_v, 0.02)))
    assert_close_rule(out, want, ref.attention_lowp(q, keys, values), "bfloat16")


def test_a_compiled_decode_step_appends_and_matches_the_reference(rng):
    """A decode step under ``torch.compile(fullgraph=True)``: one graph, the caches written in
    place as the eager call writes them, the output of kvcache_ref."""
    host = [randn(rng, shape, "bfloat16") for shape in (
        (2, 1, 8, 16), (2, 9, 2, 16), (2, 9, 2, 16), (2, 1, 2, 16), (2, 1, 2, 16))]
    seqlens = np.array([3, 7], np.int32)

    def step(q, k_cache, v_cache, k, v, lengths):
        return nft.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                           causal=True)

    results = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        args = [_tensor(x) for x in host] + [torch.from_numpy(seqlens).to(DEVICE)]
        results.append((fn(*args), args[1], args[2]))
    want, _, want_k, want_v, _ = ref.kvcache_ref(*host, cache_seqlens=seqlens, causal=True)
    for out, k_cache, v_cache in results:
        assert np.array_equal(to_host(k_cache), want_k) and np.array_equal(to_host(v_cache), want_v)
        lowp = np.stack([ref.attention_lowp(host[0][i:i + 1], want_k[i:i + 1, :seqlens[i] + 1],
                                            want_v[i:i + 1, :seqlens[i] + 1], True)[0]
                         for i in range(2)])
        assert_close_rule(to_host(out), want, lowp, "bfloat16")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(*[_tensor(x) for x in host],
                                            torch.from_numpy(seqlens).to(DEVICE))
    assert explained.graph_count == 1 and explained.graph_break_count == 0


@pytest.mark.skipif(SIMULATOR, reason="CUDA graphs need a GPU")
def test_a_decode_step_replays_from_a_cuda_graph(rng):
    """A GQA decode step over a paged cache (append, device plan, split-KV decode, combine)
    captured once and replayed: each replay appends the next token where cache_seqlens says."""
    b, hq, hk, d, page, pages = 3, 8, 2, 64, 16, 8
    host = dict(q=randn(rng, (b, 1, hq, d), "bfloat16"),
                k_cache=randn(rng, (b * pages, page, hk, d), "bfloat16"),
                v_cache=randn(rng, (b * pages, page, hk, d), "bfloat16"),
                k=randn(rng, (b, 1, hk, d), "bfloat16"), v=randn(rng, (b, 1, hk, d), "bfloat16"))
    table = rng.permutation(b * pages).astype(np.int32).reshape(b, pages)
    t = {name: _tensor(x) for name, x in host.items()}
    lengths = torch.tensor([5, 100, 60], dtype=torch.int32, device=DEVICE)
    blocks = torch.from_numpy(table).to(DEVICE)

    def step():
        return nft.flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"],
                                           cache_seqlens=lengths, block_table=blocks)

    step()  # compiles
    torch.cuda.synchronize()
    t["k_cache"].copy_(_tensor(host["k_cache"]))
    t["v_cache"].copy_(_tensor(host["v_cache"]))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(2):  # each replay appends at lengths, then moves lengths on
        graph.replay()
        torch.cuda.synchronize()
        want, _, want_k, want_v, _ = ref.kvcache_ref(
            host["q"], host["k_cache"], host["v_cache"], host["k"], host["v"],
            cache_seqlens=lengths.cpu().numpy(), block_table=table)
        assert np.array_equal(to_host(t["k_cache"]), want_k)
        assert np.array_equal(to_host(t["v_cache"]), want_v)
        host["k_cache"], host["v_cache"] = want_k, want_v
        err = np.abs(to_host(out).astype(np.float64) - want).max()
        assert err < 2e-2, err
        lengths += 1


@pytest.mark.skipif(SIMULATOR, reason="CUDA graphs need a GPU")
def test_compiled_forward_is_captured_in_a_cuda_graph(rng):
    """After a first call compiled the kernels, a compiled forward replays from a CUDA graph."""
    host = [randn(rng, (2, 300, 4, 64), "float16") for _ in range(3)]
    q, k, v = (_tensor(x) for x in host)
    attention = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True),
                              fullgraph=True)
    attention(q, k, v)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(q, k, v)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    want = ref.attention_fwd_ref(*host, True)[0]
    assert_close_rule(to_host(out), want, ref.attention_lowp(*host, True), "float16")


# ----------------------------------------------------------------------------- CPU tensors

CPU_TENSORS = """
import torch
import numba_flash.torch as nft

q = torch.ones(1, 8, 1, 16, dtype=torch.float16, requires_grad=True)
nft.flash_attn_func(q, q, q)
"""


def test_cpu_tensors_without_a_driver_say_how_to_use_the_simulator():
    """A script on CPU tensors without NUMBA_ENABLE_CUDASIM where no driver loads (hidden on a
    GPU): one error, through torch's dispatcher, that says how to run on the simulator."""
    run = run_without(["cuda"], CPU_TENSORS, timeout=120)
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("numba_flash.runtime.env.CudaSetupError: no CUDA driver found"), \
        run.stderr
    assert "NUMBA_ENABLE_CUDASIM=1" in last and "CPU torch tensors" in last
    assert "DynamicLibNotFoundError" not in run.stderr
    user_traceback(run.stderr)


@pytest.mark.skipif(SIMULATOR, reason="the simulator takes CPU tensors")
def test_cpu_tensors_on_a_gpu_are_a_type_error_that_says_to_move_them():
    q = torch.ones(1, 8, 1, 16, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^q: got a torch tensor on cpu; move it to the GPU"):
        flash_attn_func(q, q, q)
