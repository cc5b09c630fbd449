"""The device status word: how a kernel says that a value only the device could see was bad.

The host checks what it can see before any launch. The MLA decode also reads values that stay in
device memory (the metadata, block-table entries, lengths, split counts): the kernels bound every
index such a value makes, skip the work it makes invalid, and set a bit of a one-word int32
array with an atomic OR, so nothing synchronizes on the hot path. ``numba_flash.check_errors()``
reads and clears the word and names the bits set (``MESSAGES``).
"""

from numba import cuda

BAD_METADATA = 1 << 0       # a metadata row names requests outside the batch
BAD_TABLE_ENTRY = 1 << 1    # a block-table entry inside a sequence is not a page of the cache
PAST_TABLE = 1 << 2         # a length reaches past the block table's columns
BAD_SPLITS = 1 << 3         # num_splits names accumulator slots that do not exist
NEGATIVE_LENGTH = 1 << 4    # a length is negative

MESSAGES = {
    BAD_METADATA: "tile_scheduler_metadata: a row names requests outside the batch "
                  "(its parts were skipped)",
    BAD_TABLE_ENTRY: "block_table: an entry inside a sequence is not a page of k_cache "
                     "(its rows were read as zeros)",
    PAST_TABLE: "cache_seqlens: a length reaches past the block table's columns "
                "(the rows past it were read as zeros)",
    BAD_SPLITS: "num_splits: split counts name accumulator slots that do not exist "
                "(those partial results were dropped)",
    NEGATIVE_LENGTH: "cache_seqlens: a length is negative (read as 0)",
}


@cuda.jit(device=True, inline="always")
def report(status, flag):
    """Set ``flag`` in the status word (one atomic OR; called only on bad input)."""
    cuda.atomic.or_(status, 0, flag)
