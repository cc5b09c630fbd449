"""Public calls: validate -> plan -> launch.

Each public function first adapts and checks every argument (``ValueError`` / ``TypeError``
naming the argument, before anything is allocated or launched), then plans: picks the kernels
(``_forward_spec``: the one place a backend and a tc family are chosen), allocates outputs in
the caller's array library and launches on the caller's stream. Grids and argument lists come
from the kernels' specs (``runtime.spec``); what a call means is ``docs/api.md``.
"""

import math
import threading

import numpy as np
from cuda.pathfinder import DynamicLibNotFoundError

from .runtime.env import setup_error

try:
    from numba import cuda
except DynamicLibNotFoundError as e:  # numba-cuda loads the CUDA runtime library on import
    raise setup_error(e) from None

from . import scheduler
from .kernels import naive
from .kernels.common import status as device_status
from .kernels.simt import backward as simt_backward
from .kernels.simt import combine as simt_combine
from .kernels.simt import forward as simt_forward
from .kernels.simt import mla_decode as simt_mla_decode
from .kernels.simt import mla_metadata as simt_mla_metadata
from .kernels.tc import backward_mma as tc_backward_mma
from .kernels.tc import backward_wgmma as tc_backward_wgmma
from .kernels.tc import forward_mma as tc_forward_mma
from .kernels.tc import forward_wgmma as tc_forward_wgmma
from .kernels.tc import mla_decode_mma as tc_mla_decode_mma
from .kernels.tc import mla_decode_seesaw as tc_mla_decode_seesaw
from .kernels.tc import mla_decode_wgmma as tc_mla_decode_wgmma
from .runtime import arrays, device
from .runtime.launcher import PreparedLaunch
from .runtime.arrays import FLOAT_FORMATS
from .runtime.device import SIMULATOR

BACKENDS = ("auto", "simt", "tc")
MAX_HEAD_DIM = 256
MAX_MLA_HEAD_DIM = simt_mla_decode.MAX_HEAD_DIM


# ----------------------------------------------------------------------------- validation

def _tensor(x, name, ndim):
    t = arrays.adapt(x, name)
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {t.shape}")
    if t.fmt not in FLOAT_FORMATS:
        raise TypeError(f"{name}: expected float16, bfloat16 or float32, got {t.fmt}")
    if any(s == 0 for s in t.shape):
        raise ValueError(f"{name}: empty array of shape {t.shape}")
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), "
                         f"got strides {t.strides}")
    return t


def _index_array(x, name, shape):
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


# The largest softmax scale: the kernels multiply raw float32 scores by scale * log2(e), and a
# score times a scale past this overflows float32 for scores of a few hundred thousand.
MAX_SOFTMAX_SCALE = 2.0 ** 16


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


def _extent(t):
    """[first, last) byte addresses an array's elements occupy."""
    lo = hi = t.ptr
    for n, stride in zip(t.shape, t.strides):
        if stride > 0:
            hi += (n - 1) * stride * t.itemsize
        else:
            lo += (n - 1) * stride * t.itemsize
    return lo, hi + t.itemsize


def _refuse_overlap(outputs, inputs):
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


def resolve_backend(backend, fmt, dev=None):
    """``auto`` -> ``tc`` for 16-bit inputs on compute capability >= 8.0 (and under the
    simulator, which emulates it), else ``simt``; an explicit choice the inputs or the device
    cannot run is refused, never silently replaced."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    cc = (dev or device.current()).cc
    tc_ok = fmt in ("float16", "bfloat16") and (SIMULATOR or cc >= (8, 0))
    if backend == "tc" and not tc_ok:
        raise ValueError(f"backend: 'tc' needs float16 or bfloat16 inputs on compute capability "
                         f">= 8.0, got {fmt} on {cc}")
    if backend == "auto":
        return "tc" if tc_ok else "simt"
    return backend


def _check_attention(q, k, v, causal, softmax_scale, backend, dev):
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
    _check_causal(causal)
    return q, k, v, _scale(softmax_scale, d), resolve_backend(backend, q.fmt, dev)


def _check_causal(causal):
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")


# ----------------------------------------------------------------------------- plans

def tc_family(cc):
    """The tc forward that runs on compute capability ``cc``: ``"wgmma"`` (Hopper's warpgroup
    instructions) on 9.0, else ``"mma"`` (mma.sync, sm_80 and newer)."""
    return "wgmma" if tuple(cc[:2]) == (9, 0) else "mma"


TC_FORWARD = {"mma": tc_forward_mma.SPEC, "wgmma": tc_forward_wgmma.SPEC}


def _forward_spec(backend, dev):
    """The forward kernel of ``backend`` on ``dev``: adding a forward family is one line here."""
    return TC_FORWARD[tc_family(dev.cc)] if backend == "tc" else simt_forward.SPEC


def _backward_specs(backend, head_dim, dev):
    """The dK/dV and dQ kernels of ``backend``: on a Hopper the wgmma ones up to their head-dim
    limit, mma.sync past it and on every other GPU. ``DqSpec.writes_delta`` says whether dQ
    computes D_i itself or the shared preprocess runs first."""
    if backend == "tc":
        if tc_family(dev.cc) == "wgmma" and head_dim <= tc_backward_wgmma.MAX_HEAD_DIM:
            return tc_backward_wgmma.DKDV, tc_backward_wgmma.DQ
        return tc_backward_mma.DKDV, tc_backward_mma.DQ
    return simt_backward.DKDV, simt_backward.DQ


# Packed query rows per kv head up to which ``auto`` keeps the simt decode: its narrow variant
# splits the keys of one row over the warps and streams the cache at 3.8-4.3 TB/s, 0.98-1.06x
# FlashMLA, where the 64-row tensor-core tile is 63/64 padding (0.92-0.96x). At two rows (s_q 2,
# h_q 1) the tc kernel is ahead, 0.92-0.96x against 0.63-0.68x. Measured on an H200 in one run:
# bench/results/NVIDIA-H200/mla_decode.csv.
SIMT_DECODE_ROWS = 1


def _decode_spec(backend, config, q, k_cache, dev):
    """The decode kernel of ``backend`` for ``config`` = (q_rows, d, dv, causal, fmt), and its
    spec's config: adding a decode family is one line here. The tc family is wgmma on 9.0,
    mma.sync on every other device (``tc_family``)."""
    q_rows, d, dv, causal, fmt = config
    cache_aligned = arrays.rows_16_byte_aligned(k_cache)
    tc = tc_mla_decode_wgmma if tc_family(dev.cc) == "wgmma" else tc_mla_decode_mma
    if resolve_backend(backend, fmt, dev) == "tc":  # (auto: a 16-bit decode the tc family may run)
        aligned = cache_aligned and arrays.rows_16_byte_aligned(q)
        why = None
        if not tc.supports(d, dv):
            why = (f"the tensor-core decode takes head dims that are multiples of 16 up to "
                   f"{tc.MAX_HEAD_DIM} and head_dim_v up to {tc.MAX_HEAD_DIM_V}, got {d} and "
                   f"{dv}")
        elif not aligned:
            why = "the tensor-core decode copies rows of q and k_cache in 16-byte chunks: " \
                  "their data pointers and strides must be multiples of 16 bytes"
        if backend == "tc" and why:
            raise ValueError(f"backend: {why}")
        backend = "tc" if why is None and (backend == "tc" or q_rows > SIMT_DECODE_ROWS) \
            else "simt"
    else:
        backend = "simt"
    if backend == "tc":
        tma = tc is tc_mla_decode_wgmma and k_cache.shape[1] % tc.BLOCK_N == 0
        if tma and tc_mla_decode_seesaw.supports(d, dv):
            return tc_mla_decode_seesaw.SPEC, tc.SPEC.Config(*config, True, tma)
        return tc.SPEC, tc.SPEC.Config(*config, True, tma)
    return simt_mla_decode.SPEC, simt_mla_decode.SPEC.Config(*config, cache_aligned)


# ----------------------------------------------------------------------------- attention

# Forward calls on torch tensors whose signature was seen: what the checks and the plan of the
# first such call decided, kept so that a later call pays only for its outputs and the launch
# (~20 us of host time otherwise spent re-deciding it, on a 5 us tiny forward).
_forward_plans = {}
MAX_FORWARD_PLANS = 256


class _ForwardPlan:
    """A checked, planned forward for one signature: the kernel's launch with every number in
    place, the outputs' shapes and dtype, and the forced tile entry it was planned under (a
    tuner or test that forces another one gets a new plan)."""

    def __init__(self, spec, launch, out_shape, lse_shape, dtype, ordinal):
        import torch

        self.spec, self.forced, self.launch = spec, spec._forced, launch
        self.out_shape, self.lse_shape = out_shape, lse_shape
        self.dtype, self.ordinal, self.torch = dtype, ordinal, torch

    def __call__(self, pointers):
        """``(out, lse)`` for the inputs at ``pointers`` (q, k, v), or None when the plan does
        not apply any more."""
        if self.spec._forced is not self.forced:
            return None
        torch = self.torch
        o = torch.empty(self.out_shape, dtype=self.dtype, device=self.ordinal)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.ordinal)
        self.launch(torch._C._cuda_getCurrentRawStream(self.ordinal), *pointers,
                    o.data_ptr(), lse.data_ptr())
        return o, lse


def _forward_key(q, k, v, causal, softmax_scale, backend, out, stream):
    """``(key, pointers)`` of a forward call that a plan may serve (torch CUDA tensors, no
    ``out`` or ``stream``, hashable options), else ``(None, None)``. The key holds all that the
    checks and the plan read: the signatures, the options, the device, whether the pointers are
    16-byte aligned (which decides tc against simt under ``auto``)."""
    if SIMULATOR or out is not None or stream is not None or type(causal) is not bool \
            or not (softmax_scale is None or type(softmax_scale) is float) \
            or type(backend) is not str:
        return None, None
    signatures = arrays.torch_signature(q), arrays.torch_signature(k), arrays.torch_signature(v)
    if None in signatures:
        return None, None
    pointers = q.data_ptr(), k.data_ptr(), v.data_ptr()
    aligned = not (pointers[0] | pointers[1] | pointers[2]) & 15
    return (signatures, causal, softmax_scale, backend, aligned, device.current()), pointers


def _remember_forward(key, spec, config, problem, dev):
    """Keep the plan of a forward that just ran for later calls of its signature."""
    if len(_forward_plans) >= MAX_FORWARD_PLANS:
        _forward_plans.clear()
    kernel, tiles = spec.compiled(config, dev)
    launch = PreparedLaunch(kernel, spec.grid(config, tiles, problem), tiles.threads,
                            tiles.shared_bytes, *spec.arguments(config, problem))
    q, lse = problem["q"], problem["lse"]
    _forward_plans[key] = _ForwardPlan(spec, launch, q.shape, lse.shape, q.obj.dtype, q.device)


def flash_attn_fwd(q, k, v, causal=False, softmax_scale=None, backend="auto", out=None, stream=None):
    """Exact attention forward. Returns ``(out, lse)``.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hk, D) with Hq % Hk == 0; out like q; lse (B, Hq, Sq)
    float32 natural-log sum of exp of the scaled scores (+inf for rows that see no key).
    ``causal`` aligns the mask bottom-right (query i sees keys j <= i + Sk - Sq). ``auto`` runs
    the tensor-core kernel for 16-bit inputs on compute capability >= 8.0 whose q, k, v are
    16-byte aligned views, else the CUDA-core one; an explicit ``tc`` refuses unaligned views.
    """
    key, pointers = _forward_key(q, k, v, causal, softmax_scale, backend, out, stream)
    plan = _forward_plans.get(key) if key is not None else None
    if plan is not None:
        result = plan(pointers)
        if result is not None:
            return result
    dev = device.current()
    q, k, v, scale, chosen = _check_attention(q, k, v, causal, softmax_scale, backend, dev)
    if chosen == "tc" and not arrays.rows_16_byte_aligned(q, k, v):
        if backend == "tc":
            raise ValueError("backend: the 'tc' forward copies q, k and v in 16-byte chunks: "
                             "their data pointers and strides must be multiples of 16 bytes "
                             "(use 'simt' or 'auto' for other views)")
        chosen = "simt"  # auto: the CUDA-core kernel reads any view
    b, sq, hq, d = q.shape
    o = _out_buffer(out, q, q.shape, q.fmt)
    if out is not None:
        _refuse_overlap([o], [q, k, v])
    spec = _forward_spec(chosen, dev)
    lse = arrays.empty(q, (b, hq, sq), "float32", "lse")
    # launch() prepares first: tiles that do not fit the device or a grid past CUDA's limits
    # are refused before the kernel runs, with nothing of the caller's written.
    config, problem = spec.Config(d, bool(causal), q.fmt), dict(q=q, k=k, v=v, out=o, lse=lse,
                                                                scale=scale)
    spec.launch(config, problem, arrays.stream_of(q, stream), dev)
    if key is not None:
        _remember_forward(key, spec, config, problem, dev)
    return o.obj, lse.obj


def flash_attn_bwd(dout, q, k, v, out, lse, causal=False, softmax_scale=None, backend="auto",
                   dq=None, dk=None, dv=None, stream=None):
    """Gradients of exact attention for the incoming ``dout``. Returns ``(dq, dk, dv)``.

    ``out`` and ``lse`` are what ``flash_attn_fwd`` returned for the same q, k, v, causal and
    softmax_scale: dout and out shaped like q, lse (B, Hq, Sq) float32. dq is shaped like q, dk
    and dv like k (a kv head sums the gradients of its group's query heads), all in q's dtype;
    ``dq=``, ``dk=``, ``dv=`` take caller buffers. Bitwise deterministic (no atomics).
    ``auto`` runs the tensor-core kernels for 16-bit inputs on compute capability >= 8.0 whose
    q, k, v and dout (and out, for the wgmma pair, whose dQ kernel computes D_i) are 16-byte
    aligned views, else the CUDA-core ones; an explicit ``tc`` refuses unaligned views.
    """
    dev = device.current()
    q, k, v, scale, chosen = _check_attention(q, k, v, causal, softmax_scale, backend, dev)
    dout, out = _tensor(dout, "dout", 4), _tensor(out, "out", 4)
    for t in (dout, out):
        if t.shape != q.shape:
            raise ValueError(f"{t.name}: shape {t.shape} differs from q's {q.shape}")
    _same_format(q, dout, out)
    b, sq, hq, d = q.shape
    lse = arrays.adapt(lse, "lse")
    if lse.shape != (b, hq, sq) or lse.fmt != "float32":
        raise ValueError(f"lse: expected shape {(b, hq, sq)} of float32, "
                         f"got {lse.shape} of {lse.fmt}")
    dkdv, dq_spec = _backward_specs(chosen, d, dev)
    # A dQ kernel that computes D_i copies out as well.
    copied = (q, k, v, dout, out) if dq_spec.writes_delta else (q, k, v, dout)
    if chosen == "tc" and not arrays.rows_16_byte_aligned(*copied):
        if backend == "tc":
            names = ", ".join(t.name for t in copied[:-1]) + " and " + copied[-1].name
            raise ValueError(f"backend: the 'tc' backward copies {names} in 16-byte chunks: "
                             "their data pointers and strides must be multiples of 16 bytes "
                             "(use 'simt' or 'auto' for other views)")
        dkdv, dq_spec = _backward_specs("simt", d, dev)  # auto: CUDA cores read any view
    given = (dq, dk, dv)
    dq = _out_buffer(dq, q, q.shape, q.fmt, "dq")
    dk = _out_buffer(dk, q, k.shape, q.fmt, "dk")
    dv = _out_buffer(dv, q, k.shape, q.fmt, "dv")
    _refuse_overlap([t for t, g in zip((dq, dk, dv), given) if g is not None],
                    [q, k, v, out, dout, lse])
    config = simt_backward.DKDV.Config(d, bool(causal), q.fmt)
    delta = arrays.empty(q, (b, hq, sq), "float32", "delta")  # D_i = rowsum(dout * out)
    stream = arrays.stream_of(q, stream)
    problem = dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, delta=delta, dq=dq, dk=dk, dv=dv,
                   scale=scale)
    # D_i first: by the preprocess, or by a dQ kernel that computes it (then dQ runs first).
    steps = ((dq_spec, config), (dkdv, config)) if dq_spec.writes_delta else \
        ((simt_backward.PREPROCESS, config._replace(causal=False)), (dkdv, config),
         (dq_spec, config))
    for spec, cfg in steps:  # every kernel's tiles and grid fit, or nothing runs
        spec.prepare(cfg, problem, dev)
    for spec, cfg in steps:
        spec.launch(cfg, problem, stream, dev)
    return dq.obj, dk.obj, dv.obj


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, return_lse=False, backend="auto"):
    """``flash_attn_fwd`` returning ``out`` (or ``(out, lse)`` with ``return_lse=True``)."""
    out, lse = flash_attn_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend)
    return (out, lse) if return_lse else out


def naive_attention(q, k, v, causal=False, softmax_scale=None):
    """Exact attention by the three-kernel baseline (``kernels/naive.py``: S = QK^T to global
    memory, softmax, O = PV). Returns ``(out, lse)`` like ``flash_attn_fwd``: same arguments and
    checks (no ``backend``, ``out`` or ``stream``: launched on q's library stream); allocates
    B * Hq * Sq * Sk float32 of scratch. Not part of the public API: the benchmarks' and the
    IO measurement's baseline."""
    dev = device.current()
    q, k, v, scale, _ = _check_attention(q, k, v, causal, softmax_scale, "simt", dev)
    b, sq, hq, d = q.shape
    problem = dict(q=q, k=k, v=v, scale=scale,
                   scores=arrays.empty(q, (b, hq, sq, k.shape[1]), "float32", "scores"),
                   out=arrays.empty(q, q.shape, q.fmt, "out"),
                   lse=arrays.empty(q, (b, hq, sq), "float32", "lse"))
    stream = arrays.stream_of(q)
    config = naive.SCORES.Config(bool(causal), q.fmt)
    for spec in (naive.SCORES, naive.SOFTMAX, naive.OUTPUT):
        spec.prepare(config, problem, dev)
    for spec in (naive.SCORES, naive.SOFTMAX, naive.OUTPUT):
        spec.launch(config, problem, stream, dev)
    return problem["out"].obj, problem["lse"].obj


# ----------------------------------------------------------------------------- paged MLA decode

def _not_implemented(**options):
    """``NotImplementedError`` naming the first option that asks for what no kernel does."""
    for name, value in options.items():
        if value is not None and value is not False:
            raise NotImplementedError(f"{name}: not implemented (got {value!r}); numba_flash "
                                      f"decodes dense 16- and 32-bit caches")


def _positive_int(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None, *, num_sms=None):
    """FlashMLA's tile scheduler: how the decode work of a batch is dealt out to the SMs.

    ``cache_seqlens (b,)`` int32, a device array or a host NumPy array;
    ``num_q_tokens_per_head_k = s_q * h_q // h_kv``; ``num_heads_k = h_kv``; ``num_heads_q``
    (FlashMLA's fourth argument) is checked and otherwise unused; ``num_sms`` (keyword only)
    defaults to the device's SM count (under the simulator, which has no device to ask, to
    ``device.SIMULATED.sms = 8``). The plan is ``scheduler.plan_mla``'s, made on the device by
    ``kernels/simt/mla_metadata.py`` (no host copy, no synchronization: capturable in a CUDA
    graph), or on the host for a NumPy ``cache_seqlens``. Returns
    ``(tile_scheduler_metadata (num_sm_parts, 8), num_splits (b + 1,))``, int32 device arrays in
    cache_seqlens's library (Numba device arrays for a NumPy input on a GPU).
    """
    _not_implemented(is_fp8_kvcache=is_fp8_kvcache, topk=topk)
    q_rows = _positive_int(num_q_tokens_per_head_k, "num_q_tokens_per_head_k")
    h_kv = _positive_int(num_heads_k, "num_heads_k")
    if num_heads_q is not None and _positive_int(num_heads_q, "num_heads_q") % h_kv:
        raise ValueError(f"num_heads_q: expected a multiple of num_heads_k ({h_kv}), "
                         f"got {num_heads_q}")
    dev = device.current()
    num_sms = _positive_int(dev.sms if num_sms is None else num_sms, "num_sms")
    if type(cache_seqlens).__module__.split(".")[0] == "numpy" and not SIMULATOR:
        host = np.asarray(cache_seqlens)
        if host.dtype != np.int32:
            raise TypeError(f"cache_seqlens: expected int32, got {host.dtype}")
        if host.ndim != 1 or host.size == 0:
            raise ValueError(f"cache_seqlens: expected shape (n,), got {host.shape}")
        plan = scheduler.plan_mla(host, q_rows, h_kv, num_sms)
        return tuple(cuda.to_device(values) for values in plan)
    metadata, num_splits = _plan_on_device(
        _index_array(cache_seqlens, "cache_seqlens", (None,)), q_rows, h_kv, num_sms, dev)
    return metadata.obj, num_splits.obj


def _plan_on_device(seqlens, q_rows, h_kv, num_sms, dev):
    """Metadata and num_splits (adapted, in seqlens's library) planned by the one-warp kernel
    of kernels/simt/mla_metadata.py on seqlens's stream."""
    parts = scheduler.num_sm_parts(num_sms, h_kv, q_rows)
    problem = dict(cache_seqlens=seqlens, parts=np.int32(parts),
                   metadata=arrays.empty(seqlens, (parts, scheduler.METADATA_SIZE), "int32",
                                         "tile_scheduler_metadata"),
                   num_splits=arrays.empty(seqlens, (seqlens.shape[0] + 1,), "int32",
                                           "num_splits"))
    plan = simt_mla_metadata.SPEC
    plan.launch(plan.Config(), problem, arrays.stream_of(seqlens), dev)
    return problem["metadata"], problem["num_splits"]


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, backend="auto",
                           out=None, stream=None, attn_sink=None):
    """Paged MLA decode (FlashMLA's ``flash_mla_with_kvcache``). Returns ``(out, lse)``.

    q: (b, s_q, h_q, d), d a multiple of 8 up to 576; k_cache: (num_blocks, page_block_size,
    h_kv, d), any page size, V being ``k_cache[..., :head_dim_v]``; block_table (b, n) and
    cache_seqlens (b,) int32; the metadata and num_splits of ``get_mla_metadata`` for these
    lengths, or neither (the call then plans itself). out: (b, s_q, h_q, head_dim_v) in q's
    dtype (``out=`` takes a caller buffer); lse: (b, h_q, s_q) float32, natural log. ``causal``
    (for s_q > 1): query token i sees the keys before ``seqlen - (s_q - 1 - i)``. Block-table
    entries at or past ``ceil(seqlen / page)`` and cache slots at or past ``seqlen`` are never
    read. ``backend``: ``"tc"`` (tensor cores, ``_decode_spec``), ``"simt"`` or ``"auto"``.
    FlashMLA's ``is_fp8_kvcache=True``, ``indices`` (sparse attention) and ``attn_sink`` raise
    ``NotImplementedError``.
    """
    dev = device.current()
    _not_implemented(is_fp8_kvcache=is_fp8_kvcache, indices=indices, attn_sink=attn_sink)
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
    if isinstance(head_dim_v, (bool, np.bool_)) or not isinstance(head_dim_v, (int, np.integer)) \
            or not 1 <= head_dim_v <= d:
        raise ValueError(f"head_dim_v: expected an integer from 1 to the head dim {d}, "
                         f"got {head_dim_v!r}")
    block_table = _index_array(block_table, "block_table", (b, None))
    cache_seqlens = _index_array(cache_seqlens, "cache_seqlens", (b,))
    if (tile_scheduler_metadata is None) != (num_splits is None):
        raise ValueError("tile_scheduler_metadata, num_splits: pass both (a plan of "
                         "get_mla_metadata) or neither (the call plans itself)")
    planned = tile_scheduler_metadata is not None
    if planned:
        metadata = _index_array(tile_scheduler_metadata, "tile_scheduler_metadata",
                                (None, scheduler.METADATA_SIZE))
        num_splits = _index_array(num_splits, "num_splits", (b + 1,))
    _check_causal(causal)
    scale = _scale(softmax_scale, d)
    q_rows = s_q * (h_q // h_kv)
    config = (q_rows, d, int(head_dim_v), bool(causal) and s_q > 1, q.fmt)
    decode, config = _decode_spec(backend, config, q, k_cache, dev)
    dv = int(head_dim_v)
    o = _out_buffer(out, q, (b, s_q, h_q, dv), q.fmt)
    if out is not None:
        _refuse_overlap([o], [q, k_cache, block_table, cache_seqlens]
                        + ([metadata, num_splits] if planned else []))
    decode.choose(config, dev)
    if not planned:
        metadata, num_splits = _plan_on_device(cache_seqlens, q_rows, h_kv, dev.sms, dev)

    parts = metadata.shape[0]
    # Split requests: one slot per piece, at most b + parts - 1 of them (see scheduler.py).
    problem = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens,
                   metadata=metadata, num_splits=num_splits, out=o, scale=scale,
                   lse=arrays.empty(q, (b, h_q, s_q), "float32", "lse"),
                   o_acc=arrays.empty(q, (b + parts, s_q, h_q, dv), "float32", "o_acc"),
                   lse_acc=arrays.empty(q, (b + parts, h_q, s_q), "float32", "lse_acc"))
    problem["status"] = _status_word(q)
    stream = arrays.stream_of(q, stream)
    # Behind a decode that allows it (sm_90 kernels) the combine starts alongside the decode.
    combine = simt_combine.SPEC.Config(dv, q.fmt, decode.allows_dependents)
    simt_combine.SPEC.prepare(combine, problem, dev)  # its grid fits before the decode writes
    decode.launch(config, problem, stream, dev)
    simt_combine.SPEC.launch(combine, problem, stream, dev)
    return o.obj, problem["lse"].obj


# ----------------------------------------------------------------------------- the status word

_status_words = {}  # device ordinal -> (the word: an int32 device array of 1, its Tensor)
_status_lock = threading.Lock()


def _status_word(t):
    """The status word (kernels/common/status.py) of the device ``t`` lives on, made on first
    use and kept: kernels set its bits, ``check_errors`` reads and clears them."""
    entry = _status_words.get(t.device)
    if entry is None:
        with _status_lock:
            entry = _status_words.get(t.device)
            if entry is None:
                if SIMULATOR:
                    word = np.zeros(1, np.int32)
                else:
                    with cuda.gpus[t.device]:
                        word = cuda.to_device(np.zeros(1, np.int32))
                entry = _status_words[t.device] = (word, arrays.adapt(word, "status"))
    return entry[1]


def check_errors():
    """Raise ``RuntimeError`` naming what the kernels found wrong in values only the device saw
    (metadata, block-table entries, lengths, split counts) since the last call, and clear it.
    The kernels bound every access such a value makes and skip the work it makes invalid; this
    call is how the caller learns of it. It synchronizes each device that ran a decode."""
    if not SIMULATOR:
        device.context()  # without a driver: CudaSetupError, not "nothing found"
    found = 0
    for ordinal, (word, _) in list(_status_words.items()):
        if SIMULATOR:
            found |= int(word[0])
            word[0] = 0
            continue
        with cuda.gpus[ordinal]:
            cuda.synchronize()
            value = int(word.copy_to_host()[0])
            if value:
                word.copy_to_device(np.zeros(1, np.int32))
                cuda.synchronize()
        found |= value
    if found:
        raise RuntimeError("; ".join(message for flag, message in device_status.MESSAGES.items()
                                     if found & flag))


# ----------------------------------------------------------------------------- warmup

WARMUP_CALLS = ("flash_attn_fwd", "flash_attn_func", "flash_attn_bwd", "flash_mla_with_kvcache")


def warmup(configs):
    """Compile ahead of time the kernels of each configuration in ``configs`` (and, with the
    persistent cache on, store them for later processes), so that no later call of that
    configuration pays a compile (``flash_attn_func`` warms the forward only: name
    ``flash_attn_bwd`` too for a training step).

    A configuration is a dict naming the ``call`` and the values that decide its kernels:
    ``head_dim``, ``dtype`` (a name, NumPy or torch dtype), ``causal`` (default False) and
    ``backend`` (default ``"auto"``) for ``flash_attn_fwd`` / ``flash_attn_func`` /
    ``flash_attn_bwd``; for ``flash_mla_with_kvcache`` also ``head_dim_v``, ``s_q`` (default 1),
    ``num_heads_q`` and ``num_heads_k`` (it compiles the planner and the combine too). Each is run
    once on the smallest inputs of its shape, contiguous, on the current device, so that exactly
    the kernels a real call picks get compiled. Bad configurations raise what the call raises
    (``ValueError`` / ``TypeError`` naming the argument), or ``ValueError`` naming the key.
    """
    device.current()  # before the inputs are made: without a driver, CudaSetupError
    for i, config in enumerate(configs):
        where = f"configs[{i}]"
        if not isinstance(config, dict):
            raise TypeError(f"{where}: expected a dict, got {type(config).__name__}")
        config = dict(config)
        call = config.pop("call", None)
        if call not in WARMUP_CALLS:
            raise ValueError(f"{where}: 'call' must be one of {WARMUP_CALLS}, got {call!r}")
        fmt = _warmup_format(config.pop("dtype", None), where)
        options = dict(causal=config.pop("causal", False), backend=config.pop("backend", "auto"))
        d = _positive_int(config.pop("head_dim", None), f"{where}['head_dim']")
        if call == "flash_mla_with_kvcache":
            s_q = _positive_int(config.pop("s_q", 1), f"{where}['s_q']")
            h_q = _positive_int(config.pop("num_heads_q", None), f"{where}['num_heads_q']")
            h_kv = _positive_int(config.pop("num_heads_k", None), f"{where}['num_heads_k']")
            dv = config.pop("head_dim_v", None)
            _refuse_extra_keys(config, where)
            flash_mla_with_kvcache(_zeros((1, s_q, h_q, d), fmt), _zeros((1, 1, h_kv, d), fmt),
                                   _zeros((1, 1), "int32"), _zeros((1,), "int32"), dv, **options)
            continue
        _refuse_extra_keys(config, where)
        q, k, v = (_zeros((1, 1, 1, d), fmt) for _ in range(3))  # heads do not decide the code
        if call == "flash_attn_bwd":
            flash_attn_bwd(_zeros((1, 1, 1, d), fmt), q, k, v, _zeros((1, 1, 1, d), fmt),
                           _zeros((1, 1, 1), "float32"), **options)
        else:
            flash_attn_fwd(q, k, v, **options)


def _warmup_format(dtype, where):
    fmt = str(dtype).replace("torch.", "")
    if fmt not in FLOAT_FORMATS and dtype is not None:
        try:
            fmt = np.dtype(dtype).name
        except TypeError:
            pass
    if fmt not in FLOAT_FORMATS:
        raise TypeError(f"{where}['dtype']: expected one of {FLOAT_FORMATS}, got {dtype!r}")
    return fmt


def _refuse_extra_keys(config, where):
    if config:
        raise ValueError(f"{where}: unknown keys {sorted(config)}")


def _zeros(shape, fmt):
    """Zeros on the current device (NumPy under the simulator); bfloat16 through its bits, which
    Numba's to_device does not take as ml_dtypes values."""
    host = np.zeros(shape, arrays.numpy_dtype(fmt))
    if SIMULATOR:
        return host
    if fmt == "bfloat16":
        return cuda.to_device(host.view(np.uint16)).view(host.dtype)
    return cuda.to_device(host)
