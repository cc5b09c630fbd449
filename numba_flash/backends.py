"""Which kernels a call runs: the ``backend`` it asked for, resolved on its device and inputs,
then the registry's first kernel of that backend that takes the problem (``kernels/registry.py``).

``auto`` takes the tensor cores for 16-bit inputs on compute capability 8.0 and newer (and under
the simulator, which emulates a Hopper) where their kernels accept the inputs, else the CUDA
cores; an explicit backend that the inputs or the device cannot run is refused with the reason,
never silently replaced.
"""

from .kernels import registry
from .runtime import device
from .runtime.arrays import FP8_FORMATS
from .runtime.device import SIMULATOR

BACKENDS = ("auto", "simt", "tc")
tc_family = registry.tc_family

# Packed query rows per kv head up to which ``auto`` keeps the simt decode: its narrow variant
# splits the keys of one row over the warps and streams the cache at 3.8-4.3 TB/s, 0.98-1.06x
# FlashMLA, where the 64-row tensor-core tile is 63/64 padding (0.92-0.96x). At two rows (s_q 2,
# h_q 1) the tc kernel is ahead, 0.92-0.96x against 0.63-0.68x. Measured on an H200 in one run:
# bench/results/NVIDIA-H200/mla_decode.csv.
SIMT_DECODE_ROWS = 1


def resolve_backend(backend, fmt, dev=None):
    """``auto`` -> ``tc`` for 16-bit inputs on compute capability >= 8.0 and FP8 inputs on 9.0
    (and under the simulator), else ``simt``; an explicit ``tc`` the format or device cannot
    run is refused."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    cc = (dev or device.current()).cc
    tc_ok = (fmt in ("float16", "bfloat16") and (SIMULATOR or cc >= (8, 0))
             or fmt in FP8_FORMATS and (SIMULATOR or tc_family(cc) == "wgmma"))
    if backend == "tc" and not tc_ok:
        raise ValueError(f"backend: 'tc' needs float16 or bfloat16 inputs on compute capability "
                         f">= 8.0 (float8_e4m3fn: 9.0), got {fmt} on {cc}")
    if backend == "auto":
        return "tc" if tc_ok else "simt"
    return backend


def _aligned_or_simt(backend, chosen, aligned, copied, pass_):
    """The tensor-core kernels copy rows in 16-byte chunks: where the ``copied`` views do not
    allow it (``aligned`` False), ``auto`` runs the CUDA-core kernels (which read any view) and
    an explicit ``tc`` is refused, naming the arrays."""
    if chosen != "tc" or aligned:
        return chosen
    if backend == "tc":
        names = ", ".join(t.name for t in copied[:-1]) + " and " + copied[-1].name
        raise ValueError(f"backend: the 'tc' {pass_} copies {names} in 16-byte chunks: their "
                         "data pointers and strides must be multiples of 16 bytes (use 'simt' or "
                         "'auto' for other views)")
    return "simt"


def forward_spec(backend, dev, problem=None):
    """The forward kernel of a resolved ``backend`` on ``dev`` for ``problem`` (an
    ``Attention``; None: a plain one)."""
    return registry.choose("forward", backend, problem, dev).specs[0]


def forward(backend, problem, dev):
    """The forward kernel for the call's ``backend`` and ``problem``."""
    chosen = resolve_backend(backend, problem.fmt, dev)
    chosen = _aligned_or_simt(backend, chosen, problem.aligned(), (problem.q, problem.k, problem.v),
                              "forward")
    return forward_spec(chosen, dev, problem)


def backward_specs(backend, problem, dev):
    """The dK/dV and dQ kernels of a resolved ``backend``: on a Hopper the wgmma ones up to their
    head-dim limit, mma.sync past it and on every other GPU. ``DqSpec.writes_delta`` says
    whether dQ computes D_i itself or the shared preprocess runs first."""
    return registry.choose("backward", backend, problem, dev).specs


def backward(backend, problem, dout, out, dev):
    """The dK/dV and dQ kernels for the call's ``backend``, ``problem`` and adapted ``dout`` and
    ``out`` (a dQ kernel that computes D_i copies ``out`` as well)."""
    chosen = resolve_backend(backend, problem.fmt, dev)
    specs = backward_specs(chosen, problem, dev)
    copied = (dout, out) if specs[1].writes_delta else (dout,)
    aligned = problem.aligned(*copied)
    if _aligned_or_simt(backend, chosen, aligned, (problem.q, problem.k, problem.v, *copied),
                        "backward") != chosen:
        specs = backward_specs("simt", problem, dev)
    return specs


def decode_spec(backend, problem, dev):
    """The decode kernel of ``backend`` for ``problem`` (a ``Decode``), and its spec's config.
    ``auto`` takes a tensor-core decode for 16-bit inputs above SIMT_DECODE_ROWS rows where one
    accepts the problem, else the simt decode; an explicit ``tc`` that none accepts is refused
    with each one's reason."""
    chosen = resolve_backend(backend, problem.fmt, dev)
    if chosen == "tc" and backend == "auto":
        try:
            chosen = "tc" if problem.q_rows > SIMT_DECODE_ROWS else "simt"
            entry = registry.choose("decode", chosen, problem, dev)
        except ValueError:  # auto: the simt decode runs what no tensor-core decode takes
            entry = registry.choose("decode", "simt", problem, dev)
    else:
        entry = registry.choose("decode", chosen, problem, dev)
    return entry.specs[0], entry.config(problem)
