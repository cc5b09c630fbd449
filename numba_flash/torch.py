"""torch integration: the kernels as ``torch.library`` operations, differentiable attention.

    from numba_flash.torch import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q (B, Sq, Hq, D), k, v (B, Sk, Hk, D)
    out.float().square().sum().backward()         # q.grad, k.grad, v.grad

Import this module explicitly: the package itself never imports torch. Importing it registers
seven operations in the namespace ``numba_flash`` (``torch.ops.numba_flash.*``), one per public
call of the host layer: ``flash_attn_fwd``, ``flash_attn_bwd``, ``flash_attn_varlen_fwd``,
``flash_attn_varlen_bwd``, ``get_mla_metadata``, ``flash_mla_with_kvcache`` and
``flash_attn_with_kvcache`` (which declares the caches it writes). Each has two
implementations:

- the real one hands the tensors to ``api.py`` zero-copy (runtime/arrays.py adapts torch CUDA
  tensors, and CPU tensors under the simulator) and runs on torch's current stream;
- a fake one that only says the outputs' shapes and dtypes. ``torch.compile`` traces that one,
  so a compiled model keeps each call as one node of its graph and never enters Numba, whose
  compiler cannot be traced.

Each forward's autograd is registered with ``torch.library.register_autograd``: it saves
``out`` and ``lse`` (not the attention matrix), and its backward is the matching backward
operation, so AOT autograd sees the backward as one node as well.
"""

from typing import Optional

import torch

from . import api, scheduler, validate

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "get_mla_metadata",
           "flash_mla_with_kvcache", "flash_attn_with_kvcache"]

Tensor = torch.Tensor


def _window_sides(window_size, causal):
    """flash-attn's ``window_size`` as the two ints the operations take, checked first
    (``validate.window``: a ``TypeError`` or ``ValueError`` names it)."""
    validate.window(window_size, causal)
    left, right = window_size
    return int(left), int(right)


def _cap(softcap):
    """``softcap`` as the operations take it (a float, 0.0 for none), checked first
    (``validate.score_cap``)."""
    return validate.score_cap(softcap) or 0.0


def _sink_grad(grads, sink):
    """A backward's (dq, dk, dv[, dsink]) as the operations return them: four tensors, dsink an
    empty one without a sink (an operation's outputs are fixed)."""
    if sink is None:
        return (*grads, grads[0].new_empty((0,), dtype=torch.float32))
    return tuple(grads)


def _new(like, shape, dtype=None):
    """A new contiguous tensor on ``like``'s device: what the real operations allocate."""
    return like.new_empty(shape, dtype=like.dtype if dtype is None else dtype)


# ----------------------------------------------------------------------------- attention

@torch.library.custom_op("numba_flash::flash_attn_fwd", mutates_args=())
def _flash_attn_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                    softmax_scale: Optional[float], backend: str, window_left: int,
                    window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                    sink: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    return api.flash_attn_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale,
                              backend=backend, window_size=(window_left, window_right),
                              softcap=softcap, alibi_slopes=alibi_slopes, learnable_sink=sink)


@_flash_attn_fwd.register_fake
def _(q, k, v, causal, softmax_scale, backend, window_left, window_right, softcap, alibi_slopes,
      sink):
    b, sq, hq, _ = q.shape
    return _new(q, q.shape), _new(q, (b, hq, sq), torch.float32)


@torch.library.custom_op("numba_flash::flash_attn_bwd", mutates_args=())
def _flash_attn_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    causal: bool, softmax_scale: Optional[float], backend: str,
                    window_left: int, window_right: int, softcap: float,
                    alibi_slopes: Optional[Tensor],
                    sink: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _sink_grad(api.flash_attn_bwd(
        dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window_size=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
        learnable_sink=sink), sink)


@_flash_attn_bwd.register_fake
def _(dout, q, k, v, out, lse, causal, softmax_scale, backend, window_left, window_right,
      softcap, alibi_slopes, sink):
    dsink = _new(q, (0,) if sink is None else sink.shape, torch.float32)
    return _new(q, q.shape), _new(q, k.shape), _new(q, k.shape), dsink


def _save_for_backward(ctx, inputs, output):
    q, k, v, causal, softmax_scale, _, window_left, window_right, softcap, slopes, sink = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, slopes, sink)
    ctx.args = (causal, softmax_scale, "auto", window_left, window_right, softcap)
    ctx.mark_non_differentiable(lse)  # the backward takes no lse gradient


def _attention_backward(ctx, dout, _dlse):
    if dout.stride(-1) != 1:  # e.g. out.sum()'s gradient: ones expanded with zero strides
        dout = dout.contiguous()
    q, k, v, out, lse, slopes, sink = ctx.saved_tensors
    dq, dk, dv, dsink = _flash_attn_bwd(dout, q, k, v, out, lse, *ctx.args, slopes, sink)
    return dq, dk, dv, None, None, None, None, None, None, None, (
        None if sink is None else dsink)


torch.library.register_autograd("numba_flash::flash_attn_fwd", _attention_backward,
                                setup_context=_save_for_backward)


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, backend="auto", *,
                    return_lse=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    learnable_sink=None, dropout_p=0.0):
    """Differentiable exact attention on torch tensors: ``out``, or ``(out, lse)`` with
    ``return_lse=True`` (``numba_flash.flash_attn_func``'s results; ``lse`` is not
    differentiable). ``return_lse``, ``window_size``, ``softcap``, ``alibi_slopes`` and
    ``learnable_sink`` (``numba_flash.flash_attn_fwd``'s) are keyword-only, so the positional
    order stays that of earlier releases. ``backend`` picks the forward's kernels (see
    ``numba_flash.flash_attn_fwd``); the backward is ``numba_flash.flash_attn_bwd``'s with
    ``backend="auto"`` and the same options; a sink that requires grad gets its gradient.
    ``dropout_p`` other than 0 raises ``NotImplementedError``."""
    validate.dropout(dropout_p)
    left, right = _window_sides(window_size, causal)
    out, lse = _flash_attn_fwd(q, k, v, causal, softmax_scale, backend, left, right,
                               _cap(softcap), alibi_slopes, learnable_sink)
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- varlen attention

@torch.library.custom_op("numba_flash::flash_attn_varlen_fwd", mutates_args=())
def _flash_attn_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                           cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           softmax_scale: Optional[float], causal: bool,
                           seqused_k: Optional[Tensor], block_table: Optional[Tensor],
                           backend: str, window_left: int, window_right: int,
                           softcap: float, alibi_slopes: Optional[Tensor],
                           sink: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    # Rows of no sequence, which the kernels do not write, read as rows that see no key.
    out = torch.zeros_like(q)
    if sink is None:
        lse = q.new_full((q.shape[1], q.shape[0]), float("inf"), dtype=torch.float32)
    else:  # such a row's sum holds the sink alone
        lse = sink[:, None].repeat(1, q.shape[0])
    return api.flash_attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                                     window_size=(window_left, window_right), softcap=softcap,
                                     alibi_slopes=alibi_slopes, learnable_sink=sink,
                                     seqused_k=seqused_k, block_table=block_table,
                                     backend=backend, out=out, lse=lse)


@_flash_attn_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      seqused_k, block_table, backend, window_left, window_right, softcap, alibi_slopes, sink):
    total_q, hq, _ = q.shape
    return _new(q, q.shape), _new(q, (hq, total_q), torch.float32)


@torch.library.custom_op("numba_flash::flash_attn_varlen_bwd", mutates_args=())
def _flash_attn_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                           lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float],
                           causal: bool, seqused_k: Optional[Tensor], window_left: int,
                           window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                           sink: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # Rows of no sequence get no gradient from the kernels: zeros, as autograd expects.
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    return _sink_grad(api.flash_attn_varlen_bwd(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
        softcap=softcap, alibi_slopes=alibi_slopes, learnable_sink=sink, seqused_k=seqused_k,
        dq=dq, dk=dk, dv=dv), sink)


@_flash_attn_varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, seqused_k, window_left, window_right, softcap, alibi_slopes, sink):
    dsink = _new(q, (0,) if sink is None else sink.shape, torch.float32)
    return _new(q, q.shape), _new(q, k.shape), _new(q, k.shape), dsink


def _save_varlen(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, seqused_k, block_table, _,
     window_left, window_right, softcap, slopes, sink) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, slopes, sink)
    ctx.args = (max_q, max_k, softmax_scale, causal)
    ctx.window = (window_left, window_right, softcap)
    ctx.paged = block_table is not None
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, _dlse):
    if ctx.paged:
        raise NotImplementedError("block_table: the backward of paged K/V is not implemented")
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    q, k, v, out, lse, cu_q, cu_k, seqused_k, slopes, sink = ctx.saved_tensors
    dq, dk, dv, dsink = _flash_attn_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args,
                                               seqused_k, *ctx.window, slopes, sink)
    return (dq, dk, dv) + (None,) * 13 + (None if sink is None else dsink,)


torch.library.register_autograd("numba_flash::flash_attn_varlen_fwd", _varlen_backward,
                                setup_context=_save_varlen)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, learnable_sink=None, return_lse=False,
                           block_table=None, backend="auto", *, seqused_k=None, dropout_p=0.0):
    """Differentiable ``numba_flash.flash_attn_varlen_func`` on packed torch tensors: ``out``,
    or ``(out, lse)`` with ``return_lse=True`` (lse (Hq, total_q), not differentiable). Rows
    of no sequence read as rows that see no key (out 0, lse +inf; with a sink, lse = sink) and
    get zero gradients. Paged K/V (``block_table``) runs forward only, as in flash-attn: asked
    for with gradients enabled on q, k or v it raises ``NotImplementedError`` before anything
    runs, as does a ``dropout_p`` other than 0."""
    validate.dropout(dropout_p)
    left, right = _window_sides(window_size, causal)
    if block_table is not None and torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("block_table: the backward of paged K/V is not implemented "
                                  "(call under torch.no_grad() or detach q, k and v)")
    out, lse = _flash_attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, softmax_scale, causal, seqused_k,
                                      block_table, backend, left, right, _cap(softcap),
                                      alibi_slopes, learnable_sink)
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- paged MLA decode

@torch.library.custom_op("numba_flash::get_mla_metadata", mutates_args=())
def _get_mla_metadata(cache_seqlens: Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                      num_heads_q: Optional[int], is_fp8_kvcache: bool, topk: Optional[int],
                      num_sms: Optional[int]) -> tuple[Tensor, Tensor]:
    return api.get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k,
                                num_heads_q, is_fp8_kvcache, topk, num_sms=num_sms)


@_get_mla_metadata.register_fake
def _(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk,
      num_sms):
    if num_sms is None:  # the device's SM count, as the real call reads it
        num_sms = api.device.current().sms
    requests, rows = cache_seqlens.shape[0], num_q_tokens_per_head_k
    if topk is not None:  # (the sparse plan: a request per query token)
        s_q = num_q_tokens_per_head_k * num_heads_k // num_heads_q
        requests, rows = requests * s_q, num_heads_q // num_heads_k
    parts = scheduler.num_sm_parts(num_sms, num_heads_k, rows)
    return (_new(cache_seqlens, (parts, scheduler.METADATA_SIZE), torch.int32),
            _new(cache_seqlens, (requests + 1,), torch.int32))


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None, *, num_sms=None):
    """``numba_flash.get_mla_metadata`` as a torch operation (CUDA ``cache_seqlens``; CPU under
    the simulator): the plan is made on the device, capturable in a CUDA graph."""
    return _get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                             is_fp8_kvcache, topk, num_sms)


@torch.library.custom_op("numba_flash::flash_mla_with_kvcache", mutates_args=())
def _flash_mla_with_kvcache(q: Tensor, k_cache: Tensor, block_table: Optional[Tensor],
                            cache_seqlens: Optional[Tensor], head_dim_v: int,
                            tile_scheduler_metadata: Optional[Tensor],
                            num_splits: Optional[Tensor], softmax_scale: Optional[float],
                            causal: bool, is_fp8_kvcache: bool, indices: Optional[Tensor],
                            backend: str, attn_sink: Optional[Tensor],
                            topk_length: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    return api.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                      tile_scheduler_metadata, num_splits, softmax_scale, causal,
                                      is_fp8_kvcache, indices, backend, attn_sink=attn_sink,
                                      topk_length=topk_length)


@_flash_mla_with_kvcache.register_fake
def _(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
      softmax_scale, causal, is_fp8_kvcache, indices, backend, attn_sink, topk_length):
    b, s_q, h_q, _ = q.shape
    if indices is not None:  # the sparse decode's lse: a transposed view, as FlashMLA's
        lse = _new(q, (b, s_q, h_q), torch.float32).transpose(1, 2)
    else:
        lse = _new(q, (b, h_q, s_q), torch.float32)
    return _new(q, (b, s_q, h_q, head_dim_v)), lse


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, backend="auto",
                           attn_sink=None, topk_length=None):
    """``numba_flash.flash_mla_with_kvcache`` as a torch operation: ``(out, lse)``."""
    return _flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                   tile_scheduler_metadata, num_splits, softmax_scale, causal,
                                   is_fp8_kvcache, indices, backend, attn_sink, topk_length)


# ----------------------------------------------------------------------------- KV cache

@torch.library.custom_op("numba_flash::flash_attn_with_kvcache",
                         mutates_args=("k_cache", "v_cache"))
def _flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                             v: Optional[Tensor], rotary_cos: Optional[Tensor],
                             rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
                             cache_seqlen: Optional[int], cache_batch_idx: Optional[Tensor],
                             cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
                             softmax_scale: Optional[float], causal: bool,
                             rotary_interleaved: bool, num_splits: int, backend: str,
                             window_left: int, window_right: int, softcap: float,
                             alibi_slopes: Optional[Tensor], k_descale: Optional[Tensor],
                             v_descale: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    return api.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
        cache_seqlen if cache_seqlens is None else cache_seqlens, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_size=(window_left, window_right),
        softcap=softcap, rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes,
        num_splits=num_splits, return_softmax_lse=True, backend=backend, k_descale=k_descale,
        v_descale=v_descale)


@_flash_attn_with_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
      cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, rotary_interleaved,
      num_splits, backend, window_left, window_right, softcap, alibi_slopes, k_descale,
      v_descale):
    b, sq, hq, _ = q.shape
    return _new(q, q.shape), _new(q, (b, hq, sq), torch.float32)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, backend="auto", k_descale=None,
                            v_descale=None):
    """``numba_flash.flash_attn_with_kvcache`` as a torch operation that declares the caches it
    writes (``k_cache``, ``v_cache``), so ``torch.compile`` orders it and CUDA graphs capture
    it: ``out``, or ``(out, lse)`` with ``return_softmax_lse``. ``cache_seqlens`` may be an int
    or an int32 tensor, as in flash-attn; FP8 caches take ``k_descale``, ``v_descale``."""
    left, right = _window_sides(window_size, causal)
    fixed = None
    if cache_seqlens is not None and not isinstance(cache_seqlens, Tensor):
        fixed, cache_seqlens = int(cache_seqlens), None
    out, lse = _flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                        cache_seqlens, fixed, cache_batch_idx, cache_leftpad,
                                        block_table, softmax_scale, causal, rotary_interleaved,
                                        num_splits, backend, left, right, _cap(softcap),
                                        alibi_slopes, k_descale, v_descale)
    return (out, lse) if return_softmax_lse else out
