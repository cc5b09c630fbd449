"""Launching a compiled kernel: its parameters packed by hand, ``cuLaunchKernel``, and the opt-in
to more than 48 KiB of dynamic shared memory.

Numba's own launch asks every argument for its type and device pointer and builds one ctypes
object per parameter, on every call: ~75 us for the decode kernel's 14 arguments (58
parameters), half the kernel's own time at seqlen 4096. Here the parameter layout follows once
from the kernel's signature and a launch is one ``struct.pack_into`` of (pointer, shape,
strides) from the adapted arrays (``arrays.Tensor``) and one ctypes call of libcuda's
``cuLaunchKernel``: a few microseconds.

A kernel launched with ``dependent=True`` goes through ``cuLaunchKernelEx`` with the
programmatic stream serialization attribute (sm_90+): it may start before the kernel ahead of it
on the stream has finished, and waits for it with ``sync.wait_prior_grid`` where it reads what
that kernel wrote (``kernels/ptx/sync.py``). Under a driver older than CUDA 12.3, which cannot
capture such launches in a graph, it is launched the ordinary way: the wait then returns at
once, and only the overlap is lost.
"""

import ctypes
import math
import struct
import threading

from cuda.pathfinder import DynamicLibNotFoundError
from numba import types
from numba.cuda.cudadrv.driver import CudaAPIError, driver

from .arrays import Tensor
from .device import DEFAULT_SHARED_LIMIT, SIMULATOR
from .env import libcuda, setup_error

_SIMULATED_LAUNCH = threading.Lock()
MAX_GRID = (2**31 - 1, 65535, 65535)  # CTAs per grid dimension, every compute capability

# Kernel parameter codes for struct; an array argument is Numba's array struct flattened into
# 5 + 2 * ndim 64-bit parameters: meminfo, parent, nitems, itemsize, data, shape..., strides...
# (bytes). meminfo and parent are host-side bookkeeping that kernels never read: 0.
_SCALAR_CODES = {types.int32: "i", types.int64: "q", types.float32: "f", types.float64: "d"}


class ParameterBlock:
    """A compiled kernel's parameters: ``cuLaunchKernel`` copies each one from the host memory
    its entry of ``kernelParams`` points at, so the layout (natural alignment, as the kernel
    reads it) and the pointers are fixed once and a launch only repacks the values."""

    def __init__(self, argument_types):
        self.types = argument_types
        # per argument: (ndim, itemsize) of an array, None for a number
        self.kinds = tuple((ty.ndim, ty.dtype.bitwidth // 8) if isinstance(ty, types.Array)
                           else None for ty in argument_types)
        fmt, offsets, end = "<", [], 0
        for ty in argument_types:
            if isinstance(ty, types.Array):
                codes = "q" * (5 + 2 * ty.ndim)
            elif ty in _SCALAR_CODES:
                codes = _SCALAR_CODES[ty]
            else:
                raise TypeError(f"launch: no parameter packing for argument type {ty}")
            for code in codes:
                size = struct.calcsize(code)
                pad = -end % size
                fmt += "x" * pad + code
                offsets.append(end + pad)
                end += pad + size
        self.format = struct.Struct(fmt)
        self.buffer = ctypes.create_string_buffer(max(end, 1))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * len(offsets))(*(base + o for o in offsets))
        self.address = ctypes.addressof(self.pointers)  # kernelParams of cuLaunchKernel
        self.lock = threading.Lock()  # one buffer: packing and launching are one step

    def values(self, args):
        """The parameter values of ``args`` and the device ordinal of their arrays."""
        if len(args) != len(self.kinds):
            raise TypeError(f"launch: {len(args)} arguments for {len(self.kinds)} parameters")
        values, device = [], None
        for kind, a in zip(self.kinds, args):
            if kind is None:
                values.append(a)
                continue
            ndim, itemsize = kind
            if not isinstance(a, Tensor) or a.device is None or len(a.shape) != ndim \
                    or a.itemsize != itemsize:
                raise TypeError(f"launch: expected a device array of {ndim} dimensions and "
                                f"{itemsize}-byte elements, got {a!r}")
            values += (0, 0, math.prod(a.shape), itemsize, a.ptr)
            values += a.shape
            values += [s * itemsize for s in a.strides]
            if device is None:
                device = a.device
        return values, device


class Kernel:
    """A compiled kernel: its code library, its parameter block (from the argument types), and
    the dynamic shared memory it is allowed (raised past the default 48 KiB per device)."""

    def __init__(self, library, argument_types, shared_bytes):
        self.library = library
        self.shared_bytes = shared_bytes
        self.parameters = ParameterBlock(argument_types)
        self.functions = {}  # device ordinal -> CUfunction handle

    def function(self, device):
        """The kernel's CUfunction handle (an int) on ``device`` (the current one): Numba loads the module into
        the current context on first use; the shared-memory opt-in is per loaded function."""
        handle = self.functions.get(device)
        if handle is None:
            try:
                cufunc = self.library.get_cufunc()
            except DynamicLibNotFoundError as e:  # NVRTC, nvJitLink: a link the cache did not do
                raise setup_error(e) from None
            if self.shared_bytes > DEFAULT_SHARED_LIMIT:
                from numba.cuda.cudadrv.driver import binding

                attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                driver.cuKernelSetAttribute(attr, self.shared_bytes, cufunc.handle,
                                            cufunc.device.id)
            handle = self.functions[device] = int(cufunc.handle)
        return handle


def launch(kernel, grid, threads, stream, shared_bytes, *args, dependent=False):
    """Launch ``kernel`` (``compiler.compile_kernel``) on ``stream``. Array arguments are
    ``arrays.Tensor`` records, the others plain numbers in the signature's order; ``dependent``:
    as a programmatic dependent of the kernel before it (the module docstring). The simulator
    ignores streams and dependencies and receives the records' views."""
    if SIMULATOR:
        with _SIMULATED_LAUNCH:  # the simulator keeps one launch's state in globals
            kernel[grid, threads, 0, shared_bytes](*(a.view if isinstance(a, Tensor) else a
                                                      for a in args))
        return
    block = kernel.parameters
    values, device = block.values(args)
    _launch_values(kernel, kernel.function(device), grid, threads, int(stream.handle),
                   shared_bytes, values, (), dependent)


class PreparedLaunch:
    """A launch of ``kernel`` with everything fixed but the arrays' data pointers: grid, block,
    shared bytes, every shape, stride and number. A call whose signature (shapes, strides,
    dtypes, device, options) was seen before repeats one of these with its new pointers, in the
    order of the kernel's array arguments, and a stream handle (an int); ``tail`` gives the
    pointers of its last array arguments (a TMA kernel's tensor maps, which follow the inputs'
    addresses: ``KernelSpec.pointer_tail``)."""

    def __init__(self, kernel, grid, threads, shared_bytes, *args):
        block = kernel.parameters
        self.values, device = block.values(args)
        self.kernel, self.function = kernel, kernel.function(device)
        self.grid, self.threads, self.shared_bytes = grid, threads, shared_bytes
        self.slots, at = [], 0  # where each array's data pointer sits among the values
        for kind in block.kinds:
            if kind is not None:
                self.slots.append(at + 4)  # meminfo, parent, nitems, itemsize, data, ...
            at += 1 if kind is None else 5 + 2 * kind[0]

    def __call__(self, stream_handle, *pointers, tail=()):
        pairs = list(zip(self.slots, pointers))
        if tail:
            pairs += zip(self.slots[-len(tail):], tail)
        _launch_values(self.kernel, self.function, self.grid, self.threads, stream_handle,
                       self.shared_bytes, self.values, pairs)


def _launch_values(kernel, function, grid, threads, stream_handle, shared_bytes, values,
                   pointers, dependent=False):
    """Pack ``values`` (with ``pointers``: (slot, address) pairs written in first) into the
    kernel's parameter block and launch."""
    block = kernel.parameters
    gx, gy, gz = tuple(grid) + (1,) * (3 - len(grid))
    with block.lock:
        for slot, ptr in pointers:
            values[slot] = ptr
        block.format.pack_into(block.buffer, 0, *values)
        if dependent and _programmatic_launches():
            config = LaunchConfig(gx, gy, gz, threads, 1, 1, shared_bytes, stream_handle,
                                  ctypes.addressof(_PROGRAMMATIC), 1)
            call = "cuLaunchKernelEx"
            result = _cu_launch_kernel_ex()(ctypes.byref(config), function, block.address, None)
        else:
            call = "cuLaunchKernel"
            result = _cu_launch_kernel()(function, gx, gy, gz, threads, 1, 1, shared_bytes,
                                         stream_handle, block.address, None)
    if result:
        raise CudaAPIError(result, f"{call} of {kernel.library.name!r} failed "
                                   f"(CUresult {result})")


_launch_kernel = []  # libcuda's cuLaunchKernel, once loaded


def _cu_launch_kernel():
    """libcuda's ``cuLaunchKernel`` called through ctypes, ~1 us a call: the CUDA Python
    binding's argument conversions behind Numba's driver wrapper take ~9 us (an H200 host's
    tiny forward spent 12 us of its 54 us of host time in the launch)."""
    if not _launch_kernel:
        fn = libcuda().cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int
        _launch_kernel.append(fn)
    return _launch_kernel[0]


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): an id, padding to 8 bytes, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h), the first argument of ``cuLaunchKernelEx``."""
    _fields_ = [(name, ctypes.c_uint) for name in ("gridDimX", "gridDimY", "gridDimZ",
                                                   "blockDimX", "blockDimY", "blockDimZ",
                                                   "sharedMemBytes")] + [
        ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_PROGRAMMATIC = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
PROGRAMMATIC_DRIVER = 12030  # CUDA 12.3: programmatic launches captured into graphs
_launch_kernel_ex = []
_driver_version = []


def _programmatic_launches():
    """Whether the driver takes programmatic dependent launches everywhere, stream capture
    included (``cuDriverGetVersion`` once)."""
    if not _driver_version:
        version = ctypes.c_int(0)
        libcuda().cuDriverGetVersion(ctypes.byref(version))
        _driver_version.append(version.value)
    return _driver_version[0] >= PROGRAMMATIC_DRIVER


def _cu_launch_kernel_ex():
    """libcuda's ``cuLaunchKernelEx`` through ctypes (a launch with attributes)."""
    if not _launch_kernel_ex:
        fn = libcuda().cuLaunchKernelEx
        fn.argtypes = [ctypes.c_void_p] * 4
        fn.restype = ctypes.c_int
        _launch_kernel_ex.append(fn)
    return _launch_kernel_ex[0]


def check_grid(name, grid):
    """``ValueError`` naming ``name`` when ``grid`` passes CUDA's per-dimension limits."""
    if grid[0] <= MAX_GRID[0] and max(grid[1:], default=0) <= MAX_GRID[1]:
        return  # y and z share one limit
    for extent, limit, axis in zip(grid, MAX_GRID, "xyz"):
        if extent > limit:
            raise ValueError(f"{name}: the problem needs {extent} CTAs in grid {axis}, CUDA "
                             f"allows {limit} (grid {tuple(grid)}); split the call")


def cdiv(a, b):
    return -(-a // b)
