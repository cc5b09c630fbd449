"""Print the sha256 of the PTX of every kernel specialization the tests and tile tables use.

A change that must leave the code the GPU runs untouched (a move, a rename, a new home for shared
device code) is checked by running this before and after it:

    python tools/ptx_hashes.py > /tmp/before.txt              # on the old tree
    python tools/ptx_hashes.py --check tools/ptx_hashes.txt   # on the new one

Every specialization is compiled for sm_80 and sm_90 (sm_90a for the wgmma kernels) in child
processes without the simulator, as ``runtime.ptxcheck`` compiles them. Each output line holds
a stable key, the hash of the PTX text as NVVM wrote it and the hash of the same text with its
mangled symbol names replaced by their order of first appearance: Numba mangles a kernel's
module path and its closure's contents into its name, so moving a factory to another module
renames the kernel without changing one instruction. ``--check`` compares the second hash.
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
TEST_KERNELS = ROOT / "tests" / "kernels" / "ptx"
SM80, SM90, SM90A = (8, 0), (9, 0), (9, 0, "a")
A100_SHARED, H100_SHARED = 163 * 1024, 227 * 1024
FMTS16 = ("float16", "bfloat16")


def specializations():
    """``[(key, target, cc, args)]``: ``target`` names a function ``module:function`` (or
    ``file.py:function``) returning ``(pyfunc, signature[, options])`` for ``*args``; kernels
    are built from their specs (``runtime.ptxcheck.spec_build``: module, config, tile entry,
    device)."""
    jobs = []
    build = "numba_flash.runtime.ptxcheck:spec_build"

    def add(key, ccs, module, config, entry=None, device=None):
        for cc in ccs:
            jobs.append((f"{key} sm_{''.join(map(str, cc))}", build, cc,
                         (f"numba_flash.kernels.{module}", config, entry, device)))

    for fmt in ("float16", "bfloat16", "float32"):
        add(f"naive scores {fmt}", (SM80, SM90), "naive:SCORES", [False, fmt])
        add(f"naive output {fmt}", (SM80, SM90), "naive:OUTPUT", [False, fmt])
    for causal in (False, True):
        add(f"naive softmax causal={causal}", (SM80, SM90), "naive:SOFTMAX", [causal, "float32"])

    for d in (64, 128, 256):
        for causal in (False, True):
            for fmt in ("float16", "bfloat16", "float32"):
                add(f"simt fwd d={d} causal={causal} {fmt}", (SM80, SM90), "simt.forward",
                    [d, causal, fmt])
    add("simt fwd d=8 causal=True bfloat16", (SM80, SM90), "simt.forward", [8, True, "bfloat16"])
    add("simt fwd d=72 causal=False bfloat16", (SM80, SM90), "simt.forward",
        [72, False, "bfloat16"])
    for d in (8, 64, 128):
        for causal in (False, True):
            add(f"simt rowwise fwd d={d} causal={causal} float16", (SM80, SM90),
                "simt.forward_rowwise", [d, causal, "float16"])

    for d in (64, 128, 256):
        for kernel in ("dkdv", "dq"):
            for causal in (False, True):
                add(f"simt bwd {kernel} d={d} causal={causal} bfloat16", (SM80, SM90),
                    f"simt.backward:{kernel.upper()}", [d, causal, "bfloat16"])
        add(f"simt bwd dkdv d={d} causal=False float32", (SM80, SM90), "simt.backward:DKDV",
            [d, False, "float32"])
    for fmt in ("float16", "bfloat16", "float32"):
        add(f"simt bwd preprocess d=256 {fmt}", (SM80, SM90), "simt.backward:PREPROCESS",
            [256, False, fmt])

    def gpu(cc, shared):
        return {"cc": list(cc), "sms": 132, "shared_per_block": shared}

    for q_rows in (1, 2, 4, 8, 16, 128):
        for causal in (False, True):
            add(f"simt mla q_rows={q_rows} causal={causal} bfloat16 limit=227K", (SM90,),
                "simt.mla_decode", [q_rows, 576, 512, causal, "bfloat16", True], None,
                gpu(SM90, H100_SHARED))
    for q_rows, causal in ((1, False), (8, True), (128, False)):
        add(f"simt mla q_rows={q_rows} causal={causal} float32 limit=163K", (SM80,),
            "simt.mla_decode", [q_rows, 576, 512, causal, "float32", True], None,
            gpu(SM80, A100_SHARED))
    add("simt mla q_rows=16 causal=False bfloat16 limit=227K unaligned", (SM90,),
        "simt.mla_decode", [16, 576, 512, False, "bfloat16", False], None, gpu(SM90, H100_SHARED))

    for fmt in ("float16", "bfloat16", "float32"):
        add(f"simt mla combine dv=512 {fmt}", (SM80, SM90), "simt.combine", [512, fmt])
        add(f"simt mla combine dv=512 {fmt} programmatic", (SM90,), "simt.combine",
            [512, fmt, True])
    add("simt mla metadata", (SM80, SM90), "simt.mla_metadata", [])
    for tma, copies in ((False, ""), (True, " tma")):  # cache tiles by cp.async or by TMA
        for q_rows, causal, fmt in ((16, False, "bfloat16"), (128, True, "float16")):
            add(f"tc wgmma mla q_rows={q_rows} causal={causal} {fmt}{copies}", (SM90A,),
                "tc.mla_decode_wgmma", [q_rows, 576, 512, causal, fmt, True, tma])
        add(f"tc wgmma mla d=48 dv=23 causal=True bfloat16{copies}", (SM90A,),
            "tc.mla_decode_wgmma", [8, 48, 23, True, "bfloat16", True, tma])
    for q_rows, causal, fmt in ((16, False, "bfloat16"), (128, True, "float16")):
        add(f"tc wgmma mla seesaw q_rows={q_rows} causal={causal} {fmt} tma", (SM90A,),
            "tc.mla_decode_seesaw", [q_rows, 576, 512, causal, fmt, True, True])
    for entry in ((32, 32, 4, 0), (16, 32, 4, 0)):  # the mma.sync decode's table
        for q_rows, causal, fmt in ((16, False, "bfloat16"), (128, True, "float16")):
            add(f"tc mma mla q_rows={q_rows} causal={causal} {fmt} tiles={entry}", (SM80,),
                "tc.mla_decode_mma", [q_rows, 576, 512, causal, fmt, True], entry)
        add(f"tc mma mla d=48 dv=23 causal=True bfloat16 tiles={entry}", (SM80,),
            "tc.mla_decode_mma", [8, 48, 23, True, "bfloat16", True], entry)

    mma = [(64, (128, 64, 4, 0)), (128, (128, 64, 4, 0)), (128, (128, 32, 4, 0)),
           (256, (64, 32, 4, 0)), (16, (32, 16, 2, 0))]
    for d, tiles in mma:
        for causal in (False, True):
            for fmt in FMTS16:
                add(f"tc mma fwd d={d} tiles={tiles} causal={causal} {fmt}", (SM80, SM90),
                    "tc.forward_mma", [d, causal, fmt], list(tiles))
    add("tc mma fwd d=8 causal=True float16", (SM80, SM90), "tc.forward_mma",
        [8, True, "float16"])

    wgmma = [(64, (128, 64, 8, 0)), (128, (128, 128, 8, 0)), (256, (64, 64, 4, 0)),
             (8, (192, 32, 12, 0))]
    for d, tiles in wgmma:
        for causal in (False, True):
            for fmt in FMTS16:
                add(f"tc wgmma fwd d={d} tiles={tiles} causal={causal} {fmt}", (SM90A,),
                    "tc.forward_wgmma", [d, causal, fmt], list(tiles))

    bwd_tiles = [(64, ((64, 64, 4), (64, 64, 4)), ((128, 32, 8), (64, 64, 4))),
                 (128, ((64, 64, 4), (32, 64, 4)), ((128, 64, 8), (64, 64, 4))),
                 (256, ((32, 32, 4), (32, 32, 4)), ((64, 32, 4), (64, 32, 4)))]
    for d, dkdv, dq in bwd_tiles:
        for causal in (False, True):
            for fmt in FMTS16:
                for name, tiles in (("dkdv", dkdv), ("dq", dq)):
                    entry = tiles[int(causal)]
                    add(f"tc mma bwd {name} d={d} tiles={entry} causal={causal} {fmt}",
                        (SM80, SM90), f"tc.backward_mma:{name.upper()}", [d, causal, fmt],
                        list(entry))
    for d, dkdv, dq in ((128, (32, 64, 4), (64, 32, 4)), (256, (16, 32, 4), (32, 16, 2))):
        for name, entry in (("dkdv", dkdv), ("dq", dq)):  # the tiles of 99 KiB blocks
            add(f"tc mma bwd {name} d={d} tiles={entry} causal=True bfloat16", (SM80, SM90),
                f"tc.backward_mma:{name.upper()}", [d, True, "bfloat16"], list(entry))
    for d, causal, fmt in ((8, True, "float16"), (72, False, "bfloat16")):
        for name in ("dkdv", "dq"):
            add(f"tc mma bwd {name} d={d} causal={causal} {fmt}", (SM80, SM90),
                f"tc.backward_mma:{name.upper()}", [d, causal, fmt])

    wgmma_bwd = [(64, ((128, 128), (128, 128)), ((128, 64), (128, 128))),
                 (128, ((64, 128), (64, 64)), ((128, 64), (128, 64)))]
    for d, dkdv, dq in wgmma_bwd:
        for causal in (False, True):
            for fmt in FMTS16:
                for name, tiles in (("dkdv", dkdv), ("dq", dq)):
                    entry = tiles[int(causal)]
                    add(f"tc wgmma bwd {name} d={d} tiles={entry} causal={causal} {fmt}",
                        (SM90A,), f"tc.backward_wgmma:{name.upper()}", [d, causal, fmt],
                        list(entry))

    def test_kernel(key, target, ccs, *args):
        for cc in ccs:
            jobs.append((f"{key} sm_{''.join(map(str, cc))}", target, cc, args))

    probe = f"{TEST_KERNELS / '_ptx_kernels.py'}:probe"
    for fmt in FMTS16:
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
