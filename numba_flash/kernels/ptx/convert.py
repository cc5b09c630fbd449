"""Number conversions and the pieces of arithmetic the kernels spell out, as inline PTX.

16-bit storage. Kernels see float16 and bfloat16 tensors as ``uint16`` bit patterns
(``arrays.py`` makes the views), so one kernel body serves both formats: a load widens the bits
to float32 and a store rounds float32 to nearest-even bits. Each conversion is one ``cvt``
instruction, or a shift for bfloat16 -> float32, whose bits are the top half of a float32
(``common/formats.py`` picks them by format).

8-bit storage. float8_e4m3fn (FP8's E4M3: 4 exponent bits, 3 mantissa bits, no infinities,
max 448) arrives as ``uint8`` bits. sm_89 and later convert it in pairs through float16, which
holds every e4m3 value exactly; rounding to e4m3 saturates (``satfinite``), the convention of
FP8 scaling, where a value past the range means the scale was chosen for other data.

Pairs. Tensor-core operands hold two 16-bit values per 32-bit register, the lower column (or k)
in bits 0-15. ``cvt.rn.f16x2.f32 d, hi, lo`` rounds two float32 into one such register (its
*first* source goes to the upper half), and unpacking is two shifts or truncations.

Arithmetic. ``ex2.approx.ftz.f32`` is the special-function unit's 2**x (2 ulp, subnormal
results flushed to zero), without the range checks ``math.exp2`` compiles to;
``rcp.approx.ftz.f32`` its 1 / x (1 ulp; 1 / inf = 0). ``div.u32`` is a
32-bit division: Numba divides integers in 64 bits, which ptxas turns into a call to a
subroutine, and a kernel with a call in it gets its wgmma serialized (ptxas warning C7509).

API (``fmt`` is ``"float16"`` or ``"bfloat16"``):

    f16_to_f32(bits), bf16_to_f32(bits)                  uint16 -> float32
    f32_to_f16(x), f32_to_bf16(x)                        float32 -> uint16 (nearest even)
    e4m3_to_f32(bits), f32_to_e4m3(x)                    uint8 e4m3 <-> float32 (sm_89+;
                                                         nearest even, saturating to +-448)
    e4m3x2_to_f16x2(bits) / e4m3x2_to_bf16x2(bits) / widen_e4m3x2(fmt)
                                                         uint16 (two e4m3) -> uint32 pair
                                                         (exact; byte 0 -> bits 0-15)
    pack_f16x2(lo, hi) / pack_bf16x2(lo, hi) / pack(fmt) two float32 -> uint32
    unpack_f16x2(r) / unpack_bf16x2(r) / unpack(fmt)     uint32 -> (lo, hi) float32
    pack_e4m3x4(x0, x1, x2, x3)                          four float32 -> four e4m3 in a uint32
                                                         (x0 in byte 0; as f32_to_e4m3)
    bits_to_f32(bits)                                    uint32 bits -> float32 (no conversion)
    exp2_approx(x)                                       ex2.approx.ftz.f32
    rcp_approx(x)                                        rcp.approx.ftz.f32
    div_rn(a, b)                                         div.rn.f32: a / b, IEEE-rounded
    div_u32(a, b)                                        32-bit a // b (a, b >= 0)
"""

from llvmlite import ir
from numba import cuda, float32, types
from numba.cuda.extending import intrinsic

from .codegen import F32, I16, I32, is_int


# ---- one 16-bit value <-> float32 --------------------------------------------------------------

@intrinsic
def f16_to_f32(typingctx, bits):
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(16)]),
                           "cvt.f32.f16 $0, $1;", "=f,h")
        return builder.call(asm, args)

    return float32(bits), codegen


@intrinsic
def bf16_to_f32(typingctx, bits):
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, sig, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return float32(bits), codegen


def _f32_to_16(instruction):
    @intrinsic
    def convert(typingctx, x):
        if not isinstance(x, types.Float) or x.bitwidth != 32:
            return None

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]),
                               instruction + " $0, $1;", "=h,f")
            return builder.call(asm, args)

        return types.uint16(x), codegen

    return convert


f32_to_f16 = _f32_to_16("cvt.rn.f16.f32")
f32_to_bf16 = _f32_to_16("cvt.rn.bf16.f32")


# ---- one 8-bit float (e4m3) <-> float32 ---------------------------------------------------------

@intrinsic
def e4m3_to_f32(typingctx, bits):
    """An float8_e4m3fn bit pattern (uint8) as float32, exactly: ``cvt.rn.f16x2.e4m3x2`` widens
    the byte (with a zero beside it) to a float16, which holds every e4m3 value (sm_89+)."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 8:
        return None

    def codegen(context, builder, sig, args):
        pair = builder.zext(args[0], I16)
        asm = ir.InlineAsm(ir.FunctionType(F32, [I16]),
                           "{ .reg .b32 w; .reg .b16 lo, hi; cvt.rn.f16x2.e4m3x2 w, $1; "
                           "mov.b32 {lo, hi}, w; cvt.f32.f16 $0, lo; }", "=f,h")
        return builder.call(asm, [pair])

    return float32(bits), codegen


@intrinsic
def f32_to_e4m3(typingctx, x):
    """float32 rounded to the nearest even float8_e4m3fn, saturated to +-448 (``satfinite``;
    NaN stays NaN), as its uint8 bit pattern: ``cvt.rn.satfinite.e4m3x2.f32`` with a zero for
    the pair's upper byte (sm_89+)."""
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(I16, [F32]),
                           "{ .reg .f32 z; mov.f32 z, 0f00000000; "
                           "cvt.rn.satfinite.e4m3x2.f32 $0, z, $1; }", "=h,f")
        return builder.trunc(builder.call(asm, args), ir.IntType(8))

    return types.uint8(x), codegen


@intrinsic
def bits_to_f32(typingctx, bits):
    """A 32-bit word read as the float32 it holds (a bitcast: no instruction)."""
    if not is_int(bits):
        return None

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[0], sig.args[0], types.uint32)
        return builder.bitcast(word, F32)

    return float32(bits), codegen


@intrinsic
def pack_e4m3x4(typingctx, x0, x1, x2, x3):
    """Four float32 rounded to float8_e4m3fn (nearest even, ``satfinite``) in one uint32, ``x0``
    in byte 0: two ``cvt.rn.satfinite.e4m3x2.f32`` (each puts its first source in the upper
    byte) and one move. An 8-bit A fragment register of wgmma (sm_89+)."""
    if not all(isinstance(x, types.Float) and x.bitwidth == 32 for x in (x0, x1, x2, x3)):
        return None

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(I32, [F32] * 4),
                           "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                           "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
                           "=r,f,f,f,f")
        return builder.call(asm, args)

    return types.uint32(x0, x1, x2, x3), codegen


# ---- two 8-bit floats (e4m3) -> two 16-bit floats, exactly ------------------------------------

def _make_widen_pair(body):
    @intrinsic
    def widen(typingctx, bits):
        if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
            return None

        def codegen(context, builder, sig, args):
            return builder.call(ir.InlineAsm(ir.FunctionType(I32, [I16]), body, "=r,h"), args)

        return types.uint32(bits), codegen

    return widen


# ``cvt.rn.f16x2.e4m3x2`` widens the low byte into the low half (float16 holds every e4m3
# value); for bfloat16 the two halves pass through float32 and are packed again (also exact:
# bfloat16's exponent range and 7 mantissa bits cover e4m3's).
e4m3x2_to_f16x2 = _make_widen_pair("cvt.rn.f16x2.e4m3x2 $0, $1;")
e4m3x2_to_f16x2.__doc__ = "Two e4m3 bytes (uint16, byte 0 low) as two float16 in one uint32."
e4m3x2_to_bf16x2 = _make_widen_pair(
    "{ .reg .b32 w; .reg .b16 lo, hi; .reg .f32 a, b; cvt.rn.f16x2.e4m3x2 w, $1; "
    "mov.b32 {lo, hi}, w; cvt.f32.f16 a, lo; cvt.f32.f16 b, hi; cvt.rn.bf16x2.f32 $0, b, a; }")
e4m3x2_to_bf16x2.__doc__ = "Two e4m3 bytes (uint16, byte 0 low) as two bfloat16 in one uint32."


def widen_e4m3x2(fmt):
    """The two-e4m3 -> 16-bit pair widening for ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": e4m3x2_to_f16x2, "bfloat16": e4m3x2_to_bf16x2}[fmt]


# ---- two 16-bit values in one register ---------------------------------------------------------

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
            asm = ir.InlineAsm(ir.FunctionType(I32, [F32, F32]),
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
    if not is_int(r):
        return None
    retty = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[0], sig.args[0], types.uint32)
        halves = [builder.trunc(word, I16),
                  builder.trunc(builder.lshr(word, ir.Constant(I32, 16)), I16)]
        return context.make_tuple(builder, retty, [
            builder.fpext(builder.bitcast(h, ir.HalfType()), F32) for h in halves])

    return retty(r), codegen


@cuda.jit(device=True, inline="always")
def unpack_f16x2(r):
    """The two float16 of a packed register as float32: (bits 0-15, bits 16-31)."""
    return _f16_pair_to_f32(r)


@intrinsic
def _bf16_pair_to_f32(typingctx, r):
    if not is_int(r):
        return None
    retty = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[0], sig.args[0], types.uint32)
        lo = builder.shl(word, ir.Constant(I32, 16))
        hi = builder.and_(word, ir.Constant(I32, 0xFFFF0000))
        return context.make_tuple(builder, retty,
                                  [builder.bitcast(lo, F32), builder.bitcast(hi, F32)])

    return retty(r), codegen


@cuda.jit(device=True, inline="always")
def unpack_bf16x2(r):
    """The two bfloat16 of a packed register as float32: (bits 0-15, bits 16-31)."""
    return _bf16_pair_to_f32(r)


def pack(fmt):
    """The float32-pair packing device function for ``fmt`` (``"float16"`` or ``"bfloat16"``)."""
    return {"float16": pack_f16x2, "bfloat16": pack_bf16x2}[fmt]


def unpack(fmt):
    """The packed-pair -> two float32 device function for ``fmt``."""
    return {"float16": unpack_f16x2, "bfloat16": unpack_bf16x2}[fmt]


# ---- arithmetic --------------------------------------------------------------------------------

def _sfu_f32(instruction):
    """A float32 -> float32 intrinsic of one special-function-unit instruction."""
    @intrinsic
    def sfu(typingctx, x):
        if not isinstance(x, (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            x32 = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(F32, [F32]), instruction + " $0, $1;", "=f,f")
            return builder.call(asm, [x32])

        return types.float32(x), codegen

    return sfu


exp2_approx = _sfu_f32("ex2.approx.ftz.f32")  # 2**x: max 2 ulp error, subnormals -> 0
rcp_approx = _sfu_f32("rcp.approx.ftz.f32")   # 1 / x: max 1 ulp error, subnormals -> 0


@intrinsic
def div_rn(typingctx, a, b):
    """``a / b`` of two float32, correctly rounded (``div.rn.f32``): the kernels compile with
    fastmath, under which a plain division may be off by an ulp, where a result must match
    IEEE division bit for bit (an FP8 descale)."""
    if not all(isinstance(x, (types.Float, types.Integer)) for x in (a, b)):
        return None

    def codegen(context, builder, sig, args):
        a32, b32 = (context.cast(builder, x, t, types.float32) for x, t in zip(args, sig.args))
        asm = ir.InlineAsm(ir.FunctionType(F32, [F32, F32]), "div.rn.f32 $0, $1, $2;",
                           "=f,f,f")
        return builder.call(asm, [a32, b32])

    return types.float32(a, b), codegen


@intrinsic
def div_u32(typingctx, a, b):
    """``a // b`` of two non-negative 32-bit integers with ``div.u32``. Numba divides in 64
    bits, which ptxas turns into a call to a subroutine; a kernel with a call in it gets its
    wgmma serialized (ptxas warning C7509)."""
    if not (is_int(a) and is_int(b)):
        return None

    def codegen(context, builder, sig, args):
        a32 = context.cast(builder, args[0], sig.args[0], types.uint32)
        b32 = context.cast(builder, args[1], sig.args[1], types.uint32)
        return builder.udiv(a32, b32)

    return types.uint32(a, b), codegen
