"""Public calls: validate -> plan -> launch.

Each public function first adapts and checks every argument (``ValueError`` / ``TypeError``
naming the argument, before anything is allocated or launched), then picks a backend and tile
configuration, allocates outputs in the caller's array library and launches on the caller's
stream. The contract is ``shared/API.md``.
"""

import math

import numpy as np

from . import arrays, launch
from .arrays import FLOAT_FORMATS, SIMULATOR

BACKENDS = ("auto", "simt", "tc")
MAX_HEAD_DIM = 256


# ----------------------------------------------------------------------------- validation helpers

def _tensor(x, name, ndim):
    t = arrays.adapt(x, name)
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {t.shape}")
    if t.fmt not in FLOAT_FORMATS:
        raise TypeError(f"{name}: expected float16, bfloat16 or float32, got {t.fmt}")
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), "
                         f"got strides {t.strides}")
    if any(s == 0 for s in t.shape):
        raise ValueError(f"{name}: empty array of shape {t.shape}")
    return t


def _same_format(ref, *others):
    for t in others:
        if t.fmt != ref.fmt:
            raise TypeError(f"{t.name}: dtype {t.fmt} differs from {ref.name}'s {ref.fmt}")


def _scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return head_dim ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating)) \
            or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite float or None, got {softmax_scale!r}")
    return float(softmax_scale)


def _out_buffer(out, like, shape, fmt, name="out"):
    """The caller's ``out=`` buffer, checked, or a new array in ``like``'s library."""
    if out is None:
        return arrays.empty(like, shape, fmt, name)
    t = arrays.adapt(out, name)
    if t.shape != tuple(shape) or t.fmt != fmt:
        raise ValueError(f"{name}: expected shape {tuple(shape)} of {fmt}, got {t.shape} of {t.fmt}")
    if t.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous, got strides {t.strides}")
    return t


def resolve_backend(backend, fmt):
    """``auto`` -> the fastest backend implemented for this format; refuse unusable choices."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "tc":
        raise ValueError("backend: 'tc' (tensor cores) is not available in this build; use 'simt'")
    return "simt"


def _check_attention(q, k, v, causal, softmax_scale, backend):
    """Shared checks of the attention calls; returns adapted q, k, v, scale and backend."""
    q, k, v = _tensor(q, "q", 4), _tensor(k, "k", 4), _tensor(v, "v", 4)
    _same_format(q, k, v)
    b, sq, hq, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"k, v: batch {k.shape[0]}, {v.shape[0]} differs from q's {b}")
    if k.shape != v.shape:
        raise ValueError(f"v: shape {v.shape} differs from k's {k.shape}")
    if k.shape[3] != d:
        raise ValueError(f"k: head dim {k.shape[3]} differs from q's {d}")
    if hq % k.shape[2] != 0:
        raise ValueError(f"k: query heads ({hq}) must be a multiple of kv heads ({k.shape[2]})")
    if d % 8 != 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"q: head dim must be a multiple of 8 up to {MAX_HEAD_DIM}, got {d}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    return q, k, v, _scale(softmax_scale, d), resolve_backend(backend, q.fmt)


# ----------------------------------------------------------------------------- attention

def flash_attn_fwd(q, k, v, causal=False, softmax_scale=None, backend="auto", out=None, stream=None):
    """Exact attention forward. Returns ``(out, lse)``.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hk, D) with Hq % Hk == 0; out like q; lse (B, Hq, Sq)
    float32 natural-log sum of exp of the scaled scores (+inf for rows that see no key).
    ``causal`` aligns the mask bottom-right (query i sees keys j <= i + Sk - Sq).
    """
    q, k, v, scale, backend = _check_attention(q, k, v, causal, softmax_scale, backend)
    b, sq, hq, d = q.shape
    o = _out_buffer(out, q, q.shape, q.fmt)
    lse = arrays.empty(q, (b, hq, sq), "float32", "lse")
    stream = arrays.stream_of(q, stream)
    kernel, tiles = launch.simt_forward_kernel(d, bool(causal), q.fmt)
    grid = (launch.cdiv(sq, tiles.BLOCK_M), b * hq)
    launch.launch(kernel, grid, tiles.threads, stream, tiles.shared_bytes,
                  q.view, k.view, v.view, o.view, lse.view,
                  np.int32(sq), np.int32(k.shape[1]), np.int32(hq), np.int32(hq // k.shape[2]),
                  np.float32(scale * math.log2(math.e)))
    return o.obj, lse.obj


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, return_lse=False, backend="auto"):
    """``flash_attn_fwd`` returning ``out`` (or ``(out, lse)`` with ``return_lse=True``)."""
    out, lse = flash_attn_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend)
    return (out, lse) if return_lse else out
