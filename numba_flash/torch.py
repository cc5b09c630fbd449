"""torch autograd adapter: attention whose ``loss.backward()`` runs the flash backward.

    from numba_flash.torch import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)   # q (B, Sq, Hq, D), k, v (B, Sk, Hk, D)
    out.float().square().sum().backward()         # q.grad, k.grad, v.grad

Import this module explicitly: the package itself never imports torch. Tensors go to the kernels
zero-copy (runtime/arrays.py adapts torch CUDA tensors, and CPU tensors under the simulator); results
are torch tensors on q's device, computed on torch's current stream. The forward saves ``out``
and ``lse`` (not the attention matrix) for ``nf.flash_attn_bwd``.
"""

import torch

from . import api


class FlashAttnFunc(torch.autograd.Function):
    """``out = softmax(q k^T * scale) v`` with gradients for q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, backend):
        # The kernels see raw memory: detached views (zero copy; torch refuses to export tensors
        # that require grad through __cuda_array_interface__).
        out, lse = api.flash_attn_fwd(q.detach(), k.detach(), v.detach(), causal=causal,
                                      softmax_scale=softmax_scale, backend=backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.softmax_scale = causal, softmax_scale
        return out

    @staticmethod
    def backward(ctx, dout):
        if dout.stride(-1) != 1:  # e.g. out.sum()'s gradient: ones expanded with zero strides
            dout = dout.contiguous()
        q, k, v, out, lse = (t.detach() for t in ctx.saved_tensors)
        dq, dk, dv = api.flash_attn_bwd(dout.detach(), q, k, v, out, lse, causal=ctx.causal,
                                        softmax_scale=ctx.softmax_scale)
        return dq, dk, dv, None, None, None


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, backend="auto"):
    """Differentiable exact attention on torch tensors. ``backend`` picks the forward's kernels
    (see ``numba_flash.flash_attn_fwd``); the backward is ``numba_flash.flash_attn_bwd``'s."""
    return FlashAttnFunc.apply(q, k, v, causal, softmax_scale, backend)
