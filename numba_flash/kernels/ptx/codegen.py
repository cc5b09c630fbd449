"""What every intrinsic of ``kernels/ptx`` builds its code from: LLVM types, operand type
checks, operand casts, state-space addresses and argument-less statements.

An intrinsic (``numba.cuda.extending.intrinsic``) is a typing function that returns a signature
and a code generator; the generator receives an LLVM IR builder and the arguments as LLVM values
and emits, here, an ``InlineAsm`` call holding the PTX text. Its constraint string binds the
``$n`` operands to LLVM values (``r``: 32-bit register, ``l``: 64-bit, ``h``: 16-bit, ``f``:
float32, ``=`` an output, a digit an output tied to that input) and ``~{memory}`` tells the
compiler the statement reads or writes memory, so loads and stores do not move across it.
"""

from llvmlite import ir
from numba import types
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
ADDRSPACE_GLOBAL = 1
ADDRSPACE_SHARED = 3


def is_int(ty):
    return isinstance(ty, types.Integer)


def int_tuple(ty, count):
    return isinstance(ty, types.BaseTuple) and len(ty) == count and all(
        isinstance(e, types.Integer) for e in ty)


def float_tuple(ty, count):
    return isinstance(ty, types.BaseTuple) and len(ty) == count and all(
        isinstance(e, (types.Float, types.Integer)) for e in ty)


def valid_index(aryty, indty):
    """Whether ``indty`` indexes one element of an array of type ``aryty``."""
    if isinstance(indty, types.Integer):
        return aryty.ndim == 1
    return (isinstance(indty, types.BaseTuple) and len(indty) == aryty.ndim
            and all(isinstance(e, types.Integer) for e in indty))


def tuple_items(context, builder, tupty, tup, target):
    """The members of a tuple value, each cast to the Numba type ``target``."""
    return [context.cast(builder, builder.extract_value(tup, i), tupty[i], target)
            for i in range(len(tupty))]


def shared_addr(context, builder, aryty, ary, offty, offset):
    """32-bit shared-state-space address of element ``offset`` (flat) of a shared array:
    the array's base pointer cast to address space 3 as an integer, plus the offset in
    bytes, all in 32-bit arithmetic (shared addresses fit in 32 bits)."""
    data = context.make_array(aryty)(context, builder, value=ary).data
    sptr = builder.addrspacecast(data, ir.PointerType(data.type.pointee, ADDRSPACE_SHARED))
    base = builder.ptrtoint(sptr, I32)
    off = context.cast(builder, offset, offty, types.int64)
    nbytes = builder.mul(builder.trunc(off, I32),
                         ir.Constant(I32, context.get_abi_sizeof(data.type.pointee)))
    return builder.add(base, nbytes)


def global_addr(context, builder, aryty, ary, indty, index):
    """64-bit global-state-space address of ``ary[index]``."""
    if isinstance(indty, types.Integer):
        indty, indices = types.UniTuple(indty, 1), [index]
    else:
        indices = [builder.extract_value(index, i) for i in range(len(indty))]
    indices = [context.cast(builder, i, t, types.intp) for t, i in zip(indty, indices)]
    arr = context.make_array(aryty)(context, builder, value=ary)
    ptr = cgutils.get_item_pointer(context, builder, aryty, arr, indices, wraparound=False)
    gptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, ADDRSPACE_GLOBAL))
    return builder.ptrtoint(gptr, I64)


def void_asm(builder, text):
    """Emit the operand-less PTX statement ``text`` (it orders memory: ``~{memory}``)."""
    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                       side_effect=True)
    builder.call(asm, [])


def statement(text, doc):
    """An intrinsic without arguments that emits ``text`` (``void_asm``), documented by ``doc``."""
    @intrinsic
    def emit(typingctx):
        def codegen(context, builder, sig, args):
            void_asm(builder, text)
            return context.get_dummy_value()

        return types.void(), codegen

    emit.__doc__ = doc
    return emit
