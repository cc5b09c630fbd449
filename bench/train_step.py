"""One attention training step on torch tensors: forward + backward of ``numba_flash.torch``'s
``flash_attn_func`` against torch SDPA (flash and cuDNN backends), fp16 or bf16.

    python bench/train_step.py --head-dim 128 --seqlen 4096 --causal 1

Times ``out = attn(q, k, v); out.backward(dout)`` (B * N = 32k tokens, Hq * D = 2048) with CUDA
events after every provider's gradients are compared with SDPA-flash's (max abs difference).
Results: train_step.csv in bench/results/<gpu>/ and a table on stdout.
"""

import argparse
import sys

import common


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--causal", type=int, default=1)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numba_flash.torch import flash_attn_func

    d, n, causal = args.head_dim, args.seqlen, bool(args.causal)
    b, h = max(32768 // n, 1), 2048 // d
    dt = getattr(torch, args.dtype)
    q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=dt) for _ in range(4))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def sdpa(backend):
        def attn(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    is_causal=causal).transpose(1, 2)
        return attn

    providers = {"nf": lambda q, k, v: flash_attn_func(q, k, v, causal=causal),
                 "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
                 "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}

    def step(attn):
        for x in leaves:
            x.grad = None
        attn(*leaves).backward(dout)
        return [x.grad for x in leaves]

    want = [g.clone() for g in step(providers["sdpa-flash"])]
    flops = common.attention_flops(b, h, n, n, d, causal) * 3.5  # forward + backward (2.5x)
    rows = []
    for name, attn in providers.items():
        err = max((g.float() - w.float()).abs().max().item() for g, w in zip(step(attn), want))
        ms = common.time_ms(lambda: step(attn))
        rows.append(dict(provider=name, dtype=args.dtype, head_dim=d, seqlen=n,
                         causal=int(causal), err_vs_sdpa_flash=err, ms=ms,
                         tflops=flops / ms * 1e-9))
        print(common.format_table(rows[-1:], list(rows[-1])), flush=True)
    base = next(r["ms"] for r in rows if r["provider"] == "sdpa-flash")
    for r in rows:
        r["speed_vs_sdpa_flash"] = base / r["ms"]
    common.write_csv(common.results_dir(args.out_dir) / "train_step.csv", rows)
    print(common.format_table(rows, list(rows[0])))


if __name__ == "__main__":
    sys.exit(main())
