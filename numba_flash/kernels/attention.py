"""The host side the attention kernels share: what decides their code, their signatures, and
how the grid and argument list of a launch follow from the problem.

Every forward kernel (``simt/forward.py``, ``tc/forward_mma.py``, ``tc/forward_wgmma.py``) takes

    q, k, v, out (B, S, H, D) in 16-bit bits or float32, lse (B, Hq, Sq) float32,
    Sq, Sk, Hq, group = Hq / Hk (int32), scale_log2 = softmax_scale * log2(e) (float32),
    cu_seqlens_q, cu_seqlens_k, seqused_k, status (int32, 1-D), block_table (int32, 2-D),
    window_left, window_right (int32: the sliding window's sides, read with ``window`` only),
    softcap (float32: the score cap, read with ``softcap`` only), alibi_slopes (float32 (B, Hq),
    read with ``alibi`` only), sink (float32 (Hq,), read with ``sink`` only)

on a grid of one CTA per BLOCK_M query rows of one (batch, query head): ``(ceil(Sq /
BLOCK_M), B * Hq)``, the B * Hq rows folded into y and z past 65535 (``common/grid.py``).
Varlen batches (``AttentionConfig.varlen``) are the same kernels over views: the packed q (total,
H, D) reaches them as (B, total, H, D) with a batch stride of 0 (``validate.varlen``, lse (Hq, total)
likewise), Sq and Sk are max_seqlen_q / max_seqlen_k, and each CTA finds its sequence's rows from
the offsets (``common/masks.make_seqlen_info``); a dense call passes the status word in place of
the three offset arrays, which its kernels never read. Paged K/V (``AttentionConfig.paged``,
varlen only) passes k and v as their pages (num_pages, page_size, Hk, D) and the block table;
every other forward call passes the status word, seen as a (1, 1) array, in its place. The
backward is three kernels, each a ``KernelSpec`` base below that a family's module completes
with its tiles and factory: the preprocess ``D_i = rowsum(dO_i * O_i)``, dK/dV (one CTA per
BLOCK_N keys of one kv head) and dQ (one CTA per BLOCK_M queries); both take the forward's
arguments from window_left on but the sink (whose gradient ``simt/sink_grad.py`` computes).
An option that is off passes a placeholder (``arrays.placeholder``) its kernel never reads.
A spec's config follows from the call's ``problem.Attention`` (``config_of``); a launch reads its
arguments, a dict of the adapted arrays (``arrays.Tensor``) and the softmax scale.

The paged MLA decode kernels (``simt/mla_decode.py``, ``tc/mla_decode_wgmma.py``) share
``DecodeSpec``: one CTA per (scheduler part, kv head, BLOCK_M packed query rows).
"""

import math
from typing import NamedTuple, Optional

import numpy as np
from numba import types

from ..runtime import arrays
from ..runtime.status import unread
from ..runtime.launcher import cdiv
from ..runtime.spec import SM80, SM90, KernelSpec, Sample
from .common.formats import storage_type
from .common.grid import fold

LOG2E = math.log2(math.e)
I32, F32 = types.int32, types.float32
F32_3D = types.Array(types.float32, 3, "A")
HALF_FORMATS = ("float16", "bfloat16")  # the tensor-core kernels' storage formats


class AttentionConfig(NamedTuple):
    """What decides an attention kernel's code (with its tiles)."""

    head_dim: int
    causal: bool
    fmt: str  # storage format of q, k, v and the outputs
    varlen: bool = False  # packed sequences behind cu_seqlens_q / cu_seqlens_k
    paged: bool = False   # varlen K and V in pages behind a block table (forward only)
    window: bool = False  # a sliding window: causal holds its right side
    softcap: bool = False  # scores through softcap * tanh(s / softcap)
    alibi: bool = False    # scores minus slope * |i + Sk - Sq - j|
    sink: bool = False     # a learned logit per head in every row's sum (forward only)
    out_fmt: Optional[str] = None  # FP8 inputs: the outputs' 16-bit format (else fmt)


def config_of(problem, causal=None):
    """The ``AttentionConfig`` of an ``Attention`` problem (``causal`` overrides its mask). A
    window is the causal code with the diagonal moved right by its right side and a second,
    lower diagonal (``masks.make_window``)."""
    window = problem.window is not None
    causal = problem.causal if causal is None else causal
    return AttentionConfig(problem.head_dim, causal or window, problem.fmt,
                           problem.cu_seqlens_q is not None, problem.block_table is not None,
                           window, problem.softcap is not None,
                           problem.alibi_slopes is not None, problem.sink is not None,
                           problem.out_fmt)


def backward_config_of(problem):
    """The ``AttentionConfig`` of a backward kernel: the forward's, but for the sink, which a
    backward kernel does not read (the lse it is given holds it)."""
    return config_of(problem)._replace(sink=False)


def sample(kernel, config, entry=None, ccs=(SM80, SM90)):
    """An attention kernel's ``Sample`` of ``config`` with tile entry ``entry``, labelled
    ``<kernel> d=<head dim>[ tiles=<entry>] causal=<causal> <format>[ varlen][ paged]``."""
    config = AttentionConfig(*config)
    tiles = "" if entry is None else f" tiles={entry}"
    label = f"{kernel} d={config.head_dim}{tiles} causal={config.causal} {config.fmt}"
    label += (" varlen" if config.varlen else "") + (" paged" if config.paged else "")
    label += (" window" if config.window else "") + (" softcap" if config.softcap else "")
    label += (" alibi" if config.alibi else "") + (" sink" if config.sink else "")
    label += f" out={config.out_fmt}" if config.out_fmt else ""
    return Sample(label, tuple(config), entry, ccs=ccs)


def tensor_type(fmt, ndim=4):
    """The kernel argument type of an array in storage format ``fmt``: 16-bit floats arrive as
    their ``uint16`` bits (``arrays.Tensor.view``), so one kernel serves float16 and bfloat16."""
    return types.Array(storage_type(fmt), ndim, "A")


I1 = types.Array(types.int32, 1, "A")
I2 = types.Array(types.int32, 2, "A")
# cu_seqlens_q, cu_seqlens_k, seqused_k, status: the arguments every attention kernel takes
SEQUENCES = (I1, I1, I1, I1)
F32_1D, F32_2D = types.Array(types.float32, 1, "A"), types.Array(types.float32, 2, "A")
# window_left, window_right, softcap, alibi_slopes: every forward's and backward's (``_mods``)
MODS = (I32, I32, F32, F32_2D)


def grid_lengths(p):
    """Sq and Sk as the kernels take them and the grids follow: the arrays' (dense), or
    max_seqlen_q / max_seqlen_k (varlen)."""
    if "cu_seqlens_q" in p:
        return p["max_seqlen_q"], p["max_seqlen_k"]
    return p["q"].shape[1], p["k"].shape[1]


def _sizes(p):
    """Sq, Sk, Hq, group of the problem ``p``, as the kernels take them."""
    q, k = p["q"], p["k"]
    sq, sk = grid_lengths(p)
    return np.int32(sq), np.int32(sk), np.int32(q.shape[2]), np.int32(q.shape[2] // k.shape[2])


def sequence_arguments(p):
    """The arguments every forward and backward kernel takes last (``SEQUENCES``): a varlen
    call's offsets, or the status word in their place (a dense kernel reads none of them)."""
    status = p["status"]
    if "cu_seqlens_q" in p:
        return p["cu_seqlens_q"], p["cu_seqlens_k"], p["seqused_k"], status
    return status, status, status, status


class ForwardSpec(KernelSpec):
    """The forward kernels' signature, grid and arguments (problem: q, k, v, out, lse, scale;
    FP8 inputs, ``config.out_fmt`` set: out in that format, the three descales last)."""

    Config = AttentionConfig
    config = staticmethod(config_of)

    def signature(self, config):
        t, o = tensor_type(config.fmt), tensor_type(config.out_fmt or config.fmt)
        descales = (F32_2D,) * 3 if config.out_fmt else ()  # FP8: q's, k's and v's
        return types.void(t, t, t, o, F32_3D, I32, I32, I32, I32, F32, *SEQUENCES, I2, *MODS,
                          F32_1D, *descales)

    def grid(self, config, tiles, p):
        b, _, hq, _ = p["q"].shape
        return (cdiv(grid_lengths(p)[0], tiles.BLOCK_M), *fold(b * hq))

    def arguments(self, config, p):
        table = p.get("block_table")
        return (p["q"], p["k"], p["v"], p["out"], p["lse"], *_sizes(p),
                np.float32(p["scale"] * LOG2E), *sequence_arguments(p),
                arrays.batched(p["status"], 1) if table is None else table, *_mods(p),
                p.get("sink") or unread(p["status"], 1),
                *(p["descale"] if config.out_fmt else ()))


class PreprocessSpec(KernelSpec):
    """``D_i = rowsum(dO_i * O_i)``: (out, dout, delta, Sq, Hq); grid (ceil(Sq / BLOCK_M), B *
    Hq). Problem: out, dout, delta."""

    Config = AttentionConfig

    def config(self, problem):
        # One code for both masks, and for varlen batches: the rows are independent, so the
        # host hands it the packed rows as one batch entry.
        return config_of(problem)._replace(causal=False, varlen=False, window=False,
                                           softcap=False, alibi=False, sink=False)

    def signature(self, config):
        t = tensor_type(config.fmt)
        return types.void(t, t, F32_3D, I32, I32)

    def grid(self, config, tiles, p):
        b, sq, hq, _ = p["out"].shape
        return (cdiv(sq, tiles.BLOCK_M), *fold(b * hq))

    def arguments(self, config, p):
        _, sq, hq, _ = p["out"].shape
        return p["out"], p["dout"], p["delta"], np.int32(sq), np.int32(hq)


def _mods(p):
    """The masks' and score modifiers' arguments of every forward, dK/dV and dQ kernel (``MODS``):
    the sliding window's left and right sides (``validate.window``), the softcap
    (``validate.score_cap``) and the ALiBi slopes (B, Hq) (``validate.head_values``), read only
    by the kernels of a ``window`` / ``softcap`` / ``alibi`` config."""
    slopes = p.get("alibi_slopes") or unread(p["status"], 2)
    return (*(np.int32(x) for x in p.get("window", (0, 0))), np.float32(p.get("softcap", 0.0)),
            slopes)


def _scales(p):
    return np.float32(p["scale"]), np.float32(p["scale"] * LOG2E)


class DkdvSpec(KernelSpec):
    """dK_j, dV_j: (q, k, v, dout, lse, delta, dk, dv, Sq, Sk, Hk, group, scale, scale_log2,
    the sequences); grid (ceil(Sk / BLOCK_N), B * Hk)."""

    Config = AttentionConfig
    config = staticmethod(backward_config_of)

    def signature(self, config):
        t = tensor_type(config.fmt)
        return types.void(t, t, t, t, F32_3D, F32_3D, t, t, I32, I32, I32, I32, F32, F32,
                          *SEQUENCES, *MODS)

    def grid(self, config, tiles, p):
        b, _, hk, _ = p["k"].shape
        return (cdiv(grid_lengths(p)[1], tiles.BLOCK_N), *fold(b * hk))

    def arguments(self, config, p):
        sq, sk, _, group = _sizes(p)
        return (p["q"], p["k"], p["v"], p["dout"], p["lse"], p["delta"], p["dk"], p["dv"],
                sq, sk, np.int32(p["k"].shape[2]), group, *_scales(p), *sequence_arguments(p),
                *_mods(p))


class DqSpec(KernelSpec):
    """dQ_i: (q, k, v, dout, lse, delta, dq, Sq, Sk, Hq, group, scale, scale_log2, the
    sequences); grid (ceil(Sq / BLOCK_M), B * Hq); after the preprocess and dK/dV."""

    Config = AttentionConfig
    config = staticmethod(backward_config_of)
    writes_delta = False

    def signature(self, config):
        t = tensor_type(config.fmt)
        return types.void(t, t, t, t, F32_3D, F32_3D, t, I32, I32, I32, I32, F32, F32, *SEQUENCES,
                          *MODS)

    def grid(self, config, tiles, p):
        b, _, hq, _ = p["q"].shape
        return (cdiv(grid_lengths(p)[0], tiles.BLOCK_M), *fold(b * hq))

    def arguments(self, config, p):
        return (p["q"], p["k"], p["v"], p["dout"], p["lse"], p["delta"], p["dq"], *_sizes(p),
                *_scales(p), *sequence_arguments(p), *_mods(p))


class DqDeltaSpec(DqSpec):
    """A dQ kernel that also computes ``D_i = rowsum(dO_i * O_i)`` of its queries (the
    preprocess fused) and writes it to ``delta`` for dK/dV, so it runs first: (q, k, v, dout,
    out, lse, delta, dq, Sq, Sk, Hq, group, scale, scale_log2)."""

    writes_delta = True

    def signature(self, config):
        t = tensor_type(config.fmt)
        return types.void(t, t, t, t, t, F32_3D, F32_3D, t, I32, I32, I32, I32, F32, F32,
                          *SEQUENCES, *MODS)

    def arguments(self, config, p):
        return (p["q"], p["k"], p["v"], p["dout"], p["out"], p["lse"], p["delta"], p["dq"],
                *_sizes(p), *_scales(p), *sequence_arguments(p), *_mods(p))


class DecodeConfig(NamedTuple):
    """What decides an MLA decode kernel's code (with its tiles)."""

    q_rows: int       # s_q * h_q / h_kv: the packed query rows of one kv head
    head_dim: int
    head_dim_v: int
    causal: bool      # and s_q > 1
    fmt: str
    vec: bool         # q and the cache may be copied in 16-byte chunks (rows_16_byte_aligned)
    tma: bool = False  # cache tiles by TMA boxes (wgmma; page size a multiple of 64)
    separate_v: bool = False  # V in a cache of its own (ordinary attention), not k_cache's columns
    leftpad: bool = False  # each sequence's keys start at its own cache position (key_start)
    window: bool = False   # ordinary attention's masks and score modifiers (KVCacheDecodeSpec)
    softcap: bool = False
    alibi: bool = False
    cache: str = None      # the cache's bytes: None (q's format), "e4m3" (float8_e4m3fn values
                           # with descales, KVCacheDecodeSpec) or "v32" (DeepSeek-V3.2's rows)
    sparse: bool = False   # each query token reads its own cache rows (packed indices as table)


# The tensor-core decodes' samples (``KernelSpec.samples``) by label: (q_rows, head_dim,
# head_dim_v, causal, fmt), small head dims first (the cheapest), then DeepSeek's (576, 512)
# with 16 and with 128 rows.
TC_DECODE_SAMPLES = (("d=48 dv=23 causal=True bfloat16", (8, 48, 23, True, "bfloat16")),
                     ("q_rows=16 causal=False bfloat16", (16, 576, 512, False, "bfloat16")),
                     ("q_rows=128 causal=True float16", (128, 576, 512, True, "float16")))


class DecodeSpec(KernelSpec):
    """(q, k_cache, block_table, cache_seqlens, metadata, num_splits, out, lse, o_acc, lse_acc,
    status, s_q, group, page_size, scale_log2); grid (metadata rows, h_kv, ceil(q_rows /
    BLOCK_M)). ``status`` is the device status word (common/status.py)."""

    Config = DecodeConfig
    # Runs griddepcontrol.launch_dependents at its start (sm_90 kernels only), so the combine
    # launched behind it may start alongside it (kernels/simt/combine.py).
    allows_dependents = False
    def parts_per_sm(self, config, device):
        """Parts per SM a plan deals the keys to (scheduler.num_sm_parts): FlashMLA's one, or
        as many as the kernel's CTAs that fit on an SM together."""
        return 1

    def code_key(self, config, tiles):
        return config._replace(q_rows=0)  # the tiles hold what q_rows decides

    def signature(self, config):
        t = tensor_type(config.fmt)
        i1, i2 = types.Array(types.int32, 1, "A"), types.Array(types.int32, 2, "A")
        f4 = types.Array(types.float32, 4, "A")
        return types.void(t, t, i2, i1, i2, i1, t, F32_3D, f4, F32_3D, i1, I32, I32, I32, F32)

    def grid(self, config, tiles, p):
        return (p["metadata"].shape[0], p["k_cache"].shape[2], cdiv(config.q_rows, tiles.BLOCK_M))

    def arguments(self, config, p):
        s_q, h_q = p["q"].shape[1:3]
        return (p["q"], p["k_cache"], p["block_table"], p["cache_seqlens"], p["metadata"],
                p["num_splits"], p["out"], p["lse"], p["o_acc"], p["lse_acc"], p["status"],
                np.int32(s_q),
                np.int32(h_q // p["k_cache"].shape[2]), np.int32(p["k_cache"].shape[1]),
                np.float32(p["scale"] * LOG2E))


class KVCacheDecodeSpec(DecodeSpec):
    """A decode that also runs ``flash_attn_with_kvcache``'s attention: the decode's arguments,
    then ``v_cache`` (V's own cache, else ``k_cache`` again) and ``key_start`` (each sequence's
    first cache position, else any int32 array), read only with ``separate_v`` / ``leftpad``,
    and the masks' and modifiers' (``MODS``: window sides, softcap, ALiBi slopes (b, h_q)),
    read only with ``window`` / ``softcap`` / ``alibi``, and last ``k_descale``, ``v_descale``
    (float32 (b, h_kv)), read only with ``cache == "e4m3"``; an FP8 cache's arrays are bytes.
    Query token t of a sequence of ``seqlen`` keys (in the view ``key_start`` begins) has
    ``diag = seqlen - s_q``: flash-attn's rules of ``common/masks.py`` and
    ``common/score_mods.py``."""

    def signature(self, config):
        i1 = types.Array(types.int32, 1, "A")
        cache = tensor_type("float8_e4m3fn" if config.cache else config.fmt)
        args = list(super().signature(config).args)
        args[1] = cache  # k_cache
        return types.void(*args, cache, i1, *MODS, F32_2D, F32_2D)

    def arguments(self, config, p):
        descales = p.get("cache_descale") or (unread(p["status"], 2),) * 2
        return super().arguments(config, p) + (p.get("v_cache", p["k_cache"]),
                                               p.get("key_start", p["cache_seqlens"]),
                                               *_mods(p), *descales)
