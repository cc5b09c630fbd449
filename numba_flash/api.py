"""Public calls: validate -> plan -> launch.

Each public function first adapts and checks every argument (``validate``: ``ValueError`` /
``TypeError`` naming the argument, before anything is allocated or launched), then plans: picks
the kernels (``backends``: the one place a backend and a tc family are chosen), allocates
outputs in the caller's array library and launches on the caller's stream. Grids and argument
lists come from the kernels' specs (``runtime.spec``); what a call means is ``docs/api.md``.
Forward calls on torch tensors reuse the plan of their signature (``torch_plans``); the kernels
report what only the device saw in the status word (``runtime.status``, ``check_errors``).
"""

import numpy as np
from cuda.pathfinder import DynamicLibNotFoundError

from .runtime.env import setup_error

try:
    from numba import cuda
except DynamicLibNotFoundError as e:  # numba-cuda loads the CUDA runtime library on import
    raise setup_error(e) from None

from . import backends, scheduler, torch_plans, validate
from .kernels import registry
from .kernels.problem import Decode
from .runtime import arrays, device, status
from .runtime.status import check_errors  # noqa: F401  (public: numba_flash.check_errors)
from .runtime.device import SIMULATOR

# ----------------------------------------------------------------------------- attention

def flash_attn_fwd(q, k, v, causal=False, softmax_scale=None, backend="auto", out=None, stream=None,
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, learnable_sink=None,
                   dropout_p=0.0, q_descale=None, k_descale=None, v_descale=None,
                   out_dtype=None):
    """Exact attention forward. Returns ``(out, lse)``.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hk, D) with Hq % Hk == 0; out like q; lse (B, Hq, Sq)
    float32 natural-log sum of exp of the scaled scores (+inf for rows that see no key).
    ``causal`` aligns the mask bottom-right (query i sees keys j <= i + Sk - Sq). ``auto`` runs
    the tensor-core kernel for 16-bit inputs on compute capability >= 8.0 whose q, k, v are
    16-byte aligned views, else the CUDA-core one; an explicit ``tc`` refuses unaligned views.
    ``window_size=(left, right)``: query i sees keys ``i + Sk - Sq - left <= j <= i + Sk - Sq +
    right`` (-1: unbounded; ``causal`` is ``right = 0``); the key tiles outside are skipped.
    ``softcap`` > 0 turns each scaled score s into ``softcap * tanh(s / softcap)``.
    ``alibi_slopes`` (float32 (Hq,) or (B, Hq)) then adds ``-slope * |i + Sk - Sq - j|``.
    ``learnable_sink`` (float32 (Hq,)) adds ``exp(sink)`` to each row's softmax sum (and
    nothing to its output): lse includes it, and a row that sees no key gets ``lse = sink``.
    ``dropout_p`` other than 0 raises ``NotImplementedError`` (no dropout is offered).
    FP8 (FlashAttention-3's): float8_e4m3fn q, k, v (torch tensors) with ``q_descale``,
    ``k_descale``, ``v_descale`` float32 (B, Hk), the stored values times their descale being
    the inputs; out is bfloat16 (``out_dtype`` may ask for float16). The tensor-core kernel
    rounds P to e4m3 for the product P V, as FA3 does (docs/api.md, "FP8 attention").
    """
    validate.dropout(dropout_p)
    fp8 = (q_descale, k_descale, v_descale, out_dtype)
    plain = (all(x is None for x in fp8) and alibi_slopes is None and learnable_sink is None and
             validate.window(window_size, causal) is None and validate.score_cap(softcap) is None)
    key, pointers = (torch_plans.key(q, k, v, causal, softmax_scale, backend, out, stream)
                     if plain else (None, None))
    if key is not None:
        result = torch_plans.run(key, pointers)
        if result is not None:
            return result
    dev = device.current()
    problem = validate.attention(q, k, v, causal, softmax_scale, window_size, softcap,
                                 alibi_slopes, learnable_sink, (*fp8, dev))
    b, sq, hq, _ = problem.q.shape
    o, lse, launched = _forward(problem, backend, out, problem.q.shape, (b, hq, sq), stream, dev)
    if key is not None:
        torch_plans.remember(key, *launched, dev)
    return o.obj, lse.obj


def flash_attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                          alibi_slopes=None, learnable_sink=None, seqused_k=None,
                          block_table=None, backend="auto", out=None, stream=None, lse=None,
                          dropout_p=0.0, q_descale=None, k_descale=None, v_descale=None,
                          out_dtype=None):
    """Exact attention forward over packed sequences (flash-attn's varlen interface). Returns
    ``(out, lse)``.

    q: (total_q, Hq, D); k, v: (total_k, Hk, D); sequence b owns rows ``cu_seqlens[b] ..
    cu_seqlens[b + 1]`` (int32 (B + 1,)) and, with ``seqused_k`` (int32 (B,)), its first
    ``seqused_k[b]`` keys; ``max_seqlen_q`` / ``max_seqlen_k`` bound the lengths (the grid). out
    like q, lse (Hq, total_q) float32 (``out=`` and ``lse=`` take caller buffers). Every rule of ``flash_attn_fwd`` holds per sequence
    (bottom-right causal, rows that see no key); rows of no sequence are not written. Offsets
    are read on the device only: values outside the arrays or past the bounds are clamped and
    reported by ``check_errors()``. ``block_table`` (B, max_blocks) int32 makes k and v pages
    (num_pages, page_size, Hk, D) of any page size: key j of sequence b is row ``j %
    page_size`` of page ``block_table[b, j // page_size]``, and ``cu_seqlens_k`` (or
    ``seqused_k``) gives only each sequence's number of keys; an entry that is not a page reads
    as zeros and is reported. ``window_size`` (not with ``block_table`` yet), ``softcap``,
    ``alibi_slopes`` ((Hq,) or (B, Hq)) and ``learnable_sink`` as in ``flash_attn_fwd``, each
    sequence with its own lengths; ``dropout_p`` and FP8 (descales (B, Hk) for B sequences) as
    in ``flash_attn_fwd``.
    """
    validate.dropout(dropout_p)
    dev = device.current()
    fp8 = (q_descale, k_descale, v_descale, out_dtype, dev)
    problem = validate.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              causal, softmax_scale, seqused_k, block_table, window_size,
                              softcap, alibi_slopes, learnable_sink, fp8)
    _, total_q, hq, d = problem.q.shape
    o, lse, _ = _forward(problem, backend, out, (total_q, hq, d), (hq, total_q), stream, dev,
                         lse)
    return o.obj, lse.obj


def _forward(problem, backend, out, out_shape, lse_shape, stream, dev, lse=None):
    """Choose, check and launch the forward of ``problem`` into ``out`` and ``lse`` (the
    caller's buffers or None: new ones), shaped as the call returns them. Returns both adapted,
    and the launch (spec, config, args) that a torch plan keeps."""
    spec = backends.forward(backend, problem, dev)
    q = problem.q
    given = [t is not None for t in (out, lse)]
    o = validate.out_buffer(out, q, out_shape, problem.out_fmt or q.fmt)
    lse = validate.out_buffer(lse, q, lse_shape, "float32", "lse")
    validate.refuse_overlap([t for t, g in zip((o, lse), given) if g],
                            [t for t in (q, problem.k, problem.v, problem.block_table) if t])
    # launch() prepares first: tiles that do not fit the device or a grid past CUDA's limits
    # are refused before the kernel runs, with nothing of the caller's written.
    config, args = spec.config(problem), _args(problem, out=o, lse=lse)
    spec.launch(config, args, arrays.stream_of(q, stream), dev)
    return o, lse, (spec, config, args)


def _args(problem, **tensors):
    """A launch's arguments: the problem's q, k, v and scale, the status word, and ``tensors``
    (outputs, lse, the backward's inputs). Varlen: ``tensors`` are packed rows, which the
    kernels see per sequence as (B, total, ...) with a batch stride of 0, and the offsets and
    bounds join them (``seqused_k`` an empty array when not given), with the block table of
    paged K/V."""
    args = dict(q=problem.q, k=problem.k, v=problem.v, scale=problem.scale,
                status=status.word(problem.q), **tensors)
    if problem.window is not None:
        args.update(window=problem.window)
    if problem.softcap is not None:
        args.update(softcap=problem.softcap)
    if problem.alibi_slopes is not None:
        args.update(alibi_slopes=problem.alibi_slopes)
    if problem.sink is not None:
        args.update(sink=problem.sink)
    if problem.descale is not None:
        args.update(descale=problem.descale)
    if problem.cu_seqlens_q is not None:
        batch = problem.q.shape[0]
        args.update({name: arrays.batched(t, batch) for name, t in tensors.items()})
        used = problem.seqused_k
        args.update(cu_seqlens_q=problem.cu_seqlens_q, cu_seqlens_k=problem.cu_seqlens_k,
                    seqused_k=arrays.prefix(problem.cu_seqlens_k, 0) if used is None else used,
                    max_seqlen_q=problem.max_seqlen[0], max_seqlen_k=problem.max_seqlen[1])
        if problem.block_table is not None:
            args.update(block_table=problem.block_table)
    return args


def flash_attn_bwd(dout, q, k, v, out, lse, causal=False, softmax_scale=None, backend="auto",
                   dq=None, dk=None, dv=None, stream=None, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, learnable_sink=None, dropout_p=0.0):
    """Gradients of exact attention for the incoming ``dout``. Returns ``(dq, dk, dv)``, and
    ``dsink`` ((Hq,) float32) fourth when ``learnable_sink`` is given.

    ``out`` and ``lse`` are what ``flash_attn_fwd`` returned for the same q, k, v, causal and
    softmax_scale: dout and out shaped like q, lse (B, Hq, Sq) float32. dq is shaped like q, dk
    and dv like k (a kv head sums the gradients of its group's query heads), all in q's dtype;
    ``dq=``, ``dk=``, ``dv=`` take caller buffers. Bitwise deterministic (no atomics).
    ``auto`` runs the tensor-core kernels for 16-bit inputs on compute capability >= 8.0 whose
    q, k, v and dout (and out, for the wgmma pair, whose dQ kernel computes D_i) are 16-byte
    aligned views, else the CUDA-core ones; an explicit ``tc`` refuses unaligned views.
    ``window_size`` and ``softcap`` as in the forward (the gradient goes through the cap's
    ``1 - tanh^2``); the key tiles outside a window are skipped here too. ``alibi_slopes`` and
    ``learnable_sink`` as in the forward (no gradient for the slopes, as in flash-attn);
    ``dropout_p`` as in the forward.
    """
    validate.dropout(dropout_p)
    dev = device.current()
    problem = validate.attention(q, k, v, causal, softmax_scale, window_size, softcap,
                                 alibi_slopes, learnable_sink)
    dout, out, lse = validate.backward(problem, dout, out, lse)
    return _backward(problem, backend, dout, out, lse, (dq, dk, dv), stream, dev)


def flash_attn_varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k, softmax_scale=None, causal=False, window_size=(-1, -1),
                          softcap=0.0, alibi_slopes=None, learnable_sink=None, backend="auto",
                          dq=None, dk=None, dv=None, stream=None, seqused_k=None,
                          dropout_p=0.0):
    """Gradients of ``flash_attn_varlen_fwd`` for the incoming ``dout``. Returns ``(dq, dk,
    dv)``: packed like q, k, v; dout and out (total_q, Hq, D), lse (Hq, total_q) as the forward
    returned them, with the same offsets, bounds, causal, softmax_scale and seqused_k. Rows of
    no sequence (and keys past ``seqused_k``) get no gradient written. Deterministic, like
    ``flash_attn_bwd``; ``window_size``, ``softcap``, ``alibi_slopes`` and ``learnable_sink``
    as in the forward (``dsink`` then fourth, as there); ``dropout_p`` as in the forward.
    """
    validate.dropout(dropout_p)
    dev = device.current()
    problem = validate.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              causal, softmax_scale, seqused_k, window_size=window_size,
                              softcap=softcap, alibi_slopes=alibi_slopes,
                              learnable_sink=learnable_sink)
    dout, out, lse = validate.backward(problem, dout, out, lse)
    return _backward(problem, backend, dout, out, lse, (dq, dk, dv), stream, dev)


def _backward(problem, backend, dout, out, lse, given, stream, dev):
    """Choose, check and launch the backward of ``problem`` for the adapted ``dout``, ``out``
    and ``lse`` (shaped as the call takes them), into the caller's ``given`` (dq, dk, dv)
    buffers or new ones; returns the caller's objects (and dsink with a sink)."""
    q = problem.q
    dkdv, dq_spec = backends.backward(backend, problem, dout, out, dev)
    packed = problem.cu_seqlens_q is not None
    q_shape, k_shape = (q.shape[1:], problem.k.shape[1:]) if packed else (q.shape, problem.k.shape)
    dq, dk, dv = (validate.out_buffer(t, q, shape, q.fmt, name) for t, shape, name in
                  zip(given, (q_shape, k_shape, k_shape), ("dq", "dk", "dv")))
    validate.refuse_overlap([t for t, g in zip((dq, dk, dv), given) if g is not None],
                            [q, problem.k, problem.v, out, dout, lse])
    delta = arrays.empty(q, lse.shape, "float32", "delta")  # D_i = rowsum(dout * out)
    stream = arrays.stream_of(q, stream)
    args = _args(problem, out=out, dout=dout, lse=lse, delta=delta, dq=dq, dk=dk, dv=dv)
    if problem.sink is not None:  # its gradient from lse and D_i, once both exist
        args.update(dsink=arrays.empty(q, problem.sink.shape, "float32", "dsink"))
    # The preprocess's rows are independent: varlen hands it the packed rows as one batch entry.
    rows = {name: arrays.batched(t, 1) for name, t in
            (("out", out), ("dout", dout), ("delta", delta))} if packed else args
    # D_i first: by the preprocess, or by a dQ kernel that computes it (then dQ runs first).
    steps = ((dq_spec, args), (dkdv, args)) if dq_spec.writes_delta else \
        ((registry.PREPROCESS, rows), (dkdv, args), (dq_spec, args))
    if problem.sink is not None:
        steps += ((registry.SINK_GRAD, args),)
    for spec, p in steps:  # every kernel's tiles and grid fit, or nothing runs
        spec.prepare(spec.config(problem), p, dev)
    for spec, p in steps:
        spec.launch(spec.config(problem), p, stream, dev)
    if problem.sink is not None:
        return dq.obj, dk.obj, dv.obj, args["dsink"].obj
    return dq.obj, dk.obj, dv.obj


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, return_lse=False, backend="auto",
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, learnable_sink=None,
                    dropout_p=0.0, q_descale=None, k_descale=None, v_descale=None,
                    out_dtype=None):
    """``flash_attn_fwd`` returning ``out`` (or ``(out, lse)`` with ``return_lse=True``)."""
    out, lse = flash_attn_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
                              window_size=window_size, softcap=softcap,
                              alibi_slopes=alibi_slopes, learnable_sink=learnable_sink,
                              dropout_p=dropout_p, q_descale=q_descale, k_descale=k_descale,
                              v_descale=v_descale, out_dtype=out_dtype)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, learnable_sink=None, return_lse=False,
                           block_table=None, backend="auto", dropout_p=0.0, q_descale=None,
                           k_descale=None, v_descale=None, out_dtype=None):
    """``flash_attn_varlen_fwd`` returning ``out`` (or ``(out, lse)`` with ``return_lse=True``)."""
    out, lse = flash_attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                                     window_size=window_size, softcap=softcap,
                                     alibi_slopes=alibi_slopes, learnable_sink=learnable_sink,
                                     block_table=block_table, backend=backend,
                                     dropout_p=dropout_p, q_descale=q_descale,
                                     k_descale=k_descale, v_descale=v_descale,
                                     out_dtype=out_dtype)
    return (out, lse) if return_lse else out


def naive_attention(q, k, v, causal=False, softmax_scale=None):
    """Exact attention by the three-kernel baseline (``kernels/naive.py``: S = QK^T to global
    memory, softmax, O = PV). Returns ``(out, lse)`` like ``flash_attn_fwd``: same arguments and
    checks (no ``backend``, ``out`` or ``stream``: launched on q's library stream); allocates
    B * Hq * Sq * Sk float32 of scratch. Not part of the public API: the benchmarks' and the
    IO measurement's baseline."""
    dev = device.current()
    problem = validate.attention(q, k, v, causal, softmax_scale)
    q, k = problem.q, problem.k
    b, sq, hq, d = q.shape
    args = dict(q=q, k=k, v=problem.v, scale=problem.scale, status=status.word(q),
                scores=arrays.empty(q, (b, hq, sq, k.shape[1]), "float32", "scores"),
                out=arrays.empty(q, q.shape, q.fmt, "out"),
                lse=arrays.empty(q, (b, hq, sq), "float32", "lse"))
    stream = arrays.stream_of(q)
    for spec in registry.NAIVE:
        spec.prepare(spec.config(problem), args, dev)
    for spec in registry.NAIVE:
        spec.launch(spec.config(problem), args, stream, dev)
    return args["out"].obj, args["lse"].obj


def hadamard_rotate(x, seed=0, out=None, stream=None):
    """FlashAttention-3's incoherent processing: every row of x's head dim rotated by one random
    orthogonal matrix (random signs, then a Walsh-Hadamard transform over blocks of the largest
    power of two dividing the head dim, at most 256; ``kernels/simt/hadamard.py``). Rotate q and
    k with the same ``seed`` before quantizing them: ``q k^T`` is unchanged, outlier channels
    are spread over the row. x: (B, S, H, D) or (total, H, D), float16, bfloat16 or float32;
    returns the rotated array (x's shape and dtype; ``out=`` takes a buffer of the caller's)."""
    dev = device.current()
    t = validate.rotation_input(x, seed)
    rows = t if t.ndim == 4 else arrays.batched(t, 1)
    o = validate.out_buffer(out, t, t.shape, t.fmt)
    if out is not None:
        validate.refuse_overlap([o], [t])
    p = dict(x=rows, out=o if o.ndim == 4 else arrays.batched(o, 1), seed=int(seed))
    spec = registry.HADAMARD
    spec.launch(spec.config(p), p, arrays.stream_of(t, stream), dev)
    return o.obj


def quantize_fp8(x, descale=None, out=None, stream=None):
    """x rounded to float8_e4m3fn with one scale per (batch, head), FlashAttention-3's
    convention: ``x ~ x_fp8 * descale[b, h]``. Without ``descale`` it is ``amax / 448`` of each
    (batch, head) (1 where all are zero), the scale that spends e4m3's whole range; a given
    float32 (B, H) descale is used as it is (values past +-448 saturate). x: (B, S, H, D) or
    (total, H, D) (descale (1, H)), float16, bfloat16 or float32, a torch tensor; returns
    ``(x_fp8, descale)`` (``out=`` takes an FP8 buffer of the caller's). Rotate q and k with
    ``hadamard_rotate`` first to spread outlier channels (``kernels/simt/quantize.py``)."""
    dev = device.current()
    t, given = validate.quantize_input(x, descale, dev)
    rows = t if t.ndim == 4 else arrays.batched(t, 1)
    b, s, h, _ = rows.shape
    o = validate.out_buffer(out, t, t.shape, "float8_e4m3fn")
    if out is not None:
        validate.refuse_overlap([o], [t])
    scales = given if given is not None else arrays.empty(t, (b, h), "float32", "descale")
    per_cta, splits = registry.QUANTIZE_SPLITS(s)  # sequence rows per CTA, CTAs per head
    p = dict(x=rows, out=o if o.ndim == 4 else arrays.batched(o, 1), descale=scales,
             given=given is not None, rows=per_cta, splits=splits)
    st = arrays.stream_of(t, stream)
    amax, quantize = registry.QUANTIZE
    if given is None:
        p["partial"] = arrays.empty(t, (b * h, splits), "float32", "partial")
        amax.launch(amax.config(p), p, st, dev)
    else:
        p["partial"] = arrays.placeholder(scales, "float32", 2)  # (never read)
    quantize.launch(quantize.config(p), p, st, dev)
    return o.obj, scales.obj


# ----------------------------------------------------------------------------- paged MLA decode

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

    With ``topk`` (sparse attention; ``num_heads_q`` required) the plan is that of the sparse
    decode, which runs each of the ``s_q = num_q_tokens_per_head_k * num_heads_k / num_heads_q``
    query tokens as a request of its own, of up to ``topk`` keys: ``b * s_q`` requests of
    ``topk`` keys and ``num_heads_q / num_heads_k`` rows each (``num_splits (b s_q + 1,)``).
    It depends on the shapes alone; ``is_fp8_kvcache`` does not change it.
    """
    q_rows, h_kv = validate.mla_metadata(num_q_tokens_per_head_k, num_heads_k, num_heads_q)
    dev = device.current()
    num_sms = validate.positive_int(dev.sms if num_sms is None else num_sms, "num_sms")
    if topk is not None:
        return _sparse_plan(cache_seqlens, q_rows, h_kv, num_heads_q, is_fp8_kvcache, topk,
                            num_sms, dev)
    validate.not_implemented(is_fp8_kvcache=is_fp8_kvcache)
    if type(cache_seqlens).__module__.split(".")[0] == "numpy" and not SIMULATOR:
        plan = scheduler.plan_mla(validate.host_lengths(cache_seqlens), q_rows, h_kv, num_sms)
        return tuple(cuda.to_device(values) for values in plan)
    seqlens = validate.index_array(cache_seqlens, "cache_seqlens", (None,))
    metadata, num_splits = _plan_arrays(seqlens, scheduler.num_sm_parts(num_sms, h_kv, q_rows))
    _plan_on_device(seqlens, metadata, num_splits, arrays.stream_of(seqlens), dev)
    return metadata.obj, num_splits.obj


def _sparse_plan(cache_seqlens, q_rows, h_kv, num_heads_q, is_fp8_kvcache, topk, num_sms, dev):
    """``get_mla_metadata`` with ``topk``: the plan of ``b s_q`` requests of ``topk`` keys,
    made on the device (their lengths written by ``sparse_indices`` without packing)."""
    s_q, rows = validate.sparse_plan(cache_seqlens, q_rows, h_kv, num_heads_q, is_fp8_kvcache,
                                     topk)
    if type(cache_seqlens).__module__.split(".")[0] == "numpy" and not SIMULATOR:
        requests = validate.host_lengths(cache_seqlens).shape[0] * s_q
        plan = scheduler.plan_mla(np.full(requests, topk, np.int32), rows, h_kv, num_sms)
        return tuple(cuda.to_device(values) for values in plan)
    seqlens = validate.index_array(cache_seqlens, "cache_seqlens", (None,))
    requests = seqlens.shape[0] * s_q
    lengths = arrays.empty(seqlens, (requests,), "int32", "lengths")
    metadata, num_splits = _plan_arrays(lengths, scheduler.num_sm_parts(num_sms, h_kv, rows))
    stream = arrays.stream_of(seqlens)
    unread = arrays.placeholder(lengths, "int32", 1)
    p = dict(indices=arrays.placeholder(lengths, "int32", 3), topk_length=unread,
             packed=arrays.strided(unread, (1, topk), (0, 0)), lengths=lengths,
             status=status.word(seqlens), s_q=s_q, num_rows=0)
    packing = registry.SPARSE_INDICES
    packing.launch(packing.Config(False), p, stream, dev)
    _plan_on_device(lengths, metadata, num_splits, stream, dev)
    return metadata.obj, num_splits.obj


def _plan_arrays(like, parts):
    """Fresh metadata (parts, 8) and num_splits (b + 1,) int32 arrays in ``like``'s library
    (``like``: the (b,) lengths)."""
    return (arrays.empty(like, (parts, scheduler.METADATA_SIZE), "int32",
                         "tile_scheduler_metadata"),
            arrays.empty(like, (like.shape[0] + 1,), "int32", "num_splits"))


def _plan_on_device(seqlens, metadata, num_splits, stream, dev):
    """The plan of ``seqlens`` into ``metadata`` and ``num_splits`` by the one-warp kernel of
    kernels/simt/mla_metadata.py, on ``stream``."""
    args = dict(cache_seqlens=seqlens, parts=np.int32(metadata.shape[0]), metadata=metadata,
                num_splits=num_splits)
    registry.METADATA.launch(registry.METADATA.Config(), args, stream, dev)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, backend="auto",
                           out=None, stream=None, attn_sink=None, topk_length=None):
    """Paged MLA decode (FlashMLA's ``flash_mla_with_kvcache``). Returns ``(out, lse)``.

    q: (b, s_q, h_q, d), d a multiple of 8 up to 576; k_cache: (num_blocks, page_block_size,
    h_kv, d), any page size, V being ``k_cache[..., :head_dim_v]``; block_table (b, n) and
    cache_seqlens (b,) int32; the metadata and num_splits of ``get_mla_metadata`` for these
    lengths, or neither (the call then plans itself). out: (b, s_q, h_q, head_dim_v) in q's
    dtype (``out=`` takes a caller buffer); lse: (b, h_q, s_q) float32, natural log. ``causal``
    (for s_q > 1): query token i sees the keys before ``seqlen - (s_q - 1 - i)``. Block-table
    entries at or past ``ceil(seqlen / page)`` and cache slots at or past ``seqlen`` are never
    read. ``backend``: ``"tc"`` (tensor cores, ``backends.decode_spec``), ``"simt"`` or ``"auto"``.
    ``attn_sink`` (float32 (h_q,), FlashMLA's): a logit per query head that joins each row's
    softmax sum and adds nothing to its output, which shrinks by ``1 / (1 + exp(sink - lse))``;
    the lse returned is the keys' alone, as FlashMLA returns it.

    Sparse attention (DeepSeek-V3.2): with ``indices`` (b, s_q, topk) int32, query token t of
    request b attends the cache rows ``indices[b, t, :]`` (``page * page_block_size + slot``;
    -1: none), the first ``topk_length[b]`` of them when that (b,) int32 array is given;
    ``block_table`` and ``cache_seqlens`` are not read. ``is_fp8_kvcache=True``: the cache holds
    V3.2's 656-byte float8_e4m3fn rows (``_sparse_mla_decode``). The lse is then a transposed
    view (b, h_q, s_q) of a (b, s_q, h_q) array, as FlashMLA returns it.
    """
    dev = device.current()
    if indices is not None:
        return _sparse_mla_decode(q, k_cache, indices, topk_length, head_dim_v,
                                  tile_scheduler_metadata, num_splits, softmax_scale, causal,
                                  is_fp8_kvcache, backend, out, stream, attn_sink, dev)
    validate.not_implemented(is_fp8_kvcache=is_fp8_kvcache, topk_length=topk_length)
    problem = validate.mla_decode(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                  tile_scheduler_metadata, num_splits, causal, softmax_scale,
                                  attn_sink)
    q, k_cache, block_table, cache_seqlens = (problem.q, problem.k_cache, problem.block_table,
                                              problem.cache_seqlens)
    metadata, num_splits, dv = problem.metadata, problem.num_splits, problem.head_dim_v
    b, s_q, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    planned = metadata is not None
    decode, config = backends.decode_spec(backend, problem, dev)
    o = validate.out_buffer(out, q, (b, s_q, h_q, dv), q.fmt)
    if out is not None:
        validate.refuse_overlap([o], [q, k_cache, block_table, cache_seqlens]
                                + ([metadata, num_splits] if planned else []))
    stream = arrays.stream_of(q, stream)
    if not planned:
        metadata, num_splits = _plan_arrays(
            cache_seqlens, scheduler.num_sm_parts(dev.sms, h_kv, problem.q_rows))
    args = _decode_args(problem, decode, config, metadata, num_splits, o, dev)
    if not planned:
        _plan_on_device(cache_seqlens, metadata, num_splits, stream, dev)
    _decode(decode, config, args, stream, dev)
    return o.obj, args["lse"].obj


def _sparse_mla_decode(q, k_cache, indices, topk_length, head_dim_v, metadata, num_splits,
                       softmax_scale, causal, is_fp8_kvcache, backend, out, stream, attn_sink,
                       dev):
    """``flash_mla_with_kvcache`` with ``indices``: every query token a request of its own
    (virtual request r = b s_q + t) whose keys are its valid indices, packed by
    ``kernels/simt/sparse_indices.py``; then the plan (unless given), the paged decode reading
    the packed rows as its table, and the combine."""
    c = validate.sparse_mla_decode(q, k_cache, indices, topk_length, head_dim_v, metadata,
                                   num_splits, causal, softmax_scale, attn_sink, is_fp8_kvcache,
                                   dev)
    b, s_q, h_q, _ = c.indices.shape[:2] + c.q.shape[2:]
    requests, topk = b * s_q, c.indices.shape[2]
    lengths = arrays.empty(c.q, (requests,), "int32", "lengths")
    packed = arrays.empty(c.q, (requests, topk), "int32", "packed indices")
    problem = Decode(c.q, c.k_cache, packed, lengths, c.head_dim_v, c.scale, False, c.metadata,
                     c.num_splits, indices=c.indices, attn_sink=c.attn_sink,
                     fp8_cache=c.fp8 or None)
    decode, config = backends.decode_spec(backend, problem, dev)
    o = validate.out_buffer(out, c.q, (b, s_q, h_q, c.head_dim_v), c.q.fmt)
    planned = c.metadata is not None
    if out is not None:
        validate.refuse_overlap([o], [c.q, c.k_cache, c.indices]
                                + ([c.metadata, c.num_splits] if planned else []))
    stream = arrays.stream_of(c.q, stream)
    metadata, num_splits = c.metadata, c.num_splits
    if not planned:
        metadata, num_splits = _plan_arrays(
            lengths, scheduler.num_sm_parts(dev.sms, c.k_cache.shape[2], problem.q_rows))
    # lse as FlashMLA returns it: (b, h_q, s_q), a transposed view of (b, s_q, h_q) rows, which
    # the kernels write as (b s_q, h_q, 1).
    lse_rows = arrays.empty(c.q, (b, s_q, h_q), "float32", "lse")
    lse = arrays.swapped(lse_rows, 1, 2)  # (refuses a library without such views: no launch yet)
    args = _decode_args(problem, decode, config, metadata, num_splits,
                        validate.tokens_as_requests(o, "out"), dev,
                        lse=arrays.strided(lse_rows, (requests, h_q, 1), (h_q, 1, 1)))
    packing = registry.SPARSE_INDICES
    p = dict(indices=c.indices, topk_length=c.topk_length or arrays.prefix(lengths, 0),
             packed=packed, lengths=lengths, status=args["status"], s_q=s_q,
             num_rows=c.k_cache.shape[0] * c.k_cache.shape[1])
    packing.launch(packing.Config(True), p, stream, dev)
    if not planned:
        _plan_on_device(lengths, metadata, num_splits, stream, dev)
    _decode(decode, config, args, stream, dev)
    return o.obj, lse.obj


def _decode_args(problem, decode, config, metadata, num_splits, o, dev, lse=None):
    """The launch arguments of a decode and its combine (outputs and split accumulators
    allocated, ``lse`` unless given), after the checks that could still refuse the call: the
    decode's tiles against the device, the combine's grid."""
    q = problem.q
    b, s_q, h_q, _ = q.shape
    dv, parts = problem.head_dim_v, metadata.shape[0]
    decode.choose(config, dev)
    # Split requests: one slot per piece, at most b + parts - 1 of them (see scheduler.py).
    args = dict(q=q, k_cache=problem.k_cache, block_table=problem.block_table,
                cache_seqlens=problem.cache_seqlens, metadata=metadata, num_splits=num_splits,
                out=o, scale=problem.scale, status=status.word(q),
                lse=lse or arrays.empty(q, (b, h_q, s_q), "float32", "lse"),
                o_acc=arrays.empty(q, (b + parts, s_q, h_q, dv), "float32", "o_acc"),
                lse_acc=arrays.empty(q, (b + parts, h_q, s_q), "float32", "lse_acc"))
    for name in ("v_cache", "key_start", "attn_sink", "window", "softcap", "alibi_slopes",
                 "cache_descale"):
        if getattr(problem, name) is not None:
            args[name] = getattr(problem, name)
    # Behind a decode that allows it (sm_90 kernels) the combine starts alongside the decode;
    # it applies an attention sink to every row (kernels/simt/combine.py).
    args["combine"] = registry.COMBINE.Config(dv, q.fmt, decode.allows_dependents,
                                              problem.attn_sink is not None)
    registry.COMBINE.prepare(args["combine"], args, dev)
    return args


def _decode(decode, config, args, stream, dev):
    """Launch a decode and the combine of its split requests."""
    decode.launch(config, args, stream, dev)
    registry.COMBINE.launch(args["combine"], args, stream, dev)


# ----------------------------------------------------------------------------- KV cache

def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, backend="auto", out=None, stream=None,
                            k_descale=None, v_descale=None):
    """Attention of q against a KV cache, after appending the new k, v to it in place
    (flash-attn 2.8's ``flash_attn_with_kvcache``). Returns ``out``, or ``(out, lse)`` with
    ``return_softmax_lse``.

    q: (B, Sq, Hq, D); k_cache, v_cache: (B_c, S_c, Hk, D), or pages (num_blocks, page_size,
    Hk, D) behind ``block_table`` (B, max_blocks) int32; k, v: (B, S_new, Hk, D), written at
    positions ``cache_seqlens[b] ..`` (an int or (B,) int32; rotated first with rotary_cos /
    rotary_sin (seqlen_ro, rotary_dim / 2), interleaved or GPT-NeoX halves), after which q
    attends ``cache_seqlens[b] + S_new`` keys (from ``cache_leftpad[b]`` on; cache row
    ``cache_batch_idx[b]``). ``causal`` aligns bottom-right. ``num_splits``: 0 lets the tile
    scheduler split long caches over CTAs, 1 gives each sequence one CTA, n > 1 plans n CTAs
    per sequence's worth of parts. Work: ``kernels/simt/kvcache_prepare.py``, then the decode and
    combine of ``flash_mla_with_kvcache``, all planned on the device (capturable in a CUDA
    graph). ``window_size``, ``softcap`` and ``alibi_slopes`` ((Hq,) or (B, Hq)) as in
    ``flash_attn_fwd``, with each sequence's ``Sk = cache_seqlens[b] + S_new - cache_leftpad[b]``
    keys (a window's keys before the first query token's are never read). FP8 caches:
    float8_e4m3fn ``k_cache``, ``v_cache`` with float32 (B, Hk) ``k_descale``, ``v_descale`` (a
    stored value times its descale is the key or value); new k, v are rounded into them.
    """
    dev = device.current()
    c = validate.kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                         rotary_interleaved, num_splits, window_size, softcap, alibi_slopes,
                         k_descale, v_descale, dev)
    q = c.q
    b, sq, hq, d = q.shape
    hk = c.k_cache.shape[2]
    one_piece = c.num_splits == 1
    q_rot = arrays.empty(q, q.shape, q.fmt, "q_rot") if c.rotary else q
    lengths = arrays.empty(q, (b,), "int32", "lengths")
    key_start = arrays.empty(q, (b,), "int32", "key_start")
    table = c.block_table if c.block_table is not None else arrays.empty(q, (b, 1), "int32",
                                                                          "table")
    # A window moves each sequence's first key (kvcache_prepare): the decode reads key_start.
    starts = c.cache_leftpad is not None or c.window is not None
    problem = Decode(q_rot, c.k_cache, table, lengths, d, c.scale, c.causal, v_cache=c.v_cache,
                     key_start=key_start if starts else None, window=c.window,
                     softcap=c.softcap, alibi_slopes=c.alibi_slopes,
                     cache_descale=c.cache_descale)
    decode, config = backends.decode_spec(backend, problem, dev)
    o = validate.out_buffer(out, q, q.shape, q.fmt)
    if out is not None:
        validate.refuse_overlap([o], [t for t in (q, c.k_cache, c.v_cache, c.k, c.v) if t])
    if one_piece:
        parts = b
    elif c.num_splits > 1:
        parts = c.num_splits * b
    else:
        parts = scheduler.num_sm_parts(dev.sms * decode.parts_per_sm(config, dev), hk,
                                       problem.q_rows)
    metadata, num_splits = _plan_arrays(lengths, parts)
    args = _decode_args(problem, decode, config, metadata, num_splits, o, dev)
    # Absent optional arrays reach the kernel as empty ones (or q: never read).
    empty = arrays.prefix(lengths, 0)
    cos, sin, mode = c.rotary or (arrays.empty(q, (0, 1), q.fmt, "rotary"),) * 2 + (None,)
    k_descale, v_descale = c.cache_descale or (arrays.empty(q, (0, 1), "float32", "descale"),) * 2
    prep = dict(q=q, k=c.k or q, v=c.v or q, k_cache=c.k_cache, v_cache=c.v_cache,
                block_table=table, cache_seqlens=c.cache_seqlens or empty,
                cache_batch_idx=c.cache_batch_idx or empty,
                cache_leftpad=c.cache_leftpad or empty, rotary_cos=cos,
                rotary_sin=sin, q_rot=q_rot, lengths=lengths, key_start=key_start,
                table=table, metadata=metadata, num_splits=num_splits, status=args["status"],
                s_new=0 if c.k is None else c.k.shape[1], fixed_seqlen=c.fixed_seqlen,
                capacity=c.capacity, rotary_dim=0 if mode is None else 2 * cos.shape[1],
                one_piece=int(one_piece), window_left=c.window[0] if c.window else 0,
                k_descale=k_descale, v_descale=v_descale)
    prepare = registry.KVCACHE_PREPARE
    prep_config = prepare.Config(q.fmt, mode, c.causal and mode is not None,
                                 c.block_table is not None, c.window is not None,
                                 c.cache_descale is not None)
    stream = arrays.stream_of(q, stream)
    prepare.prepare(prep_config, prep, dev)  # every refusal before the first write
    prepare.launch(prep_config, prep, stream, dev)
    if not one_piece:
        _plan_on_device(lengths, metadata, num_splits, stream, dev)
    _decode(decode, config, args, stream, dev)
    return (o.obj, args["lse"].obj) if return_softmax_lse else o.obj
