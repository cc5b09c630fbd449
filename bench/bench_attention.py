"""Attention benchmark: numba_flash against torch SDPA (flash, cuDNN), Triton and naive baselines.

    python bench/bench_attention.py                 # the grid of docs/design.md, forward
    python bench/bench_attention.py --quick         # a small grid
    python bench/bench_attention.py --mode both     # forward and backward
    python bench/bench_attention.py --mode bwd --providers nf-simt,sdpa-flash,triton
    python bench/bench_attention.py --repeats 5     # providers in turn, 5 rounds, medians

Grid (docs/design.md): B * N = 32k tokens, Hq * D = 2048, D in {64, 128}, N in {1k, 4k, 16k}, causal
off/on, float16 and bfloat16. Every provider is first checked against a float64 reference on a
small problem of the same configuration, then timed (CUDA events, median; with --repeats R,
R rounds per point with the providers in turn and the median of the rounds). The table's last
column is the ratio to SDPA's flash backend (FlashAttention-2) in the same run.

Providers (a missing or failing one is left out, with a note):
    nf-simt, nf-tc   numba_flash's CUDA-core and tensor-core backends (nf-tc, and each backward,
                     only where a tiny probe call succeeds)
    nf-tc-cpasync    on a Hopper, the tc forward's cp.async wgmma kernel (forward_wgmma.py) ...
    nf-tc-ws         ... and its warp-specialized one (forward_wgmma_ws.py), each with the other
                     set aside (kernels/registry.py, setting_aside)
    sdpa-flash       torch SDPA, FlashAttention-2 backend; backward through autograd
    sdpa-cudnn       torch SDPA, cuDNN backend; backward through autograd
    triton           bench/triton_kernels/flash_fwd.py and flash_bwd.py (the project's own)
    naive            numba_flash.kernels.naive: S = QK^T, softmax, O = PV through global memory
                     (forward only; points whose B*H*N*N float32 scratch does not fit are skipped)

Backward timings cover only the backward: the forward (and for SDPA the autograd graph, kept
with retain_graph) is computed once outside the timed call. TFLOP/s count 2.5x the forward's
FLOPs. Results: attention_<mode>.csv and attention_<mode>_<dtype>.png (TFLOP/s against N, one
panel per mode / head dim / causal, one line per provider) in bench/results/<gpu>/.
"""

import argparse
import functools
import statistics
import sys

import common

ANCHOR = "sdpa-flash"
MODES = ("fwd", "bwd")
CHECK_SHAPE = (2, 300, 4)  # B, N, H of the correctness check
PROBE_SHAPE = (1, 40, 2, 64)  # B, N, H, D of the availability probe
FWD_ATOL = 2e-2            # max |out - ref|
BWD_RTOL = 3e-2            # max |grad - ref| / max |ref|, over dq, dk, dv
SCRATCH_SHARE = 0.8        # the naive provider may use this share of the free device memory
DEVICE = "cuda"            # where inputs are made (the tests run the script's logic on "cpu")


def _sdpa(backend):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def fwd(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=causal).transpose(1, 2)

    def bwd(q, k, v, dout, causal):
        import torch

        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = fwd(q, k, v, causal)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    return fwd, bwd


def _numba_flash(backend, set_aside=()):
    import numba_flash as nf
    from numba_flash.kernels import registry

    def fwd(q, k, v, causal):
        with registry.setting_aside(*set_aside):
            return nf.flash_attn_func(q, k, v, causal=causal, backend=backend)

    def bwd(q, k, v, dout, causal):
        out, lse = nf.flash_attn_fwd(q, k, v, causal=causal, backend=backend)
        return lambda: nf.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal, backend=backend)

    return fwd, bwd


def _triton():
    fwd_mod, bwd_mod = common.triton_module("flash_fwd"), common.triton_module("flash_bwd")

    def fwd(q, k, v, causal):
        return fwd_mod.flash_fwd(q, k, v, causal=causal)[0]

    def bwd(q, k, v, dout, causal):
        out, lse = fwd_mod.flash_fwd(q, k, v, causal=causal)
        return lambda: bwd_mod.flash_bwd(dout, q, k, v, out, lse, causal=causal)

    return fwd, bwd


def _naive():
    from numba_flash import api

    return lambda q, k, v, causal: api.naive_attention(q, k, v, causal=causal)[0], None


def _works(make_call):
    """Run a tiny probe; None when it works, else the reason."""
    import torch

    try:
        q, k, v, dout = (torch.randn(PROBE_SHAPE, device=DEVICE, dtype=torch.float16)
                         for _ in range(4))
        make_call(q, k, v, dout)
        if DEVICE == "cuda":
            torch.cuda.synchronize()  # asynchronous launch errors surface here
        return None
    except Exception as exc:  # the reason is reported, the provider left out
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def providers_available(modes=("fwd",), names=None):
    """name -> (fwd, bwd) on torch tensors (B, N, H, D): ``fwd(q, k, v, causal) -> out``;
    ``bwd(q, k, v, dout, causal) -> run`` where ``run()`` computes only the backward and returns
    (dq, dk, dv); ``bwd`` is None for a provider without one. A provider whose forward probe
    fails is left out, one whose backward probe fails (when ``modes`` has "bwd") loses its
    ``bwd``; the reasons go to stderr. Only ``names`` are probed (default: every provider; an
    unknown name is left out)."""
    from torch.nn.attention import SDPBackend

    makers = {"nf-simt": lambda: _numba_flash("simt"), "nf-tc": lambda: _numba_flash("tc"),
              "nf-tc-cpasync": lambda: _numba_flash("tc", ("tc.forward_wgmma_ws",)),
              "nf-tc-ws": lambda: _numba_flash("tc", ("tc.forward_wgmma",)),
              "sdpa-flash": lambda: _sdpa(SDPBackend.FLASH_ATTENTION),
              "sdpa-cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION),
              "triton": _triton, "naive": _naive}
    prov = {}
    for name in names or makers:
        if name not in makers:
            continue
        try:
            fwd, bwd = makers[name]()
        except Exception as exc:
            sys.stderr.write(f"provider {name} left out: {type(exc).__name__}: {exc}\n")
            continue
        why = None
        if "fwd" in modes:
            why = _works(lambda q, k, v, dout: fwd(q, k, v, True))
        if why is None and bwd is not None and "bwd" in modes:
            reason = _works(lambda q, k, v, dout: bwd(q, k, v, dout, True)())
            if reason:
                sys.stderr.write(f"provider {name}: no backward ({reason})\n")
                bwd = None
        if why is not None:
            sys.stderr.write(f"provider {name} left out: {why}\n")
            continue
        prov[name] = (fwd, bwd)
    return prov


def _inputs(b, n, h, d, dtype, seed=None):
    import torch

    g = torch.Generator(device=DEVICE)
    if seed is not None:
        g.manual_seed(seed)
    return [torch.randn(b, n, h, d, device=DEVICE, generator=g, dtype=dtype) for _ in range(4)]


def _reference(q, k, v, causal):
    """Float64 attention of torch (B, N, H, D) tensors (square, so the causal alignment of
    numba_flash and of SDPA agree)."""
    import torch

    n = q.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def reference_check(fn, dtype, head_dim, causal, atol=FWD_ATOL):
    """Run forward ``fn`` on a small problem of this configuration against float64.
    Returns (passed, max abs error)."""
    q, k, v, _ = _inputs(*CHECK_SHAPE, head_dim, dtype, seed=0)
    ref = _reference(q.double(), k.double(), v.double(), causal)
    err = (fn(q, k, v, causal).double() - ref).abs().max().item()
    return err <= atol, err


def reference_check_bwd(make_bwd, dtype, head_dim, causal, rtol=BWD_RTOL):
    """Backward ``make_bwd`` on a small problem against float64 autograd. Returns (passed, the
    largest of max|g - ref| / max|ref| over dq, dk, dv)."""
    import torch

    q, k, v, dout = _inputs(*CHECK_SHAPE, head_dim, dtype, seed=0)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    refs = torch.autograd.grad(_reference(q64, k64, v64, causal), (q64, k64, v64), dout.double())
    grads = make_bwd(q, k, v, dout, causal)()
    err = max(((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, refs))
    return err <= rtol, err


def _checked(check, *args):
    """(passed, error, note) of a check, an exception counting as a failure with its reason."""
    try:
        passed, err = check(*args)
        return passed, err, ""
    except Exception as exc:
        return False, float("nan"), f"error: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def time_one(mode, fwd, bwd, q, k, v, dout, causal):
    """Milliseconds of one forward, or of one backward alone (its forward done beforehand)."""
    run = (lambda: fwd(q, k, v, causal)) if mode == "fwd" else bwd(q, k, v, dout, causal)
    return common.time_ms(run)


def time_point(timers, repeats, progress=None):
    """Milliseconds per provider of one point: ``timers`` maps a provider to a function that
    times it once (``time_one``). With ``repeats`` > 1 the providers are timed in turn, round
    after round (``common.rotated``), and each provider reports the median of its rounds."""
    names = list(timers)
    samples = {name: [] for name in names}
    for rnd in range(repeats):
        for name in common.rotated(names, rnd):
            if progress:
                progress(name, rnd)
            samples[name].append(timers[name]())
    return {name: statistics.median(ms) for name, ms in samples.items()}


def naive_scratch_note(b, h, n):
    """Why the naive provider must skip this point (its S/P scratch would not fit), or ''."""
    import torch

    need = 4.0 * b * h * n * n
    free = torch.cuda.mem_get_info()[0]
    if need <= SCRATCH_SHARE * free:
        return ""
    return f"skipped: S/P scratch {need / 2**30:.1f} GiB > {SCRATCH_SHARE:.0%} of free {free / 2**30:.1f} GiB"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fwd", "bwd", "both"], default="fwd")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqlens", default="1024,4096,16384")
    p.add_argument("--causal", choices=["both", "0", "1"], default="both")
    p.add_argument("--providers", default=None, help="comma list; default: all available")
    p.add_argument("--tokens", type=int, default=32768, help="B * N")
    p.add_argument("--hidden", type=int, default=2048, help="Hq * D")
    p.add_argument("--quick", action="store_true", help="fp16, D=64, N in {1k, 4k}")
    p.add_argument("--no-plot", action="store_true", help="write the CSV only")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds per point, providers in turn (rotated each round), median "
                        "reported; default 1")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.quick:
        args.dtypes, args.head_dims, args.seqlens = "float16", "64", "1024,4096"
    args.modes = MODES if args.mode == "both" else (args.mode,)
    args.dtype_names = args.dtypes.split(",")
    args.head_dim_list = [int(d) for d in args.head_dims.split(",")]
    args.seqlen_list = [int(n) for n in args.seqlens.split(",")]
    args.causal_list = [False, True] if args.causal == "both" else [args.causal == "1"]
    args.provider_list = args.providers.split(",") if args.providers else None
    return args


def finish_rows(rows):
    """Add each row's ratio to the anchor provider of the same point (same mode, dtype, D, N,
    causal): anchor time / this time, > 1 = faster than the anchor."""
    point = lambda r: (r["mode"], r["dtype"], r["head_dim"], r["seqlen"], r["causal"])  # noqa: E731
    anchor = {point(r): r["ms"] for r in rows if r["provider"] == ANCHOR}
    for r in rows:
        a = anchor.get(point(r))
        r["vs_" + ANCHOR] = a / r["ms"] if a and r["ms"] == r["ms"] else float("nan")
    return rows


def plot(rows, out, mode):
    """One PNG per dtype (log TFLOP/s axis); returns the paths written."""
    paths = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        sub = [r for r in rows if r["dtype"] == dtype]
        title = f"attention, {dtype}, B*N = {sub[0]['batch'] * sub[0]['seqlen']}"
        # log y: the CUDA-core and the tensor-core providers differ by ~50x
        path = common.plot_panels(out / f"attention_{mode}_{dtype}.png", sub, "seqlen", "tflops",
                                  ["mode", "head_dim", "causal"], "provider", "sequence length N",
                                  "TFLOP/s", title, logy=True)
        if path:
            paths.append(path)
    return paths


def main(argv=None):
    args = parse_args(argv)

    import torch

    available = providers_available(args.modes, args.provider_list)
    names = args.provider_list or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        sys.exit(f"unknown or unavailable providers {unknown}; available: {sorted(available)}")
    by_mode = {m: [n for n in names if m == "fwd" or available[n][1] is not None] for m in args.modes}
    for m, ns in by_mode.items():
        left = [n for n in names if n not in ns]
        if left:
            sys.stderr.write(f"{m}: no backward for {left}\n")
    dtypes = [getattr(torch, d) for d in args.dtype_names]
    points = [(m, dt, d, n, c) for m in args.modes for dt in dtypes for d in args.head_dim_list
              for c in args.causal_list for n in args.seqlen_list]
    out = common.results_dir(args.out_dir)
    path = out / f"attention_{args.mode}.csv"
    # Every configuration is checked (and so compiled: numba_flash and Triton JIT-compile on
    # first use) before anything is timed: a timing taken right after seconds of compilation
    # would find the GPU idle and its clock down.
    configs = list(dict.fromkeys((m, name, dt, d, c) for m, dt, d, n, c in points
                                 for name in by_mode[m]))
    progress = common.Progress(len(configs))
    checked = {}
    for mode, name, dt, d, c in configs:
        progress.step(f"check {mode} {str(dt)[6:]} D={d} causal={int(c)} {name}")
        fwd, bwd = available[name]
        checked[mode, name, dt, d, c] = (_checked(reference_check, fwd, dt, d, c) if mode == "fwd"
                                         else _checked(reference_check_bwd, bwd, dt, d, c))
    progress = common.Progress(args.repeats * sum(len(by_mode[p[0]]) for p in points))
    rows = []
    for mode, dt, d, n, c in points:
        b, h = max(args.tokens // n, 1), args.hidden // d
        q, k, v, dout = _inputs(b, n, h, d, dt)
        flops = common.attention_flops(b, h, n, n, d, c, mode)
        label = f"{mode} {str(dt)[6:]} D={d} N={n} causal={int(c)}"
        timers, point_rows = {}, []
        for name in by_mode[mode]:
            fwd, bwd = available[name]
            passed, err, note = checked[mode, name, dt, d, c]
            row = dict(mode=mode, dtype=str(dt)[6:], head_dim=d, seqlen=n, batch=b, heads=h,
                       causal=int(c), provider=name, correct=int(passed), max_err=err,
                       ms=float("nan"), tflops=float("nan"), note=note)
            if name == "naive":
                row["note"] = row["note"] or naive_scratch_note(b, h, n)
            if passed and not row["note"]:
                timers[name] = functools.partial(time_one, mode, fwd, bwd, q, k, v, dout, c)
            else:
                progress.total -= args.repeats  # nothing to time: no steps to wait for
            point_rows.append(row)
        times = time_point(timers, args.repeats,
                           lambda name, rnd: progress.step(f"{label} {name} ({rnd + 1})"))
        for row in point_rows:
            if row["provider"] in times:
                ms = times[row["provider"]]
                row.update(ms=ms, tflops=flops / ms * 1e-9)
        rows += point_rows
        del q, k, v, dout
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        common.write_csv(path, finish_rows(rows))  # after every point: a cut-short run keeps them
    print(common.format_table(rows, ["mode", "dtype", "head_dim", "seqlen", "causal", "provider",
                                     "correct", "ms", "tflops", "vs_" + ANCHOR, "note"]))
    print(f"wrote {path}")
    if not args.no_plot:
        for p in plot(rows, out, args.mode):
            print(f"wrote {p}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
