"""Moving data between global and shared memory: ``cp.async`` copies, state-space addresses and
16-byte stores, written as inline PTX.

cp.async. ``cp.async.cg.shared.global`` copies 16 bytes from global to shared memory without
passing through registers and without blocking the thread; ``cp.async.commit_group`` closes a
batch of such copies and ``cp.async.wait_group N`` waits until at most ``N`` batches are still in
flight (a ``syncthreads`` must follow before other threads read the data). That is how the
kernels double-buffer K/V tiles: the copy of tile ``j + 1`` runs while tile ``j`` is computed.
The ``zfill`` form takes a source size too: 0 writes 16 zero bytes and reads nothing, which is
how tiles are padded past the end of a sequence without a branch.

Addresses. ``ldmatrix`` and ``cp.async`` take a 32-bit shared-memory address: the generic
pointer to an element of a shared array is cast to address space 3 (shared) and converted to an
integer (``shared_address``). Global addresses are 64-bit (address space 1, ``global_address``).
Every 16-byte row/chunk these instructions touch must be 16-byte aligned, in shared and in
global memory (a misaligned one stops the kernel with ``cudaErrorMisalignedAddress``), so shared
arrays used with them are allocated with ``cuda.shared.array(shape, dtype,
alignment=SHARED_ALIGN)`` and row strides are multiples of 8 16-bit elements.

Stores. Numba stores one element at a time. ``st_global_16`` loads 16 bytes of shared memory
into four registers (``ld.shared.v4.b32``) and writes them with one ``st.global.v4.b32``: a warp
writes 512 bytes in one instruction. The address must be 16-byte aligned (kernels test it with
``global_address``); ``st_global_16_unaligned`` writes the same bytes as eight 16-bit stores.

API (``gmem`` is a global array indexed as usual, an int for 1-D, a tuple otherwise; the 16
bytes run along its last, contiguous, dimension):

    SHARED_ALIGN, CP_ASYNC_BYTES                                 alignment of shared arrays, 16
    shared_address(smem, offset)                                 -> uint32 shared address
    global_address(gmem, index)                                  -> uint64 address of an element
    cp_async_16(smem, offset, gmem, index)                       16-byte global -> shared copy
    cp_async_16_zfill(smem, offset, gmem, index, valid)          same, zeros when not ``valid``
    cp_async_commit(), cp_async_wait(n), cp_async_wait_all()
    st_global_16(address, smem, offset)                          16 bytes shared -> global
    st_global_16_unaligned(address, smem, offset)                same, any 2-byte-aligned address

Numba details. ``alignment=`` must be a compile-time constant: bind the name at module level in
the kernel's module (``SHARED_ALIGN = memory.SHARED_ALIGN``) or in the kernel factory's closure;
``memory.SHARED_ALIGN`` read as a module attribute inside a kernel is typed as a plain int and
refused. Likewise the shape of a shared array must be a constant name, not an expression.
``cp_async_wait(n)`` needs ``n`` to be a constant (a literal or a closure int).
"""

from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from .codegen import I32, I64, global_addr, is_int, shared_addr, valid_index, void_asm
from .layout import CP_ASYNC_BYTES  # noqa: F401  (API)

# Byte alignment for shared arrays read by ldmatrix / written by cp.async.
SHARED_ALIGN = 16


@intrinsic
def shared_address(typingctx, smem, offset):
    """32-bit shared-memory address of element ``offset`` (flat) of shared array ``smem``."""
    if not (isinstance(smem, types.Array) and is_int(offset)):
        return None

    def codegen(context, builder, sig, args):
        return shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])

    return types.uint32(smem, offset), codegen


@intrinsic
def global_address(typingctx, gmem, index):
    """64-bit global address of ``gmem[index]`` (to test its alignment)."""
    if not (isinstance(gmem, types.Array) and valid_index(gmem, index)):
        return None

    def codegen(context, builder, sig, args):
        return global_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])

    return types.uint64(gmem, index), codegen


# ---- cp.async ----------------------------------------------------------------------------------

def _cp_async_types_ok(smem, offset, gmem, index):
    return (isinstance(smem, types.Array) and is_int(offset)
            and isinstance(gmem, types.Array) and valid_index(gmem, index))


@intrinsic
def cp_async_16(typingctx, smem, offset, gmem, index):
    """Copy 16 bytes ``gmem[index...]`` -> ``smem.flat[offset...]`` asynchronously
    (``cp.async.cg.shared.global``; both addresses 16-byte aligned)."""
    if not _cp_async_types_ok(smem, offset, gmem, index):
        return None

    def codegen(context, builder, sig, args):
        dst = shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        src = global_addr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [I32, I64]),
                           "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}",
                           side_effect=True)
        builder.call(asm, [dst, src])
        return context.get_dummy_value()

    return types.void(smem, offset, gmem, index), codegen


def _zfill_copy(context, builder, dst, src, valid, valid_type):
    """``cp.async`` of 16 bytes from global ``src`` to shared ``dst``, or (``valid`` false)
    16 zero bytes: the source size operand is 16 or 0."""
    ok = context.cast(builder, valid, valid_type, types.boolean)
    size = builder.select(ok, ir.Constant(I32, 16), ir.Constant(I32, 0))
    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [I32, I64, I32]),
                       "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                       side_effect=True)
    builder.call(asm, [dst, src, size])


@intrinsic
def cp_async_16_zfill(typingctx, smem, offset, gmem, index, valid):
    """Like ``cp_async_16`` but writes 16 zero bytes (reading nothing) when ``valid`` is
    false; ``gmem[index]`` must still be an address inside the array."""
    if not (_cp_async_types_ok(smem, offset, gmem, index)
            and isinstance(valid, (types.Boolean, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        dst = shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        src = global_addr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
        _zfill_copy(context, builder, dst, src, args[4], sig.args[4])
        return context.get_dummy_value()

    return types.void(smem, offset, gmem, index, valid), codegen


@intrinsic
def cp_async_16_zfill_at(typingctx, smem, offset, address, valid):
    """``cp_async_16_zfill`` from a global ``address`` (from ``global_address`` plus byte
    offsets, 16-byte aligned) instead of an array element: a kernel that finds its rows through
    a table adds two 32 x 32-bit products to a base, where an element index costs 64-bit
    products of every index. ``address`` must lie inside the source array even when ``valid``
    is false."""
    if not (isinstance(smem, types.Array) and is_int(offset) and is_int(address)
            and isinstance(valid, (types.Boolean, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        dst = shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        src = context.cast(builder, args[2], sig.args[2], types.uint64)
        _zfill_copy(context, builder, dst, src, args[3], sig.args[3])
        return context.get_dummy_value()

    return types.void(smem, offset, address, valid), codegen


@intrinsic
def cp_async_commit(typingctx):
    """``cp.async.commit_group``: close the current group of asynchronous copies."""

    def codegen(context, builder, sig, args):
        void_asm(builder, "cp.async.commit_group;")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def cp_async_wait(typingctx, n):
    """``cp.async.wait_group n``: wait until at most ``n`` (a compile-time constant) groups
    of this thread's copies are still in flight."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    count = int(n.literal_value)

    def codegen(context, builder, sig, args):
        void_asm(builder, "cp.async.wait_group {};".format(count))
        return context.get_dummy_value()

    return types.void(n), codegen


@intrinsic
def cp_async_wait_all(typingctx):
    """``cp.async.wait_all``: wait for every copy this thread issued."""

    def codegen(context, builder, sig, args):
        void_asm(builder, "cp.async.wait_all;")
        return context.get_dummy_value()

    return types.void(), codegen


# ---- 16-byte stores ----------------------------------------------------------------------------

def _store16(address, smem, offset, stores):
    """Typing and code of a 16-byte shared -> global store: ``ld.shared.v4.b32`` into four
    registers, then ``stores`` (PTX over them) to the 64-bit global ``address``."""
    if not (isinstance(address, types.Integer) and isinstance(smem, types.Array)
            and is_int(offset)):
        return None

    def codegen(context, builder, sig, args):
        src = shared_addr(context, builder, sig.args[1], args[1], sig.args[2], args[2])
        dst = context.cast(builder, args[0], sig.args[0], types.uint64)
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [I64, I32]),
                           "{ .reg .b32 w<4>; .reg .b16 h<8>; "
                           "ld.shared.v4.b32 {w0, w1, w2, w3}, [$1]; " + stores + " }",
                           "l,r,~{memory}", side_effect=True)
        builder.call(asm, [dst, src])
        return context.get_dummy_value()

    return types.void(address, smem, offset), codegen


@intrinsic
def st_global_16(typingctx, address, smem, offset):
    """Store 16 bytes ``smem.flat[offset...]`` at ``address`` (16-byte aligned, e.g. from
    ``global_address``) in one ``st.global.v4.b32``: a warp writes 512 bytes at once."""
    return _store16(address, smem, offset, "st.global.v4.b32 [$0], {w0, w1, w2, w3};")


@intrinsic
def st_global_16_unaligned(typingctx, address, smem, offset):
    """``st_global_16`` as eight ``st.global.b16``: any 2-byte-aligned ``address`` (a
    misaligned 16-byte store faults)."""
    return _store16(address, smem, offset, " ".join(
        ["mov.b32 {{h{}, h{}}}, w{};".format(2 * i, 2 * i + 1, i) for i in range(4)]
        + ["st.global.b16 [$0+{}], h{};".format(2 * i, i) for i in range(8)]))
