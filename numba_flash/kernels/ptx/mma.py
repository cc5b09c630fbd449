"""Ampere's warp-level tensor-core instructions, ``mma.sync`` and the ``ldmatrix`` load that
feeds it, written as inline PTX.

Why inline PTX. Numba's CUDA target has no API for the tensor cores' ``mma.sync`` or for the
``ldmatrix`` shared-memory load. Each is one PTX instruction, so this module hands it to the
compiler directly: a Numba ``@intrinsic`` whose code generator emits an LLVM ``InlineAsm`` call
holding the PTX text (the same mechanism numba-cuda uses for its cache-hint loads). The
instruction then sits in the kernel's PTX exactly as written, and its operands stay in registers.

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

of the next product (O += P V), ``pack`` (``convert.pack``) rounding float32 pairs to 16-bit
pairs.

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
``.trans``, row ``lane & 15``, column 0). Every row address must be 16-byte aligned: see
``memory`` for ``SHARED_ALIGN`` and the shared-address conversion ldmatrix shares with cp.async.

API (``fmt`` is ``"float16"`` or ``"bfloat16"``; 16-bit data are ``uint16`` bits; ``scratch``
and ``tid`` serve only the simulator's emulation, which exchanges the warp's registers through
``scratch`` behind a warp barrier, so every thread of a warp calls these together):

    SCRATCH_DTYPE, scratch_size(threads)                         the scratch array: 1 word here
    mma_f16(a, b, c, scratch, tid) / mma_bf16(...) / mma(fmt)   -> (d0, d1, d2, d3) float32
    ldmatrix_x4(smem, offset, scratch, tid)                     -> (r0, r1, r2, r3) uint32
    ldmatrix_x4_trans / ldmatrix_x2 / ldmatrix_x2_trans         (x2 -> (r0, r1))
    ldmatrix_a_rowcol(lane), ldmatrix_b_rowcol(lane)            -> (row, col) for the x4 loads

``smem`` is a C-contiguous shared array of any rank and ``offset`` a flat element offset into it
(``row * row_stride + col``).
"""

from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from .codegen import F32, I32, float_tuple, int_tuple, is_int, shared_addr, tuple_items
from .layout import SCRATCH_DTYPE, ldmatrix_a_rowcol, ldmatrix_b_rowcol  # noqa: F401  (API)


def scratch_size(threads):
    """Elements of the ``uint32`` scratch array the warp-collective calls take: one unused word
    on a GPU (the emulations need ``6 * threads``)."""
    return 1


# ---- mma.sync ----------------------------------------------------------------------------------

def _make_mma(fmt):
    ptx = ("mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 "
           "{{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}};"
           ).format({"float16": "f16", "bfloat16": "bf16"}[fmt])
    fnty = ir.FunctionType(ir.LiteralStructType([F32] * 4), [I32] * 6 + [F32] * 4)
    constraints = "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4)

    @intrinsic
    def mma_asm(typingctx, a, b, c):
        if not (int_tuple(a, 4) and int_tuple(b, 2) and float_tuple(c, 4)):
            return None
        retty = types.UniTuple(types.float32, 4)

        def codegen(context, builder, sig, args):
            operands = (tuple_items(context, builder, sig.args[0], args[0], types.uint32)
                        + tuple_items(context, builder, sig.args[1], args[1], types.uint32)
                        + tuple_items(context, builder, sig.args[2], args[2], types.float32))
            asm = ir.InlineAsm(fnty, ptx, constraints, side_effect=True)
            out = builder.call(asm, operands)
            return context.make_tuple(builder, retty,
                                      [builder.extract_value(out, i) for i in range(4)])

        return retty(a, b, c), codegen

    @cuda.jit(device=True, inline="always")
    def mma(a, b, c, scratch, tid):
        return mma_asm(a, b, c)

    return mma


# ---- ldmatrix ----------------------------------------------------------------------------------

def _make_ldmatrix(num, trans):
    outs = ", ".join("${}".format(i) for i in range(num))
    ptx = "ldmatrix.sync.aligned.m8n8.x{0}{1}.shared.b16 {{{2}}}, [${0}];".format(
        num, ".trans" if trans else "", outs)
    fnty = ir.FunctionType(ir.LiteralStructType([I32] * num), [I32])
    constraints = ",".join(["=r"] * num) + ",r,~{memory}"

    @intrinsic
    def ldmatrix_asm(typingctx, smem, offset):
        if not (isinstance(smem, types.Array) and smem.dtype.bitwidth == 16
                and is_int(offset)):
            return None
        retty = types.UniTuple(types.uint32, num)

        def codegen(context, builder, sig, args):
            addr = shared_addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            asm = ir.InlineAsm(fnty, ptx, constraints, side_effect=True)
            out = builder.call(asm, [addr])
            return context.make_tuple(builder, retty,
                                      [builder.extract_value(out, i) for i in range(num)])

        return retty(smem, offset), codegen

    @cuda.jit(device=True, inline="always")
    def ldmatrix(smem, offset, scratch, tid):
        return ldmatrix_asm(smem, offset)

    return ldmatrix


# The warp-level instructions, each a device function with the same arguments on a GPU and under
# the simulator:
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
