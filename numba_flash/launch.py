"""Tile configurations, grids, compiled-kernel cache, the large-shared-memory opt-in, launches.

Kernel modules export *factories*: plain Python functions closed over compile-time constants
(tile sizes, head dim, causal, storage format). This module turns a factory's output into a
compiled kernel once per configuration, with an explicit signature (Numba's front end, then,
where asked, every loop marked for full unrolling, then NVVM: ``kernel_library``), raises the
kernel's dynamic shared-memory limit when it needs more than the 48 KiB every kernel gets by
default (Hopper allows up to 227 KiB per block), and launches it by writing its parameters
straight from the adapted arrays (``launch``: a few microseconds, where Numba's per-call
argument handling takes ~75).
"""

import ctypes
import math
import re
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache

from numba import config, cuda, types
from numba.cuda.cudadrv.driver import driver as _driver

from .arrays import Tensor
from .kernels import primitives as prim

SIMULATOR = bool(config.ENABLE_CUDASIM)
DEFAULT_SHARED_LIMIT = 48 * 1024


@dataclass(frozen=True)
class Tiles:
    """One kernel configuration: tile sizes, threads per block and dynamic shared bytes."""

    BLOCK_M: int
    BLOCK_N: int
    threads: int
    shared_bytes: int
    max_registers: int = 0  # a per-thread register cap (0: the compiler's choice)

    @property
    def spec(self):
        """(BLOCK_M, BLOCK_N, warps, register cap): the form the tc tile table holds."""
        return self.BLOCK_M, self.BLOCK_N, self.threads // 32, self.max_registers


# ----------------------------------------------------------------------------- SIMT forward

# (BLOCK_M, BLOCK_N) by head dim, measured on an H200 (bench/results). Larger head dims trade
# BLOCK_N (shared memory, S registers) for the O_i micro-tile, which grows as HEAD_DIM / 8.
_SIMT_FWD_TILES = ((64, (64, 64)), (128, (64, 32)), (256, (32, 32)))


def simt_forward_tiles(head_dim):
    from .kernels.simt import forward

    bm, bn = next(t for limit, t in _SIMT_FWD_TILES if head_dim <= limit)
    words = forward.shared_layout(bm, bn, head_dim)["words"]
    return Tiles(bm, bn, forward.THREADS, 4 * words)


def attention_signature(fmt):
    """Signature shared by the forward kernels: q, k, v, out, lse, Sq, Sk, Hq, group, scale."""
    t = types.Array(prim.storage_type(fmt), 4, "A")
    return types.void(t, t, t, t, types.Array(types.float32, 3, "A"),
                      types.int32, types.int32, types.int32, types.int32, types.float32)


def tc_family(cc):
    """Which tc forward kernel runs on compute capability ``cc``: ``"wgmma"`` (Hopper's warpgroup
    instructions, kernels/tc/forward_wgmma.py) on 9.0, else ``"mma"`` (mma.sync, forward.py)."""
    return "wgmma" if tuple(cc[:2]) == (9, 0) else "mma"


def forward_spec(backend, head_dim, causal, fmt, tiles=None, family="mma"):
    """``(pyfunc, signature, compile options)`` of the ``simt`` or ``tc`` forward kernel, the form
    ``ptxcheck.compile_report_isolated`` takes (``tiles``: a tc tile candidate, see
    ``tc_forward_tiles``; ``family``: the tc kernel, see ``tc_family``)."""
    if backend == "tc":
        from .kernels.tc import forward, forward_wgmma

        t = tc_forward_tiles(head_dim, tiles, family=family, causal=causal)
        if family == "wgmma":
            pyfunc = forward_wgmma.make_forward_kernel(head_dim, t.BLOCK_M, t.BLOCK_N, causal, fmt)
        else:
            pyfunc = forward.make_forward_kernel(head_dim, t.BLOCK_M, t.BLOCK_N, causal, fmt,
                                                 t.threads // 32)
    else:
        from .kernels.simt import forward

        t = simt_forward_tiles(head_dim)
        pyfunc = forward.make_forward_kernel(head_dim, t.BLOCK_M, t.BLOCK_N, causal, fmt)
    return pyfunc, attention_signature(fmt), compile_options(t, unroll_loops=backend == "tc")


@lru_cache(maxsize=None)
def forward_kernel(backend, head_dim, causal, fmt):
    """Compiled forward kernel of ``backend`` and its tiles (for the current device)."""
    if backend == "tc":
        family = tc_family(device_cc())
        tiles = tc_forward_tiles(head_dim, shared_per_sm=device_limits()[2], family=family,
                                 causal=causal)
        spec = forward_spec(backend, head_dim, causal, fmt, tiles.spec, family)
    else:
        tiles = simt_forward_tiles(head_dim)
        spec = forward_spec(backend, head_dim, causal, fmt)
    pyfunc, signature, options = spec
    return compile_kernel(pyfunc, signature, tiles.shared_bytes, options), tiles


# ----------------------------------------------------------------------------- SIMT backward

# By head dim: (BLOCK_M, BLOCK_N) of the dK/dV kernel (BLOCK_N keys held, BLOCK_M queries
# streamed) and of the dQ kernel (BLOCK_M queries held, BLOCK_N keys streamed). The register
# accumulators grow as HEAD_DIM / 8 per owned row, so larger head dims own fewer rows (dQ at 256
# with 32 query rows needs ~250 registers, at the edge of spilling). No spills on sm_80 / sm_90
# (at most ~210 registers, the PTX test checks); shared memory <= 106 KiB, so an A100 fits.
_SIMT_BWD_TILES = ((64, (32, 64), (64, 32)), (128, (32, 32), (64, 32)), (256, (32, 16), (16, 32)))


def simt_backward_tiles(head_dim, kernel):
    """Tiles of one backward kernel (``preprocess``: BLOCK_M rows of D per block, no tiles)."""
    from .kernels.simt import backward

    if kernel == "preprocess":
        return Tiles(backward.ROW_GROUPS, 0, backward.THREADS, 0)
    _, dkdv, dq = next(t for t in _SIMT_BWD_TILES if head_dim <= t[0])
    bm, bn = dkdv if kernel == "dkdv" else dq
    layout = backward.dkdv_shared_layout if kernel == "dkdv" else backward.dq_shared_layout
    return Tiles(bm, bn, backward.THREADS, 4 * layout(bm, bn, head_dim)["words"])


def simt_backward_spec(kernel, head_dim, causal, fmt):
    """``(pyfunc, signature, compile options)`` of one backward kernel, the form
    ``ptxcheck.compile_report_isolated`` takes. Signatures: preprocess (out, dout, delta, Sq,
    Hq); dkdv (q, k, v, dout, lse, delta, dk, dv, Sq, Sk, Hk, group, scale, scale_log2); dq
    (q, k, v, dout, lse, delta, dq, Sq, Sk, Hq, group, scale, scale_log2)."""
    from .kernels.simt import backward

    t = types.Array(prim.storage_type(fmt), 4, "A")
    f3 = types.Array(types.float32, 3, "A")
    i32, f32 = types.int32, types.float32
    if kernel == "preprocess":
        return (backward.make_preprocess_kernel(head_dim, fmt),
                types.void(t, t, f3, i32, i32), COMPILE_OPTIONS)
    tiles = simt_backward_tiles(head_dim, kernel)
    make = backward.make_dkdv_kernel if kernel == "dkdv" else backward.make_dq_kernel
    grads = (t, t) if kernel == "dkdv" else (t,)
    return (make(head_dim, tiles.BLOCK_M, tiles.BLOCK_N, causal, fmt),
            types.void(t, t, t, t, f3, f3, *grads, i32, i32, i32, i32, f32, f32), COMPILE_OPTIONS)


@lru_cache(maxsize=None)
def simt_backward_kernel(kernel, head_dim, causal, fmt):
    pyfunc, signature, _ = simt_backward_spec(kernel, head_dim, causal, fmt)
    tiles = simt_backward_tiles(head_dim, kernel)
    return compile_kernel(pyfunc, signature, tiles.shared_bytes), tiles


# ----------------------------------------------------------------------------- tensor-core forward

# (BLOCK_M, BLOCK_N, warps, register cap) by head dim, from the tile sweep
# bench/tune_tc_forward.py on an H200 (bench/results/2026-11-29-NVIDIA-H200/tune_tc_forward*.csv);
# every entry compiles without spills for sm_80 and sm_90 (the PTX test checks both).
# 4 warps of 32 query rows each (MT = 2), up to 255 registers: every K and V fragment from
# ldmatrix feeds two mma, and the per-tile costs (barrier, copies, row reductions) are shared by
# twice the work. Before the loops were marked for full unrolling (launch.kernel_library) these
# tiles put their register arrays in local memory at 64 keys, and 8-warp blocks of 16 rows under
# a 128-register cap were best; in the sweep at 6ecd558 the 4-warp tiles beat them by 8-18%
# (D = 64: 294 vs 272 TFLOP/s, D = 128: 323 vs 273, non-causal, N = 4096).
# A head dim lists its tiles best first; the first of which two blocks fit in one SM's shared
# memory is taken (two blocks per SM is what the registers allow; one block of 4 warps cannot
# keep the tensor cores busy). At D = 128, 64 keys (102 KiB) need a Hopper's 228 KiB per SM; an
# A100 (164 KiB) or an sm_86/89 part takes 32 keys (68 KiB). 64 keys gained nothing over 32
# until the epilogue stopped holding registers of its own; in session 9 (N = 1k / 4k / 16k,
# tc_variants_session9.log run c) they ran non-causal 310 / 332 / 333 TFLOP/s against 308 /
# 325 / 330, causal 254 / 309 / 333 against 238 / 275 / 312.
_TC_FWD_TILES = ((64, ((128, 64, 4, 0),)), (128, ((128, 64, 4, 0), (128, 32, 4, 0))),
                 (256, ((64, 32, 4, 0),)))
SHARED_RESERVED_PER_BLOCK = 1024  # bytes the hardware keeps in every block's shared memory

# The wgmma kernel's (BLOCK_M, BLOCK_N, warps, register cap) by head dim, non-causal and causal:
# BLOCK_M = 64 per warpgroup, warps = BLOCK_M / 16. Measured by bench/tune_tc_forward.py on an
# H200 (bench/results/2026-11-30-NVIDIA-H200/, TFLOP/s fp16 at N = 1k / 4k / 16k):
#   D = 128: 128 x 128 (161 KiB, one block per SM): 392 / 428 / 437 non-causal, 313 / 398 / 443
#            causal (tc_wgmma_variants_session11.log, runs r1 and r3; 192 x 64 and 128 x 64 were
#            3-20% slower in tune_tc_wgmma.csv);
#   D = 64:  128 x 64 (49 KiB, 98 registers: two blocks per SM): 357 / 389 / 400 non-causal,
#            276 / 358 / 391 causal, against 128 x 128 at 321 / 363 / 372 and 235 / 316 / 349.
#            (Before the online-softmax step was shared with forward.py, whose PTX for this
#            kernel differs only in its branch layout, tune_tc_wgmma.csv had 128 x 128 ahead for
#            causal: ptxas' schedule is that sensitive; re-sweep after changing the kernel.)
#   D = 256: 64 x 64 (248 registers), correct on the GPU tests, not swept.
_TC_WGMMA_FWD_TILES = ((64, ((128, 64, 8, 0), (128, 64, 8, 0))),
                       (128, ((128, 128, 8, 0), (128, 128, 8, 0))),
                       (256, ((64, 64, 4, 0), (64, 64, 4, 0))))


def tc_forward_tiles(head_dim, tiles=None, shared_per_sm=None, family="mma", causal=False):
    """Tiles of the tc forward for ``head_dim``: ``tiles`` = (BLOCK_M, BLOCK_N, warps, register
    cap) as the tile sweep passes them, else the table's: for ``mma`` the first entry of which two
    blocks fit in ``shared_per_sm`` bytes (None: the first), for ``wgmma`` the ``causal`` one."""
    from .kernels.tc import forward, forward_wgmma

    kernel = forward_wgmma if family == "wgmma" else forward

    def block_bytes(t):
        return 2 * kernel.shared_elements(t[0], t[1], head_dim)

    if tiles is None and family == "wgmma":
        tiles = next(t for limit, t in _TC_WGMMA_FWD_TILES if head_dim <= limit)[int(causal)]
    elif tiles is None:
        options = next(t for limit, t in _TC_FWD_TILES if head_dim <= limit)
        fits = [t for t in options if shared_per_sm is None
                or 2 * (block_bytes(t) + SHARED_RESERVED_PER_BLOCK) <= shared_per_sm]
        tiles = (fits or options[-1:])[0]
    bm, bn, warps, regs = tiles
    return Tiles(bm, bn, 32 * warps, block_bytes(tiles), regs)


# ----------------------------------------------------------------------------- naive baseline

# The three kernels of kernels/naive.py (S = QK^T, softmax, O = PV). Their tiles are fixed by the
# kernels' thread mapping (naive.TILE, naive.GEMM_THREADS); shared memory is static.
NAIVE_KERNELS = ("scores", "softmax", "output")


def naive_spec(kernel, causal, fmt):
    """``(pyfunc, signature, compile options)`` of one naive kernel. Signatures: scores (q, k, s,
    Sq, Sk, Hq, group, scale); softmax (s, lse, Sq, Sk); output (p, v, out, Sq, Sk, Hq, group)."""
    from .kernels import naive

    t = types.Array(prim.storage_type(fmt), 4, "A")
    f4, f3 = types.Array(types.float32, 4, "A"), types.Array(types.float32, 3, "A")
    i32 = types.int32
    if kernel == "scores":
        return (naive.make_scores_kernel(fmt),
                types.void(t, t, f4, i32, i32, i32, i32, types.float32), COMPILE_OPTIONS)
    if kernel == "softmax":
        return naive.make_softmax_kernel(causal), types.void(f4, f3, i32, i32), COMPILE_OPTIONS
    return naive.make_output_kernel(fmt), types.void(f4, t, t, i32, i32, i32, i32), COMPILE_OPTIONS


@lru_cache(maxsize=None)
def naive_kernel(kernel, causal, fmt):
    pyfunc, signature, _ = naive_spec(kernel, causal, fmt)
    return compile_kernel(pyfunc, signature, 0)


# ----------------------------------------------------------------------------- SIMT MLA decode

# BLOCK_N (cache rows per tile) by BLOCK_M (packed query rows, a power of two up to 16). One or
# two rows run the narrow variant (warps split the keys): 32-row tiles, 4 keys per warp, a
# three-tile cp.async ring of 108 KiB in 16 bits. More rows are bound by arithmetic and need their
# registers for the O_i micro-tile (BLOCK_M * HEAD_DIM_V / 256 floats per thread) and the S
# micro-tile, so they take shallower tiles. 128 query rows (h_q = 128) run as eight tiles of 16:
# BLOCK_M = 32 (O_i of 64 floats per thread) spills on sm_80. While a configuration exceeds the
# device's shared memory (float32 tiles), BLOCK_N halves down to the warp count, but a wide tile
# never below BLOCK_M (float32 16 x 8 spills on sm_80), then BLOCK_M halves.
# Checked by the PTX test (HEAD_DIM 576): no spills on sm_80 / sm_90.
_MLA_BLOCK_N = ((8, 32), (16, 16))
# Threads per CTA: 256 (8 warps) on a GPU. The simulator runs every thread as a Python thread and
# a barrier among 256 of them costs ~8x one among 64, so simulated runs use 64 (the layouts are
# parametric in it; one test runs the GPU's 256).
MLA_THREADS = 64 if SIMULATOR else 256
SIMULATED_SMS = 8  # get_mla_metadata's num_sms default under the simulator (no device to ask)
SIMULATED_SHARED_LIMIT = 227 * 1024
SIMULATED_CC = (9, 0)


@lru_cache(maxsize=None)
def device_cc():
    """Compute capability of the current device (under the simulator: SIMULATED_CC)."""
    if SIMULATOR:
        return SIMULATED_CC
    return cuda.get_current_device().compute_capability


@lru_cache(maxsize=None)
def device_limits():
    """(SM count, opt-in dynamic shared memory per block, shared memory per SM; bytes) of the
    current device (under the simulator: per SM None, no limit)."""
    if SIMULATOR:
        return SIMULATED_SMS, SIMULATED_SHARED_LIMIT, None
    dev = cuda.get_current_device()
    return (dev.MULTIPROCESSOR_COUNT, dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            dev.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)


def simt_mla_decode_tiles(q_rows, head_dim, head_dim_v, fmt, shared_limit):
    from .kernels.simt import mla_decode

    def nbytes(bm, bn):
        return mla_decode.layout(bm, bn, head_dim, head_dim_v, fmt, MLA_THREADS)["bytes"]

    bm = min(_MLA_BLOCK_N[-1][0], 1 << (q_rows - 1).bit_length())
    while True:
        bn = next(n for rows, n in _MLA_BLOCK_N if bm <= rows)
        least = max(MLA_THREADS // 32, 1 if bm <= mla_decode.NARROW_ROWS else bm)
        while nbytes(bm, bn) > shared_limit and bn > least:
            bn //= 2
        if nbytes(bm, bn) <= shared_limit or bm == 1:
            return Tiles(bm, bn, MLA_THREADS, nbytes(bm, bn))
        bm //= 2


def mla_copies_16_bytes(k_cache):
    """Whether the decode kernel may copy the cache (an ``arrays.Tensor`` of shape (num_blocks,
    page, h_kv, d)) in 16-byte chunks: data pointer, rows and every stride multiples of 16
    bytes. Pass it to ``simt_mla_decode_kernel`` as ``vec``."""
    size = k_cache.itemsize
    return all(x % 16 == 0 for x in (k_cache.ptr, k_cache.shape[3] * size,
                                     *(s * size for s in k_cache.strides[:3])))


def simt_mla_decode_spec(q_rows, head_dim, head_dim_v, causal, fmt, shared_limit, vec=True):
    """``(pyfunc, signature, compile options)`` of the decode kernel for ``q_rows = s_q * h_q /
    h_kv`` packed rows (``vec``: the cache is 16-byte aligned). Signature: q, k_cache,
    block_table, cache_seqlens, metadata, num_splits, out, lse, o_acc, lse_acc, s_q, group,
    page_size, scale_log2."""
    from .kernels.simt import mla_decode

    tiles = simt_mla_decode_tiles(q_rows, head_dim, head_dim_v, fmt, shared_limit)
    t = types.Array(prim.storage_type(fmt), 4, "A")
    i1, i2 = types.Array(types.int32, 1, "A"), types.Array(types.int32, 2, "A")
    f3, f4 = types.Array(types.float32, 3, "A"), types.Array(types.float32, 4, "A")
    i32 = types.int32
    pyfunc = mla_decode.make_mla_decode_kernel(head_dim, head_dim_v, tiles.BLOCK_M, tiles.BLOCK_N,
                                               tiles.threads, causal, fmt, vec)
    return (pyfunc, types.void(t, t, i2, i1, i2, i1, t, f3, f4, f3, i32, i32, i32, types.float32),
            COMPILE_OPTIONS)


@lru_cache(maxsize=None)
def simt_mla_decode_kernel(q_rows, head_dim, head_dim_v, causal, fmt, vec=True):
    """``(kernel, tiles)``; configurations with the same tiles share one compiled kernel.
    ``vec``: ``mla_copies_16_bytes(k_cache)``."""
    limit = device_limits()[1]
    tiles = simt_mla_decode_tiles(q_rows, head_dim, head_dim_v, fmt, limit)
    return _simt_mla_decode_compiled(tiles, head_dim, head_dim_v, causal, fmt, limit, vec), tiles


@lru_cache(maxsize=None)
def _simt_mla_decode_compiled(tiles, head_dim, head_dim_v, causal, fmt, limit, vec):
    # q_rows = BLOCK_M gives back the same tiles
    pyfunc, signature, _ = simt_mla_decode_spec(tiles.BLOCK_M, head_dim, head_dim_v, causal, fmt,
                                                limit, vec)
    return compile_kernel(pyfunc, signature, tiles.shared_bytes)


def simt_mla_combine_spec(head_dim_v, fmt):
    """``(pyfunc, signature, compile options)`` of the combine kernel: o_acc, lse_acc,
    num_splits, out, lse."""
    from .kernels.simt import combine

    t = types.Array(prim.storage_type(fmt), 4, "A")
    f3, f4 = types.Array(types.float32, 3, "A"), types.Array(types.float32, 4, "A")
    return (combine.make_combine_kernel(head_dim_v, fmt),
            types.void(f4, f3, types.Array(types.int32, 1, "A"), t, f3), COMPILE_OPTIONS)


@lru_cache(maxsize=None)
def simt_mla_combine_kernel(head_dim_v, fmt):
    """``(kernel, tiles)``: BLOCK_M query rows (one per warp) per CTA, no shared memory."""
    from .kernels.simt import combine

    pyfunc, signature, _ = simt_mla_combine_spec(head_dim_v, fmt)
    return compile_kernel(pyfunc, signature, 0), Tiles(combine.ROWS, 0, combine.THREADS, 0)


# ----------------------------------------------------------------------------- compile & launch

# Options of every kernel compile; the PTX checks compile with the same ones. Fast math without
# its "no infinities / no NaNs" assumptions: ``exp2`` still becomes one ``ex2.approx`` ("afn")
# and multiply-adds fuse ("contract"), while the kernels' tests for -inf (rows that see no key
# yet) cannot be folded away. Two options are the project's own, not Numba's: ``max_registers``
# (a cap for the assembler) and ``unroll_loops`` (see ``mark_loops_for_unrolling``).
COMPILE_OPTIONS = {"fastmath": {"contract", "afn", "arcp", "nsz"}}


def compile_options(tiles, unroll_loops=False):
    """COMPILE_OPTIONS plus the register cap of ``tiles`` and, for kernels whose register arrays
    outgrow the optimizer's unrolling budget, ``unroll_loops``."""
    options = dict(COMPILE_OPTIONS)
    if tiles.max_registers:
        options["max_registers"] = tiles.max_registers
    if unroll_loops:
        options["unroll_loops"] = True
    return options


def mark_loops_for_unrolling(llvm_ir):
    """``llvm_ir`` with every loop marked ``llvm.loop.unroll.full``: CUDA C++'s ``#pragma
    unroll``, which Numba has no spelling for.

    A register array (``cuda.local.array``) stays in registers only when every index into it is
    a compile-time constant, i.e. when every loop that indexes it is unrolled completely. NVVM
    decides that by a size budget: a loop nest of ~32 ``mma`` is unrolled, one of 64 is not,
    and its arrays go to local memory (the 4-warp tc forward tiles with 64-key blocks did). The
    mark makes the unrolling unconditional for every loop with a constant trip count; a loop
    whose count is known only at run time (the kernel's loop over key tiles) is left as it is.
    A loop's back edge is a branch to a block that appears earlier in its function; Numba lays
    the blocks out in source order."""
    lines, seen, loops = [], set(), 0
    first = 1 + max((int(n) for n in re.findall(r"!(\d+)", llvm_ir)), default=0)
    for line in llvm_ir.splitlines():
        if line.startswith("define "):
            seen = set()
        label = re.match(r'^"?([\w.$-]+)"?:', line)
        if label:
            seen.add(label.group(1))
        elif line.lstrip().startswith("br ") and "!llvm.loop" not in line and any(
                target in seen for target in re.findall(r'label %"?([\w.$-]+)"?', line)):
            line += f", !llvm.loop !{first + 1 + loops}"
            loops += 1
        lines.append(line)
    lines.append(f'!{first} = !{{!"llvm.loop.unroll.full"}}')
    lines += [f"!{n} = distinct !{{!{n}, !{first}}}" for n in range(first + 1, first + 1 + loops)]
    return "\n".join(lines)


def argument_types(signature):
    """The argument types of a ``void(...)`` signature or of a tuple of types."""
    return tuple(getattr(signature, "args", signature))


def kernel_library(pyfunc, signature, cc, options=COMPILE_OPTIONS):
    """Numba's front end for a kernel: ``pyfunc`` for ``signature`` (a ``void(...)`` signature
    or a tuple of argument types) as a code library (LLVM IR that ``get_asm_str`` turns into PTX
    with NVVM and ``get_cufunc`` loads). The same steps as ``cuda.jit`` takes, plus the
    project's two options."""
    from numba.cuda.compiler import compile_cuda, kernel_fixup

    options = dict(options)
    unroll = options.pop("unroll_loops", False)
    fastmath = options.pop("fastmath", False)
    cres = compile_cuda(pyfunc, types.void, argument_types(signature), fastmath=fastmath,
                        nvvm_options={"fastmath": fastmath, "opt": 3}, cc=cc,
                        max_registers=options.pop("max_registers", None) or None, **options)
    library = cres.library
    library._entry_name = cres.fndesc.llvm_func_name
    kernel_fixup(library.get_function(library._entry_name), False)
    if unroll:  # before anything asks for the IR text: the library caches it
        library._llvm_strs = [mark_loops_for_unrolling(ir) for ir in library.llvm_strs]
    return library


class Kernel:
    """A compiled kernel: its code library, its parameter block (from the argument types), and
    the dynamic shared memory it is allowed (raised past the default 48 KiB per device)."""

    def __init__(self, library, argument_types, shared_bytes):
        self.library = library
        self.shared_bytes = shared_bytes
        self.parameters = _ParameterBlock(argument_types)
        self.functions = {}  # device ordinal -> CUfunction handle

    def function(self, device):
        """The kernel's CUfunction on ``device`` (the current one): Numba loads the module into
        the current context on first use; the shared-memory opt-in is per loaded function."""
        handle = self.functions.get(device)
        if handle is None:
            cufunc = self.library.get_cufunc()
            if self.shared_bytes > DEFAULT_SHARED_LIMIT:
                from numba.cuda.cudadrv.driver import binding

                attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                _driver.cuKernelSetAttribute(attr, self.shared_bytes, cufunc.handle,
                                             cufunc.device.id)
            handle = self.functions[device] = cufunc.handle
        return handle


def compile_kernel(pyfunc, signature, shared_bytes, options=COMPILE_OPTIONS):
    """Compile ``pyfunc`` for ``signature`` with ``options`` (COMPILE_OPTIONS, maybe a register
    cap and loop unrolling) and let it use ``shared_bytes`` of dynamic shared memory (Hopper
    allows up to 227 KiB per block; past 48 KiB a kernel must opt in). Under the simulator: a
    simulated kernel."""
    if SIMULATOR:
        return cuda.jit(pyfunc)
    library = kernel_library(pyfunc, signature, device_cc(), options)
    return Kernel(library, argument_types(signature), shared_bytes)


def cdiv(a, b):
    return -(-a // b)


# Kernel parameter codes for struct; an array argument is Numba's array struct flattened into
# 5 + 2 * ndim 64-bit parameters: meminfo, parent, nitems, itemsize, data, shape..., strides...
# (bytes). meminfo and parent are host-side bookkeeping that kernels never read: 0.
_SCALAR_CODES = {types.int32: "i", types.int64: "q", types.float32: "f", types.float64: "d"}


class _ParameterBlock:
    """A compiled kernel's parameters, packed by hand.

    ``cuLaunchKernel`` copies each kernel parameter from host memory the caller points at
    (``kernelParams``: one pointer per parameter). Numba's own launch asks every argument for its
    type and device pointer and builds one ctypes object per parameter, on every call: ~75 us for
    the decode kernel's 14 arguments (58 parameters), which is half the kernel's own time at
    seqlen 4096. Here the layout follows once from the kernel's signature, the pointers are fixed,
    and a launch is one ``struct.pack_into`` of (pointer, shape, strides) from the adapted arrays.
    """

    def __init__(self, argument_types):
        self.types = argument_types
        fmt, offsets, end = "<", [], 0
        for ty in argument_types:
            if isinstance(ty, types.Array):
                codes = "q" * (5 + 2 * ty.ndim)
            elif ty in _SCALAR_CODES:
                codes = _SCALAR_CODES[ty]
            else:
                raise TypeError(f"launch: no parameter packing for argument type {ty}")
            for code in codes:
                size = struct.calcsize(code)
                pad = -end % size  # natural alignment, as the kernel reads it
                fmt += "x" * pad + code
                offsets.append(end + pad)
                end += pad + size
        self.format = struct.Struct(fmt)
        self.buffer = ctypes.create_string_buffer(max(end, 1))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * len(offsets))(*(base + o for o in offsets))
        self.lock = threading.Lock()  # one buffer: packing and launching are one step

    def values(self, args):
        """The parameter values of ``args`` and the device ordinal of their arrays."""
        if len(args) != len(self.types):
            raise TypeError(f"launch: {len(args)} arguments for {len(self.types)} parameters")
        values, device = [], None
        for ty, a in zip(self.types, args):
            if isinstance(ty, types.Array):
                if not isinstance(a, Tensor) or a.device is None or a.ndim != ty.ndim \
                        or a.itemsize * 8 != ty.dtype.bitwidth:
                    raise TypeError(f"launch: expected a device array for {ty}, got {a!r}")
                values += (0, 0, math.prod(a.shape), a.itemsize, a.ptr, *a.shape,
                           *(s * a.itemsize for s in a.strides))
                device = a.device if device is None else device
            else:
                values.append(a)
        return values, device


def launch(kernel, grid, threads, stream, shared_bytes, *args):
    """Launch ``kernel`` (compiled by ``compile_kernel``) on ``stream``. Array arguments are
    ``arrays.Tensor`` records, the others plain numbers in the signature's order. The simulator
    ignores streams and receives the records' views."""
    if SIMULATOR:
        kernel[grid, threads, 0, shared_bytes](*(a.view if isinstance(a, Tensor) else a
                                                  for a in args))
        return
    block = kernel.parameters
    values, device = block.values(args)
    function = kernel.function(device)
    gx, gy, gz = tuple(grid) + (1,) * (3 - len(grid))
    with block.lock:
        block.format.pack_into(block.buffer, 0, *values)
        _driver.cuLaunchKernel(function, gx, gy, gz, threads, 1, 1, shared_bytes, stream.handle,
                               ctypes.addressof(block.pointers), 0)
