"""Exchanges and orderings between threads that are not one instruction family's own: the warp
shuffle, the shared-memory proxy fence, named barriers and the grid dependency controls.
(wgmma's fences are in ``wgmma``, cp.async's waits in ``memory``.)

Shuffles. ``shfl.sync.bfly.b32`` lets the lanes of a warp swap registers without shared memory:
lane ``i`` receives the value of lane ``i ^ lane_mask``. The ``.sync`` form also makes the lanes
of its member mask (here the whole warp) converge before they exchange, which is why it lives
with the synchronization: the online softmax reduces the row maxima and sums of a group of four
lanes with masks 1 and 2. Numba has the instruction (``cuda.shfl_xor_sync``); the wrapper gives
it the signature of its emulation, whose simulator has no warp shuffles and exchanges through a
shared ``scratch`` array between two barriers of the caller's warp instead (so every thread of a
warp makes the call together, as the instruction requires; other warps may run other code).

Proxies. Ordinary stores and ``cp.async`` write shared memory through the *generic proxy*;
wgmma reads its operands through the *async proxy*, which does not see those writes in order
by itself. ``fence.proxy.async.shared::cta`` makes this thread's earlier shared-memory writes
visible to later async-proxy reads; the kernels wait for their copies, fence, then
``syncthreads`` so every thread's writes are covered before any warp issues a wgmma.

Named barriers. ``bar.sync id, n`` and ``bar.arrive id, n`` use one of the 16 hardware
barriers of a CTA (``syncthreads`` is ``bar.sync 0``) for ``n`` threads only: the barrier
completes when n threads have arrived, and ``arrive`` does not wait for that. Two warpgroups
hand work to each other this way: the producer arrives once its shared-memory writes are done,
the consumer syncs before it reads them, and the rest of the CTA never waits. A barrier orders
the generic proxy only (``proxy_fence`` first, where a wgmma reads what was written).

Grid dependencies (sm_90+). A kernel launched on a stream normally starts only once the kernel
before it has finished and its writes are flushed. Launched as a *programmatic dependent*
(``launcher.launch(..., dependent=True)``), it may start earlier: as soon as every CTA of the
kernel before it has executed ``griddepcontrol.launch_dependents`` or exited. Its CTAs then
run ``griddepcontrol.wait`` before they read anything that kernel wrote; the wait returns once
that kernel has completed and its memory is visible. Work that does not depend on it (reading
inputs written earlier still, deciding that there is nothing to do) runs before the wait, and
the dependent's launch and first instructions overlap the other kernel's run. Both
instructions are no-ops for a kernel launched the ordinary way.

API:

    shfl_xor(value, lane_mask, scratch, tid)    the value of lane ``lane ^ lane_mask``
    scratch_size(threads)                       float32 elements of shfl_xor's scratch: 1 here
    proxy_fence()                               fence.proxy.async.shared::cta
    warp_uniform(value)                         lane 0's value, known to ptxas as warp-uniform
    warp_any(pred, scratch, tid)                whether ``pred`` holds in any lane (warp-uniform)
    syncwarp(tid)                               __syncwarp(): the warp's lanes meet
    named_sync(barrier, count, tid)             bar.sync barrier, count (constant ids 1..15)
    named_arrive(barrier, count, tid)           bar.arrive barrier, count
    launch_dependents()                         griddepcontrol.launch_dependents (sm_90+)
    wait_prior_grid()                           griddepcontrol.wait (sm_90+)
    regs_increase(n), regs_decrease(n)          setmaxnreg.inc / .dec (sm_90a), n constant

Register reallocation (sm_90a). A CTA is launched with one register count per thread, the
kernel's. ``setmaxnreg.dec.sync.aligned.u32 n`` hands a warpgroup's registers above ``n`` back
to the SM's pool and ``setmaxnreg.inc.sync.aligned.u32 n`` takes registers from it up to ``n``
(blocking until the pool has them); ptxas allocates the code after each at the new count. A
warp-specialized kernel launched at 168 per thread (384 threads) lets its producer warpgroup,
which only issues copies, drop to 24 so the two consumer warpgroups can each rise to 240: the
same 64K registers, spent where the tensor-core accumulators are. Every warp of the warpgroup
executes the instruction together; ``n`` is a multiple of 8 in 24 .. 256, a constant.
"""

from llvmlite import ir
from numba import cuda, int32, types
from numba.cuda.extending import intrinsic

from .codegen import I32, is_int, statement, void_asm


def scratch_size(threads):
    """Elements of the float32 scratch array ``shfl_xor`` takes: a single unused word on a GPU
    (shuffles need no memory; the emulation needs one per thread)."""
    return 1


@cuda.jit(device=True, inline="always")
def shfl_xor(value, lane_mask, scratch, tid):
    return cuda.shfl_xor_sync(0xFFFFFFFF, value, lane_mask)


@cuda.jit(device=True, inline="always")
def warp_uniform(value):
    """``value`` of lane 0, broadcast by ``shfl.sync.idx``: the same number, but ptxas now knows
    every lane of the warp holds it. A branch on a warpgroup's index computed this way is not
    divergent to ptxas, which otherwise serializes the wgmma inside it (C7519)."""
    return cuda.shfl_sync(0xFFFFFFFF, value, 0)


@cuda.jit(device=True, inline="always")
def syncwarp(tid):
    """``bar.warp.sync``: every lane of the warp has reached this point (``tid`` is the
    emulation's, whose threads run apart). Before one lane signals for its warp, e.g. that
    the warp's part of a wgmma is complete."""
    cuda.syncwarp()


@cuda.jit(device=True, inline="always")
def warp_any(pred, scratch, tid):
    """Whether ``pred`` holds in any lane of the warp (``vote.sync.any``), made ``warp_uniform``:
    a branch on it may hold a warp-aligned instruction, such as a ``wgmma.wait_group`` that only
    the warps with work for it execute. ``scratch`` (shfl_xor's) and ``tid`` are the
    emulation's."""
    return warp_uniform(int32(cuda.any_sync(0xFFFFFFFF, pred))) != 0


proxy_fence = statement("fence.proxy.async.shared::cta;", """Make this thread's shared-memory
writes visible to wgmma reads (``fence.proxy.async.shared::cta``).""")


def _named_barrier(op):
    @intrinsic
    def named(typingctx, barrier, count, tid):
        if not (is_int(barrier) and is_int(count) and is_int(tid)):
            return None

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.VoidType(), [I32, I32])
            asm = ir.InlineAsm(fnty, f"{op} $0, $1;", "r,r,~{memory}", side_effect=True)
            builder.call(asm, [context.cast(builder, args[i], sig.args[i], types.int32)
                               for i in range(2)])
            return context.get_dummy_value()

        return types.void(barrier, count, tid), codegen

    return named


named_sync = _named_barrier("bar.sync")
named_sync.__doc__ = """``bar.sync barrier, count``: arrive, and wait until ``count`` threads (a
multiple of 32, whole warps) have arrived on ``barrier`` (1..15). ``tid`` is the emulation's."""
named_arrive = _named_barrier("bar.arrive")
named_arrive.__doc__ = """``bar.arrive barrier, count``: arrive on ``barrier`` without waiting."""

def _setmaxnreg(op):
    @intrinsic
    def setmaxnreg(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            return None
        count = n.literal_value
        if count % 8 or not 24 <= count <= 256:
            raise ValueError(f"setmaxnreg: {count} registers (a multiple of 8 in 24 .. 256)")

        def codegen(context, builder, sig, args):
            void_asm(builder, f"setmaxnreg.{op}.sync.aligned.u32 {count};")
            return context.get_dummy_value()

        return types.void(n), codegen

    return setmaxnreg


regs_increase = _setmaxnreg("inc")
regs_increase.__doc__ = """``setmaxnreg.inc``: this warpgroup's registers rise to ``n`` per
thread (a constant; "Register reallocation")."""
regs_decrease = _setmaxnreg("dec")
regs_decrease.__doc__ = """``setmaxnreg.dec``: this warpgroup's registers fall to ``n`` per
thread, back to the SM's pool (a constant; "Register reallocation")."""

launch_dependents = statement("griddepcontrol.launch_dependents;", """\
``griddepcontrol.launch_dependents``: this CTA no longer holds back the launch of a
programmatic dependent (sm_90+).""")
wait_prior_grid = statement("griddepcontrol.wait;", """``griddepcontrol.wait``: wait until
the kernel this one depends on programmatically has completed and its writes are visible
(sm_90+).""")
