"""Warp-level tensor-core instructions for Numba kernels, written as inline PTX.

Why inline PTX. Numba's CUDA target has no API for the tensor cores' ``mma.sync``, for the
``ldmatrix`` shared-memory load that feeds them, or for the asynchronous copy ``cp.async``. Each
of those is one PTX instruction, so this module hands it to the compiler directly: a Numba
``@intrinsic`` whose code generator emits an LLVM ``InlineAsm`` call holding the PTX text (the
same mechanism numba-cuda uses for its cache-hint loads). The instruction then sits in the
kernel's PTX exactly as written, and its operands stay in registers.

Fragments. A tensor-core ``mma.sync.m16n8k16`` is executed by a whole warp at once: the 32
threads together hold a 16x16 tile of A, a 16x8 tile of B and a 16x8 tile of C/D, each thread a
few elements of each, in a fixed pattern called the *fragment layout*. A thread never sees the
whole tile; it holds its *fragment* in registers, and the instruction exchanges data between the
lanes in hardware. 16-bit elements travel in pairs, two per 32-bit register: the element with
the lower column (A, C) or lower k (B) in the low half. With ``lane`` the thread's index in its
warp, ``g = lane >> 2`` (its *group*, 0..7) and ``t = lane & 3`` (its index in the group, 0..3),
the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type") gives:

    operand     register (low half, high half)          matrix elements
    A 16x16     a[0] = (a0, a1)                          A[g    ][2t], A[g    ][2t+1]
    (row-major) a[1] = (a2, a3)                          A[g + 8][2t], A[g + 8][2t+1]
                a[2] = (a4, a5)                          A[g    ][2t+8], A[g    ][2t+9]
                a[3] = (a6, a7)                          A[g + 8][2t+8], A[g + 8][2t+9]
    B 16x8      b[0] = (b0, b1)                          B[2t    ][g], B[2t + 1][g]
    (k x n)     b[1] = (b2, b3)                          B[2t + 8][g], B[2t + 9][g]
    C/D 16x8    c[0], c[1]  (float32)                    C[g    ][2t], C[g    ][2t+1]
                c[2], c[3]  (float32)                    C[g + 8][2t], C[g + 8][2t+1]

So lane ``lane`` owns rows ``g`` and ``g + 8`` of the accumulator, which is why the online
softmax of the FlashAttention kernels keeps two running maxima per thread and reduces them over
the four lanes of a group (``shfl_xor`` with masks 1 and 2). The accumulator layout is also the
layout of half an A fragment: a 16x16 tile of P computed as two 16x8 accumulators ``s0``
(columns 0-7) and ``s1`` (columns 8-15) is, without leaving the registers, the A operand

    a = (pack(s0[0], s0[1]), pack(s0[2], s0[3]), pack(s1[0], s1[1]), pack(s1[2], s1[3]))

of the next product (O += P V), ``pack`` rounding float32 pairs to 16-bit pairs.

ldmatrix. ``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` loads four 8x8 matrices of 16-bit values
from shared memory straight into fragment layout. Lanes ``8j .. 8j+7`` each give the address of
one 16-byte row of matrix ``j``; lane ``lane`` then receives, in register ``r[j]``, elements
``M_j[g][2t], M_j[g][2t+1]`` (with ``.trans``: ``M_j[2t][g], M_j[2t+1][g]``, the fragment of the
transposed matrix). ``x2`` loads two matrices, addresses from lanes 0-15. Which row of a 16x16
tile each lane points to, as (row, col) from the tile's corner, for the operands of attention:

    operand                       instruction   lane's row, column        registers
    A, row-major [m][k]           x4            ldmatrix_a_rowcol(lane)   a[0..3]
    B = K^T from K [n][k]         x4            ldmatrix_b_rowcol(lane)   (r0, r1) = b of n 0-7,
                                                                          (r2, r3) = b of n 8-15
    B = V from V [k][n]           x4.trans      ldmatrix_a_rowcol(lane)   (r0, r1) = b of n 0-7,
                                                                          (r2, r3) = b of n 8-15

    ldmatrix_a_rowcol(lane) = (lane & 15, (lane >> 4) * 8)
    ldmatrix_b_rowcol(lane) = ((lane >> 4) * 8 + (lane & 7), ((lane >> 3) & 1) * 8)

(an ``x2`` load of one n8 tile of K takes row ``lane & 7``, column ``lane & 8``; of V with
``.trans``, row ``lane & 15``, column 0).

cp.async. ``cp.async.cg.shared.global`` copies 16 bytes from global to shared memory without
passing through registers and without blocking the thread; ``cp.async.commit_group`` closes a
batch of such copies and ``cp.async.wait_group N`` waits until at most ``N`` batches are still in
flight (a ``syncthreads`` must follow before other threads read the data). That is how the
kernels double-buffer K/V tiles: the copy of tile ``j + 1`` runs while tile ``j`` is computed.

Addresses. ``ldmatrix`` and ``cp.async`` take a 32-bit shared-memory address: the generic
pointer to an element of a shared array is cast to address space 3 (shared) and converted to an
integer. Every 16-byte row/chunk they touch must be 16-byte aligned, so shared arrays used with
them are allocated with ``cuda.shared.array(shape, dtype, alignment=SHARED_ALIGN)`` (16 on a GPU;
``None`` under the simulator, which refuses the argument) and row strides are multiples of 8
16-bit elements.

Simulator. Numba's CUDA simulator runs each thread as a Python thread and cannot execute PTX.
Every function here therefore has an emulation in plain Python with the same per-thread result.
The warp-collective ones (``mma_*``, ``ldmatrix_*``) exchange their inputs through a shared
``scratch`` array between two ``syncthreads``; the GPU versions ignore ``scratch`` and ``tid``.
Consequences for callers: every thread of the block must call them together (never inside a
thread-dependent branch; the instructions are warp-collective on a GPU anyway), the block must be
a whole number of warps, and ``tid`` must be the thread's linear index in the block. The choice
between PTX and emulation is made once, at import time, from ``numba.config.ENABLE_CUDASIM``.

Summary of the API (``fmt`` is ``"float16"`` or ``"bfloat16"``; 16-bit data are ``uint16`` bits):

    SHARED_ALIGN, SCRATCH_DTYPE, scratch_size(threads)          allocation helpers
    mma_f16(a, b, c, scratch, tid) / mma_bf16(...) / mma(fmt)   -> (d0, d1, d2, d3) float32
    ldmatrix_x4(smem, offset, scratch, tid)                     -> (r0, r1, r2, r3) uint32
    ldmatrix_x4_trans / ldmatrix_x2 / ldmatrix_x2_trans         (x2 -> (r0, r1))
    ldmatrix_a_rowcol(lane), ldmatrix_b_rowcol(lane)            -> (row, col) for the x4 loads
    shared_address(smem, offset)                                 -> uint32 shared address
    cp_async_16(smem, offset, gmem, index)                       16-byte global -> shared copy
    cp_async_16_zfill(smem, offset, gmem, index, valid)          same, zeros when not ``valid``
    cp_async_commit(), cp_async_wait(n), cp_async_wait_all()
    global_address(gmem, index)                                  -> uint64 address of an element
    st_global_16(address, smem, offset)                          16 bytes shared -> global
    st_global_16_unaligned(address, smem, offset)                same, any 2-byte-aligned address
    pack_f16x2(lo, hi) / pack_bf16x2(lo, hi) / pack(fmt)         two float32 -> uint32
    unpack_f16x2(r) / unpack_bf16x2(r) / unpack(fmt)             uint32 -> (lo, hi) float32
    exp2_approx(x)                                               ex2.approx.ftz.f32
    div_u32(a, b)                                                32-bit a // b (a, b >= 0)
    emulate_mma(a_words, b_words, c, fmt), emulate_ldmatrix(...) NumPy, one whole warp (host)

``smem`` is a C-contiguous shared array of any rank and ``offset`` a flat element offset into it
(``row * row_stride + col``); ``gmem`` is a global array indexed as usual (an int for 1-D, a tuple
otherwise; the 16 bytes run along its last, contiguous, dimension).

Numba details. ``alignment=`` must be a compile-time constant: import the name
(``from numba_flash.kernels.tc.ptx import SHARED_ALIGN``) or bind it in the kernel factory's
closure; ``ptx.SHARED_ALIGN`` read as a module attribute inside a kernel is typed as a plain int
and refused. Likewise the shape of a shared array must be a constant name, not an expression.
``cp_async_wait(n)`` needs ``n`` to be a constant (a literal or a closure int).
"""

import numpy as np
from numba import cuda, types

from numba_flash.kernels.primitives import SIMULATOR

# Byte alignment for shared arrays read by ldmatrix / written by cp.async.
SHARED_ALIGN = None if SIMULATOR else 16

# Element type of the scratch array the warp-collective emulations exchange data through.
SCRATCH_DTYPE = types.uint32
# 32-bit words per thread: an mma exchanges its A (4) and B (2) registers.
SCRATCH_WORDS = 6

# Bytes moved by one cp.async.cg.
CP_ASYNC_BYTES = 16


def scratch_size(threads):
    """Elements of the ``uint32`` scratch array the warp-collective calls need for a block of
    ``threads`` threads: ``6 * threads`` under the simulator, one unused word on a GPU."""
    return SCRATCH_WORDS * threads if SIMULATOR else 1


@cuda.jit(device=True, inline="always")
def ldmatrix_a_rowcol(lane):
    """(row, col) of the 16x16 tile whose 8-element row ``lane`` points to, for an ``x4`` load
    of an A operand from a row-major tile, or (``.trans``) of B operands for two n8 tiles from a
    [k][n] tile such as V."""
    return lane & 15, (lane >> 4) << 3


@cuda.jit(device=True, inline="always")
def ldmatrix_b_rowcol(lane):
    """(row, col) for an ``x4`` load of B operands for two n8 tiles from a [n][k] tile such as K
    (B = K^T): rows n, columns k."""
    return ((lane >> 4) << 3) | (lane & 7), ((lane >> 3) & 1) << 3


# ---- The instructions' semantics in NumPy, one warp at a time --------------------------------
# The simulator's emulations below call these, and the GPU tests compare the real instructions
# against them on the same inputs.

_LANE = np.arange(32)[:, None]
_GROUP, _IN_GROUP = _LANE >> 2, _LANE & 3
_I8 = np.arange(8)[None, :]  # a0..a7
_A_ROW = _GROUP + 8 * ((_I8 >> 1) & 1)  # (32, 8): row of A that lane's a_i holds
_A_COL = 2 * _IN_GROUP + (_I8 & 1) + 8 * (_I8 >> 2)
_I4 = np.arange(4)[None, :]  # b0..b3 and c0..c3
_B_ROW = 2 * _IN_GROUP + (_I4 & 1) + 8 * (_I4 >> 1)  # (32, 4): row (k) of B that b_i holds
_B_COL = _GROUP + 0 * _I4
_C_ROW = _GROUP + 8 * (_I4 >> 1)  # (32, 4): row of C/D that c_i holds
_C_COL = 2 * _IN_GROUP + (_I4 & 1)


def bits_to_f64(bits, fmt):
    """uint16 bit patterns of format ``fmt`` -> float64 values."""
    bits = np.asarray(bits, dtype=np.uint16)
    if fmt == "bfloat16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def _halves(words):
    """(lanes, n) 32-bit registers -> (lanes, 2n) 16-bit values, each low half first."""
    words = np.asarray(words, dtype=np.uint32)
    pairs = np.stack([words & np.uint32(0xFFFF), words >> np.uint32(16)], axis=-1)
    return pairs.reshape(words.shape[0], -1).astype(np.uint16)


def warp_a_tile(a_words, fmt):
    """The 16x16 A tile (float64) held by a warp's A fragments ``a_words (32, 4)``."""
    A = np.zeros((16, 16), np.float64)
    A[_A_ROW, _A_COL] = bits_to_f64(_halves(a_words), fmt)  # a0..a7 of each lane
    return A


def _warp_tiles(a_words, b_words, fmt):
    """The 16x16 A and 16x8 B tiles (float64) held by a warp's A and B fragments."""
    B = np.zeros((16, 8), np.float64)
    B[_B_ROW, _B_COL] = bits_to_f64(_halves(b_words), fmt)  # b0..b3 of each lane
    return warp_a_tile(a_words, fmt), B


def _lane_mma(A, B, c, lane):
    # Products of 16-bit floats are exact in float64 and the 16-term sums nearly so: one rounding
    # to float32 at the end, an ideal float32-accumulating tensor core.
    rows, cols = _C_ROW[lane], _C_COL[lane]
    return tuple(np.float32(np.dot(A[rows[i]], B[:, cols[i]]) + np.float64(c[i]))
                 for i in range(4))


def emulate_mma(a_words, b_words, c, fmt):
    """What ``mma_f16`` / ``mma_bf16`` return for a whole warp: ``a_words (32, 4)`` and
    ``b_words (32, 2)`` uint32 registers, ``c (32, 4)`` float32, row = lane -> ``(32, 4)``."""
    A, B = _warp_tiles(a_words, b_words, fmt)
    return np.array([_lane_mma(A, B, c[lane], lane) for lane in range(32)], np.float32)


def _lane_ldmatrix(flat, offsets, lane, num, trans):
    g, t = lane >> 2, lane & 3
    out = []
    for j in range(num):
        if trans:  # M_j[2t][g], M_j[2t + 1][g]
            lo = flat[int(offsets[8 * j + 2 * t]) + g]
            hi = flat[int(offsets[8 * j + 2 * t + 1]) + g]
        else:  # M_j[g][2t], M_j[g][2t + 1]
            start = int(offsets[8 * j + g]) + 2 * t
            lo, hi = flat[start], flat[start + 1]
        out.append(np.uint32(int(lo) | (int(hi) << 16)))
    return tuple(out)


def emulate_ldmatrix(flat, offsets, num, trans):
    """What ``ldmatrix_x{num}[_trans]`` returns for a whole warp reading the 16-bit array
    ``flat`` when lane ``i`` passes ``offsets[i]`` -> ``(32, num)`` uint32."""
    return np.array([_lane_ldmatrix(flat, offsets, lane, num, trans) for lane in range(32)],
                    np.uint32)


if SIMULATOR:
    import ctypes
    import math

    from numba_flash.kernels.primitives import bf16_to_f32 as _bf16_to_f32
    from numba_flash.kernels.primitives import f16_to_f32 as _f16_to_f32
    from numba_flash.kernels.primitives import f32_to_bf16 as _f32_to_bf16
    from numba_flash.kernels.primitives import f32_to_f16 as _f32_to_f16

    # Each emulation: barrier (everyone has finished reading the scratch of the previous call),
    # publish this thread's registers, barrier, compute this lane's result from the warp's.

    def _make_mma(fmt):
        @cuda.jit(device=True)
        def mma(a, b, c, scratch, tid):
            cuda.syncthreads()
            row = SCRATCH_WORDS * tid
            for i in range(4):
                scratch[row + i] = np.uint32(int(a[i]) & 0xFFFFFFFF)
            scratch[row + 4] = np.uint32(int(b[0]) & 0xFFFFFFFF)
            scratch[row + 5] = np.uint32(int(b[1]) & 0xFFFFFFFF)
            cuda.syncthreads()
            lane = tid & 31
            base = tid - lane
            words = np.array(scratch[SCRATCH_WORDS * base:SCRATCH_WORDS * (base + 32)],
                             dtype=np.uint32).reshape(32, SCRATCH_WORDS)
            A, B = _warp_tiles(words[:, :4], words[:, 4:], fmt)
            return _lane_mma(A, B, c, lane)

        return mma

    def _make_ldmatrix(num, trans):
        @cuda.jit(device=True)
        def ldmatrix(smem, offset, scratch, tid):
            cuda.syncthreads()
            scratch[SCRATCH_WORDS * tid] = np.uint32(offset)
            cuda.syncthreads()
            lane = tid & 31
            base = tid - lane
            offsets = scratch[SCRATCH_WORDS * base:SCRATCH_WORDS * (base + 32):SCRATCH_WORDS]
            return _lane_ldmatrix(smem.reshape(-1), offsets, lane, num, trans)

        return ldmatrix

    @cuda.jit(device=True)
    def shared_address(smem, offset):
        """The simulator has no shared address space: the element's byte offset in its array
        stands in for it."""
        return np.uint32(int(offset) * smem.itemsize)

    def _copy16(smem, offset, gmem, index, valid):
        if not smem.flags.c_contiguous:
            raise ValueError("cp.async destination must be a C-contiguous shared array")
        flat = smem.reshape(-1)
        n = CP_ASYNC_BYTES // flat.itemsize
        offset = int(offset)
        if isinstance(index, tuple):
            head, last = tuple(index[:-1]), int(index[-1])
            for j in range(n):
                flat[offset + j] = gmem[head + (last + j,)] if valid else 0
        else:
            for j in range(n):
                flat[offset + j] = gmem[int(index) + j] if valid else 0

    @cuda.jit(device=True)
    def cp_async_16(smem, offset, gmem, index):
        """Copy 16 bytes ``gmem[index...]`` -> ``smem.flat[offset...]`` (emulated: at once)."""
        _copy16(smem, offset, gmem, index, True)

    @cuda.jit(device=True)
    def cp_async_16_zfill(smem, offset, gmem, index, valid):
        """Like ``cp_async_16``; writes 16 zero bytes instead when ``valid`` is false."""
        _copy16(smem, offset, gmem, index, valid)

    @cuda.jit(device=True)
    def cp_async_commit():
        """Close the current group of copies (nothing to do: emulated copies are immediate)."""
        return None

    @cuda.jit(device=True)
    def cp_async_wait(n):
        """Wait until at most ``n`` groups are in flight (nothing to do under the simulator)."""
        return None

    @cuda.jit(device=True)
    def cp_async_wait_all():
        """Wait for every copy issued so far (nothing to do under the simulator)."""
        return None

    def _store16(address, smem, offset):
        """Simulated global memory is host memory, and ``global_address`` gives its real
        addresses: the store is a plain copy of 16 bytes to that address."""
        flat = smem.reshape(-1)
        n = CP_ASYNC_BYTES // flat.itemsize
        chunk = np.ascontiguousarray(flat[int(offset):int(offset) + n])
        ctypes.memmove(int(address), chunk.ctypes.data, CP_ASYNC_BYTES)

    @cuda.jit(device=True)
    def st_global_16(address, smem, offset):
        """Store the 16 bytes ``smem.flat[offset...]`` at global ``address``."""
        _store16(address, smem, offset)

    @cuda.jit(device=True)
    def st_global_16_unaligned(address, smem, offset):
        """Like ``st_global_16`` (alignment only matters on a GPU)."""
        _store16(address, smem, offset)

    @cuda.jit(device=True)
    def global_address(gmem, index):
        """The element's real host address: its alignment is what the GPU's would be."""
        base = gmem.__array_interface__["data"][0]
        return np.uint64(base + sum(int(i) * s for i, s in zip(index, gmem.strides)))

    @cuda.jit(device=True)
    def pack_f16x2(lo, hi):
        """Round two float32 to float16 (nearest even) and pack them: ``lo`` in bits 0-15."""
        return np.uint32(int(_f32_to_f16(lo)) | (int(_f32_to_f16(hi)) << 16))

    @cuda.jit(device=True)
    def pack_bf16x2(lo, hi):
        """Round two float32 to bfloat16 (nearest even) and pack them: ``lo`` in bits 0-15."""
        return np.uint32(int(_f32_to_bf16(lo)) | (int(_f32_to_bf16(hi)) << 16))

    @cuda.jit(device=True)
    def unpack_f16x2(r):
        """The two float16 of a packed register as float32: (bits 0-15, bits 16-31)."""
        r = int(r)
        return _f16_to_f32(np.uint16(r & 0xFFFF)), _f16_to_f32(np.uint16(r >> 16))

    @cuda.jit(device=True)
    def unpack_bf16x2(r):
        """The two bfloat16 of a packed register as float32: (bits 0-15, bits 16-31)."""
        r = int(r)
        return _bf16_to_f32(np.uint16(r & 0xFFFF)), _bf16_to_f32(np.uint16(r >> 16))

    @cuda.jit(device=True)
    def exp2_approx(x):
        """2**x in float32 (correctly rounded here; ``ex2.approx.ftz.f32`` on a GPU)."""
        with np.errstate(over="ignore", under="ignore"):
            y = np.float32(np.exp2(np.float32(x)))
        if math.isfinite(y) and abs(y) < np.float32(1.1754944e-38):
            y = np.float32(0.0)  # .ftz: subnormal results flush to zero
        return y

    @cuda.jit(device=True)
    def div_u32(a, b):
        """``a // b`` of two non-negative 32-bit integers."""
        return np.uint32(int(a) // int(b))

else:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    _I16 = ir.IntType(16)
    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)
    _F32 = ir.FloatType()
    _ADDRSPACE_GLOBAL = 1
    _ADDRSPACE_SHARED = 3

    def _is_int(ty):
        return isinstance(ty, types.Integer)

    def _int_tuple(ty, count):
        return isinstance(ty, types.BaseTuple) and len(ty) == count and all(
            isinstance(e, types.Integer) for e in ty)

    def _float_tuple(ty, count):
        return isinstance(ty, types.BaseTuple) and len(ty) == count and all(
            isinstance(e, (types.Float, types.Integer)) for e in ty)

    def _tuple_items(context, builder, tupty, tup, target):
        """The members of a tuple value, each cast to the Numba type ``target``."""
        return [context.cast(builder, builder.extract_value(tup, i), tupty[i], target)
                for i in range(len(tupty))]

    def _shared_addr(context, builder, aryty, ary, offty, offset):
        """32-bit shared-state-space address of element ``offset`` (flat) of a shared array:
        the array's base pointer cast to address space 3 as an integer, plus the offset in
        bytes, all in 32-bit arithmetic (shared addresses fit in 32 bits)."""
        data = context.make_array(aryty)(context, builder, value=ary).data
        sptr = builder.addrspacecast(data, ir.PointerType(data.type.pointee, _ADDRSPACE_SHARED))
        base = builder.ptrtoint(sptr, _I32)
        off = context.cast(builder, offset, offty, types.int64)
        nbytes = builder.mul(builder.trunc(off, _I32),
                             ir.Constant(_I32, context.get_abi_sizeof(data.type.pointee)))
        return builder.add(base, nbytes)

    def _global_addr(context, builder, aryty, ary, indty, index):
        """64-bit global-state-space address of ``ary[index]``."""
        if isinstance(indty, types.Integer):
            indty, indices = types.UniTuple(indty, 1), [index]
        else:
            indices = [builder.extract_value(index, i) for i in range(len(indty))]
        indices = [context.cast(builder, i, t, types.intp) for t, i in zip(indty, indices)]
        arr = context.make_array(aryty)(context, builder, value=ary)
        ptr = cgutils.get_item_pointer(context, builder, aryty, arr, indices, wraparound=False)
        gptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, _ADDRSPACE_GLOBAL))
        return builder.ptrtoint(gptr, _I64)

    def _valid_index(aryty, indty):
        if isinstance(indty, types.Integer):
            return aryty.ndim == 1
        return (isinstance(indty, types.BaseTuple) and len(indty) == aryty.ndim
                and all(isinstance(e, types.Integer) for e in indty))

    # ---- mma.sync ------------------------------------------------------------------------

    def _make_mma(fmt):
        ptx = ("mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 "
               "{{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}};"
               ).format({"float16": "f16", "bfloat16": "bf16"}[fmt])
        fnty = ir.FunctionType(ir.LiteralStructType([_F32] * 4), [_I32] * 6 + [_F32] * 4)
        constraints = "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4)

        @intrinsic
        def mma_asm(typingctx, a, b, c):
            if not (_int_tuple(a, 4) and _int_tuple(b, 2) and _float_tuple(c, 4)):
                return None
            retty = types.UniTuple(types.float32, 4)

            def codegen(context, builder, sig, args):
                operands = (_tuple_items(context, builder, sig.args[0], args[0], types.uint32)
                            + _tuple_items(context, builder, sig.args[1], args[1], types.uint32)
                            + _tuple_items(context, builder, sig.args[2], args[2], types.float32))
                asm = ir.InlineAsm(fnty, ptx, constraints, side_effect=True)
                out = builder.call(asm, operands)
                return context.make_tuple(builder, retty,
                                          [builder.extract_value(out, i) for i in range(4)])

            return retty(a, b, c), codegen

        @cuda.jit(device=True, inline="always")
        def mma(a, b, c, scratch, tid):
            return mma_asm(a, b, c)

        return mma

    # ---- ldmatrix ------------------------------------------------------------------------

    def _make_ldmatrix(num, trans):
        outs = ", ".join("${}".format(i) for i in range(num))
        ptx = "ldmatrix.sync.aligned.m8n8.x{0}{1}.shared.b16 {{{2}}}, [${0}];".format(
            num, ".trans" if trans else "", outs)
        fnty = ir.FunctionType(ir.LiteralStructType([_I32] * num), [_I32])
        constraints = ",".join(["=r"] * num) + ",r,~{memory}"

        @intrinsic
        def ldmatrix_asm(typingctx, smem, offset):
            if not (isinstance(smem, types.Array) and smem.dtype.bitwidth == 16
                    and _is_int(offset)):
                return None
            retty = types.UniTuple(types.uint32, num)

            def codegen(context, builder, sig, args):
                addr = _shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                asm = ir.InlineAsm(fnty, ptx, constraints, side_effect=True)
                out = builder.call(asm, [addr])
                return context.make_tuple(builder, retty,
                                          [builder.extract_value(out, i) for i in range(num)])

            return retty(smem, offset), codegen

        @cuda.jit(device=True, inline="always")
        def ldmatrix(smem, offset, scratch, tid):
            return ldmatrix_asm(smem, offset)

        return ldmatrix

    @intrinsic
    def shared_address(typingctx, smem, offset):
        """32-bit shared-memory address of element ``offset`` (flat) of shared array ``smem``."""
        if not (isinstance(smem, types.Array) and _is_int(offset)):
            return None

        def codegen(context, builder, sig, args):
            return _shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])

        return types.uint32(smem, offset), codegen

    # ---- cp.async ------------------------------------------------------------------------

    def _cp_async_types_ok(smem, offset, gmem, index):
        return (isinstance(smem, types.Array) and _is_int(offset)
                and isinstance(gmem, types.Array) and _valid_index(gmem, index))

    @intrinsic
    def cp_async_16(typingctx, smem, offset, gmem, index):
        """Copy 16 bytes ``gmem[index...]`` -> ``smem.flat[offset...]`` asynchronously
        (``cp.async.cg.shared.global``; both addresses 16-byte aligned)."""
        if not _cp_async_types_ok(smem, offset, gmem, index):
            return None

        def codegen(context, builder, sig, args):
            dst = _shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            src = _global_addr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32, _I64]),
                               "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}",
                               side_effect=True)
            builder.call(asm, [dst, src])
            return context.get_dummy_value()

        return types.void(smem, offset, gmem, index), codegen

    @intrinsic
    def cp_async_16_zfill(typingctx, smem, offset, gmem, index, valid):
        """Like ``cp_async_16`` but writes 16 zero bytes (reading nothing) when ``valid`` is
        false; ``gmem[index]`` must still be an address inside the array."""
        if not (_cp_async_types_ok(smem, offset, gmem, index)
                and isinstance(valid, (types.Boolean, types.Integer))):
            return None

        def codegen(context, builder, sig, args):
            dst = _shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            src = _global_addr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            ok = context.cast(builder, args[4], sig.args[4], types.boolean)
            size = builder.select(ok, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32, _I64, _I32]),
                               "cp.async.cg.shared.global [$0], [$1], 16, $2;",
                               "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [dst, src, size])
            return context.get_dummy_value()

        return types.void(smem, offset, gmem, index, valid), codegen

    def _void_asm(builder, text):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                           side_effect=True)
        builder.call(asm, [])

    def _store16(address, smem, offset, stores):
        """Typing and code of a 16-byte shared -> global store: ``ld.shared.v4.b32`` into four
        registers, then ``stores`` (PTX over them) to the 64-bit global ``address``."""
        if not (isinstance(address, types.Integer) and isinstance(smem, types.Array)
                and _is_int(offset)):
            return None

        def codegen(context, builder, sig, args):
            src = _shared_addr(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            dst = context.cast(builder, args[0], sig.args[0], types.uint64)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64, _I32]),
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

    @intrinsic
    def global_address(typingctx, gmem, index):
        """64-bit global address of ``gmem[index]`` (to test its alignment)."""
        if not (isinstance(gmem, types.Array) and _valid_index(gmem, index)):
            return None

        def codegen(context, builder, sig, args):
            return _global_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])

        return types.uint64(gmem, index), codegen

    @intrinsic
    def cp_async_commit(typingctx):
        """``cp.async.commit_group``: close the current group of asynchronous copies."""

        def codegen(context, builder, sig, args):
            _void_asm(builder, "cp.async.commit_group;")
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
            _void_asm(builder, "cp.async.wait_group {};".format(count))
            return context.get_dummy_value()

        return types.void(n), codegen

    @intrinsic
    def cp_async_wait_all(typingctx):
        """``cp.async.wait_all``: wait for every copy this thread issued."""

        def codegen(context, builder, sig, args):
            _void_asm(builder, "cp.async.wait_all;")
            return context.get_dummy_value()

        return types.void(), codegen

    # ---- conversions ---------------------------------------------------------------------

    def _make_pack(instruction):
        @intrinsic
        def pack_asm(typingctx, lo, hi):
            if not (isinstance(lo, (types.Float, types.Integer))
                    and isinstance(hi, (types.Float, types.Integer))):
                return None

            def codegen(context, builder, sig, args):
                lo32 = context.cast(builder, args[0], sig.args[0], types.float32)
                hi32 = context.cast(builder, args[1], sig.args[1], types.float32)
                # The first source goes to the upper half of the destination.
                asm = ir.InlineAsm(ir.FunctionType(_I32, [_F32, _F32]),
                                   instruction + " $0, $1, $2;", "=r,f,f")
                return builder.call(asm, [hi32, lo32])

            return types.uint32(lo, hi), codegen

        return pack_asm

    pack_f16x2 = _make_pack("cvt.rn.f16x2.f32")
    pack_f16x2.__doc__ = ("Round two float32 to float16 (nearest even) and pack them into one "
                          "uint32, ``lo`` in bits 0-15 (``cvt.rn.f16x2.f32``).")
    pack_bf16x2 = _make_pack("cvt.rn.bf16x2.f32")
    pack_bf16x2.__doc__ = ("Round two float32 to bfloat16 (nearest even) and pack them into one "
                           "uint32, ``lo`` in bits 0-15 (``cvt.rn.bf16x2.f32``).")

    @intrinsic
    def _f16_pair_to_f32(typingctx, r):
        if not _is_int(r):
            return None
        retty = types.UniTuple(types.float32, 2)

        def codegen(context, builder, sig, args):
            word = context.cast(builder, args[0], sig.args[0], types.uint32)
            halves = [builder.trunc(word, _I16),
                      builder.trunc(builder.lshr(word, ir.Constant(_I32, 16)), _I16)]
            return context.make_tuple(builder, retty, [
                builder.fpext(builder.bitcast(h, ir.HalfType()), _F32) for h in halves])

        return retty(r), codegen

    @cuda.jit(device=True, inline="always")
    def unpack_f16x2(r):
        """The two float16 of a packed register as float32: (bits 0-15, bits 16-31)."""
        return _f16_pair_to_f32(r)

    @intrinsic
    def _bf16_pair_to_f32(typingctx, r):
        if not _is_int(r):
            return None
        retty = types.UniTuple(types.float32, 2)

        def codegen(context, builder, sig, args):
            word = context.cast(builder, args[0], sig.args[0], types.uint32)
            lo = builder.shl(word, ir.Constant(_I32, 16))
            hi = builder.and_(word, ir.Constant(_I32, 0xFFFF0000))
            return context.make_tuple(builder, retty,
                                      [builder.bitcast(lo, _F32), builder.bitcast(hi, _F32)])

        return retty(r), codegen

    @cuda.jit(device=True, inline="always")
    def unpack_bf16x2(r):
        """The two bfloat16 of a packed register as float32: (bits 0-15, bits 16-31)."""
        return _bf16_pair_to_f32(r)

    @intrinsic
    def exp2_approx(typingctx, x):
        """2**x in float32 with ``ex2.approx.ftz.f32`` (max 2 ulp error, subnormals -> 0)."""
        if not isinstance(x, (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            x32 = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(_F32, [_F32]), "ex2.approx.ftz.f32 $0, $1;",
                               "=f,f")
            return builder.call(asm, [x32])

        return types.float32(x), codegen

    @intrinsic
    def div_u32(typingctx, a, b):
        """``a // b`` of two non-negative 32-bit integers with ``div.u32``. Numba divides in 64
        bits, which ptxas turns into a call to a subroutine; a kernel with a call in it gets its
        wgmma serialized (ptxas warning C7509)."""
        if not (_is_int(a) and _is_int(b)):
            return None

        def codegen(context, builder, sig, args):
            a32 = context.cast(builder, args[0], sig.args[0], types.uint32)
            b32 = context.cast(builder, args[1], sig.args[1], types.uint32)
            return builder.udiv(a32, b32)

        return types.uint32(a, b), codegen


# The warp-level instructions, each a device function with the same arguments on a GPU and under
# the simulator (``scratch`` and ``tid`` serve only the emulations):
#   mma_f16 / mma_bf16 (a, b, c, scratch, tid) -> d: D = A @ B + C for one m16n8k16 tile,
#       float16 / bfloat16 inputs, float32 accumulate (``mma.sync.aligned.m16n8k16.row.col``);
#   ldmatrix_x4[_trans] (smem, offset, scratch, tid) -> 4 registers: four 8x8 matrices from
#       shared memory in fragment layout, ``_trans`` each transposed; ldmatrix_x2[_trans] -> 2
#       registers: two matrices, rows from lanes 0-15 (``ldmatrix.sync.aligned.m8n8``).
mma_f16 = _make_mma("float16")
mma_bf16 = _make_mma("bfloat16")
ldmatrix_x4 = _make_ldmatrix(4, False)
ldmatrix_x4_trans = _make_ldmatrix(4, True)
ldmatrix_x2 = _make_ldmatrix(2, False)
ldmatrix_x2_trans = _make_ldmatrix(2, True)


def mma(fmt):
    """The mma device function for storage format ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": mma_f16, "bfloat16": mma_bf16}[fmt]


def pack(fmt):
    """The float32-pair packing device function for ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": pack_f16x2, "bfloat16": pack_bf16x2}[fmt]


def unpack(fmt):
    """The packed-pair -> two float32 device function for ``fmt``."""
    return {"float16": unpack_f16x2, "bfloat16": unpack_bf16x2}[fmt]
