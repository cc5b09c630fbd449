"""The device status word: how a kernel says that a value only the device could see was bad.

The host checks what it can see before any launch. The MLA decode and the varlen attention
kernels also read values that stay in device memory (the metadata, block-table entries, lengths,
split counts, sequence offsets): the kernels bound every
index such a value makes, skip the work it makes invalid, and set a bit of a one-word int32
array with an atomic OR, so nothing synchronizes on the hot path. ``numba_flash.check_errors()``
reads and clears the word and names the bits set; the bits and their messages are defined with
the word itself (``runtime/status.py``).
"""

from numba import cuda

from ...runtime.status import (BAD_CACHE_INDEX, BAD_CACHE_LENGTH, BAD_INDEX,  # noqa: F401
                               BAD_METADATA, BAD_SEQLENS, BAD_SPLITS, BAD_TABLE_ENTRY,
                               NEGATIVE_LENGTH, PAST_TABLE)


@cuda.jit(device=True, inline="always")
def report(status, flag):
    """Set ``flag`` in the status word (one atomic OR; called only on bad input)."""
    cuda.atomic.or_(status, 0, flag)
