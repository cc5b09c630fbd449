"""Start-up costs, each in a new process: ``import numba_flash``, and the first call of one
configuration with an empty compile cache (cold: Numba, NVVM and the linker run) and again with
the cache that the cold run filled (warm: the kernels are loaded from disk).

    python bench/first_call.py                          # forward, D = 128, causal, fp16
    python bench/first_call.py --call bwd --head-dim 64 --repeat 3

The cache lives in a temporary directory (``NUMBA_FLASH_CACHE_DIR``), so the user's cache is
neither read nor written. The first call includes what every first call pays besides the
kernels: Numba's import and the CUDA context; ``--repeat`` takes the lowest of several warm runs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
start = time.perf_counter()
import numba_flash as nf
imported = time.perf_counter() - start
import numpy as np
from numba import cuda
call, d, causal = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
shape = (1, 128, 8, d)
q = cuda.to_device(np.zeros(shape, np.float16))
cuda.synchronize()
start = time.perf_counter()
out, lse = nf.flash_attn_fwd(q, q, q, causal=causal)
if call == "bwd":
    nf.flash_attn_bwd(q, q, q, q, out, lse, causal=causal)
cuda.synchronize()
print(json.dumps(dict(import_s=imported, first_call_s=time.perf_counter() - start)))
"""


def run(args, cache_dir):
    env = dict(os.environ, NUMBA_FLASH_CACHE_DIR=cache_dir, NUMBA_FLASH_CACHE="1")
    out = subprocess.run([sys.executable, "-c", CHILD, args.call, str(args.head_dim),
                          str(int(args.causal))], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--call", choices=("fwd", "bwd"), default="fwd",
                        help="fwd: flash_attn_fwd; bwd: the forward then flash_attn_bwd")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="warm runs (the lowest is kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = run(args, cache_dir)
        warm = min((run(args, cache_dir) for _ in range(args.repeat)),
                   key=lambda r: r["first_call_s"])
    print(f"{args.call}, D = {args.head_dim}, causal = {bool(args.causal)}, fp16")
    print(f"import numba_flash      {warm['import_s'] * 1e3:8.1f} ms")
    print(f"first call, cold cache  {cold['first_call_s']:8.3f} s")
    print(f"first call, warm cache  {warm['first_call_s']:8.3f} s")


if __name__ == "__main__":
    main()
