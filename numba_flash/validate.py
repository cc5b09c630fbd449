"""The argument checks of the public calls: each adapts the caller's arrays (runtime/arrays.py)
and checks them, raising ``ValueError`` / ``TypeError`` naming the argument before anything is
allocated or launched, and builds the call's problem description (``kernels/problem.py``),
which the kernel choice and the kernels' configs read. What the calls accept is
``docs/api.md``."""

import math
from typing import NamedTuple

import numpy as np

from . import scheduler
from .kernels import registry
from .kernels.problem import Attention, Decode
from .runtime import arrays
from .runtime.arrays import FLOAT_FORMATS, FP8_FORMATS

MAX_HEAD_DIM = 256
MAX_MLA_HEAD_DIM = registry.MAX_DECODE_HEAD_DIM

# The largest softmax scale: the kernels multiply raw float32 scores by scale * log2(e), and a
# score times a scale past this overflows float32 for scores of a few hundred thousand.
MAX_SOFTMAX_SCALE = 2.0 ** 16


def _tensor(x, name, ndim, fp8=False):
    """A float array argument of ``ndim`` dimensions (``fp8``: float8_e4m3fn is taken too)."""
    return _checked(arrays.adapt(x, name), name, ndim, fp8)


def _checked(t, name, ndim, fp8=False):
    """``_tensor``'s checks of an adapted array."""
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {t.shape}")
    if t.fmt in FP8_FORMATS and not fp8:
        raise NotImplementedError(f"{name}: this call takes no FP8 ({t.fmt}) arrays (FP8 "
                                  "attention is forward only, as in FlashAttention-3)")
    if t.fmt not in FLOAT_FORMATS and t.fmt not in FP8_FORMATS:
        raise TypeError(f"{name}: expected float16, bfloat16 or float32, got {t.fmt}")
    if any(s == 0 for s in t.shape):
        raise ValueError(f"{name}: empty array of shape {t.shape}")
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), "
                         f"got strides {t.strides}")
    return t


def _rows(x):
    """x of ``hadamard_rotate`` and ``quantize_fp8``: (B, S, H, D) or (total, H, D), adapted and
    checked."""
    t = arrays.adapt(x, "x")
    if t.ndim not in (3, 4):
        raise ValueError(f"x: expected (B, S, H, D) or (total, H, D), got shape {t.shape}")
    return _tensor(x, "x", t.ndim)


def rotation_input(x, seed):
    """``hadamard_rotate``'s x (B, S, H, D) or (total, H, D), adapted and checked, and its seed,
    an int in 0 .. 2^31 - 1."""
    t = _rows(x)
    if t.shape[-1] > registry.MAX_ROTATION_DIM:
        raise ValueError(f"x: head dims up to {registry.MAX_ROTATION_DIM}, got {t.shape[-1]}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or \
            not 0 <= seed < 2 ** 31:
        raise ValueError(f"seed: expected an int in 0 .. 2^31 - 1, got {seed!r}")
    return t


# FP8 results are torch tensors (NumPy arrays under the simulator): CuPy and Numba have no
# float8_e4m3fn dtype to hand them back in.
FP8_LIBRARIES = ("torch", "numpy")
FP8_MIN_CC = (8, 9)  # the e4m3 conversions (cvt ... e4m3x2)


def _fp8_device(name, dev):
    if dev.cc[:2] < FP8_MIN_CC:
        cc = ".".join(map(str, dev.cc[:2]))
        raise ValueError(f"{name}: FP8 needs compute capability 8.9 or later, not {cc}")


def quantize_input(x, descale, dev):
    """``quantize_fp8``'s x (B, S, H, D) or (total, H, D), adapted and checked, and its descale:
    None, or float32 (B, H) on x's device ((1, H) for packed rows)."""
    t = _rows(x)
    if t.lib not in FP8_LIBRARIES:
        raise TypeError(f"x: FP8 results are torch tensors, and {t.lib} has no float8_e4m3fn "
                        f"dtype; pass torch tensors")
    _fp8_device("x", dev)
    if descale is not None:
        batch = t.shape[0] if t.ndim == 4 else 1
        descale = _head_values(descale, "descale", t, ((batch, t.shape[-2]),))
    return t, descale


def index_array(x, name, shape):
    """An int32 array argument of ``shape`` (``None``: any non-zero length there)."""
    t = arrays.adapt(x, name)
    if t.fmt != "int32":
        raise TypeError(f"{name}: expected int32, got {t.fmt}")
    if t.ndim != len(shape) or any(n == 0 or s not in (None, n) for s, n in zip(shape, t.shape)):
        want = str(tuple("n" if s is None else s for s in shape)).replace("'", "")
        raise ValueError(f"{name}: expected shape {want}, got {t.shape}")
    return t


def _same_format(ref, *others):
    for t in others:
        if t.fmt != ref.fmt:
            raise TypeError(f"{t.name}: dtype {t.fmt} differs from {ref.name}'s {ref.fmt}")


def _scale(softmax_scale, head_dim):
    """The softmax scale: ``head_dim ** -0.5`` by default, else a positive float up to
    MAX_SOFTMAX_SCALE (the kernels take row maxima of raw scores, which commute only with a
    positive scale)."""
    if softmax_scale is None:
        return head_dim ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating)) \
            or not math.isfinite(softmax_scale) or not 0 < softmax_scale <= MAX_SOFTMAX_SCALE:
        raise ValueError(f"softmax_scale: expected a positive float up to {MAX_SOFTMAX_SCALE:g} "
                         f"or None, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_causal(causal):
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")


def positive_int(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def not_implemented(**options):
    """``NotImplementedError`` naming the first option that asks for what no kernel does."""
    for name, value in options.items():
        if value is not None and value is not False:
            shown = value if isinstance(value, (bool, int, float, str)) else type(value).__name__
            raise NotImplementedError(f"{name}: not implemented (got {shown!r}); numba_flash "
                                      f"decodes dense 16- and 32-bit caches")


def dropout(dropout_p):
    """flash-attn's ``dropout_p``: only 0 (or None) is accepted. numba_flash offers no dropout
    (FA3 and FA4 dropped it): anything else is a ``NotImplementedError``, a non-number a
    ``TypeError``."""
    if dropout_p is None:
        return
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.integer,
                                                                  np.floating)):
        raise TypeError(f"dropout_p: expected a number, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise NotImplementedError(f"dropout_p: not implemented (got {dropout_p!r}); numba_flash "
                                  f"offers no dropout, as FA3 and FA4 do not")


# ----------------------------------------------------------------------------- outputs

def _extent(t):
    """[first, last) byte addresses an array's elements occupy."""
    lo = hi = t.ptr
    for n, stride in zip(t.shape, t.strides):
        if stride > 0:
            hi += (n - 1) * stride * t.itemsize
        else:
            lo += (n - 1) * stride * t.itemsize
    return lo, hi + t.itemsize


def refuse_overlap(outputs, inputs):
    """``ValueError`` when one of the caller's output buffers shares memory with an input or
    another output (the kernels read inputs while they write outputs), or repeats elements (a
    zero stride). ``outputs`` are the buffers the caller passed: fresh ones overlap nothing, so
    a call without ``out=`` buffers pays for no check."""
    if not outputs:
        return
    spans = [(t, *_extent(t)) for t in inputs]
    for o in outputs:
        if 0 in o.strides and any(n > 1 and s == 0 for n, s in zip(o.shape, o.strides)):
            raise ValueError(f"{o.name}: a zero stride repeats elements (strides {o.strides})")
        lo, hi = _extent(o)
        for other, other_lo, other_hi in spans:
            if lo < other_hi and other_lo < hi:
                raise ValueError(f"{o.name}: overlaps {other.name} (an output may not share "
                                 f"memory with an input or another output)")
        spans.append((o, lo, hi))


def out_buffer(out, like, shape, fmt, name="out"):
    """The caller's ``out=`` buffer, checked, or a new array in ``like``'s library."""
    if out is None:
        return arrays.empty(like, shape, fmt, name)
    t = arrays.adapt(out, name)
    if t.shape != tuple(shape) or t.fmt != fmt:
        raise ValueError(f"{name}: expected shape {tuple(shape)} of {fmt}, got {t.shape} of {t.fmt}")
    if t.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous, got strides {t.strides}")
    return t


# ----------------------------------------------------------------------------- attention

def attention(q, k, v, causal, softmax_scale, window_size=None, softcap=None,
              alibi_slopes=None, learnable_sink=None, fp8=None):
    """The checks the attention calls share; returns the ``Attention`` problem. ``fp8``: the
    call's ``(q_descale, k_descale, v_descale, out_dtype, dev)`` (``fp8_attention``)."""
    q, k, v = _qkv(q, k, v, 4, fp8=fp8 is not None)
    _check_causal(causal)
    descale, out_fmt = fp8_attention(q, k, q.shape[0], *fp8) if fp8 else (None, None)
    return Attention(q, k, v, _scale(softmax_scale, q.shape[3]), bool(causal),
                     window=window(window_size, causal), softcap=score_cap(softcap),
                     alibi_slopes=alibi(alibi_slopes, q, q.shape[0]),
                     sink=sink(learnable_sink, q), descale=descale, out_fmt=out_fmt)


OUT_FORMATS_FP8 = ("bfloat16", "float16")  # what FP8 attention writes (FA3's)


def _format_name(dtype, name):
    """A dtype given as a string, a NumPy or a torch dtype -> its name ("float16", ...)."""
    text = str(dtype).replace("torch.", "")
    if text in FLOAT_FORMATS or text in FP8_FORMATS:
        return text
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"{name}: expected a dtype, got {dtype!r}") from None


def fp8_attention(q, k, batch, q_descale, k_descale, v_descale, out_dtype, dev):
    """FP8 attention's own arguments (FA3's convention): with float8_e4m3fn q, k, v, the three
    descales, float32 (batch, Hk) on q's device, all required, and the output's format
    (``out_dtype``: bfloat16 by default, or float16). Returns ``(descales, out_fmt)``, or
    ``(None, None)`` for 16-bit inputs, which take no descale and write their own format."""
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    out_fmt = None if out_dtype is None else _format_name(out_dtype, "out_dtype")
    if q.fmt not in FP8_FORMATS:
        for name, x in given.items():
            if x is not None:
                raise ValueError(f"{name}: descales go with float8_e4m3fn q, k, v, not {q.fmt}")
        if out_fmt not in (None, q.fmt):
            raise ValueError(f"out_dtype: {q.fmt} inputs write {q.fmt}, not {out_fmt} (out_dtype "
                             "is for FP8 inputs)")
        return None, None
    _fp8_device("q", dev)
    missing = [name for name, x in given.items() if x is None]
    if missing:
        raise ValueError(f"{missing[0]}: FP8 attention takes q_descale, k_descale and v_descale, "
                         f"float32 ({batch}, {k.shape[-2]}); {', '.join(missing)} missing")
    shape = (batch, k.shape[-2])
    descales = tuple(_head_values(x, name, q, (shape,)) for name, x in given.items())
    out_fmt = out_fmt or OUT_FORMATS_FP8[0]
    if out_fmt not in OUT_FORMATS_FP8:
        raise ValueError(f"out_dtype: FP8 attention writes {' or '.join(OUT_FORMATS_FP8)}, not "
                         f"{out_fmt}")
    return descales, out_fmt


def _head_values(x, name, q, shapes):
    """A float32 array of per-head values on q's device, of one of ``shapes``."""
    t = arrays.adapt(x, name)
    if t.fmt != "float32":
        raise TypeError(f"{name}: expected float32, got {t.fmt}")
    if t.shape not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name}: expected shape {want}, got {t.shape}")
    if t.device != q.device:
        raise ValueError(f"{name}: on device {t.device}, q on device {q.device}")
    return t


def alibi(alibi_slopes, q, batch):
    """flash-attn's ``alibi_slopes``: float32 (Hq,) or (batch, Hq) on q's device, returned as
    (batch, Hq) (a (Hq,) one seen with a batch stride of 0); None for None. The slopes are
    values only the kernels read: any float, as in flash-attn."""
    if alibi_slopes is None:
        return None
    hq = q.shape[-2]
    t = _head_values(alibi_slopes, "alibi_slopes", q, ((hq,), (batch, hq)))
    return arrays.batched(t, batch) if t.ndim == 1 else t


def sink(learnable_sink, q):
    """flash-attn 4's ``learnable_sink``: float32 (Hq,) on q's device, or None."""
    if learnable_sink is None:
        return None
    return _head_values(learnable_sink, "learnable_sink", q, ((q.shape[-2],),))


def score_cap(softcap):
    """flash-attn's ``softcap`` as the kernels take it: a positive float, or None for 0 / None
    (no cap). ``TypeError`` unless a real number, ``ValueError`` when negative or not finite."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.integer,
                                                              np.floating)):
        raise TypeError(f"softcap: expected a number, got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap: expected a finite number >= 0, got {softcap!r}")
    return float(softcap) if softcap > 0 else None


# A window side of -1 (unbounded) reaches the kernels as this many keys: past any sequence, and
# small enough that a row index plus or minus it stays in int32.
WINDOW_UNBOUNDED = 1 << 30


def window(window_size, causal):
    """flash-attn's ``window_size=(left, right)`` as the kernels take it: ``(left, right)`` with
    ``causal`` as ``right = 0`` and an unbounded side (-1) as WINDOW_UNBOUNDED; None where it
    bounds nothing the causal flag does not (``(-1, -1)``, or ``(-1, right)`` with causal).
    ``TypeError`` unless a pair of ints, ``ValueError`` for a side below -1."""
    if window_size is None:
        return None
    try:
        sides = tuple(window_size)
    except TypeError:
        raise TypeError(f"window_size: expected a pair of ints, got {window_size!r}") from None
    if len(sides) != 2 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                  for x in sides):
        raise TypeError(f"window_size: expected a pair of ints, got {window_size!r}")
    if min(sides) < -1:
        raise ValueError(f"window_size: each side must be -1 (unbounded) or >= 0, got "
                         f"{window_size!r}")
    left, right = (int(x) for x in sides)
    if causal:
        right = 0
    if left == -1 and (right == -1 or causal):
        return None

    def side(x):
        return WINDOW_UNBOUNDED if x == -1 else min(x, WINDOW_UNBOUNDED)
    return side(left), side(right)


def _qkv(q, k, v, ndim, q_ndim=None, fp8=False):
    """q, k, v adapted and checked, dense (B, S, H, D) or packed (total, H, D), k and v
    ``ndim``-dimensional (pages: q packed, ``q_ndim`` 3): one dtype (``fp8``: float8_e4m3fn
    too), k and v alike, the head dim shared and allowed, Hq a multiple of Hk, and (dense) one
    batch."""
    q = _tensor(q, "q", q_ndim or ndim, fp8)
    k, v = _tensor(k, "k", ndim, fp8), _tensor(v, "v", ndim, fp8)
    _same_format(q, k, v)
    hq, d = q.shape[-2:]
    if ndim == 4 and q.ndim == 4 and (k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]):
        raise ValueError(f"k, v: batch {k.shape[0]}, {v.shape[0]} differs from q's {q.shape[0]}")
    if k.shape != v.shape:
        raise ValueError(f"v: shape {v.shape} differs from k's {k.shape}")
    if k.shape[-1] != d:
        raise ValueError(f"k: head dim {k.shape[-1]} differs from q's {d}")
    if hq % k.shape[-2] != 0:
        raise ValueError(f"k: query heads ({hq}) must be a multiple of kv heads ({k.shape[-2]})")
    if d % 8 != 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"q: head dim must be a multiple of 8 up to {MAX_HEAD_DIM}, got {d}")
    return q, k, v


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
           softmax_scale, seqused_k=None, block_table=None, window_size=None, softcap=None,
           alibi_slopes=None, learnable_sink=None, fp8=None):
    """The checks of the varlen calls: packed q (total_q, Hq, D), k and v (total_k, Hk, D) or,
    with a block table (B, max_blocks) int32, pages (num_pages, page_size, Hk, D); offsets (B +
    1,) and seqused_k (B,) int32, positive max_seqlen_q / max_seqlen_k. Returns the
    ``Attention`` problem, its q (and unpaged k, v) seen as (B, total, H, D) with a batch stride
    of 0. The offsets' and the table's values stay on the device (the kernels bound them,
    ``common/masks.py``, ``common/paged_kv.py``)."""
    paged = block_table is not None
    q, k, v = _qkv(q, k, v, 4 if paged else 3, q_ndim=3, fp8=fp8 is not None)
    cu_q = index_array(cu_seqlens_q, "cu_seqlens_q", (None,))
    if cu_q.shape[0] < 2:
        raise ValueError(f"cu_seqlens_q: expected shape (B + 1,) with B >= 1, got {cu_q.shape}")
    b = cu_q.shape[0] - 1
    descale, out_fmt = fp8_attention(q, k, b, *fp8) if fp8 else (None, None)
    cu_k = index_array(cu_seqlens_k, "cu_seqlens_k", (b + 1,))
    if seqused_k is not None:
        seqused_k = index_array(seqused_k, "seqused_k", (b,))
    if paged:
        block_table = index_array(block_table, "block_table", (b, None))
        for t in (k, v):  # the kernels address rows as page * stride + slot * stride, 32-bit
            if not all(0 <= st * t.itemsize < 2 ** 32 for st in t.strides[:2]):
                raise ValueError(f"{t.name}: pages and their rows must be 0 to 4 GiB apart "
                                 f"(non-negative strides under 2**32 bytes), got strides "
                                 f"{t.strides}")
    max_q = positive_int(max_seqlen_q, "max_seqlen_q")
    max_k = positive_int(max_seqlen_k, "max_seqlen_k")
    _check_causal(causal)
    local = window(window_size, causal)
    cap, slopes, logits = score_cap(softcap), alibi(alibi_slopes, q, b), sink(learnable_sink, q)
    q = arrays.batched(q, b)
    if not paged:
        k, v = arrays.batched(k, b), arrays.batched(v, b)
    return Attention(q, k, v, _scale(softmax_scale, q.shape[3]), bool(causal), cu_seqlens_q=cu_q,
                     cu_seqlens_k=cu_k, seqused_k=seqused_k, max_seqlen=(max_q, max_k),
                     block_table=block_table, window=local, softcap=cap, alibi_slopes=slopes,
                     sink=logits, descale=descale, out_fmt=out_fmt)


def backward(problem, dout, out, lse):
    """The backward's own inputs against the checked ``problem``: dout and out shaped like the
    caller's q, (B, Sq, Hq, D) or packed (total_q, Hq, D), and lse (B, Hq, Sq) or (Hq, total_q)
    float32; returns them adapted."""
    q = problem.q
    packed = problem.cu_seqlens_q is not None
    shape = q.shape[1:] if packed else q.shape
    dout, out = _tensor(dout, "dout", len(shape)), _tensor(out, "out", len(shape))
    for t in (dout, out):
        if t.shape != shape:
            raise ValueError(f"{t.name}: shape {t.shape} differs from q's {shape}")
    _same_format(q, dout, out)
    *batch, sq, hq, _ = shape
    want = (*batch, hq, sq)
    lse = arrays.adapt(lse, "lse")
    if lse.shape != want or lse.fmt != "float32":
        raise ValueError(f"lse: expected shape {want} of float32, got {lse.shape} of {lse.fmt}")
    return dout, out, lse


# ----------------------------------------------------------------------------- paged MLA decode

def mla_metadata(num_q_tokens_per_head_k, num_heads_k, num_heads_q):
    """``get_mla_metadata``'s counts; returns the query rows per kv head and the kv heads."""
    q_rows = positive_int(num_q_tokens_per_head_k, "num_q_tokens_per_head_k")
    h_kv = positive_int(num_heads_k, "num_heads_k")
    if num_heads_q is not None and positive_int(num_heads_q, "num_heads_q") % h_kv:
        raise ValueError(f"num_heads_q: expected a multiple of num_heads_k ({h_kv}), "
                         f"got {num_heads_q}")
    return q_rows, h_kv


def sparse_plan(cache_seqlens, q_rows, h_kv, num_heads_q, is_fp8_kvcache, topk):
    """``get_mla_metadata``'s sparse counts: returns s_q and the query rows of a request."""
    if num_heads_q is None:
        raise ValueError("num_heads_q: required with topk (s_q = num_q_tokens_per_head_k * "
                         "num_heads_k / num_heads_q)")
    if q_rows * h_kv % num_heads_q:
        raise ValueError(f"num_q_tokens_per_head_k: expected s_q * num_heads_q / num_heads_k, "
                         f"a multiple of {num_heads_q // h_kv}, got {q_rows}")
    positive_int(topk, "topk")
    if not isinstance(is_fp8_kvcache, (bool, np.bool_)):
        raise TypeError(f"is_fp8_kvcache: expected a bool, got {type(is_fp8_kvcache).__name__}")
    return q_rows * h_kv // num_heads_q, num_heads_q // h_kv


def host_lengths(cache_seqlens):
    """A NumPy ``cache_seqlens`` that the host plans from: int32 of shape (n,)."""
    host = np.asarray(cache_seqlens)
    if host.dtype != np.int32:
        raise TypeError(f"cache_seqlens: expected int32, got {host.dtype}")
    if host.ndim != 1 or host.size == 0:
        raise ValueError(f"cache_seqlens: expected shape (n,), got {host.shape}")
    return host


def _head_dim_v(head_dim_v, d):
    if isinstance(head_dim_v, (bool, np.bool_)) or not isinstance(head_dim_v, (int, np.integer)) \
            or not 1 <= head_dim_v <= d:
        raise ValueError(f"head_dim_v: expected an integer from 1 to the head dim {d}, "
                         f"got {head_dim_v!r}")


def _plan(tile_scheduler_metadata, num_splits, requests):
    """A decode's given plan for ``requests`` requests: both arrays, or neither (None, None)."""
    if (tile_scheduler_metadata is None) != (num_splits is None):
        raise ValueError("tile_scheduler_metadata, num_splits: pass both (a plan of "
                         "get_mla_metadata) or neither (the call plans itself)")
    if tile_scheduler_metadata is None:
        return None, None
    return (index_array(tile_scheduler_metadata, "tile_scheduler_metadata",
                        (None, scheduler.METADATA_SIZE)),
            index_array(num_splits, "num_splits", (requests + 1,)))


def mla_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
               num_splits, causal, softmax_scale, attn_sink=None):
    """The decode's arguments; returns the ``Decode`` problem (its metadata and num_splits None
    when the call plans itself)."""
    q, k_cache = _tensor(q, "q", 4), _tensor(k_cache, "k_cache", 4)
    _same_format(q, k_cache)
    b, s_q, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} differs from q's {d}")
    if d % 8 != 0 or d > MAX_MLA_HEAD_DIM:
        raise ValueError(f"q: head dim must be a multiple of 8 up to {MAX_MLA_HEAD_DIM}, got {d}")
    if h_q % h_kv != 0:
        raise ValueError(f"k_cache: query heads ({h_q}) must be a multiple of kv heads ({h_kv})")
    _head_dim_v(head_dim_v, d)
    block_table = index_array(block_table, "block_table", (b, None))
    cache_seqlens = index_array(cache_seqlens, "cache_seqlens", (b,))
    tile_scheduler_metadata, num_splits = _plan(tile_scheduler_metadata, num_splits, b)
    _check_causal(causal)
    sink = None if attn_sink is None else _head_values(attn_sink, "attn_sink", q, ((h_q,),))
    return Decode(q, k_cache, block_table, cache_seqlens, int(head_dim_v), _scale(softmax_scale, d),
                  bool(causal), tile_scheduler_metadata, num_splits, attn_sink=sink)


class SparseCall(NamedTuple):
    """The sparse MLA decode's checked arguments: q and out as one query token per request
    (``(b s_q, 1, h_q, .)`` views), the cache with its head axis, the indices (b, s_q, topk) and
    the rest as ``Decode`` takes them."""

    q: object
    k_cache: object
    indices: object
    topk_length: object  # (b,) int32, or None
    head_dim_v: int
    scale: float
    metadata: object     # a plan for b s_q requests, or None (with num_splits)
    num_splits: object
    attn_sink: object
    fp8: bool            # DeepSeek-V3.2's 656-byte FP8 rows


V32_HEAD_DIM, V32_HEAD_DIM_V = 576, 512


def tokens_as_requests(t, name):
    """(b, s_q, ...) seen as (b s_q, 1, ...): one query token per request."""
    b, s_q = t.shape[:2]
    if s_q > 1 and b > 1 and t.strides[0] != s_q * t.strides[1]:
        raise ValueError(f"{name}: the sparse decode takes each query token as a request of its "
                         f"own: stride(0) must be size(1) * stride(1), got strides {t.strides}")
    return arrays.strided(t, (b * s_q, 1, *t.shape[2:]),
                          (t.strides[1], t.strides[1], *t.strides[2:]))


def sparse_mla_decode(q, k_cache, indices, topk_length, head_dim_v, tile_scheduler_metadata,
                      num_splits, causal, softmax_scale, attn_sink, is_fp8_kvcache, dev):
    """The sparse decode's arguments (FlashMLA's ``indices``): q (b, s_q, h_q, d); k_cache
    (num_blocks, page, h_kv, d) in q's dtype, or with ``is_fp8_kvcache`` DeepSeek-V3.2's
    float8_e4m3fn rows (num_blocks, page, 1, 656) or (num_blocks, page, 656) with bfloat16 q of
    576 columns and head_dim_v 512; indices (b, s_q, topk) int32; topk_length (b,) int32."""
    if not isinstance(is_fp8_kvcache, (bool, np.bool_)):
        raise TypeError(f"is_fp8_kvcache: expected a bool, got {type(is_fp8_kvcache).__name__}")
    q = _tensor(q, "q", 4)
    b, s_q, h_q, d = q.shape
    cache = arrays.adapt(k_cache, "k_cache")
    if is_fp8_kvcache and cache.ndim == 3:  # FlashMLA's form without the head axis
        cache = arrays.strided(cache, (*cache.shape[:2], 1, cache.shape[2]),
                               (*cache.strides[:2], cache.shape[2], cache.strides[2]))
    k_cache = _checked(cache, "k_cache", 4, fp8=is_fp8_kvcache)
    if is_fp8_kvcache:
        if k_cache.fmt not in FP8_FORMATS:
            raise TypeError(f"k_cache: is_fp8_kvcache takes float8_e4m3fn rows, got {k_cache.fmt}")
        _fp8_device("k_cache", dev)
        if q.fmt != "bfloat16" or d != V32_HEAD_DIM:
            raise ValueError(f"q: DeepSeek-V3.2's FP8 cache is read with bfloat16 queries of "
                             f"{V32_HEAD_DIM} columns, got {q.fmt} with {d}")
        row = registry.V32_ROW_BYTES
        if k_cache.shape[2:] != (1, row):
            raise ValueError(f"k_cache: expected rows of one kv head of {row} bytes "
                             f"(num_blocks, page, 1, {row}), got {k_cache.shape}")
        if head_dim_v != V32_HEAD_DIM_V:
            raise ValueError(f"head_dim_v: DeepSeek-V3.2's cache holds {V32_HEAD_DIM_V} value "
                             f"columns, got {head_dim_v!r}")
        if not arrays.rows_16_byte_aligned(k_cache):
            raise ValueError("k_cache: FP8 rows are copied in 16-byte chunks: the data pointer "
                             "and every stride must be multiples of 16 bytes")
    else:
        _same_format(q, k_cache)
        if d % 8 != 0 or d > MAX_MLA_HEAD_DIM:
            raise ValueError(f"q: head dim must be a multiple of 8 up to {MAX_MLA_HEAD_DIM}, "
                             f"got {d}")
        if k_cache.shape[3] != d:
            raise ValueError(f"k_cache: head dim {k_cache.shape[3]} differs from q's {d}")
        _head_dim_v(head_dim_v, d)
    if h_q % k_cache.shape[2]:
        raise ValueError(f"k_cache: query heads ({h_q}) must be a multiple of kv heads "
                         f"({k_cache.shape[2]})")
    indices = index_array(indices, "indices", (b, s_q, None))
    if topk_length is not None:
        topk_length = index_array(topk_length, "topk_length", (b,))
    _check_causal(causal)
    if causal:
        raise ValueError("causal: a sparse decode's indices choose each token's keys; pass "
                         "causal=False")
    tile_scheduler_metadata, num_splits = _plan(tile_scheduler_metadata, num_splits, b * s_q)
    sink = None if attn_sink is None else _head_values(attn_sink, "attn_sink", q, ((h_q,),))
    return SparseCall(tokens_as_requests(q, "q"), k_cache, indices, topk_length, int(head_dim_v),
                      _scale(softmax_scale, d), tile_scheduler_metadata, num_splits, sink,
                      bool(is_fp8_kvcache))


# ----------------------------------------------------------------------------- KV cache

class KVCacheCall(NamedTuple):
    """``flash_attn_with_kvcache``'s checked arguments (adapted arrays, None where absent)."""

    q: object
    k_cache: object
    v_cache: object
    k: object
    v: object
    cache_seqlens: object   # a (B,) int32 array, or None: ``fixed_seqlen`` for every sequence
    fixed_seqlen: int
    cache_batch_idx: object
    cache_leftpad: object
    block_table: object
    rotary: object          # None, or (rotary_cos, rotary_sin, "interleaved" | "half")
    capacity: int           # cache positions a sequence may use
    scale: float
    causal: bool
    num_splits: int
    window: object = None        # validate.window's (left, right), or None
    softcap: object = None       # validate.score_cap's, or None
    alibi_slopes: object = None  # (B, Hq) float32, or None
    cache_descale: object = None  # FP8 caches: (k_descale, v_descale) float32 (B, Hk), or None


def kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, rotary_interleaved, num_splits,
            window_size=None, softcap=None, alibi_slopes=None, k_descale=None, v_descale=None,
            dev=None):
    """The checks of ``flash_attn_with_kvcache`` (flash-attn 2.8's rules, docs/api.md); values
    only the device sees (lengths, indices, table entries) are bounded by the kernels."""
    q = _tensor(q, "q", 4)
    k_cache = _tensor(k_cache, "k_cache", 4, fp8=True)
    v_cache = _tensor(v_cache, "v_cache", 4, fp8=True)
    b, sq, hq, d = q.shape
    cache_descale = _cache_descales(q, k_cache, v_cache, k_descale, v_descale, dev)
    if cache_descale is None:
        _same_format(q, k_cache, v_cache)
    if d % 8 != 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"q: head dim must be a multiple of 8 up to {MAX_HEAD_DIM}, got {d}")
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} differs from q's {d}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {v_cache.shape} differs from k_cache's {k_cache.shape}")
    hk = k_cache.shape[2]
    if hq % hk:
        raise ValueError(f"k_cache: query heads ({hq}) must be a multiple of kv heads ({hk})")
    if block_table is not None:
        block_table = index_array(block_table, "block_table", (b, None))
        capacity = block_table.shape[1] * k_cache.shape[1]
        for name, value in (("cache_batch_idx", cache_batch_idx),
                            ("cache_leftpad", cache_leftpad)):
            if value is not None:
                raise ValueError(f"{name}: not supported with a paged cache (block_table), as "
                                 "in flash-attn")
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] < b:
            raise ValueError(f"k_cache: {k_cache.shape[0]} cache rows for a batch of {b} (pass "
                             "cache_batch_idx to pick rows)")
    if cache_batch_idx is not None:
        cache_batch_idx = index_array(cache_batch_idx, "cache_batch_idx", (b,))
    if cache_leftpad is not None:
        cache_leftpad = index_array(cache_leftpad, "cache_leftpad", (b,))
    if (k is None) != (v is None):
        raise ValueError("k, v: pass both new keys and values, or neither")
    s_new = 0
    if k is not None:
        k, v = _tensor(k, "k", 4), _tensor(v, "v", 4)
        _same_format(q, k, v)
        if k.shape != v.shape or k.shape[0] != b or k.shape[2:] != (hk, d):
            raise ValueError(f"k, v: expected shape ({b}, S_new, {hk}, {d}), got {k.shape} and "
                             f"{v.shape}")
        s_new = k.shape[1]
        if s_new > capacity:
            raise ValueError(f"k: {s_new} new keys do not fit a cache of {capacity} positions")
        if cache_seqlens is None:
            raise ValueError("cache_seqlens: required with new k, v (where to append them)")
    fixed = capacity
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        fixed = int(cache_seqlens)
        if not 0 <= fixed <= capacity - s_new:
            raise ValueError(f"cache_seqlens: expected 0 to {capacity - s_new} (the cache holds "
                             f"{capacity} positions, {s_new} new keys), got {fixed}")
        cache_seqlens = None
    elif cache_seqlens is not None:
        cache_seqlens = index_array(cache_seqlens, "cache_seqlens", (b,))
    rotary = None
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos, rotary_sin: pass both or neither")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos, rotary_sin: rotary applies to new k, v; none given")
        cos, sin = _tensor(rotary_cos, "rotary_cos", 2), _tensor(rotary_sin, "rotary_sin", 2)
        _same_format(q, cos, sin)
        if sin.shape != cos.shape:
            raise ValueError(f"rotary_sin: shape {sin.shape} differs from rotary_cos's "
                             f"{cos.shape}")
        if 2 * cos.shape[1] > d:
            raise ValueError(f"rotary_cos: rotary_dim / 2 = {cos.shape[1]} columns, more than "
                             f"half the head dim {d}")
        if cos.shape[0] < capacity:
            raise ValueError(f"rotary_cos: {cos.shape[0]} positions, fewer than the cache's "
                             f"{capacity}")
        if not isinstance(rotary_interleaved, (bool, np.bool_)):
            raise TypeError(f"rotary_interleaved: expected a bool, got "
                            f"{type(rotary_interleaved).__name__}")
        rotary = (cos, sin, "interleaved" if rotary_interleaved else "half")
    _check_causal(causal)
    if isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, (int, np.integer)) \
            or num_splits < 0:
        raise ValueError(f"num_splits: expected an integer >= 0, got {num_splits!r}")
    written = [t for t in (k_cache, v_cache)]
    read = [t for t in (q, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                        *(rotary[:2] if rotary else ()), *(cache_descale or ())) if t is not None]
    refuse_overlap(written, read)  # the append writes the caches while these are read
    return KVCacheCall(q, k_cache, v_cache, k, v, cache_seqlens, fixed, cache_batch_idx,
                       cache_leftpad, block_table, rotary, capacity,
                       _scale(softmax_scale, d), bool(causal), int(num_splits),
                       window(window_size, causal), score_cap(softcap), alibi(alibi_slopes, q, b),
                       cache_descale)


def _cache_descales(q, k_cache, v_cache, k_descale, v_descale, dev):
    """FP8 caches' descales: both caches float8_e4m3fn with float32 (B, Hk) ``k_descale`` and
    ``v_descale`` on q's device (q float16 or bfloat16, compute capability 8.9+), returned as a
    pair; None for 16-bit caches, which take no descales."""
    fp8 = [t.fmt in FP8_FORMATS for t in (k_cache, v_cache)]
    if not any(fp8):
        for name, value in (("k_descale", k_descale), ("v_descale", v_descale)):
            if value is not None:
                raise ValueError(f"{name}: descales go with float8_e4m3fn caches, and k_cache "
                                 f"is {k_cache.fmt}")
        return None
    if not all(fp8):
        raise TypeError(f"v_cache: dtype {v_cache.fmt} differs from k_cache's {k_cache.fmt}")
    if q.fmt not in ("float16", "bfloat16"):
        raise TypeError(f"q: FP8 caches are read with float16 or bfloat16 queries, got {q.fmt}")
    _fp8_device("k_cache", dev)
    shape = ((q.shape[0], k_cache.shape[2]),)
    pair = []
    for name, value in (("k_descale", k_descale), ("v_descale", v_descale)):
        if value is None:
            raise ValueError(f"{name}: required with float8_e4m3fn caches (the float32 (B, Hk) "
                             f"factors their values are multiplied by)")
        pair.append(_head_values(value, name, q, shape))
    return tuple(pair)
