"""Compile kernels to PTX and SASS without a GPU, and read back what the assembler reports.

A kernel that will only ever run on a GPU can still be checked on a machine without one:
Numba's front end and NVVM run without a driver (``compile_ptx``), and nvJitLink
assembles the PTX for a given architecture with ``ptxas``, whose ``-verbose`` log gives the
registers per thread, the stack frame and the bytes spilled to local memory. Spills are the
usual sign that a register array is indexed by a run-time value or that a tile does not fit in
the register file; the tests of the GPU-only kernels assert there are none.

Numba decides between the simulator and the real CUDA target when ``numba.cuda`` is first
imported, so under the simulator (the test suite's mode on machines without a GPU) the checks
run in a child process: ``compile_report_isolated`` names a function by module (or file) and
runs it there with ``NUMBA_ENABLE_CUDASIM=0`` (``compile_reports_isolated`` spreads several
kernels over one child per CPU core, each paying for Numba's import once).

    ptx, report = compile_report(kernel_py_func, signature, cc=(9, 0))
    ptx, report = compile_report_isolated("pkg.module:make_target", cc=(9, 0), args=(...))
    cubin = link_cubin(ptx, cc=(9, 0))  # ELF bytes, for nvdisasm (tools/sass.py)
    [(ptx, report), ...] = compile_reports_isolated([(spec, cc, args), ...])
    [(key, job), ...] = sample_jobs(SPEC)  # a spec's samples as jobs of the call above
    report -> {"registers": 96, "spill_stores": 0, "spill_loads": 0, "stack": 0,
               "smem": 16384, "lmem": 0, "barriers": 1, "functions": {...}, "log": "..."}
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

_PROPERTIES = re.compile(r"Function properties for '?([^\s':]+)'?:?\s*$")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"[Uu]sed (\d+) registers(?:, used (\d+) barriers)?")
_FINAL = re.compile(r"(\d+) stack, (\d+) bytes smem, .* (\d+) bytes lmem")


def arch(cc):
    """The architecture name of compute capability ``cc``: (9, 0) -> sm_90, (9, 0, "a") ->
    sm_90a."""
    return "sm_" + "".join(map(str, cc))


def compile_ptx(pyfunc, signature, cc=(9, 0), **options):
    """PTX text of a kernel for compute capability ``cc``, compiled the way the runtime compiles
    it (``compiler.kernel_library``). ``pyfunc`` is the Python function or a ``@cuda.jit``
    dispatcher (its ``py_func`` is used); ``options``: ``compiler.COMPILE_OPTIONS`` and the
    like."""
    return _library(pyfunc, signature, cc, options).get_asm_str(cc=cc)


def _library(pyfunc, signature, cc, options):
    from numba import config

    if config.ENABLE_CUDASIM:
        raise RuntimeError("compiling PTX needs the real CUDA target: NUMBA_ENABLE_CUDASIM is "
                           "set (use compile_report_isolated)")
    from .compiler import kernel_library

    return kernel_library(getattr(pyfunc, "py_func", pyfunc), signature, cc, options)


def library_report(library, cc, max_registers=0):
    """``(ptx_text, report)`` of a code library as the runtime links it: its PTX through
    ``assemble_report``, or for an ``lto`` library (``compiler.py``) the PTX after link-time
    optimization and the report of a whole-program link of its LTO-IR."""
    if not library._lto:
        ptx = library.get_asm_str(cc=cc)
        return ptx, assemble_report(ptx, cc=cc, max_registers=max_registers)
    ltoir = library.get_ltoir(cc=cc)
    log = _link(ltoir, cc, max_registers, cubin=False, lto=True)
    return library.get_lto_ptx(cc=cc), parse_ptxas_log(log)


def assemble_report(ptx, cc=(9, 0), max_registers=0):
    """Assemble PTX for ``sm_<cc>`` with nvJitLink and parse ptxas' verbose log.

    Returns a dict: ``registers`` (most used by any function), ``spill_stores``,
    ``spill_loads``, ``stack`` (bytes, summed over functions), ``smem``/``lmem`` bytes and
    ``barriers`` of the linked kernel (when the linker reports them), ``functions``
    ({name: {registers, spill_stores, spill_loads, stack, barriers}}) and the raw ``log``.
    """
    return parse_ptxas_log(_link(ptx, cc, max_registers, cubin=False))


def link_cubin(ptx, cc=(9, 0), max_registers=0):
    """The machine code (a cubin, ELF bytes) nvJitLink makes of PTX for ``sm_<cc>``: what
    ``assemble_report`` reports on, for a disassembler (``tools/sass.py``)."""
    return _link(ptx, cc, max_registers, cubin=True)


def _link(ptx, cc, max_registers, cubin, lto=False):
    """nvJitLink on one PTX text (``lto``: LTO-IR): its info log, or with ``cubin`` the linked
    cubin."""
    from cuda.bindings import nvjitlink

    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    flags = ["-arch=" + arch(cc)] + (["-lto"] if lto else [])
    if not cubin:
        flags.append("-verbose")
    if max_registers:
        flags.append(f"-maxrregcount={max_registers}")
    handle = nvjitlink.create(len(flags), flags)
    try:
        kind = nvjitlink.InputType.LTOIR if lto else nvjitlink.InputType.PTX
        nvjitlink.add_data(handle, kind, data, len(data), "kernel")
        try:
            nvjitlink.complete(handle)
        except Exception as exc:
            raise RuntimeError("ptxas failed:\n" + _log(nvjitlink, handle, error=True)) from exc
        if not cubin:
            return _log(nvjitlink, handle, error=False)
        out = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(handle)


def _log(nvjitlink, handle, error):
    size = (nvjitlink.get_error_log_size if error else nvjitlink.get_info_log_size)(handle)
    buf = bytearray(size)
    if size:
        (nvjitlink.get_error_log if error else nvjitlink.get_info_log)(handle, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def parse_ptxas_log(log):
    """The numbers of a ``ptxas -verbose`` / nvJitLink info log (see ``assemble_report``).

    nvJitLink's log holds up to two accounts of each function. ptxas' own lines ("ptxas info :
    Function properties for X", then its stack frame and spill bytes and "Used N registers")
    come first when nvJitLink passes them on; the linker's summary ("info : Function properties
    for 'X':", then one "used N registers, used N barriers, N stack, N bytes smem, ..., N bytes
    lmem" line) comes last. Some logs hold the summary alone (the CUDA 13.0 nvJitLink of the
    H200 image writes it so for some links): then the registers, barriers and stack are the
    summary's, and the spill bytes are its local memory, an upper bound that is 0 exactly when
    nothing spilled (the kernels keep no other local arrays; a register array indexed at run
    time lands there too, which the checks want to see as well)."""
    ptxas, summary = {}, {}
    current = None
    report = {"smem": None, "lmem": None}
    for line in log.splitlines():
        m = _PROPERTIES.search(line)
        if m:
            table = ptxas if line.startswith("ptxas") else summary
            current = table.setdefault(m.group(1), {
                "registers": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0, "barriers": 0})
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current["stack"], current["spill_stores"], current["spill_loads"] = map(
                int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            current["registers"] = int(m.group(1))
            current["barriers"] = int(m.group(2) or 0)
        m = _FINAL.search(line)
        if m and not line.startswith("ptxas"):
            stack, report["smem"], report["lmem"] = map(int, m.groups())
            current["stack"] = stack
            current["spill_stores"] = current["spill_loads"] = report["lmem"]
    functions = ptxas or summary
    if not functions:
        raise ValueError("no function properties in the ptxas log:\n" + log)
    report.update(
        registers=max(f["registers"] for f in functions.values()),
        spill_stores=sum(f["spill_stores"] for f in functions.values()),
        spill_loads=sum(f["spill_loads"] for f in functions.values()),
        stack=sum(f["stack"] for f in functions.values()),
        barriers=max(f["barriers"] for f in functions.values()),
        functions=functions,
        log=log,
    )
    return report


def compile_report(pyfunc, signature, cc=(9, 0), max_registers=0, **options):
    """``(ptx_text, report)`` for a kernel, compiled and assembled as the runtime does
    (``library_report``), under the register cap ``max_registers`` (0: none) it is launched
    with."""
    return library_report(_library(pyfunc, signature, cc, options), cc, max_registers)


def spec_build(module, config, entry=None, device=None):
    """Target for the isolated compiles: ``module.SPEC`` (or ``module:NAME`` for a module with
    several specs) built for ``config`` (a list of the spec's ``Config`` fields) with tile entry
    ``entry`` or the table's entry for ``device`` (``Device`` fields as a dict)."""
    import importlib

    from .device import Device

    where, _, name = module.partition(":")
    spec = getattr(importlib.import_module(where), name or "SPEC")
    config = spec.Config(*config)
    entry = _tuples(entry) if entry is not None else None
    device = Device(**dict(device, cc=tuple(device["cc"]))) if device is not None else None
    return spec.build(config, entry, device)


def sample_jobs(spec, samples=None):
    """``[(key, (target, cc, args))]``: each of ``samples`` (default: ``spec.samples()``, see
    ``runtime.spec.Sample``) for each of its compute capabilities, keyed ``"<label> sm_<cc>"``,
    as a job of ``compile_reports_isolated`` that builds it with ``spec_build``. ``spec`` is a
    kernel module's spec instance."""
    module = sys.modules[type(spec).__module__]
    name = next(n for n, value in vars(module).items() if value is spec)
    where = f"{module.__name__}:{name}"
    jobs = []
    for s in spec.samples() if samples is None else samples:
        device = None if s.device is None else dataclasses.asdict(s.device)
        jobs += [(f"{s.label} {arch(cc)}", ("numba_flash.runtime.ptxcheck:spec_build", cc,
                                           (where, list(s.config), s.entry, device)))
                 for cc in s.ccs]
    return jobs


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


_MODULES = {}


def _load_target(spec):
    """``"pkg.mod:func"`` or ``"/path/to/file.py:func"`` -> the function."""
    where, _, name = spec.rpartition(":")
    if where in _MODULES:
        module = _MODULES[where]
    elif where.endswith(".py"):
        import importlib.util

        path = pathlib.Path(where)
        mod_spec = importlib.util.spec_from_file_location("_ptxcheck_" + path.stem, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, str(path.parent))
        mod_spec.loader.exec_module(module)
    else:
        import importlib

        module = importlib.import_module(where)
    _MODULES[where] = module
    return getattr(module, name)


def _front_end_key(spec, args, cc):
    """Jobs with one key share one code library (Numba's front end, the slow part of a
    compile): the same kernel (target and arguments), and a capability from sm_75 up, where the
    LLVM IR no longer consults it (below, float64 atomics and fastmath tanh differ)."""
    cc = tuple(cc)[:2]
    return spec, json.dumps(args), cc if cc < (7, 5) else None


def _child(jobs_json):
    """Child-process side of ``compile_reports_isolated``: prints one JSON line per job.
    Consecutive jobs of one ``_front_end_key`` are lowered once, and NVVM and ptxas run for each
    capability, as the runtime's own compile for that capability would."""
    from .compiler import kernel_library

    last = None
    for spec, cc, args in json.loads(jobs_json):
        cc = tuple(cc)
        if _front_end_key(spec, args, cc) != last:
            target = _load_target(spec)(*args)
            pyfunc, signature = getattr(target[0], "py_func", target[0]), target[1]
            options = dict(target[2]) if len(target) > 2 else {}
            max_registers = options.pop("max_registers", 0)
            library = kernel_library(pyfunc, signature, cc, options)
            last = _front_end_key(spec, args, cc)
        ptx, report = library_report(library, cc, max_registers)
        print("PTXCHECK-RESULT " + json.dumps({"ptx": ptx, "report": report}), flush=True)


def compile_reports_isolated(jobs, timeout=600):
    """``compile_report`` for several kernels in fresh Python processes with the simulator off,
    one per CPU core (up to one per kernel; each imports Numba once, and the jobs of one kernel
    for several compute capabilities go to the same child, which lowers it once).

    ``jobs`` is a list of ``(spec, cc, args)``. ``spec`` names a function,
    ``"package.module:function"`` or ``"/path/file.py:function"``, which is called with ``*args``
    (JSON-serialisable) in the child and returns ``(pyfunc, signature)`` or ``(pyfunc,
    signature, compile_options)``; it builds its signature there (Numba types do not cross
    processes). Returns a list of ``(ptx_text, report)``, one per job, in the jobs' order.
    """
    jobs = [(str(spec), list(cc), list(args)) for spec, cc, args in jobs]
    env = dict(os.environ)
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    code = "import sys; from numba_flash.runtime import ptxcheck; ptxcheck._child(sys.argv[1])"
    kernels = {}  # front-end key -> indices of its jobs, in the order the keys first appear
    for i, (spec, cc, args) in enumerate(jobs):
        kernels.setdefault(_front_end_key(spec, args, cc), []).append(i)
    kernels = list(kernels.values())
    n = max(1, min(os.cpu_count() or 1, len(kernels)))
    shares = [[i for indices in kernels[c::n] for i in indices] for c in range(n)]

    def run(share):  # a thread per child: each drains its own pipes (the PTX is megabytes)
        return subprocess.run([sys.executable, "-c", code, json.dumps([jobs[i] for i in share])],
                              env=env, capture_output=True, text=True, timeout=timeout)

    with ThreadPoolExecutor(n) as pool:
        procs = list(pool.map(run, shares))
    results = [None] * len(jobs)
    for proc, share in zip(procs, shares):
        done = [json.loads(line[len("PTXCHECK-RESULT "):]) for line in proc.stdout.splitlines()
                if line.startswith("PTXCHECK-RESULT ")]
        if proc.returncode != 0 or len(done) != len(share):
            failed = jobs[share[len(done)]] if len(done) < len(share) else None
            raise RuntimeError("PTX compile failed at job {} (exit {}):\n{}".format(
                failed, proc.returncode, proc.stderr[-8000:]))
        for i, result in zip(share, done):
            results[i] = (result["ptx"], result["report"])
    return results


def compile_report_isolated(spec, cc=(9, 0), args=(), timeout=600):
    """``(ptx_text, report)`` of one kernel compiled in a fresh process with the simulator off
    (see ``compile_reports_isolated`` for ``spec`` and ``args``)."""
    return compile_reports_isolated([(spec, cc, args)], timeout=timeout)[0]
