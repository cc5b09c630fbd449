"""Tensor maps for Hopper's TMA copies (``kernels/ptx/tma.py``), built on the host.

A tensor map is the 128-byte descriptor a ``cp.async.bulk.tensor`` copy reads: the array's base
address, sizes and byte strides, the box one copy moves, and the shared-memory swizzle. libcuda
encodes it (``cuTensorMapEncodeTiled``, called through ctypes); the kernels read it from global
memory, so each map is copied to the device once and kept, keyed by everything it encodes. A
decode that runs every step on the same cache finds its map in ``_maps`` and pays one dict
lookup. The map's sizes are the array's own, and the TMA unit writes zeros for every element of
a box outside them: a kernel can name any box, none reads outside the array.

Under the simulator a map is 16 zero words: the emulated copy reads the array itself.
"""

import ctypes
import threading

import numpy as np

from . import arrays
from .device import SIMULATOR
from .env import libcuda

MAP_WORDS = 16                 # CU_TENSOR_MAP_NUM_QWORDS
BOX_COLS = 64                  # elements of a box row: the 128 bytes of the swizzle
MAX_MAPS = 64
_UINT16, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _OOB_ZERO = 1, 0, 3, 3, 0
_maps = {}                     # key -> (device array, its Tensor), oldest first
_lock = threading.Lock()


def box_map(t, box_rows):
    """The map (an adapted uint64 array of ``MAP_WORDS``) of 4-D 16-bit array ``t`` (an
    ``arrays.Tensor``, last dimension contiguous) with boxes of ``BOX_COLS`` elements of the last
    dimension by ``box_rows`` of the second, one along the others, 128-byte swizzled."""
    return _kept((t.ptr, t.shape, t.strides, t.itemsize, t.device, box_rows), t, box_rows)


def no_map(t):
    """A map of zeros on ``t``'s device, for kernels that take a map argument but were built
    to copy without one."""
    return _kept((None, t.device), t, None)


def _kept(key, t, box_rows):
    """The map of ``key`` from ``_maps``, made on first use (the oldest dropped past
    MAX_MAPS)."""
    entry = _maps.get(key)
    if entry is None:
        with _lock:
            entry = _maps.get(key)
            if entry is None:
                entry = _maps[key] = _device_map(t, box_rows)
                while len(_maps) > MAX_MAPS:
                    del _maps[next(iter(_maps))]
    return entry[1]


def _device_map(t, box_rows):
    """(array, its Tensor) holding the map (``box_rows`` None: zeros) where kernels read it."""
    words = np.zeros(MAP_WORDS, np.uint64)
    if SIMULATOR:
        return words, arrays.adapt(words, "tensor map")
    if box_rows is not None:
        words[:] = encode(t, box_rows)
    from numba import cuda
    with cuda.gpus[t.device]:
        dev = cuda.to_device(words)
    return dev, arrays.adapt(dev, "tensor map")


def encode(t, box_rows):
    """``cuTensorMapEncodeTiled`` for ``t``: the 16 words of the map; ``ValueError`` when libcuda
    refuses the array (base or strides not multiples of 16 bytes, sizes past its limits)."""
    if t.ndim != 4 or t.itemsize != 2 or t.strides[3] != 1:
        raise ValueError(f"{t.name}: a TMA map takes a 4-D 16-bit array with a contiguous last "
                         f"dimension, got shape {t.shape}, strides {t.strides}")
    u64x4, u32x4 = ctypes.c_uint64 * 4, ctypes.c_uint32 * 4
    dims = u64x4(*reversed(t.shape))                     # innermost first
    strides = (ctypes.c_uint64 * 3)(*(s * t.itemsize for s in reversed(t.strides[:3])))
    box = u32x4(BOX_COLS, 1, box_rows, 1)
    ones = u32x4(1, 1, 1, 1)
    out = (ctypes.c_uint64 * MAP_WORDS)()
    fn = libcuda().cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    result = fn(out, _UINT16, 4, ctypes.c_void_p(t.ptr), dims, strides, box, ones,
                _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _OOB_ZERO)
    if result:
        raise ValueError(f"{t.name}: cuTensorMapEncodeTiled refused shape {t.shape}, strides "
                         f"{t.strides} at {t.ptr:#x} (CUresult {result})")
    return np.frombuffer(out, np.uint64).copy()
