"""Before a sparse MLA decode: each query token's list of cache rows, checked and packed.

What it computes
    DeepSeek-V3.2's sparse attention gives every query token its own keys: token ``t`` of
    request ``b`` attends the cache rows ``indices[b, t, :]`` (row = ``page * page_block_size +
    slot``), ``-1`` marking an empty entry, and with ``topk_length`` only the first
    ``topk_length[b]`` entries count. The decode (``mla_decode.py`` and the tensor-core ones)
    runs each token as a request of its own, *virtual request* ``r = b * s_q + t`` with one
    query token, whose key ``n`` is cache row ``packed[r, n]``: this kernel writes the entries
    that name a row of the cache, in their order, to ``packed[r, :n]`` and their number ``n`` to
    ``lengths[r]``. The decode then needs no mask (``paged_kv``'s row lookup with ``SPARSE``
    reads ``packed`` as its table), and a token without a valid entry is a request of length 0
    (``out = 0``, ``lse = +inf``).

    An entry below -1 or at or past ``num_rows`` (the cache's pages times their size) is dropped
    and a ``topk_length`` outside ``0 .. topk`` clamped, each reported in the status word
    (``BAD_INDEX``). Without ``PACK`` (``get_mla_metadata(...,
    topk=...)``) nothing is read: ``lengths[r] = topk``, the lengths a plan for any indices
    assumes (a packed request is never longer).

Grid / block mapping
    grid = (b * s_q,), block = THREADS threads, one CTA per virtual request. Thread ``i`` owns
    the contiguous run of entries ``i * RUN ..`` (``RUN = ceil(topk / THREADS)``): it counts its
    valid entries, the block turns the counts into each thread's first output position (an
    exclusive prefix sum over shared memory, Hillis-Steele: log2 THREADS steps of one add and
    one barrier), and the thread writes its valid entries from there. The order of the entries
    is kept. Shared memory: THREADS int32 (static).

Limits
    Any topk, any number of pages; indices are int32. No access leaves its array: entries are
    read below ``min(topk_length, topk)``, packed entries written below the count.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, int32, types

from ...runtime.device import SIMULATOR
from ...runtime.spec import FixedSpec, Sample
from ..common.status import BAD_INDEX, report

THREADS = 32 if SIMULATOR else 256
LOG_THREADS = THREADS.bit_length() - 1


def make_sparse_indices_kernel(PACK):
    @cuda.jit(device=True, inline="always")
    def usable(entry, num_rows, status):
        """Whether ``entry`` names a cache row: -1 (empty) is silently not, other values
        outside the cache are reported."""
        ok = entry >= 0 and entry < num_rows
        if not ok and entry != -1:
            report(status, BAD_INDEX)
        return ok

    def sparse_indices(indices, topk_length, packed, lengths, status, s_q, num_rows):
        r = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        topk = packed.shape[1]
        if not PACK:
            if tid == 0:
                lengths[r] = topk
            return
        b = r // s_q
        t = r - b * s_q
        n = topk
        if topk_length.shape[0] > 0:
            n = topk_length[b]
            if n < 0 or n > topk:
                n = min(max(n, 0), topk)
                if tid == 0:
                    report(status, BAD_INDEX)
        run = (n + THREADS - 1) // THREADS
        lo = min(tid * run, n)
        hi = min(lo + run, n)

        count = 0
        for i in range(lo, hi):
            if usable(indices[b, t, i], num_rows, status):
                count += 1
        # Exclusive prefix sum of the counts: offsets[i] = sum of counts[j < i].
        offsets = cuda.shared.array(THREADS, int32)
        offsets[tid] = count
        cuda.syncthreads()
        for k in range(LOG_THREADS):
            step = 1 << k
            add = offsets[tid - step] if tid >= step else 0
            cuda.syncthreads()
            offsets[tid] += add
            cuda.syncthreads()
        at = offsets[tid] - count
        if tid == THREADS - 1:
            lengths[r] = offsets[tid]
        for i in range(lo, hi):
            entry = indices[b, t, i]
            if entry >= 0 and entry < num_rows:  # (reported in the first pass)
                packed[r, at] = entry
                at += 1

    return sparse_indices


# ----------------------------------------------------------------------------- spec

class Config(NamedTuple):
    pack: bool = True  # False: only lengths = topk (the plan of get_mla_metadata(topk=...))


class Spec(FixedSpec):
    """(indices (b, s_q, topk), topk_length (b,) or empty, packed (b s_q, topk), lengths
    (b s_q,), status, s_q, num_rows); grid (b s_q,). Without ``pack`` indices and topk_length
    are not read."""

    name = "sparse_indices"
    Config = Config
    THREADS = THREADS

    def make(self, config, tiles):
        return make_sparse_indices_kernel(config.pack)

    def samples(self):
        return [Sample(f"simt sparse indices pack={pack}", (pack,)) for pack in (True, False)]

    def signature(self, config):
        i1, i2 = types.Array(types.int32, 1, "A"), types.Array(types.int32, 2, "A")
        i3 = types.Array(types.int32, 3, "A")
        return types.void(i3, i1, i2, i1, i1, types.int32, types.int32)

    def grid(self, config, tiles, p):
        return (p["lengths"].shape[0],)

    def arguments(self, config, p):
        return (p["indices"], p["topk_length"], p["packed"], p["lengths"], p["status"],
                np.int32(p["s_q"]), np.int32(p["num_rows"]))


SPEC = Spec()
