"""Where kernels run: a real CUDA device, or Numba's CUDA simulator.

The choice must be made before ``numba.cuda`` is first imported, so this module asks the driver
directly through ctypes instead of importing Numba. When a library that a real device needs is
missing, ``setup_error`` says which and what to do about it.
"""

import ctypes
import os
import re


DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")

_libcuda = []  # the driver library, once loaded


def libcuda():
    """The CUDA driver library (ctypes), or None where it does not load."""
    if not _libcuda:
        for name in DRIVER_LIBRARIES:
            try:
                _libcuda.append(ctypes.CDLL(name))
                break
            except OSError:
                continue
        else:
            _libcuda.append(None)
    return _libcuda[0]


def gpu_present():
    """True when libcuda loads and reports at least one device."""
    lib = libcuda()
    if lib is None:
        return False
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


def use_simulator_without_gpu():
    """Turn Numba's CUDA simulator on when no GPU is present (call before importing numba.cuda).

    Returns True when the simulator is (now) in use.
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


class CudaSetupError(RuntimeError):
    """A library that running kernels needs is missing: the CUDA driver, or a library of the
    CUDA toolkit (the runtime, NVRTC, NVVM, nvJitLink)."""


def setup_error(error):
    """The ``CudaSetupError`` to raise (``from None``) for ``error``, a cuda-pathfinder
    ``DynamicLibNotFoundError``: numba-cuda and the CUDA bindings load each library on its first
    use, and the error's own traceback runs through their search. Its message quotes the library
    it did not find ("cuda" for the driver), which decides the advice."""
    named = re.search(r'"([^"]+)"', str(error))
    library = named.group(1) if named else str(error).strip().split("\n")[0]
    if library == "cuda" or library in DRIVER_LIBRARIES:
        return CudaSetupError(
            "no CUDA driver found (the NVIDIA driver library libcuda did not load), so there is "
            "no GPU to run on. To run on Numba's CUDA simulator instead, set "
            "NUMBA_ENABLE_CUDASIM=1 in the environment before Numba is first imported, and pass "
            "NumPy arrays (or CPU torch tensors), which the simulator treats as device memory; "
            "it is slow, so keep shapes tiny.")
    return CudaSetupError(
        f"the CUDA toolkit library {library!r} was not found: numba-cuda needs the toolkit's "
        f"runtime, NVRTC, NVVM and nvJitLink. Install them with the extra of your driver's CUDA "
        f'version (nvidia-smi shows it): pip install "numba_flash[cu13]" for CUDA 13, '
        f'"numba_flash[cu12]" for CUDA 12 (".[cu13]" from a checkout).')
