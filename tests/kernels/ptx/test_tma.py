"""The TMA instructions of kernels/ptx/tma.py (and their emulation): box copies of a 4-D array
into the 128-byte swizzle, zeros for every element outside the array, completion on an
mbarrier whose phase flips once per expected transaction. On a GPU the boxes come through the
tensor map of runtime/tma.py; under the simulator through the emulation: both must give the
same bytes."""

import numpy as np
import pytest
from numba import cuda, uint16, uint64

from helpers import SIMULATOR, to_device, to_host
from numba_flash.kernels.instructions import memory, sync, tma, wgmma
from numba_flash.runtime import arrays
from numba_flash.runtime import tma as tma_maps

pytestmark = pytest.mark.skipif(
    not SIMULATOR and cuda.is_available()
    and cuda.get_current_device().compute_capability < (9, 0),
    reason="TMA needs compute capability 9.0")

SHARED_ALIGN = memory.SHARED_ALIGN
ROWS = 16                       # box rows
SMEM = ROWS * 64 + 512          # one box, and room to put it on a 1024-byte boundary
# (c0 column, c1 head, c2 row, c3 page): inside; past the last columns (d = 80); past the
# page's rows; a negative page; a page past the array.
COORDS = [(0, 1, 4, 2), (64, 0, 0, 1), (0, 1, 16, 0), (0, 0, 0, -1), (0, 0, 0, 3)]


@cuda.jit
def _boxes(tmap, gmem, coords, out):
    smem = cuda.shared.array(SMEM, uint16, alignment=SHARED_ALIGN)
    bars = cuda.shared.array(1, uint64)
    tid = cuda.threadIdx.x
    base = wgmma.aligned_base(smem)
    if tid == 0:
        tma.tensormap_acquire(tmap)
        tma.mbarrier_init(bars, 0, 1)
        tma.mbarrier_init_fence()
    cuda.syncthreads()
    for k in range(coords.shape[0]):  # one phase of the barrier per box
        if tid == 0:
            tma.expect_tx(bars, 0, ROWS * 64 * 2)
            tma.load_box_4d(smem, base, tmap, gmem,
                            (coords[k, 0], coords[k, 1], coords[k, 2], coords[k, 3]), ROWS,
                            bars, 0)
        tma.wait(bars, 0, k & 1)
        for i in range(tid, ROWS * 64, cuda.blockDim.x):
            out[k, i] = smem[base + i]
        cuda.syncthreads()  # every thread has read the box before the next overwrites it


def _expected(g, c0, c1, c2, c3):
    """The box at these coordinates, zeros outside ``g``, in the 128-byte swizzle."""
    box = np.zeros((ROWS, 64), np.uint16)
    for r in range(ROWS):
        for c in range(64):
            idx = (c3, c2 + r, c1, c0 + c)
            if all(0 <= i < n for i, n in zip(idx, g.shape)):
                box[r, c] = g[idx]
    flat = np.zeros(ROWS * 64, np.uint16)
    for r in range(ROWS):
        for c in range(64):
            flat[r * 64 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7)] = box[r, c]
    return flat


def test_boxes_land_swizzled_with_zeros_outside_the_array(rng):
    g = rng.integers(1, 1 << 16, (3, 24, 2, 80)).astype(np.uint16)  # pages, rows, heads, d
    dg = to_device(g)
    tmap = tma_maps.box_map(arrays.adapt(dg, "g"), ROWS).obj  # the uint64 array itself
    coords = np.array(COORDS, np.int32)
    out = to_device(np.full((len(COORDS), ROWS * 64), 0xFFFF, np.uint16))  # poisoned
    _boxes[1, 64](tmap, dg, to_device(coords), out)
    got = to_host(out)
    for k, c in enumerate(COORDS):
        np.testing.assert_array_equal(got[k], _expected(g, *c), err_msg=f"box at {c}")


def test_maps_are_kept_per_array_and_refused_for_other_shapes(rng):
    g = to_device(rng.integers(0, 9, (2, 64, 1, 64)).astype(np.uint16))
    t = arrays.adapt(g, "k_cache")
    assert tma_maps.box_map(t, 64) is tma_maps.box_map(arrays.adapt(g, "k_cache"), 64)
    assert tma_maps.box_map(t, 32) is not tma_maps.box_map(t, 64)
    with pytest.raises(ValueError, match="4-D 16-bit"):
        tma_maps.encode(arrays.adapt(to_device(np.zeros((4, 64), np.uint16)), "x"), 64)


RING = 2           # stages
BOXES = 5          # boxes through the ring: each stage refilled twice or more
CONSUMERS = 64     # two consumer warps
RING_SMEM = RING * ROWS * 64 + 512
RING_BARS = 2 * RING  # FULL, then EMPTY, per stage


@cuda.jit
def _ring(tmap, gmem, out):
    """Thread 0 copies box k (rows 16 k ..) into stage k % RING once the consumer warps have
    released the stage's previous box (``arrive`` on its EMPTY barrier); the two consumer warps
    wait for FULL, copy the box out and release it, lane 0 of each after its warp met."""
    smem = cuda.shared.array(RING_SMEM, uint16, alignment=SHARED_ALIGN)
    bars = cuda.shared.array(RING_BARS, uint64)
    tid = cuda.threadIdx.x
    base = wgmma.aligned_base(smem)
    if tid == 0:
        tma.tensormap_acquire(tmap)
        for s in range(RING):
            tma.mbarrier_init(bars, s, 1)
            tma.mbarrier_init(bars, RING + s, CONSUMERS // 32)
        tma.mbarrier_init_fence()
    cuda.syncthreads()
    if tid == CONSUMERS:  # the producer, in a warp of its own
        for k in range(BOXES):
            s = k % RING
            if k >= RING:
                tma.wait(bars, RING + s, ((k // RING) & 1) ^ 1)
            tma.expect_tx(bars, s, ROWS * 64 * 2)
            tma.load_box_4d(smem, base + s * ROWS * 64, tmap, gmem, (0, 0, ROWS * k, 0), ROWS,
                            bars, s)
    elif tid < CONSUMERS:
        for k in range(BOXES):
            s = k % RING
            tma.wait(bars, s, (k // RING) & 1)
            for i in range(tid, ROWS * 64, CONSUMERS):
                out[k, i] = smem[base + s * ROWS * 64 + i]
            sync.syncwarp(tid)
            if tid % 32 == 0:
                tma.arrive(bars, RING + s)


def test_a_ring_of_stages_hands_boxes_between_a_producer_and_consumer_warps(rng):
    """mbarrier ``arrive``: the consumers' release of a stage lets the producer refill it (the
    handshake of the warp-specialized forward, tc/forward_wgmma_ws.py)."""
    g = rng.integers(1, 1 << 16, (1, ROWS * BOXES, 1, 64)).astype(np.uint16)
    dg = to_device(g)
    tmap = tma_maps.box_map(arrays.adapt(dg, "g"), ROWS).obj
    out = to_device(np.zeros((BOXES, ROWS * 64), np.uint16))
    _ring[1, CONSUMERS + 32](tmap, dg, out)
    got = to_host(out)
    for k in range(BOXES):
        np.testing.assert_array_equal(got[k], _expected(g, 0, 0, ROWS * k, 0), err_msg=f"box {k}")
