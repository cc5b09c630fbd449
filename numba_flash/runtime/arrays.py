"""Device-array adapter: CuPy, Numba, torch, any DLPack or CUDA-array-interface producer (JAX,
...) and (under the simulator) NumPy, zero copy.

Every public call turns its array arguments into ``Tensor`` records first. A record keeps the
caller's object, the library it came from, the element format (``float16``, ``bfloat16``,
``float32``, ``float8_e4m3fn`` or ``int32``), the shape, strides in elements, and a *storage view*:
the Numba device array (a NumPy array under the simulator) that kernels receive. 16-bit floats
are viewed as ``uint16`` bits, so one kernel body serves float16 and bfloat16, and FP8 as
``uint8`` bits (kernels/common/formats.py converts). FP8 arrays come as torch tensors (or, under
the simulator, NumPy arrays of ml_dtypes' float8_e4m3fn): CuPy and Numba have no FP8 dtype.
Views share memory with the caller's array: nothing is copied, and strided views (say ``q`` sliced
out of a packed ``qkv`` tensor) keep their strides. Only the last dimension must be contiguous.

Outputs are allocated in the library of a given input and launched on that library's current
stream, so CuPy code gets CuPy arrays back and torch code gets torch tensors on its own stream.
Arrays of other libraries ("foreign": JAX, say) are read through cuda.core's
``StridedMemoryView``, from ``__dlpack__`` (which names the device) or else
``__cuda_array_interface__``; their outputs are allocated as Numba's (NumPy under the simulator)
and handed over by DLPack: to the ``from_dlpack`` of the caller's library when it has one, else
as the ``StridedMemoryView`` itself, which any DLPack consumer takes. Foreign work runs on the
legacy default stream, which the producer is asked to order its pending writes before.

On a GPU, kernels are launched from the record's device pointer, shape and strides
(``launcher.launch`` writes them into the kernel's parameter block), so the Numba device view is
built only when something asks for it (``Tensor.view``: host copies, the simulator, tests). Going
through each library's ``__cuda_array_interface__`` and Numba's ``as_cuda_array`` costs ~25 us
per array, which for the ten arrays of one MLA decode call took longer than the decode kernel
itself (0.46 ms of host time against 0.15 ms on the H200). Views that are built are cached by
descriptor: a view owns no memory and keeps nothing alive, so sharing it is exact.
"""

import ctypes
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np
from numba import cuda

from .device import SIMULATOR

FLOAT_FORMATS = ("float16", "bfloat16", "float32")
FP8_FORMATS = ("float8_e4m3fn",)


@dataclass
class Tensor:
    """One adapted array argument (treated as immutable; not frozen, whose ``__init__`` costs
    ~2x: ten records are built per decode call)."""

    name: str        # argument name, for error messages
    obj: object      # the caller's array
    lib: str         # "cupy" | "torch" | "numba" | "numpy" | "foreign"
    fmt: str         # "float16" | "bfloat16" | "float32" | "int32" | other dtype name
    shape: tuple
    strides: tuple   # in elements
    itemsize: int
    ptr: int         # address of element 0 (device memory; host memory under the simulator)
    device: int      # CUDA device ordinal (None for host memory)
    storage: object  # a ready view (simulator, NumPy, Numba arrays), else None: built from ptr

    @property
    def ndim(self):
        return len(self.shape)

    @cached_property
    def view(self):
        """What kernels receive: a Numba device array over the memory, 16-bit floats as uint16
        bits (a NumPy-backed array under the simulator); None for formats no kernel takes."""
        if self.storage is not None or not _kernel_format(self.fmt):
            return self.storage
        return _device_view(self.ptr, self.device, self.shape,
                            tuple(s * self.itemsize for s in self.strides),
                            _storage_dtype(self.fmt, self.itemsize).str)


def _kernel_format(fmt):
    return fmt in FLOAT_FORMATS or fmt in FP8_FORMATS or fmt == "int32"


def _storage_dtype(fmt, itemsize):
    if fmt in FP8_FORMATS:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if itemsize == 2 else np.dtype(fmt)


_libraries = {}  # array type -> what _library found for it (a property of the type alone)


def _library(x):
    lib = _libraries.get(type(x))
    if lib is None:
        lib = _libraries[type(x)] = _library_of_type(x)
    return lib


def _library_of_type(x):
    mod = type(x).__module__.split(".")[0]
    if mod in ("cupy", "torch", "numpy"):
        return mod
    if getattr(x, "__cuda_ndarray__", False):  # Numba device arrays (simulated ones too)
        return "numba"
    if hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__"):
        return "foreign"
    return None


_torch_formats = {}  # torch dtype -> its name without "torch."


def _torch_format(t):
    fmt = _torch_formats.get(t.dtype)
    if fmt is None:
        fmt = _torch_formats[t.dtype] = str(t.dtype).replace("torch.", "")
    return fmt


def adapt(x, name):
    """Adapt one array argument; ``TypeError`` naming ``name`` if it is not a usable array."""
    lib = _library(x)
    if lib is None:
        raise TypeError(f"{name}: expected a CuPy array, torch CUDA tensor, Numba device array or "
                        f"an object with __dlpack__ or __cuda_array_interface__, "
                        f"got {type(x).__name__}")
    if lib == "numpy" and not SIMULATOR:
        raise TypeError(f"{name}: got a host NumPy array; pass a device array instead "
                        f"(e.g. cupy.asarray({name}) or numba.cuda.to_device({name}))")
    if lib == "torch":
        return _adapt_torch(x, name)
    if lib == "foreign":
        return _adapt_foreign(x, name)
    if lib == "numba" and SIMULATOR:
        host = _sim_device_view(x)
        return _adapt_numpy_like(host, name, "numba", obj=x, view_of=host)
    if lib == "numpy":
        return _adapt_numpy_like(x, name, "numpy", obj=x, view_of=x)
    if lib == "cupy":
        return _adapt_numpy_like(x, name, "cupy", obj=x, view_of=None)
    return _adapt_numpy_like(x, name, "numba", obj=x, view_of=x)


def _sim_device_view(x):
    """The NumPy array behind a simulator device array (it is what simulated kernels index)."""
    return getattr(x, "_ary", x)


def _adapt_numpy_like(x, name, lib, obj, view_of):
    """CuPy arrays (``view_of`` None: device memory by pointer), Numba device arrays and NumPy
    arrays (``view_of``: the array kernels index)."""
    dtype = np.dtype(x.dtype)
    fmt = dtype.name
    itemsize = dtype.itemsize
    shape = tuple(int(s) for s in x.shape)
    strides = tuple(int(s) // itemsize for s in x.strides)
    device = storage = None
    if lib == "cupy":
        ptr, device = x.data.ptr, x.device.id
    elif lib == "numba" and not SIMULATOR:
        ptr = x.__cuda_array_interface__["data"][0]
        device = x.gpu_data.context.device.id if x.gpu_data is not None else None
    else:
        ptr = x.ctypes.data
    if view_of is not None and _kernel_format(fmt):
        bits = _storage_dtype(fmt, itemsize)
        storage = _sim_wrap(view_of.view(bits) if bits != dtype else view_of)
    return Tensor(name, obj, lib, fmt, shape, strides, itemsize, ptr, device, storage)


def _sim_wrap(view):
    """Under the simulator, hand kernels the NumPy memory itself: a plain NumPy argument would be
    copied in and out (and refused when strided)."""
    if SIMULATOR and isinstance(view, np.ndarray):
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(view)
    return view


def _adapt_torch(x, name):
    fmt = _torch_format(x)
    shape = tuple(x.shape)
    strides = x.stride()
    itemsize = x.element_size()
    if x.is_cuda:
        return Tensor(name, x, "torch", fmt, shape, strides, itemsize, x.data_ptr(),
                      x.device.index, None)
    if not SIMULATOR:
        raise TypeError(f"{name}: got a torch tensor on {x.device}; move it to the GPU (.cuda())")
    storage = None
    if _kernel_format(fmt):
        # Kernels read the memory, not the autograd graph (a tensor that requires grad is
        # viewed all the same).
        import torch

        bits = x.detach()
        if itemsize < 4:  # (NumPy has no bfloat16 or FP8: their bits go through ints)
            bits = bits.view(torch.int16 if itemsize == 2 else torch.uint8)
        storage = _sim_wrap(bits.numpy().view(_storage_dtype(fmt, itemsize)))
    return Tensor(name, x, "torch", fmt, shape, strides, itemsize, x.data_ptr(), None, storage)


def _adapt_foreign(x, name):
    """An array of another library, through cuda.core's ``StridedMemoryView`` (zero copy)."""
    from cuda.core.utils import StridedMemoryView

    if hasattr(x, "__dlpack__"):
        # stream 1: the legacy default stream foreign work runs on; -1: host memory, no stream
        view = StridedMemoryView.from_dlpack(x, stream_ptr=-1 if SIMULATOR else 1)
    elif SIMULATOR:
        raise TypeError(f"{name}: under the simulator, {type(x).__name__} (a "
                        f"__cuda_array_interface__ producer) names no host memory; pass a NumPy "
                        f"array or a DLPack producer on the CPU")
    else:
        view = StridedMemoryView.from_cuda_array_interface(x, stream_ptr=0)
    dtype = np.dtype(view.dtype)
    shape = tuple(int(n) for n in view.shape)
    strides = tuple(int(s) for s in view.strides) if view.strides is not None \
        else _contiguous_strides(shape)
    if SIMULATOR:
        if view.is_device_accessible:
            raise TypeError(f"{name}: got device memory under the simulator; pass a host array")
        host = _host_array(view.ptr, shape, strides, dtype)
        return _adapt_numpy_like(host, name, "foreign", obj=x, view_of=host)
    if not view.is_device_accessible:
        raise TypeError(f"{name}: got host memory ({type(x).__name__}); pass a device array")
    return Tensor(name, x, "foreign", dtype.name, shape, strides, dtype.itemsize, int(view.ptr),
                  int(view.device_id), None)


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _host_array(ptr, shape, strides, dtype):
    """A NumPy array over host memory at ``ptr`` (strides in elements, any sign); it owns nothing:
    the caller's object keeps the memory alive for the call."""
    steps = [(n - 1) * s * dtype.itemsize for n, s in zip(shape, strides)]
    lo = sum(step for step in steps if step < 0)
    hi = sum(step for step in steps if step > 0) + dtype.itemsize
    memory = (ctypes.c_byte * (hi - lo)).from_address(ptr + lo)
    return np.ndarray(shape, dtype, buffer=memory, offset=-lo,
                      strides=tuple(s * dtype.itemsize for s in strides))


_views = OrderedDict()  # (pointer, device, shape, byte strides, typestr) -> Numba device array
_views_lock = threading.Lock()
_MAX_VIEWS = 256


def _device_view(ptr, device, shape, strides, typestr):
    """A Numba device array over existing device memory (no owner: the caller's array keeps the
    memory alive for the duration of the call), cached by its descriptor."""
    key = (ptr, device, shape, strides, typestr)
    with _views_lock:  # an LRU update is two steps: no other thread may evict between them
        view = _views.get(key)
        if view is not None:
            _views.move_to_end(key)
            return view
    desc = {"shape": shape, "strides": strides, "typestr": typestr, "data": (ptr, False),
            "version": 3}
    view = cuda.from_cuda_array_interface(desc, owner=None, sync=False)
    with _views_lock:
        _views[key] = view
        if len(_views) > _MAX_VIEWS:
            _views.popitem(last=False)
    return view


def torch_signature(x):
    """What a call's checks and plans read of a torch tensor besides its data pointer (shape,
    strides, dtype, device ordinal: -1 on the CPU), or None for any other array: a call whose
    arrays' signatures were seen before may skip straight to its launch (api.py)."""
    if _library(x) != "torch":
        return None
    return x.shape, x.stride(), x.dtype, x.get_device()


def rows_16_byte_aligned(*tensors):
    """Whether kernels may copy every tensor in 16-byte chunks of its rows (``cp.async``): the
    data pointer, the row length and every stride but the last (1) are multiples of 16 bytes."""
    for t in tensors:  # (loops, not generators: every tc call asks, ~3x cheaper)
        size = t.itemsize
        if t.ptr % 16 or t.shape[-1] * size % 16:
            return False
        for s in t.strides[:-1]:
            if s * size % 16:
                return False
    return True


def batched(t, batch):
    """``t`` seen as ``batch`` copies of itself: shape (batch, *t.shape), the new leading stride
    0, the same memory (varlen kernels index packed rows through such a view, kernels/
    attention.py). Nothing is copied; under the simulator the view is NumPy's."""
    shape, strides = (batch, *t.shape), (0, *t.strides)
    storage = None
    if t.storage is not None and SIMULATOR:
        base = _sim_device_view(t.storage)
        storage = _sim_wrap(np.lib.stride_tricks.as_strided(base, shape, (0, *base.strides)))
    return replace(t, shape=shape, strides=strides, storage=storage)


def strided(t, shape, strides):
    """``t``'s memory seen with another ``shape`` and ``strides`` (elements) that stay inside
    it (the sparse MLA decode's query tokens as requests; a cache given without its head
    axis). Kernels take the view; the caller's object is unchanged."""
    storage = None
    if t.storage is not None and SIMULATOR:
        base = _sim_device_view(t.storage)
        storage = _sim_wrap(np.lib.stride_tricks.as_strided(
            base, shape, tuple(s * base.itemsize for s in strides)))
    return replace(t, shape=tuple(shape), strides=tuple(strides), storage=storage)


def swapped(t, i, j):
    """``t`` with axes ``i`` and ``j`` exchanged, its ``obj`` the library's own view of that
    (torch, CuPy, NumPy; for Numba a device array over the same memory that keeps ``t``'s
    alive): how the sparse MLA decode hands back its lse, FlashMLA's transposed (b, h_q, s_q)."""
    order = list(range(t.ndim))
    order[i], order[j] = order[j], order[i]
    shape = tuple(t.shape[k] for k in order)
    strides = tuple(t.strides[k] for k in order)
    if t.lib == "torch":
        obj = t.obj.transpose(i, j)
    elif t.lib in ("cupy", "numpy"):
        obj = t.obj.swapaxes(i, j)
    elif t.lib == "numba" and SIMULATOR:
        obj = _sim_wrap(_sim_device_view(t.obj).swapaxes(i, j))
    elif t.lib == "numba":
        desc = {"shape": shape, "strides": tuple(s * t.itemsize for s in strides),
                "typestr": numpy_dtype(t.fmt).str, "data": (t.ptr, False), "version": 3}
        obj = cuda.from_cuda_array_interface(desc, owner=t.obj, sync=False)
    else:
        raise TypeError(f"{t.name}: no transposed view for {t.lib} arrays; pass torch, CuPy or "
                        f"Numba arrays")
    storage = None
    if t.storage is not None and SIMULATOR:
        storage = _sim_wrap(_sim_device_view(t.storage).swapaxes(i, j))
    return replace(t, obj=obj, shape=shape, strides=strides, storage=storage)


def placeholder(t, fmt, ndim):
    """``t``'s first element seen as an ``ndim``-dimensional array of ``fmt`` (of ``t``'s item
    size) with every length 1 and every stride 0: what a kernel takes for an optional array
    that its configuration never reads (no allocation, no copy)."""
    shape, strides = (1,) * ndim, (0,) * ndim
    storage = None
    if SIMULATOR:
        base = _sim_device_view(t.storage).reshape(-1)[:1].view(_storage_dtype(fmt, t.itemsize))
        storage = _sim_wrap(np.lib.stride_tricks.as_strided(base, shape, strides))
    return replace(t, fmt=fmt, shape=shape, strides=strides, storage=storage)


def prefix(t, n):
    """The first ``n`` elements of the 1-D ``t`` (a view; ``n = 0``: an empty array a kernel may
    take for an absent optional one)."""
    storage = None
    if t.storage is not None and SIMULATOR:
        storage = _sim_wrap(_sim_device_view(t.storage)[:n])
    return replace(t, shape=(n,), storage=storage)


# ----------------------------------------------------------------------------- output allocation

def empty(like, shape, fmt, name):
    """Allocate an array of ``shape`` and element format ``fmt`` in the library of ``like``."""
    lib = like.lib
    if lib == "torch":
        import torch

        if like.device is not None:  # a fresh CUDA tensor: contiguous, its record known
            obj = torch.empty(shape, dtype=getattr(torch, fmt), device=like.device)
            return Tensor(name, obj, "torch", fmt, tuple(shape), contiguous_strides(shape),
                          obj.element_size(), obj.data_ptr(), like.device, None)
        return _adapt_torch(torch.empty(shape, dtype=getattr(torch, fmt), device=like.obj.device),
                            name)
    dt = numpy_dtype(fmt)
    if lib == "foreign":
        return _foreign_empty(like, shape, dt, name)
    if lib == "cupy":
        import cupy

        obj = cupy.empty(shape, dtype=dt)
        return _adapt_numpy_like(obj, name, "cupy", obj=obj, view_of=None)
    if lib == "numba" and not SIMULATOR:
        obj = cuda.device_array(shape, dtype=dt)
        return _adapt_numpy_like(obj, name, "numba", obj=obj, view_of=obj)
    obj = np.empty(shape, dtype=dt)
    if lib == "numba":
        dev = cuda.to_device(obj)
        return _adapt_numpy_like(obj, name, "numba", obj=dev, view_of=_sim_device_view(dev))
    return _adapt_numpy_like(obj, name, "numpy", obj=obj, view_of=obj)


@lru_cache(maxsize=1024)
def contiguous_strides(shape):
    """Strides in elements of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _foreign_empty(like, shape, dtype, name):
    """An output for a foreign caller: Numba memory (NumPy under the simulator) handed to the
    ``from_dlpack`` of the caller's library, or as a ``StridedMemoryView`` when it has none."""
    from cuda.core.utils import StridedMemoryView

    if dtype.name == "bfloat16":  # NumPy's and cuda.core's DLPack export have no code for it
        raise TypeError(f"{name}: a bfloat16 result cannot be handed to "
                        f"{type(like.obj).__name__}'s library through DLPack; pass a buffer of "
                        f"your own as out= (or torch or CuPy arrays)")
    if SIMULATOR:
        storage = _host_empty_aligned(shape, dtype)
        t = _adapt_numpy_like(storage, name, "foreign", obj=storage, view_of=storage)
        exporter = StridedMemoryView.from_dlpack(storage, stream_ptr=-1)
    else:
        with cuda.gpus[like.device]:
            storage = cuda.device_array(shape, dtype=dtype)
        t = replace(_adapt_numpy_like(storage, name, "numba", obj=storage, view_of=storage),
                    lib="foreign")
        exporter = StridedMemoryView.from_cuda_array_interface(storage, stream_ptr=-1)
    consumer = foreign_consumer(like.obj)
    result = exporter if consumer is None else consumer(exporter)
    shared = consumer is None or StridedMemoryView.from_dlpack(
        result, stream_ptr=-1 if SIMULATOR else 1).ptr == t.ptr  # JAX refuses -1 on a GPU
    if not shared:
        raise RuntimeError(f"{name}: {consumer.__module__}.from_dlpack copied the result "
                           f"instead of sharing its memory")
    return replace(t, obj=result)


HOST_ALIGN = 64  # bytes: XLA's CPU client copies a DLPack buffer that is less aligned than this


def _host_empty_aligned(shape, dtype):
    """A C-contiguous host array on a HOST_ALIGN-byte boundary, so that a CPU library's
    ``from_dlpack`` (JAX's) shares it rather than copying it before the kernel writes."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + HOST_ALIGN, np.uint8)
    start = -raw.ctypes.data % HOST_ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


# The module whose from_dlpack takes arrays back into a library, where it is not the top-level
# module of the library's array type.
_CONSUMER_MODULES = {"jax": "jax.numpy", "jaxlib": "jax.numpy"}


def foreign_consumer(obj):
    """The ``from_dlpack`` of ``obj``'s library, or None when it has none."""
    top = type(obj).__module__.split(".")[0]
    module = sys.modules.get(_CONSUMER_MODULES.get(top, top))
    return getattr(module, "from_dlpack", None)


def numpy_dtype(fmt):
    """NumPy dtype for an element format (bfloat16 and FP8 through ml_dtypes)."""
    if fmt == "bfloat16" or fmt in FP8_FORMATS:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, fmt))
    return np.dtype(fmt)


# ----------------------------------------------------------------------------- streams

_external_streams = {}


def stream_of(t, stream=None):
    """The stream to launch on: ``stream`` if given, else the current stream of ``t``'s library."""
    if SIMULATOR:
        return 0
    if stream is not None:
        return _numba_stream(stream)
    if t.lib == "cupy":
        import cupy

        return _external(cupy.cuda.get_current_stream().ptr)
    if t.lib == "torch":
        import torch

        # The raw cudaStream_t, as Triton asks for it: torch.cuda.current_stream builds a
        # Stream object (~5 us) only to read this number from it.
        return _external(torch._C._cuda_getCurrentRawStream(t.device))
    return cuda.default_stream()


def _numba_stream(stream):
    """Accept a Numba stream, a CuPy / torch stream object, or a raw ``cudaStream_t`` integer."""
    if hasattr(stream, "handle") and hasattr(stream, "synchronize") and not hasattr(stream, "ptr"):
        if type(stream).__module__.startswith("numba"):
            return stream
    for attr in ("ptr", "cuda_stream"):
        if hasattr(stream, attr):
            return _external(int(getattr(stream, attr)))
    if isinstance(stream, int):
        return _external(stream)
    raise TypeError(f"stream: expected a Numba, CuPy or torch stream or an int handle, "
                    f"got {type(stream).__name__}")


def _external(ptr):
    s = _external_streams.get(ptr)
    if s is None:
        s = cuda.default_stream() if ptr == 0 else cuda.external_stream(ptr)
        _external_streams[ptr] = s
    return s
