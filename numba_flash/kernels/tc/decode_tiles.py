"""The tile geometry of the Hopper MLA decodes (``mla_decode_wgmma.py``, ``mla_decode_seesaw.py``):
two warpgroups, tiles of BLOCK_M = 64 packed query rows and BLOCK_N = 64 cache rows, and the
shared-memory layout both kernels use.

Shared memory (16-bit elements, every tile in ``ptx/wgmma.py``'s 128-byte swizzle)
    q      64 x QW          QW = HEAD_DIM rounded up to 64 columns
    k      2 x 64 x KW      KW = max(QW, 2 VH): the double-buffered cache tiles; V is the
                            first 2 VH columns of each
    stage  over q and k     the finished O_i (float32, 64 x 2 VH) of the epilogue
    p      64 x 64          P
    + ``wgmma.TILE_ALIGN`` bytes to put the tiles on a 1024-byte boundary. HEAD_DIM 576,
    HEAD_DIM_V 512: 72 + 144 + 8 + 1 KiB = 225 KiB.
"""

from ..common.layout import SharedLayout
from ..common.paged_kv import SCHED_BLOCK
from ..instructions import wgmma

WARPGROUP = wgmma.WARPGROUP
THREADS = 2 * WARPGROUP
BLOCK_M = 64                # packed query rows per CTA: one wgmma M
BLOCK_N = SCHED_BLOCK       # cache rows per tile (64): a tile never straddles two pieces
TPR = THREADS // BLOCK_N    # copy: threads per cache row
MAX_HEAD_DIM, MAX_HEAD_DIM_V = 576, 512  # VH <= 256: wgmma's largest N


def value_cols(head_dim_v):
    """VH, the O_i columns per warpgroup: half of HEAD_DIM_V rounded up to whole 64-column
    blocks (a warpgroup's V operand starts on a block of the swizzled tile)."""
    return wgmma.padded_cols(-(-head_dim_v // 2))


def tile_cols(head_dim, head_dim_v):
    """(QW, KW): columns of the Q tile and of a cache tile."""
    qw = wgmma.padded_cols(head_dim)
    return qw, max(qw, 2 * value_cols(head_dim_v))


def shared_layout(head_dim, head_dim_v):
    """The CTA's dynamic shared memory (offsets from the aligned base, with its reserve)."""
    qw, kw = tile_cols(head_dim, head_dim_v)
    stage = BLOCK_M * 2 * value_cols(head_dim_v) * 2  # float32 words in 16-bit elements
    return SharedLayout(2, [("q", BLOCK_M * qw), ("k", 2 * BLOCK_N * kw), ("stage", stage, "q"),
                            ("p", BLOCK_M * BLOCK_N)], reserve=wgmma.TILE_ALIGN)
