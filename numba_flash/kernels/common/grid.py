"""Long rows of CTAs folded into the grid's y and z.

CUDA bounds a grid at 2^31 - 1 CTAs in x but 65535 in y and z. The attention kernels put the
query (or key) tiles in x, so consecutive CTAs share one head's K and V in L2, and one CTA per
(batch, head) in y: B * H = 512 * 128 already passes 65535. ``fold(n)`` spreads ``n`` such
rows over (y, z) with ``y * z >= n``, and ``folded_row()`` gives a CTA its row back,
``z * gridDim.y + y``: the same order of CTAs as one long y. The last z-slice may hold up to
``z - 1`` CTAs past ``n``; each kernel returns at once from those (a whole CTA, before any
barrier). Below 65536 rows the fold is the identity (z = 1, no idle CTA).

A causal grid has CTAs of very different lengths: the first key tile of a row sees every query
tile, the last one a single one. Launched row by row, the last rows' longest CTAs start in the
final wave and run on alone while the other SMs idle. ``make_longest_first`` walks such a grid
in groups of rows, tile by tile within a group, longest tiles first (the longest-processing-
time-first rule), so the final wave is made of the shortest CTAs; the group is as many rows as
keep their streamed operands within ``L2_BUDGET`` bytes, so concurrent CTAs still share them in
L2.
"""

from numba import cuda

from ...runtime.launcher import MAX_GRID, cdiv
from ..instructions import convert

L2_BUDGET = 16 << 20  # bytes: half of an H100 / H200 L2 (50 MB), a quarter of an A100's 40


def fold(n):
    """(y, z) extents that cover ``n`` rows of CTAs within CUDA's limits."""
    z = max(1, cdiv(n, MAX_GRID[1]))
    return cdiv(n, z), z


@cuda.jit(device=True, inline="always")
def folded_row():
    """This CTA's row of a ``fold``-ed grid (it may pass the row count: see the module)."""
    return cuda.blockIdx.z * cuda.gridDim.y + cuda.blockIdx.y


def make_longest_first(CAUSAL, ROW_BYTES):
    """``tile_and_row(n_rows, seqlen) -> (rank, row)`` of this CTA in a ``(tiles, fold(n_rows))``
    grid whose rows stream ``seqlen`` rows of ``ROW_BYTES`` bytes each: causal, the groups of
    ``max(1, L2_BUDGET // (seqlen ROW_BYTES))`` rows one after another, rank 0 (the longest
    tile, which the kernel maps to its first key tile or last query tile) of every row of a
    group first; otherwise ``(blockIdx.x, folded_row())``. Call it after the kernel's
    ``folded_row() < n_rows`` check."""
    div = convert.div_u32

    @cuda.jit(device=True, inline="always")
    def tile_and_row(n_rows, seqlen):
        if not CAUSAL:
            return cuda.blockIdx.x, folded_row()
        tiles = cuda.gridDim.x
        group = min(n_rows, max(1, int(div(L2_BUDGET, max(1, seqlen) * ROW_BYTES))))
        launched = folded_row() * tiles + cuda.blockIdx.x  # the launch order
        first = int(div(launched, group * tiles)) * group  # this group's first row
        rows = min(group, n_rows - first)
        at = launched - first * tiles
        rank = int(div(at, rows))
        return rank, first + at - rank * rows

    return tile_and_row
