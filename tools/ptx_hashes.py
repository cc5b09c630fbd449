"""Print the sha256 of the PTX of every sample specialization of the kernels and test kernels.

A change that must leave the code the GPU runs untouched (a move, a rename, a new home for shared
device code) is checked by running this before and after it:

    python tools/ptx_hashes.py > /tmp/before.txt              # on the old tree
    python tools/ptx_hashes.py --check tools/ptx_hashes.txt   # on the new one

The kernels are the registry's specs and the teaching kernel, each with the samples it declares
(``KernelSpec.samples``: a new kernel brings its own). Every specialization is compiled for
sm_80 and sm_90 (sm_90a for the wgmma kernels) in child processes without the simulator, as
``runtime.ptxcheck`` compiles them. Each output line holds a stable key, the hash of the PTX text
as NVVM wrote it and the hash of the same text with its mangled symbol names replaced by their
order of first appearance: Numba mangles a kernel's module path and its closure's contents into
its name, so moving a factory to another module renames the kernel without changing one
instruction. ``--check`` compares the second hash.
"""

import argparse
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's numba_flash, as the children import it (PYTHONPATH)
TEST_KERNELS = ROOT / "tests" / "kernels" / "ptx"


def specializations():
    """``[(key, target, cc, args)]``: ``target`` names a function ``module:function`` (or
    ``file.py:function``) returning ``(pyfunc, signature[, options])`` for ``*args``. The kernels
    are the registry's specs and the teaching kernel, each built from its samples
    (``KernelSpec.samples``, through ``runtime.ptxcheck.sample_jobs``); the test kernels of
    ``tests/kernels/ptx`` follow."""
    from numba_flash.kernels import registry
    from numba_flash.kernels.attention import HALF_FORMATS
    from numba_flash.kernels.simt import forward_rowwise
    from numba_flash.runtime import ptxcheck
    from numba_flash.runtime.spec import SM80, SM90, SM90A

    jobs = []
    for spec in registry.specs() + [forward_rowwise.SPEC]:
        samples = spec.samples()
        if not samples:
            raise ValueError(f"{spec.name}: no samples")
        jobs += [(key, *job) for key, job in ptxcheck.sample_jobs(spec, samples)]

    def test_kernel(key, target, ccs, *args):
        jobs.extend((f"{key} {ptxcheck.arch(cc)}", target, cc, args) for cc in ccs)

    probe = f"{TEST_KERNELS / '_ptx_kernels.py'}:probe"
    for fmt in HALF_FORMATS:
        test_kernel(f"test probe tiles {fmt}", probe, (SM80, SM90), "tiles", fmt)
    test_kernel("test probe conversions", probe, (SM90,), "conversions")
    chain = f"{TEST_KERNELS / '_wgmma_kernels.py'}:chain"
    for args in (("float16", 64, False, 0), ("bfloat16", 128, True, 1)):
        test_kernel(f"test wgmma chain {args}", chain, (SM90A,), *args)
    unique = {}
    for job in jobs:  # a tile entry that two tables share is one specialization
        unique.setdefault(job[0], job)
    return list(unique.values())


_MANGLED = re.compile(r"_Z\w+?(?=_param_\d+\b|\b)")
_SHARED = re.compile(r"_cudapy_smem_\d+")


def normalized(ptx):
    """``ptx`` with every mangled name replaced by ``F<n>`` and every shared array's name by
    ``S<n>``, n its order of first appearance (Numba numbers shared arrays with one counter per
    process, so the names depend on what the process compiled before)."""
    names, arrays = {}, {}
    ptx = _MANGLED.sub(lambda m: names.setdefault(m.group(0), f"F{len(names)}"), ptx)
    return _SHARED.sub(lambda m: arrays.setdefault(m.group(0), f"S{len(arrays)}"), ptx)


def _child(jobs):
    """Child side: compile each ``(key, target, cc, args)`` and print its hashes."""
    from numba_flash.runtime import ptxcheck

    for key, target, cc, args in jobs:
        built = ptxcheck._load_target(target)(*args)
        options = built[2] if len(built) > 2 else {}
        ptx = ptxcheck.compile_ptx(built[0], built[1], cc=tuple(cc), **options)
        raw = hashlib.sha256(ptx.encode()).hexdigest()
        norm = hashlib.sha256(normalized(ptx).encode()).hexdigest()
        print(f"HASH {json.dumps([key, raw, norm])}", flush=True)


def run(jobs, workers):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    shares = [jobs[i::workers] for i in range(workers)]

    def one(share):
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(share)], env=env,
                              capture_output=True, text=True)
        done = [json.loads(line[5:]) for line in proc.stdout.splitlines()
                if line.startswith("HASH ")]
        if proc.returncode != 0 or len(done) != len(share):
            raise RuntimeError(f"compile failed after {len(done)} of {len(share)} jobs:\n"
                               + proc.stderr[-6000:])
        return done

    with ThreadPoolExecutor(workers) as pool:
        results = [r for share in pool.map(one, shares) for r in share]
    return sorted(results)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", metavar="FILE", help="compare against a recorded output")
    parser.add_argument("--only", metavar="TEXT", action="append",
                        help="compile only the keys containing TEXT (repeatable)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(json.loads(args.child))
    jobs = [j for j in specializations() if not args.only or any(t in j[0] for t in args.only)]
    results = run(jobs, max(1, min(args.workers, len(jobs))))
    for key, raw, norm in results:
        print(f"{key} | {raw} | {norm}")
    print(f"# {len(results)} specializations", file=sys.stderr)
    if args.check:
        recorded = {}
        for line in pathlib.Path(args.check).read_text().splitlines():
            if line and not line.startswith("#"):
                key, raw, norm = (x.strip() for x in line.split("|"))
                recorded[key] = (raw, norm)
        got = {key: (raw, norm) for key, raw, norm in results}
        changed = sorted(k for k in got if k in recorded and got[k][1] != recorded[k][1])
        missing = sorted(k for k in set(recorded) - set(got)
                         if not args.only or any(t in k for t in args.only))
        added = sorted(set(got) - set(recorded))
        same_raw = sum(got[k][0] == recorded[k][0] for k in got if k in recorded)
        print(f"# {len(got) - len(added) - len(changed)} identical ({same_raw} byte for byte), "
              f"{len(changed)} changed, {len(missing)} missing, {len(added)} new",
              file=sys.stderr)
        for k in changed + missing:
            print(f"# differs: {k}", file=sys.stderr)
        return 1 if changed or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
