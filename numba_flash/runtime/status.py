"""The device status words on the host: one int32 array of one element per device, made on first
use and kept. Kernels set its bits with an atomic OR when they meet a value only the device saw
(``kernels/common/status.report``); ``take`` reads and clears them, synchronizing only when
asked, never on the hot path, and ``check_errors`` names the bits set."""

import threading

import numpy as np
from numba import cuda

from . import arrays, device
from .device import SIMULATOR

BAD_METADATA = 1 << 0       # a metadata row names requests outside the batch
BAD_TABLE_ENTRY = 1 << 1    # a block-table entry inside a sequence is not a page of the cache
PAST_TABLE = 1 << 2         # a length reaches past the block table's columns
BAD_SPLITS = 1 << 3         # num_splits names accumulator slots that do not exist
NEGATIVE_LENGTH = 1 << 4    # a length is negative
BAD_SEQLENS = 1 << 5        # varlen offsets or lengths outside the arrays or past their bounds
BAD_CACHE_INDEX = 1 << 6    # a cache_batch_idx entry is not a row of the cache
BAD_CACHE_LENGTH = 1 << 7   # kvcache: keys past the cache, a left padding outside its sequence
BAD_INDEX = 1 << 8          # sparse decode: an index that is not a cache row, a bad topk_length

MESSAGES = {
    BAD_METADATA: "tile_scheduler_metadata: a row names requests outside the batch "
                  "(its parts were skipped)",
    BAD_TABLE_ENTRY: "block_table: an entry inside a sequence is not a page of the cache "
                     "(k_cache, or the paged k and v; its rows were read as zeros)",
    PAST_TABLE: "cache_seqlens: a length reaches past the block table's columns "
                "(the rows past it were read as zeros)",
    BAD_SPLITS: "num_splits: split counts name accumulator slots that do not exist "
                "(those partial results were dropped)",
    NEGATIVE_LENGTH: "cache_seqlens: a length is negative (read as 0)",
    BAD_SEQLENS: "cu_seqlens_q, cu_seqlens_k or seqused_k: an offset decreases or runs past its "
                 "array, or a length exceeds max_seqlen_q / max_seqlen_k, its sequence or its "
                 "block table (the "
                 "sequence was cut to what lies inside; rows past it were not computed)",
    BAD_CACHE_INDEX: "cache_batch_idx: an entry is not a row of the cache (that sequence "
                     "appended nothing and attended no key)",
    BAD_CACHE_LENGTH: "cache_seqlens, cache_leftpad: the new keys run past the cache, a left "
                      "padding lies outside its sequence, or a query's rotary position lies "
                      "past rotary_cos (cut to the cache, clamped, or the query zeroed)",
    BAD_INDEX: "indices, topk_length: an index is neither -1 nor a row of the cache, or a "
               "length lies outside 0 .. topk (the index was skipped, the length clamped)",
}

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


_unread = {}  # (device, ndim) -> a float32 placeholder over that device's status word


def unread(t, ndim):
    """A float32 array of ``ndim`` dimensions over the status word of ``t``'s device (cached):
    what a kernel takes for an optional float array its configuration never reads, at no host
    cost per call (``arrays.placeholder``)."""
    key = (t.device, ndim)
    view = _unread.get(key)
    if view is None:
        view = _unread[key] = arrays.placeholder(word(t), "float32", ndim)
    return view


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


def check_errors():
    """Raise ``RuntimeError`` naming what the kernels found wrong in values only the device saw
    (metadata, block-table entries, lengths, split counts) since the last call, and clear it.
    The kernels bound every access such a value makes and skip the work it makes invalid; this
    call is how the caller learns of it. It synchronizes each device that ran a decode."""
    found = take()
    if found:
        raise RuntimeError("; ".join(message for flag, message in MESSAGES.items()
                                     if found & flag))
