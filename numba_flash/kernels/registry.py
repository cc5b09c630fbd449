"""Which kernel runs each pass: the registry of every kernel the host launches.

A pass (the forward, the backward's dK/dV + dQ pair, the MLA decode) has its candidates listed
here best first. Each ``Entry`` names its backend (``simt`` or ``tc``), the spec or specs it
launches, and ``refuses(problem, dev)``: None when it can run the problem on that device, else
the reason it cannot. ``choose`` takes the first candidate of the backend that accepts; when an
explicit backend has none, the ``ValueError`` lists every candidate's reason. A new kernel is its
module (its spec with the samples the checks compile, ``KernelSpec.samples``) and one line in
``ENTRIES``; ``tools/ptx_hashes.py`` and the registry's compile test enumerate the specs from here
too.

The problem is ``kernels/problem.py``'s description of the call (``Attention`` or ``Decode``), as
the host's validation built it. An entry takes only problems whose options (``options()``: varlen
offsets, paging, masks, score modifiers, FP8) it ``honours``; every other refusal is its own
``refuses``. A decode entry also builds its spec's config.
"""

from contextlib import contextmanager
from typing import Callable, NamedTuple, Optional

from . import naive
from .common import paged_kv
from .simt import backward as simt_backward
from .simt import combine as simt_combine
from .simt import kvcache_prepare as simt_kvcache_prepare
from .simt import forward as simt_forward
from .simt import hadamard as simt_hadamard
from .simt import mla_decode as simt_mla_decode
from .simt import mla_metadata as simt_mla_metadata
from .simt import quantize as simt_quantize
from .simt import sink_grad as simt_sink_grad
from .simt import sparse_indices as simt_sparse_indices
from .tc import backward_mma as tc_backward_mma
from .tc import backward_wgmma as tc_backward_wgmma
from .tc import forward_mma as tc_forward_mma
from .tc import forward_wgmma as tc_forward_wgmma
from .tc import forward_wgmma_fp8 as tc_forward_wgmma_fp8
from .tc import forward_wgmma_ws as tc_forward_wgmma_ws
from .tc import kvcache_decode_mma as tc_kvcache_decode_mma
from .tc import mla_decode_mma as tc_mla_decode_mma
from .tc import mla_decode_seesaw as tc_mla_decode_seesaw
from .tc import mla_decode_wgmma as tc_mla_decode_wgmma


class Entry(NamedTuple):
    name: str
    pass_: str
    backend: str
    specs: tuple
    refuses: Callable
    config: Optional[Callable] = None  # decode: (problem) -> its spec's Config
    honours: frozenset = frozenset()   # the problem options its kernels implement


def tc_family(cc):
    """The tensor-core family that runs on compute capability ``cc``: ``"wgmma"`` (Hopper's
    warpgroup instructions) on 9.0, else ``"mma"`` (mma.sync, sm_80 and newer)."""
    return "wgmma" if tuple(cc[:2]) == (9, 0) else "mma"


def _on(family):
    def refuses(problem, dev):
        if tc_family(dev.cc) == family:
            return None
        cc = ".".join(map(str, dev.cc[:2]))
        return (f"needs compute capability 9.0, not {cc}" if family == "wgmma" else
                "compute capability 9.0 runs the wgmma kernel")
    return refuses


def _anywhere(problem, dev):
    return None


def _wgmma_backward(problem, dev):
    if problem.softcap is not None and problem.cu_seqlens_q is not None:  # (mma.sync runs it)
        return ("runs no softcap on varlen batches: the cap and the sequence bounds together "
                "spill the registers of the 64-row accumulators (8-88 bytes)")
    return _on("wgmma")(problem, dev) or (
        None if problem.head_dim <= tc_backward_wgmma.MAX_HEAD_DIM else
        f"takes head dims up to {tc_backward_wgmma.MAX_HEAD_DIM}, got {problem.head_dim}")


def _fp8_forward(problem, dev):
    if problem is None or problem.descale is None:
        return "runs FP8 inputs only"
    if problem.head_dim % 16:
        return (f"copies e4m3 rows in 16-byte chunks: head dims that are multiples of 16, got "
                f"{problem.head_dim}")
    return _on("wgmma")(problem, dev)


def _tc_decode(module, family):
    def refuses(problem, dev):
        why = _on(family)(problem, dev)
        if why:
            return why
        d, dv = problem.head_dim, problem.head_dim_v
        if not module.supports(d, dv):
            return (f"the tensor-core decode takes head dims that are multiples of 16 up to "
                    f"{module.MAX_HEAD_DIM} and head_dim_v up to {module.MAX_HEAD_DIM_V}, got "
                    f"{d} and {dv}")
        if not problem.aligned:
            return ("the tensor-core decode copies rows of q and k_cache in 16-byte chunks: "
                    "their data pointers and strides must be multiples of 16 bytes")
        return None
    return refuses


def _seesaw(problem, dev):
    why = _tc_decode(tc_mla_decode_wgmma, "wgmma")(problem, dev)
    if why:
        return why
    if problem.page % tc_mla_decode_wgmma.BLOCK_N:
        return f"loads whole pages of {tc_mla_decode_wgmma.BLOCK_N} rows by TMA, got {problem.page}"
    if not tc_mla_decode_seesaw.supports(problem.head_dim, problem.head_dim_v):
        return "its schedule needs Q's columns past head_dim_v to fill two value blocks"
    return None


def _kvcache_decode(problem, dev):
    if problem.v_cache is None:
        return "decodes V from a cache of its own (flash_attn_with_kvcache), not MLA's latent cache"
    d, dv = problem.head_dim, problem.head_dim_v
    if not tc_kvcache_decode_mma.supports(d, dv, dev.cc):
        top = tc_kvcache_decode_mma.max_head_dim(dev.cc)
        return f"takes head dims that are multiples of 16 up to {top} here, got {d} and {dv}"
    if not (problem.aligned and problem.cache_aligned):
        return ("copies rows of q, k_cache and v_cache in 16-byte chunks: their data pointers "
                "and strides must be multiples of 16 bytes")
    return None


def _decode_key(problem):
    return (problem.q_rows, problem.head_dim, problem.head_dim_v, problem.masked, problem.fmt)


def _tc_decode_config(problem):
    """The tc decodes' config: rows in 16-byte chunks, TMA boxes where each 64-key tile lies in
    one page (wgmma; the seesaw takes the same config); a sparse decode's rows are scattered
    (cp.async), V3.2's FP8 ones widened on the way."""
    sparse = problem.indices is not None
    tma = problem.page % tc_mla_decode_wgmma.BLOCK_N == 0 and not sparse
    return tc_mla_decode_wgmma.SPEC.Config(*_decode_key(problem), True, tma)._replace(
        cache="v32" if problem.fp8_cache else None, sparse=sparse)


def _mma_decode_config(problem):
    return tc_mla_decode_mma.SPEC.Config(*_decode_key(problem), True, False)._replace(
        cache="v32" if problem.fp8_cache else None, sparse=problem.indices is not None)


def _modifiers(problem):
    """A KV-cache decode config's last fields: window, softcap, alibi, the cache's format."""
    cache = "e4m3" if problem.cache_descale is not None else "v32" if problem.fp8_cache else None
    return (problem.window is not None, problem.softcap is not None,
            problem.alibi_slopes is not None, cache)


def _kvcache_decode_config(problem):
    return tc_kvcache_decode_mma.SPEC.Config(*_decode_key(problem), True, False, True,
                                             problem.key_start is not None, *_modifiers(problem))


def _simt_decode_config(problem):
    return simt_mla_decode.SPEC.Config(*_decode_key(problem), problem.cache_aligned, False,
                                       problem.v_cache is not None,
                                       problem.key_start is not None, *_modifiers(problem),
                                       problem.indices is not None)


# Packed sequences (kernels/attention.py): every forward and backward kernel runs them, and
# every forward kernel reads their K and V from pages behind a block table too.
VARLEN = frozenset(("cu_seqlens_q", "cu_seqlens_k", "seqused_k"))
PAGED_VARLEN = VARLEN | {"block_table"}
# The masks and score modifiers run in every forward and backward kernel (the window not with
# paged K/V yet; a sink's gradient is SINK_GRAD's, after the backward's pair).
MODIFIERS = frozenset(("window", "softcap", "alibi_slopes", "sink"))
FORWARD = PAGED_VARLEN | MODIFIERS
# FP8 q, k, v with their descales: packed sequences and the modifiers, not paged K/V.
FORWARD_FP8 = VARLEN | MODIFIERS | {"descale"}
BACKWARD = VARLEN | MODIFIERS
# A decode's attention sink is the combine's, behind every decode kernel (simt/combine.py).
DECODE = frozenset(("attn_sink",))
# flash_attn_with_kvcache's decode: V in its own cache, keys from a per-sequence start, the
# masks and score modifiers of ordinary attention, FP8 caches with their descales.
KVCACHE = DECODE | {"v_cache", "key_start", "window", "softcap", "alibi_slopes", "cache_descale"}
# DeepSeek-V3.2's sparse decode: each query token's own cache rows, FP8 rows of 656 bytes.
SPARSE = frozenset(("indices", "fp8_cache"))

ENTRIES = (
    # The warp-specialized forward leads on Hopper; paged K/V (which it does not take) falls
    # through to the cp.async wgmma kernel (docs/design.md, "Warp-specialized forward").
    Entry("tc.forward_wgmma_ws", "forward", "tc", (tc_forward_wgmma_ws.SPEC,), _on("wgmma"),
          honours=VARLEN | MODIFIERS),
    Entry("tc.forward_wgmma", "forward", "tc", (tc_forward_wgmma.SPEC,), _on("wgmma"),
          honours=FORWARD),
    Entry("tc.forward_mma", "forward", "tc", (tc_forward_mma.SPEC,), _anywhere,
          honours=FORWARD),
    Entry("tc.forward_wgmma_fp8", "forward", "tc", (tc_forward_wgmma_fp8.SPEC,), _fp8_forward,
          honours=FORWARD_FP8),
    Entry("simt.forward", "forward", "simt", (simt_forward.SPEC,), _anywhere,
          honours=FORWARD | {"descale"}),
    Entry("tc.backward_wgmma", "backward", "tc",
          (tc_backward_wgmma.DKDV, tc_backward_wgmma.DQ), _wgmma_backward, honours=BACKWARD),
    Entry("tc.backward_mma", "backward", "tc", (tc_backward_mma.DKDV, tc_backward_mma.DQ),
          _anywhere, honours=BACKWARD),
    Entry("simt.backward", "backward", "simt", (simt_backward.DKDV, simt_backward.DQ), _anywhere,
          honours=BACKWARD),
    Entry("tc.kvcache_decode_mma", "decode", "tc", (tc_kvcache_decode_mma.SPEC,),
          _kvcache_decode, _kvcache_decode_config, honours=KVCACHE),
    Entry("tc.mla_decode_seesaw", "decode", "tc", (tc_mla_decode_seesaw.SPEC,), _seesaw,
          _tc_decode_config, honours=DECODE),
    Entry("tc.mla_decode_wgmma", "decode", "tc", (tc_mla_decode_wgmma.SPEC,),
          _tc_decode(tc_mla_decode_wgmma, "wgmma"), _tc_decode_config,
          honours=DECODE | SPARSE),
    Entry("tc.mla_decode_mma", "decode", "tc", (tc_mla_decode_mma.SPEC,),
          _tc_decode(tc_mla_decode_mma, "mma"), _mma_decode_config, honours=DECODE | SPARSE),
    Entry("simt.mla_decode", "decode", "simt", (simt_mla_decode.SPEC,), _anywhere,
          _simt_decode_config, honours=KVCACHE | SPARSE),
)

# Single kernels every call of their pass uses, whatever the backend.
PREPROCESS = simt_backward.PREPROCESS
SINK_GRAD = simt_sink_grad.SPEC
HADAMARD = simt_hadamard.SPEC
QUANTIZE = (simt_quantize.AMAX, simt_quantize.QUANTIZE)  # the maxima, then the rounding
COMBINE = simt_combine.SPEC
KVCACHE_PREPARE = simt_kvcache_prepare.SPEC
METADATA = simt_mla_metadata.SPEC
SPARSE_INDICES = simt_sparse_indices.SPEC
NAIVE = (naive.SCORES, naive.SOFTMAX, naive.OUTPUT)
MAX_DECODE_HEAD_DIM = simt_mla_decode.MAX_HEAD_DIM
V32_ROW_BYTES = paged_kv.V32_ROW_BYTES  # DeepSeek-V3.2's FP8 cache rows (the sparse decode's)
MAX_ROTATION_DIM = simt_hadamard.MAX_HEAD_DIM
QUANTIZE_SPLITS = simt_quantize.split_rows  # (rows, CTAs) per (batch, head) of a length


_set_aside = set()  # names of entries ``choose`` passes over (``setting_aside``)


@contextmanager
def setting_aside(*names):
    """Within the block, ``choose`` passes over the entries ``names``: the tests of a kernel
    that a better one precedes, and A/B benchmarks (not thread-safe)."""
    unknown = set(names) - {e.name for e in ENTRIES}
    if unknown:
        raise ValueError(f"no registry entries {sorted(unknown)}")
    added = set(names) - _set_aside
    _set_aside.update(added)
    try:
        yield
    finally:
        _set_aside.difference_update(added)


def set_aside():
    """The names ``setting_aside`` holds now (a plan made under them is theirs alone)."""
    return frozenset(_set_aside)


def choose(pass_, backend, problem, dev):
    """The first entry of ``pass_`` for ``backend`` that accepts ``problem`` on ``dev`` (None: a
    forward asked about without one, as the demo asks which kernel a backend runs); when none
    does, a ValueError that gives each candidate's reason."""
    reasons = []
    options = frozenset() if problem is None else problem.options()
    for entry in ENTRIES:
        if entry.pass_ == pass_ and entry.backend == backend:
            missing = options - entry.honours
            why = ("set aside" if entry.name in _set_aside else
                   f"does not implement {', '.join(sorted(missing))}" if missing else
                   entry.refuses(problem, dev))
            if why is None:
                return entry
            reasons.append(f"{entry.name}: {why}")
    raise ValueError(f"backend: no {backend!r} kernel runs this {pass_}: " + "; ".join(reasons))


def specs():
    """Every spec the registry can launch, each once, in the order of ``ENTRIES``."""
    seen = []
    for entry in ENTRIES:
        seen += [s for s in entry.specs if s not in seen]
    singles = (PREPROCESS, SINK_GRAD, COMBINE, METADATA, KVCACHE_PREPARE, SPARSE_INDICES,
               HADAMARD, *QUANTIZE, *NAIVE)
    return seen + [s for s in singles if s not in seen]
