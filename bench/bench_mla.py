"""Paged MLA decode benchmark: numba_flash, the project's Triton kernel and a torch baseline.

    python bench/bench_mla.py              # b=128, s_q in {1, 2}, h_q in {16, 128}, seqlen 4k..32k
    python bench/bench_mla.py --quick      # s_q=1, h_q=128, seqlen {4k, 8k}
    python bench/bench_mla.py --providers nf-simt,triton --varlen
    FLASHMLA_DIR=.flashmla python bench/bench_mla.py --heads-q 1,16,32,64,128   # + FlashMLA
    python bench/bench_mla.py --repeats 3  # each point on 3 fresh caches, medians and spread

Grid (docs/design.md): b = 128 sequences, h_kv = 1, d = 576 (512 latent + 64 rope), dv = 512, pages
of 64 rows, bfloat16, causal for s_q > 1. The block table is a random permutation of the pages,
seeded by the round: round r of every run places the pages alike, so two trees timed in turn see
the same layouts. With --varlen the lengths are drawn uniformly from [seqlen/2, 3 seqlen/2] (the
mean is what the formulas use). Every provider is first checked against
numba_flash.reference.mla_decode_ref (float64) on a small problem with ragged lengths, then
timed (CUDA events, median). With --repeats R each point is timed in R rounds, each on a freshly
allocated cache with its own permutation and the providers in turn (common.rotated): where the
pages land and how the clock drifts show in ms_min and ms_max, and ms is the median of the
rounds.

Providers (a missing or failing one is left out, with a note):
    nf-simt, nf-tc   numba_flash.get_mla_metadata (once, untimed) + flash_mla_with_kvcache
    nf-mma           nf-tc's mma.sync kernel (kernels/tc/mla_decode_mma.py, the sm_80-89 build)
                     planned as for an A100 (163 KiB per block) on the GPU at hand
    flashmla         DeepSeek's FlashMLA (sm_90a, bf16, page 64), built on the GPU machine from
                     the folder FLASHMLA_DIR names (a copy of the benchmark-only build the GPU
                     machine provides; nothing of it is in this repo); its first call plans,
                     later calls reuse its metadata, which is compared with ours (printed:
                     columns 0-6 and num_splits; FlashMLA leaves column 7 unwritten)
    triton           bench/triton_kernels/mla_decode.py (split-KV + combine)
    torch            gather the pages (k_cache[block_table]), einsum, masked softmax, einsum

Columns: ms (the median over the rounds; ms_min, ms_max and rounds beside it), TB/s = the
fewest bytes a decode must move (q, the cache, out once each; common.mla_decode_bytes) over the
time; TFLOP/s (common.mla_decode_flops); vs_copy = TB/s over
the device-to-device copy bandwidth measured in the same run (a large torch copy, bytes read +
written); vs_flashmla = time of FlashMLA over the provider's at the same point (> 1: faster
than FlashMLA). Results: mla_decode.csv and mla_decode.png (TB/s against seqlen, one panel per
(s_q, h_q), one line per provider, the copy bandwidth dashed) in bench/results/<gpu>/.
"""

import argparse
import statistics
import sys

import common

DEVICE = "cuda"  # the tests run the script's logic on "cpu"
COPY_BYTES = 2 << 30  # source size of the copy-bandwidth measurement (well above L2)
CHECK_SEQLENS = (1000, 77, 300, 64)  # the correctness check's ragged lengths
ATOL = 2e-2  # max |out - ref| and |lse - ref|


# ----------------------------------------------------------------------------- inputs

def make_inputs(b, s_q, h_q, h_kv, d, page, seqlens, dtype, seed=None):
    """q, a k_cache holding exactly the pages the sequences use (shuffled), the block table and
    int32 lengths. ``seqlens`` is a list of b ints."""
    import torch

    g = torch.Generator(device=DEVICE)
    if seed is not None:
        g.manual_seed(seed)
    pages = [max(-(-n // page), 1) for n in seqlens]
    order = torch.randperm(sum(pages), generator=g, device=DEVICE).to(torch.int32)
    table = torch.zeros(b, max(pages), dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(pages):
        table[i, :n] = order[start:start + n]
        start += n
    k_cache = torch.randn(sum(pages), page, h_kv, d, generator=g, device=DEVICE).to(dtype)
    q = torch.randn(b, s_q, h_q, d, generator=g, device=DEVICE).to(dtype)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    return q, k_cache, table, lens


def draw_seqlens(b, seqlen, varlen, seed=0):
    if not varlen:
        return [seqlen] * b
    import random

    rng = random.Random(seed)
    return [rng.randint(seqlen // 2, seqlen * 3 // 2) for _ in range(b)]


# ----------------------------------------------------------------------------- providers

def torch_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, causal):
    """The baseline: gather every sequence's pages into one dense tensor, then two einsums
    around a float32 masked softmax. Returns (out, lse) like flash_mla_with_kvcache."""
    import torch

    b, s_q, h_q, d = q.shape
    _, page, h_kv, _ = k_cache.shape
    group = h_q // h_kv
    kv = k_cache[block_table.long()].reshape(b, -1, h_kv, d)  # (b, keys, h_kv, d)
    qg = q.reshape(b, s_q, h_kv, group, d)
    s = torch.einsum("btkgd,bnkd->bkgtn", qg, kv).float() * d ** -0.5
    keys = torch.arange(kv.shape[1], device=q.device)
    visible = cache_seqlens.long()[:, None]  # (b, s_q): keys < visible
    if causal:
        visible = visible - (s_q - 1 - torch.arange(s_q, device=q.device))[None, :]
    else:
        visible = visible.expand(b, s_q)
    mask = keys[None, None, :] < visible[:, :, None]  # (b, s_q, keys)
    s = s.masked_fill(~mask[:, None, None], float("-inf"))
    lse = torch.logsumexp(s, -1)  # (b, h_kv, group, s_q)
    p = torch.softmax(s, -1).to(q.dtype)
    out = torch.einsum("bkgtn,bnkd->btkgd", p, kv[..., :head_dim_v])
    return out.reshape(b, s_q, h_q, head_dim_v), lse.reshape(b, h_q, s_q)


def _numba_flash(backend):
    import numba_flash as nf

    def prepare(q, k_cache, table, lens, dv, causal):
        h_kv = k_cache.shape[2]
        meta, splits = nf.get_mla_metadata(lens, q.shape[1] * q.shape[2] // h_kv, h_kv)
        return lambda: nf.flash_mla_with_kvcache(q, k_cache, table, lens, dv, meta, splits,
                                                 causal=causal, backend=backend)

    return prepare


def _flashmla():
    import os

    path = os.environ.get("FLASHMLA_DIR")
    if not path:
        raise RuntimeError("FLASHMLA_DIR is not set")
    sys.path.insert(0, os.path.abspath(path))
    from build import load_flashmla

    fm = load_flashmla()

    def prepare(q, k_cache, table, lens, dv, causal):
        scale = q.shape[-1] ** -0.5
        _, _, meta, splits = fm.dense_decode_fwd(q, k_cache, dv, lens, table, scale, causal,
                                                 None, None)
        _compare_metadata(meta, splits, lens, q.shape[1] * q.shape[2] // k_cache.shape[2],
                          k_cache.shape[2])
        return lambda: tuple(fm.dense_decode_fwd(q, k_cache, dv, lens, table, scale, causal,
                                                 meta, splits)[:2])

    return prepare


_compared = set()


def _compare_metadata(meta, splits, lens, q_rows, h_kv):
    """Print once per (batch, rows) whether numba_flash plans exactly as FlashMLA did (columns
    0-6 of the metadata and num_splits; FlashMLA leaves its padding column 7 unwritten)."""
    import numba_flash as nf

    key = (tuple(lens.tolist()), q_rows)
    if key in _compared:
        return
    _compared.add(key)
    ours = nf.get_mla_metadata(lens, q_rows, h_kv)
    same = all(a.shape == b.shape and bool((a.cpu() == b.cpu()).all())
               for a, b in ((ours[0][:, :7], meta[:, :7]), (ours[1], splits)))
    print(f"metadata identical to FlashMLA's (b={len(key[0])}, rows={q_rows}): {same}")


def _triton():
    mla = common.triton_module("mla_decode")

    def prepare(q, k_cache, table, lens, dv, causal):
        b, s_q, h_q, _ = q.shape
        h_kv = k_cache.shape[2]
        splits = mla.default_splits(b, h_kv, s_q * h_q // h_kv, q.device)
        return lambda: mla.mla_decode(q, k_cache, table, lens, dv, causal=causal, num_splits=splits)

    return prepare


def _torch():
    def prepare(q, k_cache, table, lens, dv, causal):
        return lambda: torch_decode(q, k_cache, table, lens, dv, causal)

    return prepare


def _numba_flash_mma():
    """nf-tc's mma.sync build (the sm_80-89 kernel) on whatever GPU runs the benchmark, planned
    as for an A100's 163 KiB blocks with this GPU's SM count."""
    from numba_flash.runtime import device

    prepare = _numba_flash("tc")

    def planned(*args):
        a100 = device.Device(cc=(8, 0), sms=device.current().sms, shared_per_block=166912)
        with device.plan_for(a100):
            run = prepare(*args)

        def call():
            with device.plan_for(a100):
                return run()

        return call

    return planned


# name -> () -> prepare; see providers_available
PROVIDERS = {"nf-simt": lambda: _numba_flash("simt"), "nf-tc": lambda: _numba_flash("tc"),
             "nf-mma": _numba_flash_mma, "flashmla": _flashmla, "triton": _triton,
             "torch": _torch}


def providers_available(names=None):
    """name -> prepare(q, k_cache, block_table, cache_seqlens, dv, causal) -> run, where
    ``run()`` returns (out, lse) and setup work (metadata, split counts) is done in prepare,
    for ``names`` (default: every provider; an unknown name is left out). Providers whose
    import or tiny probe fails are left out, with the reason on stderr."""
    import torch

    prov = {}
    for name in names or PROVIDERS:
        if name not in PROVIDERS:
            continue
        try:
            prepare = PROVIDERS[name]()
            q, k_cache, table, lens = make_inputs(2, 2, 16, 1, 576, 64, [100, 3], torch.bfloat16, seed=0)
            prepare(q, k_cache, table, lens, 512, True)()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            sys.stderr.write(f"provider {name} left out: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}\n")
            continue
        prov[name] = prepare
    return prov


# ----------------------------------------------------------------------------- check, copy

def reference_check(prepare, dtype, s_q, h_q, h_kv, d, dv, page, causal, atol=ATOL):
    """(passed, max error over out and the finite lse) on a small ragged problem against the
    float64 reference of numba_flash."""
    import numpy as np

    from numba_flash import reference

    q, k_cache, table, lens = make_inputs(len(CHECK_SEQLENS), s_q, h_q, h_kv, d, page,
                                          list(CHECK_SEQLENS), dtype, seed=0)
    out, lse = prepare(q, k_cache, table, lens, dv, causal)()
    host = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
    ref_out, ref_lse = reference.mla_decode_ref(host(q), host(k_cache), host(table).astype(np.int32),
                                                host(lens).astype(np.int32), dv, causal=causal)
    fin = np.isfinite(ref_lse)
    err = max(np.abs(host(out) - ref_out).max(), np.abs(host(lse)[fin] - ref_lse[fin]).max())
    return bool(err <= atol), float(err)


def copy_bandwidth():
    """TB/s of a device-to-device copy of COPY_BYTES (read + written bytes over the time)."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = common.time_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / ms * 1e-9


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--s-q", default="1,2", help="query tokens per sequence")
    p.add_argument("--heads-q", default="1,16,32,64,128")
    p.add_argument("--heads-kv", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=576)
    p.add_argument("--head-dim-v", type=int, default=512)
    p.add_argument("--page", type=int, default=64)
    p.add_argument("--seqlens", default="4096,8192,16384,32768")
    p.add_argument("--varlen", action="store_true", help="lengths uniform in [seqlen/2, 3 seqlen/2]")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--causal", choices=["0", "1"], default="1", help="(matters for s_q > 1)")
    p.add_argument("--providers", default=None, help="comma list; default: all available")
    p.add_argument("--quick", action="store_true", help="s_q=1, h_q=128, seqlen in {4k, 8k}")
    p.add_argument("--no-plot", action="store_true", help="write the CSV only")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds per point, each on a fresh cache and permutation, providers in "
                        "turn; the median reported with min and max; default 1")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.quick:
        args.s_q, args.heads_q, args.seqlens = "1", "128", "4096,8192"
    args.s_q_list = [int(x) for x in args.s_q.split(",")]
    args.heads_q_list = [int(x) for x in args.heads_q.split(",")]
    args.seqlen_list = [int(x) for x in args.seqlens.split(",")]
    args.provider_list = args.providers.split(",") if args.providers else None
    return args


def main(argv=None):
    args = parse_args(argv)

    import torch

    available = providers_available(args.provider_list)
    names = args.provider_list or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        sys.exit(f"unknown or unavailable providers {unknown}; available: {sorted(available)}")
    dtype, causal = getattr(torch, args.dtype), args.causal == "1"
    h_kv, d, dv, page = args.heads_kv, args.head_dim, args.head_dim_v, args.page
    copy_tbps = copy_bandwidth()
    print(f"device copy bandwidth: {copy_tbps:.2f} TB/s (read + written)")
    points = [(s_q, h_q, n) for s_q in args.s_q_list for h_q in args.heads_q_list
              for n in args.seqlen_list]
    progress = common.Progress(len(points) * len(names) * args.repeats)
    out = common.results_dir(args.out_dir)
    path = out / "mla_decode.csv"
    rows, checked = [], {}
    for s_q, h_q, n in points:
        lens = draw_seqlens(args.batch, n, args.varlen)
        mean = sum(lens) / len(lens)
        nbytes = common.mla_decode_bytes(args.batch, s_q, h_q, h_kv, d, dv, mean,
                                         elem=torch.finfo(dtype).bits // 8)
        flops = common.mla_decode_flops(args.batch, s_q, h_q, d, dv, mean)
        label = f"s_q={s_q} h_q={h_q} seqlen={n}"
        point_rows, samples = [], {}
        for name in names:
            key = (name, s_q, h_q)
            if key not in checked:
                progress.total += 1
                progress.step(f"check s_q={s_q} h_q={h_q} {name}")
                try:
                    checked[key] = reference_check(available[name], dtype, s_q, h_q, h_kv, d, dv,
                                                   page, causal) + ("",)
                except Exception as exc:
                    checked[key] = (False, float("nan"), f"error: {type(exc).__name__}: "
                                                          f"{str(exc).splitlines()[0]}")
            passed, err, note = checked[key]
            point_rows.append(dict(dtype=args.dtype, batch=args.batch, s_q=s_q, heads_q=h_q,
                                   heads_kv=h_kv, seqlen=n, mean_seqlen=mean, causal=int(causal),
                                   provider=name, correct=int(passed), max_err=err,
                                   ms=float("nan"), ms_min=float("nan"), ms_max=float("nan"),
                                   rounds=0, tbps=float("nan"), tflops=float("nan"),
                                   vs_copy=float("nan"), copy_tbps=copy_tbps, note=note))
            if passed:
                samples[name] = []
            else:
                progress.total -= args.repeats  # nothing to time: no steps to wait for
        for rnd in range(args.repeats):
            inputs = make_inputs(args.batch, s_q, h_q, h_kv, d, page, lens, dtype, seed=rnd)
            for name in common.rotated(list(samples), rnd):
                progress.step(f"{label} {name} ({rnd + 1})")
                samples[name].append(common.time_ms(available[name](*inputs, dv, causal)))
            del inputs
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        for row in point_rows:
            ms_all = samples.get(row["provider"])
            if ms_all:
                ms = statistics.median(ms_all)
                tbps = nbytes / ms * 1e-9
                row.update(ms=ms, ms_min=min(ms_all), ms_max=max(ms_all), rounds=len(ms_all),
                           tbps=tbps, tflops=flops / ms * 1e-9, vs_copy=tbps / copy_tbps)
        rows += point_rows
        anchor = [r["ms"] for r in point_rows if r["provider"] == "flashmla"]
        for r in point_rows:
            r["vs_flashmla"] = anchor[0] / r["ms"] if anchor else float("nan")
        common.write_csv(path, rows)  # after every point: a cut-short run keeps them
    spread = ["ms_min", "ms_max"] if args.repeats > 1 else []
    print(common.format_table(rows, ["s_q", "heads_q", "seqlen", "provider", "correct", "ms",
                                     *spread, "tbps", "tflops", "vs_copy", "vs_flashmla",
                                     "note"]))
    print(f"wrote {path}")
    if not args.no_plot:
        png = common.plot_panels(out / "mla_decode.png", rows, "seqlen", "tbps", ["s_q", "heads_q"],
                                 "provider", "cache length per sequence", "effective TB/s",
                                 f"paged MLA decode, {args.dtype}, b={args.batch}",
                                 hline=(copy_tbps, "device copy"))
        if png:
            print(f"wrote {png}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
