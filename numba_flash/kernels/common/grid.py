"""Long rows of CTAs folded into the grid's y and z.

CUDA bounds a grid at 2^31 - 1 CTAs in x but 65535 in y and z. The attention kernels put the
query (or key) tiles in x, so consecutive CTAs share one head's K and V in L2, and one CTA per
(batch, head) in y: B * H = 512 * 128 already passes 65535. ``fold(n)`` spreads ``n`` such
rows over (y, z) with ``y * z >= n``, and ``folded_row()`` gives a CTA its row back,
``z * gridDim.y + y``: the same order of CTAs as one long y. The last z-slice may hold up to
``z - 1`` CTAs past ``n``; each kernel returns at once from those (a whole CTA, before any
barrier). Below 65536 rows the fold is the identity (z = 1, no idle CTA).
"""

from numba import cuda

from ...runtime.launcher import MAX_GRID, cdiv


def fold(n):
    """(y, z) extents that cover ``n`` rows of CTAs within CUDA's limits."""
    z = max(1, cdiv(n, MAX_GRID[1]))
    return cdiv(n, z), z


@cuda.jit(device=True, inline="always")
def folded_row():
    """This CTA's row of a ``fold``-ed grid (it may pass the row count: see the module)."""
    return cuda.blockIdx.z * cuda.gridDim.y + cuda.blockIdx.y
