"""The MLA tile scheduler on the device: ``scheduler.plan_mla`` as a one-warp kernel.

What it computes
    The metadata and ``num_splits`` of ``scheduler.plan_mla`` (its docstring has the algorithm
    and the format; that host function stays the reference these are tested against), from the
    lengths in device memory: no copy to the host, no synchronization, so a serving loop can
    capture planning and decoding in one CUDA graph. FlashMLA plans the same way.

Grid / block mapping
    grid = (1,), block = one warp (THREADS = 32). The plan is a sequential walk over parts and
    requests (each part's start depends on where the previous one stopped), so one thread's
    worth of work, but the lengths must first be summed (the budget of a part depends on the
    total): the lanes sum strided lengths and add their partial sums up through shared memory.
    Then every lane walks the requests in the same order with the same numbers (uniform control
    flow, so barriers stay legal), reading the lengths from a shared window of CHUNK requests
    that the lanes refill together when the walk leaves it; lane 0 writes the results.

Shared memory (static)
    CHUNK int32 lengths (8 KiB) + THREADS int64 partial sums.

Limits
    Any batch size (the window slides); lengths are read as ``max(seqlen, 0)`` (the decode,
    which reads every length again, reports a negative one: ``common/paged_kv.py``); ``parts``
    >= 1 rows of metadata (the host computes ``scheduler.num_sm_parts``, which needs no length).
"""

from typing import NamedTuple

from numba import cuda, int32, int64, types

from ... import scheduler
from ...runtime.spec import FixedSpec, Sample

THREADS = 32
CHUNK = 2048  # lengths in the shared window
BLOCK_SHIFT = scheduler.BLOCK_N.bit_length() - 1  # blocks of 64 keys: a shift
assert 1 << BLOCK_SHIFT == scheduler.BLOCK_N
OV = scheduler.FIXED_OVERHEAD_BLOCKS
BEGIN_REQ, END_REQ, BEGIN_BLOCK, END_BLOCK = (scheduler.BEGIN_REQ, scheduler.END_REQ,
                                              scheduler.BEGIN_BLOCK, scheduler.END_BLOCK)
BEGIN_SPLIT, FIRST_SPLIT, LAST_SPLIT = (scheduler.BEGIN_SPLIT, scheduler.FIRST_SPLIT,
                                        scheduler.LAST_SPLIT)


@cuda.jit(device=True, inline="always")
def blocks_of(seqlen):
    """``scheduler.num_blocks`` of one length: a length-0 request still counts one block."""
    return (max(seqlen - 1, 0) >> BLOCK_SHIFT) + 1


def mla_metadata(cache_seqlens, metadata, num_splits, parts):
    window = cuda.shared.array(CHUNK, int32)
    partial = cuda.shared.array(THREADS, int64)
    lane = cuda.threadIdx.x
    b = cache_seqlens.shape[0]

    # The budget of a part: ceil(sum(nb + OV) / parts) + OV.
    total = int64(0)
    for i in range(lane, b, THREADS):
        total += blocks_of(max(cache_seqlens[i], 0)) + OV
    partial[lane] = total
    cuda.syncthreads()
    total = int64(0)
    for i in range(THREADS):
        total += partial[i]
    budget = (total + parts - 1) // parts + OV
    first_nb = blocks_of(max(cache_seqlens[0], 0))
    if lane == 0:
        num_splits[0] = 0

    # The walk of scheduler.plan_mla, every lane alike.
    lo = b  # first request of the window (none loaded yet)
    req = 0
    blk = int64(0)
    piece = 0
    slots = 0
    done_nb = int64(0)  # nb and length of the last request finished (req - 1)
    done_len = 0
    for p in range(parts):
        begin_req = req
        begin_block = blk
        begin_split = piece
        first_cut = blk != 0
        rem = budget
        seqlen = 0
        while req < b:
            if req < lo or req >= lo + CHUNK:  # slide the window to start at req
                cuda.syncthreads()
                lo = req
                for i in range(lane, CHUNK, THREADS):
                    if lo + i < b:
                        window[i] = max(cache_seqlens[lo + i], 0)
                cuda.syncthreads()
            seqlen = window[req - lo]
            left = blocks_of(seqlen) - blk
            if rem >= left + OV:  # the rest of the request fits: take it, move on
                rem -= left + OV
                slots += piece + 1
                if lane == 0:
                    num_splits[req + 1] = slots
                done_nb = blocks_of(seqlen)
                done_len = seqlen
                req += 1
                blk = 0
                piece = 0
            else:
                if rem - OV > 0:  # take what the budget allows; the next part continues
                    blk += rem - OV
                    piece += 1
                break
        if blk > 0:  # stopped inside req
            end_req = req
            end_nb = blocks_of(seqlen)
            end_len = seqlen
            end_block = blk
        else:  # ended on a request boundary (or idle); a length-0 request ends at block 0
            end_req = req - 1
            end_nb = done_nb
            end_len = done_len
            end_block = int64(0) if end_req < 0 or end_len == 0 else end_nb
        last_cut = end_req >= 0 and end_block != end_nb and end_len != 0
        if begin_req == b:  # idle: FlashMLA's begin_block (scheduler.py)
            begin_block = first_nb - 1
        if begin_req == end_req:  # one piece of one request: both flags say "is it cut"
            first_cut = first_cut or last_cut
            last_cut = first_cut
        if lane == 0:
            metadata[p, BEGIN_REQ] = begin_req
            metadata[p, END_REQ] = end_req
            metadata[p, BEGIN_BLOCK] = begin_block
            metadata[p, END_BLOCK] = end_block
            metadata[p, BEGIN_SPLIT] = begin_split
            metadata[p, FIRST_SPLIT] = 1 if first_cut else 0
            metadata[p, LAST_SPLIT] = 1 if last_cut else 0
            metadata[p, 7] = 0


# ----------------------------------------------------------------------------- spec

class Config(NamedTuple):
    pass


class Spec(FixedSpec):
    """(cache_seqlens, metadata, num_splits, parts); grid (1,), one warp."""

    name = "mla_metadata"
    Config = Config
    THREADS = THREADS

    def make(self, config, tiles):
        return mla_metadata

    def samples(self):
        return [Sample("simt mla metadata", ())]

    def signature(self, config):
        i1, i2 = types.Array(types.int32, 1, "A"), types.Array(types.int32, 2, "A")
        return types.void(i1, i2, i1, types.int32)

    def grid(self, config, tiles, p):
        return (1,)

    def arguments(self, config, p):
        return p["cache_seqlens"], p["metadata"], p["num_splits"], p["parts"]


SPEC = Spec()
