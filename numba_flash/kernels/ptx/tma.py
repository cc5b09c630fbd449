"""Hopper's tensor memory accelerator (TMA) and the shared-memory barriers it completes, as
inline PTX (compute capability 9.0).

Why. ``cp.async`` (``memory.py``) moves 16 bytes per thread and instruction: a 64 x 576 cache
tile of the MLA decode is 4608 copies, 18 instructions and their address arithmetic in every one
of 256 threads, all of it competing with the tensor cores' issue slots. A TMA copy is one
instruction from one thread: ``cp.async.bulk.tensor`` reads a whole *box* of a tensor described
by a *tensor map* (a 128-byte descriptor built on the host, ``runtime/tma.py``: base address,
sizes, strides, box shape, swizzle) and writes it to shared memory in the 128-byte swizzle
wgmma reads (``wgmma.py``). Elements of the box outside the tensor's sizes are not read and are
written as zeros, so a box can never read outside the array its map names: a page number past
the cache, or negative, gives a box of zeros.

mbarriers. A TMA copy reports completion to an *mbarrier*, a 64-bit object in shared memory that
counts arrivals and bytes. ``mbarrier_init(bars, i, 1)`` expects one arrival per phase; the
issuing thread arrives with ``expect_tx(bars, i, bytes)`` (the bytes its copies will deliver),
each copy's completion subtracts its bytes, and when both counts reach zero the barrier's phase
flips. ``wait(bars, i, parity)`` blocks until the phase with that parity has completed: a thread
keeps one parity bit per barrier and flips it after each wait. TMA writes through the async
proxy, the proxy wgmma reads through, so data seen through an mbarrier needs no proxy fence
before a wgmma (ordinary stores into it afterwards do: ``sync.proxy_fence``).

Tensor maps live in global memory here (Numba has no 128-byte by-value kernel parameter); a
kernel makes its map visible to the TMA unit with ``tensormap_acquire`` once before its first
copy (``fence.proxy.tensormap::generic.acquire``: the map was written by an ordinary copy).

API (``bars``: a shared uint64 array, one word per barrier; ``tmap``: the map's global uint64
array; ``gmem``, ``rows`` serve only the simulator's emulation, which copies the box from the
array itself):

    mbarrier_init(bars, i, count), mbarrier_init_fence()
    expect_tx(bars, i, nbytes)                      arrive, expecting ``nbytes`` more bytes
    arrive(bars, i)                                 arrive (a consumer freeing a buffer)
    wait(bars, i, parity)                           until the phase of ``parity`` completed
    tensormap_acquire(tmap)
    load_box_4d(smem, offset, tmap, gmem, coords, rows, bars, i)
        the box at ``coords`` (innermost dimension first, 4 int32) -> smem.flat[offset ...],
        completing on barrier i; ``offset`` on a 1024-byte boundary for the 128-byte swizzle.
"""

from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from .codegen import I32, I64, global_addr, is_int, shared_addr, void_asm


def _bar_addr(context, builder, sig, args):
    return shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])


def _is_shared_u64(bars):
    return isinstance(bars, types.Array) and bars.dtype == types.uint64


@intrinsic
def mbarrier_init(typingctx, bars, i, count):
    """``mbarrier.init``: barrier ``i`` expects ``count`` arrivals per phase (phase 0 open)."""
    if not (_is_shared_u64(bars) and is_int(i) and is_int(count)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [I32, I32])
        asm = ir.InlineAsm(fnty, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}",
                           side_effect=True)
        builder.call(asm, [_bar_addr(context, builder, sig, args),
                           context.cast(builder, args[2], sig.args[2], types.uint32)])
        return context.get_dummy_value()

    return types.void(bars, i, count), codegen


@intrinsic
def mbarrier_init_fence(typingctx):
    """Make the initialised barriers visible to the async proxy (TMA) before any copy uses
    them; a ``syncthreads`` after it makes them visible to the other threads."""

    def codegen(context, builder, sig, args):
        void_asm(builder, "fence.mbarrier_init.release.cluster;")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def expect_tx(typingctx, bars, i, nbytes):
    """``mbarrier.arrive.expect_tx``: one arrival on barrier ``i``, which now also waits for
    ``nbytes`` bytes of copies to complete."""
    if not (_is_shared_u64(bars) and is_int(i) and is_int(nbytes)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [I32, I32])
        asm = ir.InlineAsm(fnty, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                           "r,r,~{memory}", side_effect=True)
        builder.call(asm, [_bar_addr(context, builder, sig, args),
                           context.cast(builder, args[2], sig.args[2], types.uint32)])
        return context.get_dummy_value()

    return types.void(bars, i, nbytes), codegen


@intrinsic
def arrive(typingctx, bars, i):
    """``mbarrier.arrive``: one arrival on barrier ``i``, with release semantics: this thread's
    earlier reads of the buffer the barrier guards are done before a waiter refills it."""
    if not (_is_shared_u64(bars) and is_int(i)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [I32])
        asm = ir.InlineAsm(fnty, "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}",
                           side_effect=True)
        builder.call(asm, [_bar_addr(context, builder, sig, args)])
        return context.get_dummy_value()

    return types.void(bars, i), codegen


# The loop's labels are local to the braces, so the statement can be inlined any number of
# times in one kernel.
_WAIT = ("{ .reg .pred done; NF_MBAR_WAIT: "
         "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1; "
         "@!done bra NF_MBAR_WAIT; }")


@intrinsic
def wait(typingctx, bars, i, parity):
    """Spin on ``mbarrier.try_wait.parity`` until barrier ``i`` completed the phase of
    ``parity`` (0 or 1)."""
    if not (_is_shared_u64(bars) and is_int(i) and is_int(parity)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [I32, I32])
        asm = ir.InlineAsm(fnty, _WAIT, "r,r,~{memory}", side_effect=True)
        builder.call(asm, [_bar_addr(context, builder, sig, args),
                           context.cast(builder, args[2], sig.args[2], types.uint32)])
        return context.get_dummy_value()

    return types.void(bars, i, parity), codegen


@intrinsic
def tensormap_acquire(typingctx, tmap):
    """Order the TMA unit's reads of the map after the ordinary writes that filled it."""
    if not (isinstance(tmap, types.Array) and tmap.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        addr = global_addr(context, builder, sig.args[0], args[0], types.intp,
                           context.get_constant(types.intp, 0))
        fnty = ir.FunctionType(ir.VoidType(), [I64])
        asm = ir.InlineAsm(fnty, "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;",
                           "l,~{memory}", side_effect=True)
        builder.call(asm, [addr])
        return context.get_dummy_value()

    return types.void(tmap), codegen


@intrinsic
def _load_box_4d(typingctx, smem, offset, tmap, coords, bars, i):
    if not (isinstance(smem, types.Array) and is_int(offset)
            and isinstance(tmap, types.Array) and tmap.ndim == 1
            and isinstance(coords, types.BaseTuple) and len(coords) == 4
            and all(is_int(c) for c in coords) and _is_shared_u64(bars) and is_int(i)):
        return None

    def codegen(context, builder, sig, args):
        dst = shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        src = global_addr(context, builder, sig.args[2], args[2], types.intp,
                          context.get_constant(types.intp, 0))
        cs = [context.cast(builder, builder.extract_value(args[3], k), sig.args[3][k],
                           types.int32) for k in range(4)]
        bar = shared_addr(context, builder, sig.args[4], args[4], sig.args[5], args[5])
        fnty = ir.FunctionType(ir.VoidType(), [I32, I64] + [I32] * 4 + [I32])
        asm = ir.InlineAsm(
            fnty, "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx"
                  "::bytes [$0], [$1, {$2, $3, $4, $5}], [$6];",
            "r,l,r,r,r,r,r,~{memory}", side_effect=True)
        builder.call(asm, [dst, src] + cs + [bar])
        return context.get_dummy_value()

    return types.void(smem, offset, tmap, coords, bars, i), codegen


@cuda.jit(device=True, inline="always")
def load_box_4d(smem, offset, tmap, gmem, coords, rows, bars, i):
    _load_box_4d(smem, offset, tmap, coords, bars, i)
