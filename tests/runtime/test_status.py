"""runtime/status.py: one status word per device, made once; ``take`` returns the bits set since
the last take and clears them."""

import numpy as np

from numba_flash.runtime import arrays, status
from helpers import SIMULATOR, to_device


def _array():
    return arrays.adapt(to_device(np.zeros(4, np.float32)), "x")


def _set(word, bits):
    """What a kernel's atomic OR does, from the host."""
    if SIMULATOR:
        word.obj[0] |= bits
    else:
        word.obj.copy_to_device(word.obj.copy_to_host() | bits)


def test_a_device_has_one_word_made_once():
    word = status.word(_array())
    assert status.word(_array()) is word
    assert (word.fmt, word.shape, word.name) == ("int32", (1,), "status")


def test_take_returns_the_bits_set_since_the_last_take_and_clears_them():
    word = status.word(_array())
    assert status.take() == 0
    _set(word, 0b101)
    _set(word, 0b10)
    assert status.take() == 0b111
    assert status.take() == 0
