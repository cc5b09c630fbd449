"""Sparse MLA decode benchmark (DeepSeek-V3.2): numba_flash beside FlashMLA's sparse FP8 decode.

    python bench/bench_mla_sparse.py                         # the grid below, numba_flash alone
    FLASHMLA_DIR=.flashmla python bench/bench_mla_sparse.py  # + FlashMLA (load_flashmla_sparse)
    python bench/bench_mla_sparse.py --batch 64 --heads-q 128 --s-q 1 --repeats 3

Grid: b in {64, 128}, s_q in {1, 2}, h_q in {64, 128}, h_kv = 1, topk = 2048 indices per query
token drawn without repetition from a cache of --seqlen (32k) tokens per sequence behind a
shuffled block table (pages of 64), d = 576, dv = 512, V3.2's 656-byte FP8 rows made on the
GPU from N(0, 1/16) values (``quantize_v32``: reference.quantize_v32's power-of-two scales per
128 values), bfloat16 q. The indices are FlashMLA's: ``page * page_size + slot``.

Providers:
    nf-sparse        numba_flash.get_mla_metadata(..., topk) once, untimed, then
                     flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...) (backend
                     "auto": the wgmma decode on a Hopper)
    nf-sparse-simt   the same call with backend="simt" (the CUDA-core decode)
    flashmla-sparse  FlashMLA's sparse decode (sm_90a), built from the folder FLASHMLA_DIR names
                     (``load_flashmla_sparse`` of the GPU machine's benchmark-only build; nothing
                     of it is in this repo); its first call plans, later calls reuse the plan

numba_flash is first checked against numba_flash.reference.sparse_mla_ref (float64) on a small
problem, and at each point every provider's output against numba_flash's. Columns: ms (median
of --repeats alternating rounds), TFLOP/s = 2 b s_q h_q topk (d + dv) over the time, TB/s = the
656 cache bytes per index read (b s_q topk of them, each once per token) plus q and out, and
vs_flashmla = FlashMLA's time over the provider's (> 1: faster). Results: mla_sparse.csv in
bench/results/<gpu>/.
"""

import argparse
import statistics
import sys

import common

ROW_BYTES = 656  # one V3.2 cache token
D, DV, PAGE = 576, 512, 64
ATOL = 2e-2


def sparse_flops(b, s_q, h_q, topk, d=D, dv=DV):
    """FLOPs of a sparse decode: every (token, head) row scores topk keys and sums topk values."""
    return 2 * b * s_q * h_q * topk * (d + dv)


def sparse_bytes(b, s_q, h_q, topk, d=D, dv=DV):
    """Bytes a sparse decode must move: its FP8 rows once per token, q and out in bfloat16."""
    return b * s_q * topk * ROW_BYTES + 2 * b * s_q * h_q * (d + dv)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="64,128")
    p.add_argument("--s-q", default="1,2")
    p.add_argument("--heads-q", default="64,128")
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--seqlen", type=int, default=32768, help="cache tokens per sequence")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--providers", default="nf-sparse,flashmla-sparse")
    p.add_argument("--out-dir", default=None)
    return p.parse_args(argv)


def quantize_v32(kv):
    """``numba_flash.reference.quantize_v32`` on the GPU (torch): rows (n, 576) -> (n, 656)
    uint8, a power-of-two scale per 128 latent values (the smallest >= amax / 448)."""
    import torch

    blocks = kv[:, :512].float().view(-1, 4, 128)
    amax = blocks.abs().amax(dim=-1)
    scale = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1e-30) / 448))),
                        torch.ones_like(amax))
    latent = (blocks / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).view(-1, 512)
    rope = kv[:, 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([latent, scale.contiguous().view(torch.uint8), rope], dim=1)


def make_inputs(b, s_q, h_q, topk, seqlen, seed=0):
    """q, the FP8 cache (b * seqlen / PAGE pages of V3.2 rows, made on the GPU), indices
    (b, s_q, topk): distinct token positions per query token through a shuffled block table."""
    import numpy as np
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    rng = np.random.default_rng(seed)
    pages = b * (seqlen // PAGE)
    rows = torch.empty(pages * PAGE, ROW_BYTES, dtype=torch.uint8, device="cuda")
    for lo in range(0, rows.shape[0], 1 << 20):  # a million rows at a time
        n = min(1 << 20, rows.shape[0] - lo)
        rows[lo:lo + n] = quantize_v32(torch.randn(n, D, device="cuda", generator=g) / 4)
    k_cache = rows.view(torch.float8_e4m3fn).view(pages, PAGE, 1, ROW_BYTES)
    table = rng.permutation(pages).reshape(b, seqlen // PAGE)
    positions = np.stack([np.stack([rng.choice(seqlen, topk, replace=False) for _ in range(s_q)])
                          for _ in range(b)])  # (b, s_q, topk)
    indices = table[np.arange(b)[:, None, None], positions // PAGE] * PAGE + positions % PAGE
    q = torch.randn(b, s_q, h_q, D, device="cuda", generator=g) / 4
    return q.to(torch.bfloat16), k_cache, torch.from_numpy(indices.astype(np.int32)).cuda()


def nf_sparse(q, k_cache, indices, backend="auto"):
    import numba_flash as nf

    b, s_q, h_q, _ = q.shape
    meta, splits = nf.get_mla_metadata(indices.new_zeros(b), s_q * h_q, 1, h_q, True,
                                       indices.shape[2])
    return lambda: nf.flash_mla_with_kvcache(q, k_cache, None, None, DV, meta, splits,
                                             is_fp8_kvcache=True, indices=indices,
                                             backend=backend)


def flashmla_sparse(q, k_cache, indices):
    import os

    path = os.environ.get("FLASHMLA_DIR")
    if not path:
        raise RuntimeError("FLASHMLA_DIR is not set")
    sys.path.insert(0, os.path.abspath(path))
    from build import load_flashmla_sparse

    fs = load_flashmla_sparse()
    scale = D ** -0.5
    _, _, meta, splits = fs.sparse_decode_fwd(q, k_cache, indices, None, None, DV, scale, None,
                                              None)
    return lambda: tuple(fs.sparse_decode_fwd(q, k_cache, indices, None, None, DV, scale, meta,
                                              splits)[:2])


PROVIDERS = {"nf-sparse": nf_sparse,
             "nf-sparse-simt": lambda q, k_cache, indices: nf_sparse(q, k_cache, indices, "simt"),
             "flashmla-sparse": flashmla_sparse}


def check_small():
    """numba_flash's sparse FP8 decode against sparse_mla_ref on a small problem."""
    import numpy as np
    import torch
    from numba_flash import reference as ref

    q, k_cache, indices = make_inputs(2, 2, 64, 128, 1024, seed=1)
    out, lse = nf_sparse(q, k_cache, indices)()
    want, want_lse = ref.sparse_mla_ref(q.float().cpu().numpy(),
                                        k_cache.cpu().view(torch.uint8).numpy(),
                                        indices.cpu().numpy(), DV, is_fp8_kvcache=True)
    return max(float(np.abs(out.float().cpu().numpy() - want).max()),
               float(np.abs(lse.cpu().numpy() - want_lse).max()))


def main(argv=None):
    import torch

    args = parse_args(argv)
    err = check_small()
    print(f"nf-sparse against sparse_mla_ref: max error {err:.3g}", flush=True)
    if not err < ATOL:
        print("numba_flash disagrees with the reference: no timings", flush=True)
        return 1
    points = [(b, s_q, h_q) for b in map(int, args.batch.split(","))
              for s_q in map(int, args.s_q.split(",")) for h_q in map(int, args.heads_q.split(","))]
    progress = common.Progress(len(points))
    rows, out_dir = [], common.results_dir(args.out_dir)
    for b, s_q, h_q in points:
        q, k_cache, indices = make_inputs(b, s_q, h_q, args.topk, args.seqlen)
        runs = {}
        for name in args.providers.split(","):
            try:
                runs[name] = PROVIDERS[name](q, k_cache, indices)
            except Exception as e:  # a missing provider is left out, with a note
                print(f"  {name}: left out ({type(e).__name__}: {e})", flush=True)
        want = runs["nf-sparse"]()[0].float() if "nf-sparse" in runs else None
        for name in list(runs):
            err = 0.0 if want is None else (runs[name]()[0].float() - want).abs().max().item()
            if not err <= ATOL:
                print(f"  {name}: differs from nf-sparse by {err:.3g}; left out", flush=True)
                del runs[name]
        samples = {name: [] for name in runs}
        for rnd in range(args.repeats):
            for name in common.rotated(list(runs), rnd):
                samples[name].append(common.time_ms(runs[name]))
        base = statistics.median(samples["flashmla-sparse"]) if "flashmla-sparse" in samples \
            else float("nan")
        for name, ms in samples.items():
            ms = statistics.median(ms)
            rows.append(dict(batch=b, s_q=s_q, h_q=h_q, topk=args.topk, provider=name, ms=ms,
                             tflops=sparse_flops(b, s_q, h_q, args.topk) / ms * 1e-9,
                             tbps=sparse_bytes(b, s_q, h_q, args.topk) / ms * 1e-9,
                             vs_flashmla=base / ms))
        common.write_csv(out_dir / "mla_sparse.csv", rows)
        progress.step(f"b {b} s_q {s_q} h_q {h_q}: " + ", ".join(
            f"{r['provider']} {r['tflops']:.0f}" for r in rows[-len(samples):]) + " TFLOP/s")
        del q, k_cache, indices, runs
        torch.cuda.empty_cache()
    print(common.format_table(rows, ["batch", "s_q", "h_q", "provider", "ms", "tflops", "tbps",
                                     "vs_flashmla"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
