"""Where the data of the instructions live: facts of layout that the PTX intrinsics and their
simulator emulations share, so neither half imports the other.

Nothing here emits an instruction. The device functions are index arithmetic (``cuda.jit``
under either target), the rest plain Python:

    ldmatrix_a_rowcol(lane), ldmatrix_b_rowcol(lane)  the (row, col) a lane's ldmatrix row starts
                                                      at (``mma``'s docstring has the tables)
    tile_offset(row, col, rows)                       element offset in a 128-byte-swizzled tile
    k_step(ks, rows)                                  descriptor offset of k-step ks, K-major
    padded_cols(cols)                                 columns rounded up to whole 64-col blocks
    make_aligned_base(shared_address)                 -> aligned_base(smem) for a binding
    make_descriptor(shared_address)                   -> descriptor(smem, offset, lbo, sbo)
    CP_ASYNC_BYTES, SCRATCH_DTYPE, SCRATCH_WORDS, SWIZZLE_BYTES, BLOCK_COLS, TILE_ALIGN,
    SBO, MN_K_STEP, E4M3, K_STEP_ELEMS

``aligned_base`` and ``descriptor`` read a shared address, which is an intrinsic on a GPU and a
byte offset under the simulator: each ``wgmma`` module builds them from its own
``memory.shared_address``, with one body for both.
"""

from numba import cuda, types, uint32, uint64

# Bytes moved by one cp.async.cg (and by one 16-byte store): every address it touches is a
# multiple of this.
CP_ASYNC_BYTES = 16

# Element type of the scratch array the warp-collective emulations exchange data through.
SCRATCH_DTYPE = types.uint32
# 32-bit words per thread: an mma exchanges its A (4) and B (2) registers.
SCRATCH_WORDS = 6


# ---- mma.sync fragments: the row each lane gives ldmatrix ------------------------------------

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


# ---- wgmma's 128-byte swizzle ----------------------------------------------------------------

WARPGROUP = 128  # threads: the four warps that issue one wgmma together
SWIZZLE_BYTES = 128           # bytes per row of a column block
BLOCK_COLS = 64               # 16-bit elements per row of a column block
TILE_ALIGN = 1024             # bytes: the swizzle pattern repeats every 8 rows of 128 bytes
SWIZZLE_128 = 1 << 62         # descriptor bits 62-63: layout type 1, 128-byte swizzle


def padded_cols(cols):
    """Columns of a swizzled tile holding ``cols`` columns: whole 64-element blocks."""
    return -(-cols // BLOCK_COLS) * BLOCK_COLS


@cuda.jit(device=True, inline="always")
def tile_offset(row, col, rows):
    """Element offset of (row, col) in a 128-byte-swizzled tile of ``rows`` rows; ``col`` a
    multiple of 2 stays in its 32-bit word, a multiple of 8 starts a 16-byte chunk."""
    chunk = ((col >> 3) & 7) ^ (row & 7)
    return (col >> 6) * rows * BLOCK_COLS + row * BLOCK_COLS + (chunk << 3) + (col & 7)


# The 8-bit element format wgmma takes (FP8's E4M3), and the elements of one k-step (32 bytes
# along a K-major row) per format.
E4M3 = "float8_e4m3fn"
K_STEP_ELEMS = {"float16": 16, "bfloat16": 16, E4M3: 32}


# Descriptor arithmetic, in the 16-byte units of a descriptor's address fields (kernels/ptx/
# wgmma.py, "Shared-memory operands"): eight rows of 128 bytes from one core-matrix group to the
# next (the stride byte offset of both readings), and the step of one k-step (16 rows) of an
# MN-major operand.
SBO = 8 * SWIZZLE_BYTES
MN_K_STEP = 16 * SWIZZLE_BYTES // 16


@cuda.jit(device=True, inline="always")
def k_step(ks, rows):
    """Descriptor offset (16-byte units) of k-step ``ks`` of a K-major tile of ``rows`` rows: 32
    bytes along its rows, or on to the next 64-column block."""
    return uint64(((ks >> 2) * rows * SWIZZLE_BYTES + (ks & 3) * 32) >> 4)


def make_aligned_base(shared_address):
    """``aligned_base(smem)`` over the binding's ``shared_address``."""

    @cuda.jit(device=True, inline="always")
    def aligned_base(smem):
        """Offset of the first element of the 16-bit shared array ``smem`` that lies on a
        1024-byte boundary (reserve TILE_ALIGN bytes for it)."""
        return ((TILE_ALIGN - (shared_address(smem, 0) & (TILE_ALIGN - 1)))
                & (TILE_ALIGN - 1)) >> 1

    return aligned_base


def make_descriptor(shared_address):
    """``descriptor(smem, offset, lbo, sbo)`` over the binding's ``shared_address``."""

    @cuda.jit(device=True, inline="always")
    def descriptor(smem, offset, lbo, sbo):
        """Matrix descriptor of the 128-byte-swizzled operand starting at element ``offset`` of
        ``smem``: start address, leading and stride byte offsets in 16-byte units, layout type.
        Later k-steps add their byte offset / 16 to it (no carry: addresses are below 256 KiB)."""
        address = uint64(shared_address(smem, offset))
        return (((address & uint64(0x3FFFF)) >> uint64(4))
                | (uint64(lbo >> 4) << uint64(16)) | (uint64(sbo >> 4) << uint64(32))
                | uint64(SWIZZLE_128))

    return descriptor


# A descriptor's high word (stride byte offset SBO, layout type) is the same constant in every
# kernel here, and its low word (start address, leading byte offset) is all that k-steps and
# buffers move. Kept as a 32-bit value and joined to the constant only as the wgmma's operand
# (``descriptor_join``), an operand costs one 32-bit add (none where ptxas keeps the value in a
# uniform register) instead of a 64-bit add with carry and two moves to uniform registers.
HIGH_WORD = (SBO >> 4) | (SWIZZLE_128 >> 32)


def make_descriptor_low(shared_address):
    """``descriptor_low(smem, offset, lbo)`` over the binding's ``shared_address``."""

    @cuda.jit(device=True, inline="always")
    def descriptor_low(smem, offset, lbo):
        """The low word of ``descriptor(smem, offset, lbo, SBO)`` as a uint32; ``low +
        k-step offset`` never carries out of it (addresses are below 256 KiB)."""
        return uint32(((shared_address(smem, offset) & 0x3FFFF) >> 4) | ((lbo >> 4) << 16))

    return descriptor_low
