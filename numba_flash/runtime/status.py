"""The device status words on the host: one int32 array of one element per device, made on first
use and kept. Kernels set its bits with an atomic OR when they meet a value only the device saw
(which bits mean what is the kernels' business: kernels/common/status.py); ``take`` reads and
clears them, synchronizing only when asked, never on the hot path."""

import threading

import numpy as np
from numba import cuda

from . import arrays, device
from .device import SIMULATOR

_words = {}  # device ordinal -> (the word: an int32 device array of 1, its Tensor)
_lock = threading.Lock()


def word(t):
    """The status word of the device ``t`` lives on (a ``Tensor``, a kernel argument)."""
    entry = _words.get(t.device)
    if entry is None:
        with _lock:
            entry = _words.get(t.device)
            if entry is None:
                if SIMULATOR:
                    array = np.zeros(1, np.int32)
                else:
                    with cuda.gpus[t.device]:
                        array = cuda.to_device(np.zeros(1, np.int32))
                entry = _words[t.device] = (array, arrays.adapt(array, "status"))
    return entry[1]


def take():
    """The bits set in any device's word since the last call, cleared there: each device that
    has a word is synchronized first. Without a driver: ``CudaSetupError``."""
    if not SIMULATOR:
        device.context()  # without a driver: CudaSetupError, not "nothing found"
    found = 0
    for ordinal, (array, _) in list(_words.items()):
        if SIMULATOR:
            found |= int(array[0])
            array[0] = 0
            continue
        with cuda.gpus[ordinal]:
            cuda.synchronize()
            value = int(array.copy_to_host()[0])
            if value:
                array.copy_to_device(np.zeros(1, np.int32))
                cuda.synchronize()
        found |= value
    return found
