"""Warpgroup tensor-core instructions of Hopper (sm_90a), ``wgmma.mma_async`` and its fences,
as inline PTX.

Why a second instruction set. ``mma.sync`` (``mma.py``) is the Ampere tensor-core instruction:
a warp multiplies 16x8x16 tiles and both operands pass through its registers. On a Hopper that
cannot keep the tensor cores fed: tc/forward_mma.py, shaped like FlashAttention-2, stopped at FA2's
own ~340 TFLOP/s on an H200, where tc/forward_wgmma.py, built on this module, reaches ~450.
``wgmma.mma_async`` is the Hopper one: the four warps of a *warpgroup* (128 consecutive threads,
the first warp's index a multiple of 4) compute ``D[64 x N] (+)= A[64 x 16] B[16 x N]`` for N up
to 256 in one instruction, reading B (and optionally A) straight from shared memory, and the
instruction runs asynchronously: the warps issue a chain of them and wait for the whole chain at
once.

Accumulator. D stays in registers with the ``mma.sync`` C-fragment layout, one m16 slab per
warp: warp ``w`` of the warpgroup holds rows ``16 w .. 16 w + 15``, and within a warp, with
``g = lane >> 2`` and ``t = lane & 3``, register ``4 i + e`` of the thread holds

    D[16 w + g + 8 (e >> 1)][8 i + 2 t + (e & 1)]         i = 0 .. N/8 - 1, e = 0 .. 3

so an online softmax written for ``mma.sync`` fragments works on wgmma accumulators unchanged.
A from registers (``mma_rs``) uses the ``mma.sync`` A-fragment layout of mma.py, again one m16
slab per warp: P computed as an accumulator is the A operand of the next product.

Shared-memory operands and descriptors. An operand in shared memory is named by a 64-bit
*matrix descriptor* (``descriptor``): its start address, two strides, and a swizzle mode. This
module uses one layout for every tile, the *128-byte swizzle*: a tile of ``rows`` rows of 16-bit
elements is stored as column blocks of 64 elements (128 bytes per row), each block ``rows x 128``
bytes, row ``r`` of a block at ``128 r``; inside a row the eight 16-byte chunks are permuted,
chunk ``c`` stored at chunk position ``c ^ (r & 7)`` (``tile_offset``). The permutation puts the
eight rows of an 8x8 core matrix in eight different bank groups, so the tensor cores read, and
``cp.async`` writes a row's chunks, without bank conflicts. The hardware applies the XOR to the
absolute address bits 4-6 from bits 7-9, so each tile must start on a 1024-byte boundary
(``aligned_base``). The same bytes serve two readings (PTX ISA, "Shared Memory Matrix Layout"):

    K-major (A, or B with trans_b = 0): the 16 k of a k-step are 32 contiguous bytes of a row;
        rows are M or N. Descriptor of k-step ks: start = block (16 ks) // 64, byte 32 (ks % 4)
        of row 0; SBO (next 8 rows) = 1024; LBO unused. For Q (A) and K (B = K^T).
    MN-major (B with trans_b = 1): rows are k, the N columns run along the row. Descriptor of
        k-step kk: start = row 16 kk of block 0; SBO (next 8 k) = 1024; LBO (next 64 columns)
        = rows * 128. For V (B of P V).

8-bit operands (``fmt`` "float8_e4m3fn", FP8's E4M3). A k-step is 32 elements, still 32 bytes
of a row, so a tile of 8-bit elements is the same swizzled image as a 16-bit tile of half the
columns, with the same descriptors and ``k_step`` offsets (a 64-column block of 16-bit elements
is 128 e4m3 columns). Both operands must be K-major (the ISA has no transpose for 8-bit types:
a kernel that needs V as B stores V^T). A from registers is then 16 bytes a thread for the warp's
16 x 32 slab: register ``r`` holds the four k ``4 t + 16 (r >> 1) .. + 3`` (byte 0 the lowest)
of row ``g + 8 (r & 1)``. The accumulator is the 16-bit one.

Ordering. Three rules the kernels follow:
  * ``fence()`` (wgmma.fence) before the first wgmma of a batch whose accumulator or A registers
    other instructions have touched since the previous wgmma;
  * ``commit()`` closes the batch, ``wait(n)`` waits until at most ``n`` batches are pending,
    and ``fence_operands(acc, count)`` after it ties the accumulator registers to that point, so
    the compiler cannot move a read of D above the wait (the asynchronous write is invisible to
    it otherwise);
  * ``sync.proxy_fence()`` between writing shared memory with ordinary or ``cp.async`` stores
    and reading it with wgmma (the *async proxy*): wait for the copies, proxy_fence,
    syncthreads.

API (``fmt`` "float16", "bfloat16" or "float8_e4m3fn"; accumulators are float32 local arrays, ``acc.flat[start ..
start + N/2 - 1]`` the thread's D registers; ``smem``, ``scratch`` and ``tid`` serve only the
simulator's emulation):

    tile_offset(row, col, rows)                      -> element offset in a swizzled tile
    aligned_base(smem)                               -> first 1024-byte-aligned element of smem
    descriptor(smem, offset, lbo, sbo)               -> uint64 128-byte-swizzle descriptor
    descriptor_low(smem, offset, lbo)                -> uint32: its low word (address, lbo)
    descriptor_join(low)                             -> uint64: low + the constant high word
    operand_low(smem, offset, lbo)                   descriptor_low of aligned_base + offset,
                                                     from a base ptxas keeps uniform
    k_step(ks, rows)                                 its offset for k-step ks of a K-major tile
    SBO, MN_K_STEP                                   the stride between 8-row groups; the offset
                                                     of one k-step of an MN-major tile
    mma_ss(fmt, n, trans_b)(acc, start, desc_a, desc_b, scale_d, smem, scratch, tid)
    mma_rs(fmt, n, trans_b)(acc, start, a, desc_b, scale_d, smem, scratch, tid)  a: 4 x uint32
    fence(), commit(), wait(n), fence_operands(acc, count)
    scratch_size(threads)                            uint32 words the emulations exchange
    padded_cols(cols)                                columns rounded up to whole 64-col blocks
    SWIZZLE_BYTES, BLOCK_COLS, TILE_ALIGN            the swizzle's row bytes, columns, alignment

``scale_d`` false: D = A B (the accumulator's old values are ignored). Compiling needs an sm_90a
target: numba-cuda compiles for ``compute_90a`` on a Hopper, ``ptxcheck`` with ``cc=(9, 0, "a")``.
"""

from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from . import memory
from .codegen import F32, I32, I64, statement, void_asm
from .layout import (BLOCK_COLS, SWIZZLE_BYTES, TILE_ALIGN, make_aligned_base,  # noqa: F401
                     make_descriptor, make_descriptor_low, HIGH_WORD, padded_cols,
                     tile_offset, SBO, MN_K_STEP, k_step, WARPGROUP, E4M3, K_STEP_ELEMS)


def scratch_size(threads):
    """uint32 words of the scratch array ``mma_rs`` exchanges A through: one unused word on a
    GPU (the emulation needs ``6 * threads``)."""
    return 1


aligned_base = make_aligned_base(memory.shared_address)
descriptor = make_descriptor(memory.shared_address)
descriptor_low = make_descriptor_low(memory.shared_address)


@intrinsic
def _opaque_u32(typingctx, x):
    """``x`` through a ``mov.b32`` LLVM may neither move nor merge with another."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        word = builder.trunc(context.cast(builder, args[0], sig.args[0], types.uint64), I32)
        asm = ir.InlineAsm(ir.FunctionType(I32, [I32]), "mov.b32 $0, $1;", "=r,r",
                           side_effect=True)
        return builder.call(asm, [word])

    return types.uint32(x), codegen


@cuda.jit(device=True, inline="always")
def operand_low(smem, offset, lbo):
    """``descriptor_low`` of the operand ``offset`` elements past ``aligned_base(smem)``, the
    base computed again here behind an opaque move. A base computed once is shared with the
    threads' own addresses, lives in a vector register, and every descriptor made from it then
    costs moves to uniform registers before each wgmma; made here from the shared-memory
    symbol alone, ptxas keeps the descriptors and their k-step sums in uniform registers."""
    return descriptor_low(smem, _opaque_u32(aligned_base(smem)) + offset, lbo)


@intrinsic
def descriptor_join(typingctx, low):
    """The descriptor of low word ``low`` (``descriptor_low`` plus offsets): one ``mov.b64``
    from the 32-bit value and the constant high word, opaque to LLVM, so the sums that made
    ``low`` stay 32-bit adds."""
    if not isinstance(low, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        word = builder.trunc(context.cast(builder, args[0], sig.args[0], types.uint64), I32)
        asm = ir.InlineAsm(ir.FunctionType(I64, [I32]),
                           "mov.b64 $0, {{$1, {}}};".format(HIGH_WORD), "=l,r")
        return builder.call(asm, [word])

    return types.uint64(low), codegen


# ---- wgmma.mma_async ---------------------------------------------------------------------------

def _acc_pointers(context, builder, aryty, ary, startty, start, count):
    """Pointers to ``count`` consecutive float32 elements of a local array: loads and
    stores through them at constant offsets become registers once loops are unrolled."""
    data = context.make_array(aryty)(context, builder, value=ary).data
    first = context.cast(builder, start, startty, types.intp)
    return [builder.gep(data, [builder.add(first, ir.Constant(first.type, i))],
                        inbounds=True) for i in range(count)]


def _tied(count, extra):
    """Constraints: ``count`` float outputs, each tied to the same-numbered input, then the
    ``extra`` operand constraints."""
    return ",".join(["=f"] * count + [str(i) for i in range(count)] + extra)


def _make_mma(fmt, n, a_regs, trans_b):
    ab = {"float16": "f16", "bfloat16": "bf16", E4M3: "e4m3"}[fmt]
    assert fmt != E4M3 or not trans_b, "8-bit operands are read K-major only"
    k = K_STEP_ELEMS[fmt]
    count = n // 2
    d = ", ".join("${}".format(i) for i in range(count))
    i = 2 * count
    # Flags: scale-d (the predicate), the +1 scales of A and B, and for 16-bit types the
    # transpose bits (A's only when A is in shared memory); 8-bit types have none.
    transposes = "" if fmt == E4M3 else ", {}".format(trans_b)
    if a_regs:
        a = "{" + ", ".join("${}".format(i + j) for j in range(4)) + "}"
        extra, a_types, i = ["r"] * 4, [I32] * 4, i + 4
    else:
        a, extra, a_types, i = "${}".format(i), ["l"], [I64], i + 1
        transposes = "" if fmt == E4M3 else ", 0" + transposes
    flags = "p, 1, 1" + transposes
    text = ("{{ .reg .pred p; setp.ne.b32 p, ${}, 0; "
            "wgmma.mma_async.sync.aligned.m64n{}k{}.f32.{}.{} {{{}}}, {}, ${}, {}; }}"
            ).format(i + 1, n, k, ab, ab, d, a, i, flags)
    fnty = ir.FunctionType(ir.LiteralStructType([F32] * count),
                           [F32] * count + a_types + [I64, I32])
    constraints = _tied(count, extra + ["l", "r", "~{memory}"])

    @intrinsic
    def mma_asm(typingctx, acc, start, a, desc_b, scale_d):
        a_ok = (isinstance(a, types.BaseTuple) and len(a) == 4
                and all(isinstance(e, types.Integer) for e in a)) if a_regs \
            else isinstance(a, types.Integer)
        if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and a_ok
                and isinstance(start, types.Integer) and isinstance(desc_b, types.Integer)
                and isinstance(scale_d, (types.Integer, types.Boolean))):
            return None

        def codegen(context, builder, sig, args):
            ptrs = _acc_pointers(context, builder, sig.args[0], args[0], sig.args[1],
                                 args[1], count)
            if a_regs:
                a_vals = [context.cast(builder, builder.extract_value(args[2], j),
                                       sig.args[2][j], types.uint32) for j in range(4)]
            else:
                a_vals = [context.cast(builder, args[2], sig.args[2], types.uint64)]
            operands = ([builder.load(p) for p in ptrs] + a_vals
                        + [context.cast(builder, args[3], sig.args[3], types.uint64),
                           context.cast(builder, args[4], sig.args[4], types.uint32)])
            out = builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True),
                               operands)
            for j, p in enumerate(ptrs):
                builder.store(builder.extract_value(out, j), p)
            return context.get_dummy_value()

        return types.void(acc, start, a, desc_b, scale_d), codegen

    @cuda.jit(device=True, inline="always")
    def mma(acc, start, a, desc_b, scale_d, smem, scratch, tid):
        mma_asm(acc, start, a, desc_b, scale_d)

    return mma


_MMA = {}


def mma_ss(fmt, n, trans_b):
    """``D[64 x n] (+)= A B`` with A (K-major, 64 rows) and B from shared memory descriptors;
    ``trans_b`` 0: B stored K-major ([n][k] rows), 1: MN-major ([k][n] rows)."""
    key = (fmt, n, False, trans_b)
    if key not in _MMA:
        _MMA[key] = _make_mma(fmt, n, False, trans_b)
    return _MMA[key]


def mma_rs(fmt, n, trans_b):
    """As ``mma_ss`` with A from registers: 4 uint32 per thread, mma.py's A-fragment layout for
    the warp's 16 rows."""
    key = (fmt, n, True, trans_b)
    if key not in _MMA:
        _MMA[key] = _make_mma(fmt, n, True, trans_b)
    return _MMA[key]


# ---- fences and waits --------------------------------------------------------------------------

fence = statement("wgmma.fence.sync.aligned;",
                   "wgmma.fence: order earlier register accesses before the next wgmma.")
commit = statement("wgmma.commit_group.sync.aligned;",
                    "wgmma.commit_group: close the batch of wgmma issued since the last.")


@intrinsic
def wait(typingctx, n):
    """wgmma.wait_group n: at most ``n`` (a constant) batches still pending."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    text = "wgmma.wait_group.sync.aligned {};".format(int(n.literal_value))

    def codegen(context, builder, sig, args):
        void_asm(builder, text)
        return context.get_dummy_value()

    return types.void(n), codegen


@intrinsic
def fence_operands(typingctx, acc, count):
    """An empty statement that reads and rewrites ``acc.flat[:count]`` (a constant): code
    after it that uses the accumulator cannot move above it."""
    if not (isinstance(acc, types.Array) and acc.dtype == types.float32
            and isinstance(count, types.IntegerLiteral)):
        return None
    num = int(count.literal_value)
    fnty = ir.FunctionType(ir.LiteralStructType([F32] * num), [F32] * num)

    def codegen(context, builder, sig, args):
        ptrs = _acc_pointers(context, builder, sig.args[0], args[0], types.intp,
                             context.get_constant(types.intp, 0), num)
        out = builder.call(ir.InlineAsm(fnty, "", _tied(num, []), side_effect=True),
                           [builder.load(p) for p in ptrs])
        for j, p in enumerate(ptrs):
            builder.store(builder.extract_value(out, j), p)
        return context.get_dummy_value()

    return types.void(acc, count), codegen
