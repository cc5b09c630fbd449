"""A correct kernel that compute-sanitizer's racecheck reports as racy: the reason its reports on
the seesaw decode (``kernels/tc/mla_decode_seesaw.py``) cannot be read, and the check of whether a
newer racecheck still does it.

    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py both   # hazards: misread
    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py arrive # 0 hazards
    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py sync   # 0 hazards
    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py both-named

``arrive``: warpgroup 1 writes shared memory and arrives on named barrier 1 (``bar.arrive 1,
256``), warpgroup 0 waits there (``bar.sync 1, 256``) and reads: racecheck follows that. ``sync``:
warpgroup 0 writes, ``__syncthreads``, warpgroup 1 reads: racecheck follows that too. ``both``:
the first, a ``__syncthreads``, then the second: racecheck 2025.3.1 (H200) reports the second
part's reads as RAW hazards, although a ``__syncthreads`` separates them from the writes. The
seesaw uses ``bar.arrive`` for its hand-offs and ``__syncthreads`` around each piece, and its
hazards under racecheck are all of this kind: each pairs two accesses that a barrier orders.
``both-named``: ``both`` with every CTA-wide ``__syncthreads`` (``bar.sync 0``) replaced by a
named barrier over all 256 threads (``bar.sync 7, 256``), the same ordering on another of the
CTA's barriers: racecheck 2025.3.1 reports it too (128 hazards against ``both``'s 256, H200), so
moving the seesaw's CTA-wide barriers off barrier 0 would not make it clean. Exit status 0 when
the results are right (checked, so a real race would show here too).
"""

import sys

import numpy as np
from numba import cuda, float32

from numba_flash.kernels.instructions import sync


@cuda.jit(device=True)
def hand_off(sm, out, tid):
    """Warpgroup 1 -> warpgroup 0 through barrier 1 (arrive / sync)."""
    if tid >= 128:
        sm[tid - 128] = tid
        sync.named_arrive(1, 256, tid)
    else:
        sync.named_sync(1, 256, tid)
        out[tid] = sm[tid] - 128


ALL = 7  # the named barrier that stands in for __syncthreads in ``both-named``


@cuda.jit(device=True)
def block_sync(named, tid):
    """Every thread of the CTA: ``__syncthreads``, or named barrier ``ALL`` over all 256."""
    if named:
        sync.named_sync(ALL, 256, tid)
    else:
        cuda.syncthreads()


@cuda.jit(device=True)
def exchange(sm, out, tid, named):
    """Warpgroup 0 -> warpgroup 1 through a CTA-wide barrier."""
    if tid < 128:
        sm[128 + tid] = tid + 128
    block_sync(named, tid)
    if tid >= 128:
        out[tid] = sm[tid]


@cuda.jit
def kernel(out, parts):
    sm = cuda.shared.array(256, float32)
    tid = cuda.threadIdx.x
    named = parts & 4
    if parts & 1:
        hand_off(sm, out, tid)
    block_sync(named, tid)
    if parts & 2:
        exchange(sm, out, tid, named)


def main(argv=None):
    which = (sys.argv[1:] if argv is None else argv)[0]
    parts = {"arrive": 1, "sync": 2, "both": 3, "both-named": 7}[which]
    out = cuda.to_device(np.full(256, np.nan, np.float32))
    kernel[1, 256](out, parts)
    got = out.copy_to_host()
    want = np.arange(256, dtype=np.float32)
    lanes = {1: slice(0, 128), 2: slice(128, 256)}.get(parts, slice(0, 256))
    ok = np.array_equal(got[lanes], want[lanes])
    print(f"{which}: {'right' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
