"""The compile pipeline: Numba's front end, every loop marked for full unrolling, NVVM.

Kernel modules export *factories*: plain Python functions closed over compile-time constants
(tile sizes, head dim, causal, storage format). ``compile_kernel`` turns one factory output into
a ``launcher.Kernel`` for an explicit signature and compute capability, by the steps
``cuda.jit`` takes plus the project's options: ``max_registers`` (a cap for the assembler),
``unroll_loops`` (``mark_loops_for_unrolling``) and ``lto``: NVVM writes LTO-IR and nvJitLink
compiles the kernel as a whole program. Without it nvJitLink assembles the PTX as a relocatable
unit, and ptxas then ignores ``setmaxnreg`` (C7504: "ignored to maintain compatibility across
compilation units"); the warp-specialized kernels, which move registers between warpgroups with
it, are built this way. ``ptxcheck`` compiles through the same
``kernel_library``, so what the offline checks see is what runs. A kernel compiled with a
``key`` (its spec's name, code key and tiles) goes through the persistent cache (``cache.py``):
loaded from disk when an earlier process compiled it, else compiled and stored.
"""

import logging
import re
import time

from cuda.pathfinder import DynamicLibNotFoundError
from numba import cuda, types

from . import cache
from .device import SIMULATOR
from .env import setup_error
from .launcher import Kernel

log = logging.getLogger("numba_flash")

# Options of every kernel compile. Fast math without its "no infinities / no NaNs" assumptions:
# ``exp2`` still becomes one ``ex2.approx`` ("afn") and multiply-adds fuse ("contract"), while
# the kernels' tests for -inf (rows that see no key yet) cannot be folded away.
COMPILE_OPTIONS = {"fastmath": {"contract", "afn", "arcp", "nsz"}}


def compile_options(max_registers=0, unroll_loops=False, lto=False):
    """COMPILE_OPTIONS plus a register cap (0: the compiler's choice), for kernels whose
    register arrays outgrow the optimizer's unrolling budget ``unroll_loops``, and for those
    that need a whole-program assembly ``lto``."""
    options = dict(COMPILE_OPTIONS)
    if max_registers:
        options["max_registers"] = max_registers
    if unroll_loops:
        options["unroll_loops"] = True
    if lto:
        options["lto"] = True
    return options


def mark_loops_for_unrolling(llvm_ir):
    """``llvm_ir`` with every loop marked ``llvm.loop.unroll.full``: CUDA C++'s ``#pragma
    unroll``, which Numba has no spelling for.

    A register array (``cuda.local.array``) stays in registers only when every index into it is
    a compile-time constant, i.e. when every loop that indexes it is unrolled completely. NVVM
    decides that by a size budget: a loop nest of ~32 ``mma`` is unrolled, one of 64 is not,
    and its arrays go to local memory. The mark makes the unrolling unconditional for every loop
    with a constant trip count; a loop whose count is known only at run time (a kernel's loop
    over key tiles) is left as it is. A loop's back edge is a branch to a block that appears
    earlier in its function; Numba lays the blocks out in source order."""
    lines, seen, loops = [], set(), 0
    first = 1 + max((int(n) for n in re.findall(r"!(\d+)", llvm_ir)), default=0)
    for line in llvm_ir.splitlines():
        if line.startswith("define "):
            seen = set()
        label = re.match(r'^"?([\w.$-]+)"?:', line)
        if label:
            seen.add(label.group(1))
        elif line.lstrip().startswith("br ") and "!llvm.loop" not in line and any(
                target in seen for target in re.findall(r'label %"?([\w.$-]+)"?', line)):
            line += f", !llvm.loop !{first + 1 + loops}"
            loops += 1
        lines.append(line)
    lines.append(f'!{first} = !{{!"llvm.loop.unroll.full"}}')
    lines += [f"!{n} = distinct !{{!{n}, !{first}}}" for n in range(first + 1, first + 1 + loops)]
    return "\n".join(lines)


def argument_types(signature):
    """The argument types of a ``void(...)`` signature or of a tuple of types."""
    return tuple(getattr(signature, "args", signature))


def kernel_library(pyfunc, signature, cc, options=COMPILE_OPTIONS):
    """Numba's front end for a kernel: ``pyfunc`` for ``signature`` as a code library (LLVM IR
    that ``get_asm_str`` turns into PTX with NVVM and ``get_cufunc`` loads)."""
    from numba.cuda.compiler import compile_cuda, kernel_fixup

    options = dict(options)
    unroll = options.pop("unroll_loops", False)
    fastmath = options.pop("fastmath", False)
    cres = compile_cuda(pyfunc, types.void, argument_types(signature), fastmath=fastmath,
                        nvvm_options={"fastmath": fastmath, "opt": 3}, cc=cc,
                        max_registers=options.pop("max_registers", None) or None,
                        lto=options.pop("lto", False), **options)
    library = cres.library
    library._entry_name = cres.fndesc.llvm_func_name
    kernel_fixup(library.get_function(library._entry_name), False)
    if unroll:  # before anything asks for the IR text: the library caches it
        library._llvm_strs = [mark_loops_for_unrolling(ir) for ir in library.llvm_strs]
    return library


def compile_kernel(pyfunc, signature, shared_bytes, cc, options=COMPILE_OPTIONS, key=None):
    """``pyfunc`` compiled for ``signature`` on compute capability ``cc`` with ``options``,
    allowed ``shared_bytes`` of dynamic shared memory. Under the simulator: a simulated kernel.
    With ``key`` = (spec name, code key, tiles) and the cache on, through the disk cache.
    ``CudaSetupError`` names the extra to install where a toolkit library is missing (NVVM loads
    in the front end and the cache key, NVRTC and nvJitLink where the cache links)."""
    if SIMULATOR:
        return cuda.jit(pyfunc)
    types_ = argument_types(signature)
    try:
        entry = (cache.key(*key, types_, options, cc) if key is not None and cache.enabled()
                 else None)
        library = cache.load(entry) if entry is not None else None
        if library is None:
            start = time.perf_counter()
            library = kernel_library(pyfunc, signature, cc, options)
            if entry is not None:
                cache.store(entry, library, cc)
            log.info("numba_flash: compiled %s for sm_%d%d in %.2f s", key[0] if key else
                     pyfunc.__name__, cc[0], cc[1], time.perf_counter() - start)
    except DynamicLibNotFoundError as e:
        raise setup_error(e) from None
    return Kernel(library, types_, shared_bytes)
