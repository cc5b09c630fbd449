"""Where kernels run: a real CUDA device, or Numba's CUDA simulator.

The choice must be made before ``numba.cuda`` is first imported, so this module asks the driver
directly through ctypes instead of importing Numba.
"""

import ctypes
import os


_libcuda = []  # the driver library, once loaded


def libcuda():
    """The CUDA driver library (ctypes), or None where it does not load."""
    if not _libcuda:
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
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
