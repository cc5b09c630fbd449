"""Test helpers shared by the suite: device arrays, small inputs of the public calls, poisoning,
and the tolerance rules in docs/design.md."""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def randn(rng, shape, fmt, scale=1.0):
    """Fresh random values in format ``fmt`` (a NumPy host array)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(DTYPES[fmt])


def to_device(x):
    """Host array -> what the library accepts here: NumPy under the simulator, CuPy on a GPU
    (CuPy holds ml_dtypes.bfloat16 arrays; Numba's to_device refuses them), torch for FP8 (CuPy
    has no float8_e4m3fn)."""
    if SIMULATOR:
        return x
    if x.dtype == ml_dtypes.float8_e4m3fn:
        import torch

        return torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    import cupy

    return cupy.asarray(x)


def torch_device(x):
    """A host array as the torch-only calls (quantize_fp8, ...) take it here: NumPy under the
    simulator, a torch CUDA tensor on a GPU."""
    if SIMULATOR:
        return x
    import torch

    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()
    if x.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    return torch.from_numpy(x).cuda()


def to_host(x):
    """Any supported array (NumPy, CuPy, Numba device array, torch) -> NumPy, keeping the dtype."""
    if type(x).__module__.startswith("torch"):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if t.dtype == torch.float8_e4m3fn:
            return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        return t.numpy()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def nan_like(x):
    """A device array shaped like the host array ``x`` and filled with NaN (poisoned output)."""
    return to_device(np.full(x.shape, np.nan, dtype=np.float32).astype(x.dtype))


def qkv(rng, B=1, Sq=5, Sk=6, Hq=2, Hk=1, D=16, fmt="float16"):
    """Random device q (B, Sq, Hq, D) and k, v (B, Sk, Hk, D): small attention inputs."""
    return (to_device(randn(rng, (B, Sq, Hq, D), fmt)), to_device(randn(rng, (B, Sk, Hk, D), fmt)),
            to_device(randn(rng, (B, Sk, Hk, D), fmt)))


def int32_array(x, dtype=np.int32):
    """``x`` as a device array of ``dtype`` (int32 unless a test wants it wrong)."""
    return to_device(np.asarray(x, dtype))


def mla_arguments(rng):
    """Good arguments of a small decode, planned: b 2, s_q 1, h_q 2, h_kv 1, d 16, head_dim_v 8,
    pages of 4 rows."""
    import numba_flash as nf

    seqlens = int32_array([5, 3])
    metadata, num_splits = nf.get_mla_metadata(seqlens, 2, 1, num_sms=2)
    return dict(q=to_device(randn(rng, (2, 1, 2, 16), "float16")),
                k_cache=to_device(randn(rng, (4, 4, 1, 16), "float16")),
                block_table=int32_array([[0, 1], [2, 3]]), cache_seqlens=seqlens, head_dim_v=8,
                tile_scheduler_metadata=metadata, num_splits=num_splits)


def attention_problem(d=64, fmt="float16", causal=False, offset=0, sq=8, heads=(2, 1)):
    """The ``Attention`` problem that validation builds for zero q, k, v of head dim ``d``, each
    a view ``offset`` elements into rows that much wider (offset 1: rows 2 bytes off 16)."""
    from numba_flash import validate

    def view(h):
        wide = np.zeros((1, sq, h, d + offset), DTYPES[fmt])
        return to_device(wide)[..., offset:]

    return validate.attention(view(heads[0]), view(heads[1]), view(heads[1]), causal, None)


def decode_problem(d=576, dv=512, rows=64, page=64, offset=0, fmt="bfloat16"):
    """The ``Decode`` problem that validation builds for one request of one query token whose
    ``rows`` heads share one kv head, pages of ``page`` rows; q and the cache views ``offset``
    elements into rows that much wider."""
    from numba_flash import validate

    q = to_device(np.zeros((1, 1, rows, d + offset), DTYPES[fmt]))[..., offset:]
    cache = to_device(np.zeros((1, page, 1, d + offset), DTYPES[fmt]))[..., offset:]
    return validate.mla_decode(q, cache, int32_array([[0]]), int32_array([1]), dv, None, None,
                               False, None)


def f64(x):
    return to_host(x).astype(np.float32).astype(np.float64)


def assert_close_rule(out, ref, lowp_ref, fmt, factor=2.0, what="out"):
    """The tolerance rule in docs/design.md: max|out - ref| <= factor * max|lowp - ref| + 1e-5
    for 16-bit inputs; 1e-4 relative Frobenius error for float32. The plain computation's
    error is floored at half a unit in the last place of the largest reference value: on tiny
    random problems it can land below the rounding that storing any result in the dtype costs."""
    out = f64(out)
    assert not np.isnan(out).any(), f"{what}: NaN (unwritten or invalid) elements"
    if fmt == "float32":
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= 1e-4, f"{what}: relative error {err:.3g} > 1e-4"
    else:
        err = np.abs(out - ref).max()
        half_ulp = 0.5 * float(ml_dtypes.finfo(DTYPES[fmt]).eps) * np.abs(ref).max()
        bound = factor * max(np.abs(lowp_ref - ref).max(), half_ulp) + 1e-5
        assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def assert_lse(lse, ref, tol=2e-4):
    lse = to_host(lse)
    assert lse.dtype == np.float32
    assert np.array_equal(np.isposinf(lse), np.isposinf(ref)), "lse: +inf rows differ"
    fin = np.isfinite(ref)
    assert np.isfinite(lse[fin]).all(), "lse: non-finite values on rows that see keys"
    err = np.abs(lse[fin] - ref[fin]) / (1 + np.abs(ref[fin]))
    assert err.size == 0 or err.max() <= tol, f"lse: error {err.max():.3g}"


def check_forward(rng, B, Sq, Sk, Hq, Hk, D, causal, fmt, backend, scale=1.0, softmax_scale=None,
                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, learnable_sink=None):
    """Run flash_attn_fwd on fresh random inputs (out poisoned with NaN) and check out and lse
    against the float64 reference with the tolerance rule in docs/design.md (``window_size``:
    the reference masks by ``reference.window_mask``; ``softcap``: it caps its scores;
    ``alibi_slopes``: it adds ``reference.alibi_bias``; ``learnable_sink``: its rows' sums hold
    the sink)."""
    import numba_flash as nf
    from numba_flash import reference as ref

    q, k, v = (randn(rng, s, fmt, scale) for s in ((B, Sq, Hq, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    out = nan_like(q)
    o, lse = nf.flash_attn_fwd(to_device(q), to_device(k), to_device(v), causal=causal,
                               softmax_scale=softmax_scale, backend=backend, out=out,
                               window_size=window_size, softcap=softcap,
                               alibi_slopes=None if alibi_slopes is None else to_device(
                                   alibi_slopes),
                               learnable_sink=None if learnable_sink is None else to_device(
                                   learnable_sink))
    assert o is out
    mask = None if tuple(window_size) == (-1, -1) else ref.window_mask(Sq, Sk, window_size, causal)
    bias = None if alibi_slopes is None else ref.alibi_bias(alibi_slopes, Sq, Sk)
    ro, rl = ref.attention_fwd_ref(q, k, v, causal, softmax_scale, mask, softcap, bias,
                                   learnable_sink)
    assert to_host(o).dtype == q.dtype
    assert_close_rule(o, ro, ref.attention_lowp(q, k, v, causal, softmax_scale, mask, softcap,
                                                bias, learnable_sink), fmt)
    assert_lse(lse, rl)


CCS = ((8, 0), (9, 0))


# What every ptxas note on serialized wgmma says, whichever its reason (C7509 ... C7519).
SERIALIZED = "wgmma.mma_async instructions are serialized"


# The 16-bit format a compile check gives a tile entry, by causality: the two formats change only
# the conversions and the type of the mma instructions, so each entry is compiled once and each
# head dim in both.
FMTS = {False: "float16", True: "bfloat16"}


# nvJitLink before this version (the H200 image's CUDA 13.0) spills a few bytes in some kernels at
# the 254-255 register edge (8 bytes in the D = 128 mma.sync forward and dK/dV tiles for sm_80,
# 20 in the h_q = 16 wgmma decode; the image, 2026-12-03) where 13.5, which the cu13 extra
# installs and CI runs, spills none. There the check accepts such edge spills and nothing else.
ZERO_SPILL_NVJITLINK = (13, 5)
EDGE_REGISTERS, EDGE_SPILL_BYTES = 254, 32


def spill_problem(report, nvjitlink):
    """Why ``report`` fails the spill rule (None when it passes): zero spills, or under an
    nvJitLink older than ZERO_SPILL_NVJITLINK, at most EDGE_SPILL_BYTES from a kernel at
    EDGE_REGISTERS or more."""
    spilled = max(report["spill_stores"], report["spill_loads"])
    if spilled == 0:
        return None
    if (tuple(nvjitlink) < ZERO_SPILL_NVJITLINK and report["registers"] >= EDGE_REGISTERS
            and spilled <= EDGE_SPILL_BYTES):
        return None
    return (f"{report['spill_stores']} bytes of spill stores, {report['spill_loads']} of loads "
            f"at {report['registers']} registers (nvJitLink {'.'.join(map(str, nvjitlink))})")


def assert_compiles_clean(module, configs, must_contain=(), ccs=CCS, must_not_log=(),
                          also=None):
    """Compile the spec of kernel ``module`` (``"simt.forward"``, or ``"simt.backward:DQ"`` for
    a module with several specs) for each ``(config, tile entry)`` of ``configs`` (entry None:
    the table's) and each of ``ccs`` (sm_80 and sm_90) and check each (``assert_jobs_clean``);
    ``also(config)``: instructions that config's PTX must hold besides ``must_contain``."""
    from numba_flash.runtime import ptxcheck

    target = "numba_flash.runtime.ptxcheck:spec_build"
    assert_jobs_clean([(f"{module}{tuple(config)} tiles {entry} {ptxcheck.arch(cc)}",
                        (target, cc, (f"numba_flash.kernels.{module}", list(config),
                                      None if entry is None else list(entry))),
                        tuple(also(config)) if also else ())
                       for config, entry in configs for cc in ccs], must_contain, must_not_log)


def later_samples(spec):
    """``(config, entry)`` of each of ``spec``'s samples but the first, which the registry's
    compile test builds (tests/kernels/test_registry.py): for a kernel's own compile test that
    builds its samples."""
    return [(sample.config, sample.entry) for sample in spec.samples()[1:]]


def assert_jobs_clean(jobs, must_contain=(), must_not_log=()):
    """Compile each ``(name, job)`` of ``jobs`` (a job of ``ptxcheck.compile_reports_isolated``;
    ``(name, job, instructions)`` adds instructions of its own to ``must_contain``) in a child
    process without the simulator, and require no spills (``spill_problem``), no local-memory
    traffic, the given PTX instructions, no wgmma that ptxas serialized (any of its C75xx
    reasons) and none of the given ptxas messages. Every compiled specialization is checked
    before the test fails, and the failure lists them all by name."""
    from cuda.bindings import nvjitlink

    from numba_flash.runtime import ptxcheck

    problems = []
    results = ptxcheck.compile_reports_isolated([job[1] for job in jobs])
    for (ptx, report), (where, _, *extra) in zip(results, jobs):
        spills = spill_problem(report, nvjitlink.version())
        if spills:
            problems.append(f"{where}: {spills}")
        if "ld.local" in ptx or "st.local" in ptx:
            problems.append(f"{where}: local memory")
        problems += [f"{where}: no {instruction}"
                     for instruction in tuple(must_contain) + tuple(*extra)
                     if instruction not in ptx]
        problems += [f"{where}: {message} in\n{report['log']}"
                     for message in must_not_log + (SERIALIZED,) if message in report["log"]]
    assert not problems, "\n".join(problems)


# Prepended to a child's code by ``run_without``: cuda-pathfinder, through which numba-cuda and
# the CUDA bindings load the toolkit's libraries, searches as always but sees none of the
# libraries named in HIDDEN, on disk or loaded, and raises its own error for them. The driver is
# a system library that some versions of the bindings open without cuda-pathfinder (the H200
# image's 13.3): where it loads, the child's driver bindings (numba-cuda's ``binding``, which
# every driver call of numba-cuda and numba_flash goes through) raise at their first call the
# error the bindings raise on a machine without a driver.
_HIDE = """
import cuda.pathfinder._dynamic_libs.load_nvidia_dynamic_lib as _finder

class _Blind:
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        method = getattr(self.loader, name)
        return lambda desc, *a, **k: None if desc.name in HIDDEN else method(desc, *a, **k)

_finder.LOADER = _Blind(_finder.LOADER)
_steps, _canary = _finder.run_find_steps, _finder._try_ctk_root_canary
_finder.run_find_steps = lambda ctx, steps: None if ctx.desc.name in HIDDEN else _steps(ctx, steps)
_finder._try_ctk_root_canary = lambda ctx: None if ctx.desc.name in HIDDEN else _canary(ctx)

if "cuda" in HIDDEN:
    import types as _types
    from cuda.pathfinder import DynamicLibNotFoundError as _NotFound
    from numba.cuda.cudadrv import driver as _driver

    def _no_driver(*args, **kwargs):
        raise _NotFound('"cuda" is an NVIDIA driver library and can only be found via system '
                        'search. Ensure the NVIDIA display driver is installed.')

    class _NoDriver(_types.ModuleType):
        def __getattr__(self, name):
            real = getattr(_BINDING, name)
            return _no_driver if name.startswith("cu") and callable(real) else real

    _BINDING = _driver.binding
    _driver.binding = _NoDriver(_BINDING.__name__)
"""


def run_without(libraries, code, env=None, timeout=300):
    """Run ``code`` in a fresh Python, without Numba's simulator, to which the CUDA
    ``libraries`` (cuda-pathfinder's names: "cuda" is the driver; "cudart", "nvrtc", "nvvm",
    "nvJitLink" the toolkit's) cannot be found: what a machine without them sees, whether this
    one has them (a GPU) or not. Returns the ``subprocess.CompletedProcess``."""
    child_env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    child_env.update(env or {})
    code = f"HIDDEN = {set(libraries)!r}\n{_HIDE}\n{code}"
    return subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True,
                          text=True, timeout=timeout)


def user_traceback(stderr):
    """The frames (``File ...`` lines) of the traceback in ``stderr``, which must be one error
    with no chained cause or context (what the user reads)."""
    assert "During handling" not in stderr and "direct cause" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.lstrip().startswith('File "')]
