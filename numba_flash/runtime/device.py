"""Facts of the device a kernel runs on, or of Numba's CUDA simulator standing in for one.

Kernel modules choose their tiles from these facts (shared memory per block and per SM, the
compute capability that decides the instruction family), so a ``Device`` is part of what decides
a kernel's code and is hashable: the kernel cache (``runtime.spec``) keys on it, and two GPUs of
different architectures in one process each get their own build.
"""

from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from cuda.pathfinder import DynamicLibNotFoundError
from numba import config

from .env import setup_error

SIMULATOR = bool(config.ENABLE_CUDASIM)  # Numba chose the simulator when numba.cuda loaded
if SIMULATOR:
    from .simulator import hold_module_swaps, lock_shared_arrays

    lock_shared_arrays()
    hold_module_swaps()

DEFAULT_SHARED_LIMIT = 48 * 1024   # dynamic shared bytes a kernel gets without opting in
SHARED_RESERVED_PER_BLOCK = 1024   # bytes the hardware keeps in every block's shared memory


@dataclass(frozen=True)
class Device:
    """What kernels are planned for: compute capability, SM count, the opt-in dynamic shared
    memory of one block and the shared memory of one SM (bytes; None: not known)."""

    cc: tuple
    sms: int
    shared_per_block: int
    shared_per_sm: int = None


# The simulator has no device to ask: it stands in for a Hopper (so the tc family it emulates is
# the wgmma one) with 8 SMs (the MLA scheduler's default there) and no per-SM limit.
SIMULATED = Device(cc=(9, 0), sms=8, shared_per_block=227 * 1024, shared_per_sm=None)


_planned = []  # the devices of open ``plan_for`` blocks


_by_context = {}  # CUcontext handle -> Device: the contexts Numba has made ready


def current():
    """The ``Device`` calls are planned for: that of the current CUDA context (``SIMULATED``
    under the simulator), or the innermost ``plan_for`` device.

    Every public call asks, so the answer costs one driver call (``cuCtxGetCurrent``) once a
    context has been seen: Numba's ``get_current_device`` takes a lock and makes several
    driver calls whenever the context was made current by another library (torch, CuPy), ~10 us
    of a tiny forward's host time. The first sight of a context goes through Numba, which makes
    it ready for its use (or creates the primary context when none is current). Without a
    driver, every public call stops here with ``CudaSetupError`` before anything is written."""
    if _planned:
        return _planned[-1]
    if SIMULATOR:
        return SIMULATED
    ctx = context()
    dev = None if ctx is None else _by_context.get(int(ctx))
    if dev is None:
        from numba import cuda

        ordinal = cuda.get_current_device().id
        dev = _by_context[int(context())] = _facts(ordinal)
    return dev


def context():
    """The current CUDA context handle, None before anything initialised the driver (no context
    is created). The first call loads the driver: ``CudaSetupError`` where there is none."""
    from numba.cuda.cudadrv.driver import binding

    try:
        return binding.cuCtxGetCurrent()[1]
    except DynamicLibNotFoundError as e:
        raise setup_error(e) from None


@lru_cache(maxsize=None)
def _facts(ordinal):
    from numba import cuda

    dev = cuda.get_current_device()
    assert dev.id == ordinal
    return Device(cc=tuple(dev.compute_capability), sms=dev.MULTIPROCESSOR_COUNT,
                  shared_per_block=dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                  shared_per_sm=dev.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)


@contextmanager
def plan_for(device):
    """Plan calls for ``device`` instead of the real one: kernels, tiles and compiles as that
    device would get them (an sm_80 part's mma.sync forward on a Hopper, whose driver runs
    sm_80 PTX too, or under the simulator). For tests and tuning; not thread-safe."""
    _planned.append(device)
    try:
        yield device
    finally:
        _planned.pop()
