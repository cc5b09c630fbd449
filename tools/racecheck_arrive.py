"""A correct kernel that compute-sanitizer's racecheck reports as racy: the reason its reports on
the seesaw decode (``kernels/tc/mla_decode_seesaw.py``) cannot be read, and the check of whether a
newer racecheck still does it.

    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py both   # hazards: misread
    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py arrive # 0 hazards
    compute-sanitizer --tool racecheck python tools/racecheck_arrive.py sync   # 0 hazards

``arrive``: warpgroup 1 writes shared memory and arrives on named barrier 1 (``bar.arrive 1,
256``), warpgroup 0 waits there (``bar.sync 1, 256``) and reads: racecheck follows that. ``sync``:
warpgroup 0 writes, ``__syncthreads``, warpgroup 1 reads: racecheck follows that too. ``both``:
the first, a ``__syncthreads``, then the second: racecheck 2025.3.1 (H200) reports the second
part's reads as RAW hazards, although a ``__syncthreads`` separates them from the writes. The
seesaw uses ``bar.arrive`` for its hand-offs and ``__syncthreads`` around each piece, and its
hazards under racecheck are all of this kind: each pairs two accesses that a barrier orders.
Exit status 0 when the results are right (checked, so a real race would show here too).
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


@cuda.jit(device=True)
def exchange(sm, out, tid):
    """Warpgroup 0 -> warpgroup 1 through ``__syncthreads``."""
    if tid < 128:
        sm[128 + tid] = tid + 128
    cuda.syncthreads()
    if tid >= 128:
        out[tid] = sm[tid]


@cuda.jit
def kernel(out, parts):
    sm = cuda.shared.array(256, float32)
    tid = cuda.threadIdx.x
    if parts & 1:
        hand_off(sm, out, tid)
    cuda.syncthreads()
    if parts & 2:
        exchange(sm, out, tid)


def main(argv=None):
    which = (sys.argv[1:] if argv is None else argv)[0]
    parts = {"arrive": 1, "sync": 2, "both": 3}[which]
    out = cuda.to_device(np.full(256, np.nan, np.float32))
    kernel[1, 256](out, parts)
    got = out.copy_to_host()
    want = np.arange(256, dtype=np.float32)
    lanes = slice(0, 128) if parts == 1 else slice(128, 256) if parts == 2 else slice(0, 256)
    ok = np.array_equal(got[lanes], want[lanes])
    print(f"{which}: {'right' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
