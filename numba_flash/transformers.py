"""Hugging Face transformers backend: every attention layer of a model on numba_flash.

    import numba_flash.transformers
    name = numba_flash.transformers.register()          # "numba_attention"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name)

``register()`` adds ``attention_forward`` to ``transformers.AttentionInterface`` and, under the
same name, transformers' own flash-attention mask function to ``AttentionMaskInterface``: the
model then hands each layer either no mask (causal, no padding) or its 2D padding mask, as it
does for flash-attn. The name holds no "flash": transformers 5 takes an implementation whose
name contains it for a flash-attn kernel and tries to load one when the model is built.

``attention_forward`` runs, through ``numba_flash.torch`` (differentiable):

- a dense batch without padding: ``flash_attn_func`` (causal aligned bottom-right, so a decode
  step's queries see the whole cache);
- a padded batch (a 2D mask): the rows the mask keeps, packed, through
  ``flash_attn_varlen_func``, the output scattered back (padded query rows get 0);
- a padding-free packed batch (batch 1 whose ``position_ids`` restart): the sequences found where
  the positions restart, or the ``cu_seq_lens_q/k`` a data collator passed, through
  ``flash_attn_varlen_func``.

A layer's sliding window (Mistral, Qwen2, Gemma's local layers), softcap (Gemma-2) and sinks
(gpt-oss's ``s_aux``, trained through autograd) run as flash-attn's ``window_size``, ``softcap``
and ``learnable_sink`` in each of these calls. Dropout in training is refused with
``NotImplementedError``; nothing is silently computed without it.
"""

import torch
import transformers
from transformers.masking_utils import flash_attention_mask

from .torch import flash_attn_func, flash_attn_varlen_func

NAME = "numba_attention"

__all__ = ["register", "attention_forward", "NAME"]


def register(name=NAME):
    """Register numba_flash's attention (and the mask it takes) with transformers under
    ``name``; returns the name to pass as ``attn_implementation``."""
    if "flash" in name:
        raise ValueError(f"name: transformers treats an implementation named {name!r} as a "
                         f"flash-attn kernel and tries to load one; pick a name without 'flash'")
    transformers.AttentionInterface.register(name, attention_forward)
    transformers.AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def _refuse(dropout, module):
    if dropout and module.training:
        raise NotImplementedError(f"dropout: not implemented (got {dropout}); numba_flash "
                                  f"offers none (set the model's attention_dropout to 0)")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention function: query (B, Hq, Sq, D), key and value (B, Hk, Sk, D);
    returns ``(out (B, Sq, Hq, D), None)``. A layer's ``sliding_window`` W (query i sees the
    keys i - W < j <= i, transformers' sliding-window mask) is flash-attn's ``window_size=(W -
    1, W - 1)``, its right side cut to 0 by causality, as transformers' flash-attn path passes
    it. A layer's ``softcap`` (Gemma-2) caps its scores as flash-attn's ``softcap``; its sinks
    ``s_aux`` (gpt-oss, one logit per query head) are ``learnable_sink`` (in float32, their
    gradient flowing back through the cast)."""
    _refuse(dropout, module)
    causal = bool(module.is_causal if is_causal is None else is_causal)
    window = (-1, -1) if sliding_window is None else (sliding_window - 1,) * 2
    options = dict(softmax_scale=scaling, causal=causal, window_size=window,
                   softcap=softcap or 0.0,
                   learnable_sink=None if s_aux is None else s_aux.float())
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, S, H, D) views
    batch, sq = q.shape[:2]
    if attention_mask is not None:
        return _padded(q, k, v, attention_mask, options), None
    cu = _packed(kwargs, batch, q.device)
    if cu is not None:
        (cu_q, cu_k), (max_q, max_k) = cu
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, **options)
        return out[None], None
    return flash_attn_func(q, k, v, **options), None


def _packed(kwargs, batch, device):
    """``((cu_q, cu_k), (max_q, max_k))`` of a padding-free packed batch, or None: a data
    collator's ``cu_seq_lens_q/k`` and ``max_length_q/k``, else batch 1 whose ``position_ids``
    restart at their minimum (each restart begins a sequence)."""
    if kwargs.get("cu_seq_lens_q") is not None:
        return ((kwargs["cu_seq_lens_q"].to(torch.int32), kwargs["cu_seq_lens_k"].to(torch.int32)),
                (int(kwargs["max_length_q"]), int(kwargs["max_length_k"])))
    positions = kwargs.get("position_ids")
    if positions is None or batch != 1 or positions.shape[-1] == 1:
        return None
    positions = positions.reshape(-1)
    starts = (positions == positions.min()).nonzero().view(-1)
    if starts.numel() <= 1:
        return None
    cu = torch.cat([starts, starts.new_tensor([positions.numel()])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return (cu.to(device), cu.to(device)), (longest, longest)


def _padded(q, k, v, mask, options):
    """A padded batch: the kept rows packed, attended per sequence (``options``: the varlen
    call's keywords), scattered back (padded query rows 0). ``mask`` (B, Sk) marks the keys
    kept; the queries are its last Sq columns (left padding during generation, as transformers
    lays it out)."""
    batch, sq, hq, d = q.shape
    keep_k = mask.bool()
    keep_q = keep_k[:, -sq:]
    lens_q, lens_k = keep_q.sum(-1, dtype=torch.int32), keep_k.sum(-1, dtype=torch.int32)
    cu_q = torch.nn.functional.pad(lens_q.cumsum(0, dtype=torch.int32), (1, 0))
    cu_k = torch.nn.functional.pad(lens_k.cumsum(0, dtype=torch.int32), (1, 0))
    rows_q, rows_k = keep_q.reshape(-1).nonzero().view(-1), keep_k.reshape(-1).nonzero().view(-1)
    packed_q = q.reshape(batch * sq, hq, d).index_select(0, rows_q)
    packed_k, packed_v = (x.reshape(batch * x.shape[1], *x.shape[2:]).index_select(0, rows_k)
                          for x in (k, v))
    out = flash_attn_varlen_func(packed_q, packed_k, packed_v, cu_q, cu_k,
                                 max(int(lens_q.max()), 1), max(int(lens_k.max()), 1),
                                 **options)
    full = out.new_zeros(batch * sq, hq, d).index_copy(0, rows_q, out)
    return full.view(batch, sq, hq, d)
