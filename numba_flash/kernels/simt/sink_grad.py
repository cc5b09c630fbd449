"""The gradient of a learnable sink (gpt-oss's per-head logit; flash-attn 4's ``learnable_sink``).

What it computes
    A sink adds ``exp(sink_h)`` to every row's softmax sum and nothing to its output, so row i of
    head h has ``P_sink = exp(sink_h - lse_i)`` (the forward's lse holds the sink) and
    ``O_i = sum_j P_ij V_j``. Moving the sink moves every ``P_ij`` by ``-P_ij P_sink`` and so
    ``O_i`` by ``-P_sink O_i``; with ``D_i = rowsum(dO_i * O_i)``, the backward's preprocess,

        dsink_h = - sum over the batch and the rows i of  exp(sink_h - lse_i) D_i

    The scores' own gradients need nothing new: ``dS_ij = P_ij (dP_ij - D_i)`` holds as before,
    P being recomputed from the same lse. So this kernel runs after D_i exists and reads only
    lse and D: 8 bytes per row, against the 4 D (2 bytes) of dO and O the preprocess read.

Grid / block mapping
    grid = (Hq,), block = THREADS: the CTA of head h walks the batch entries (or, varlen, the
    sequences' rows from ``common/masks.make_seqlen_info``), its threads striding over the rows;
    the THREADS partial sums meet in a tree in shared memory. Every sum runs in a fixed order:
    the result is bitwise repeatable, like the other gradients.

Shared memory
    THREADS float32 (the tree), static.

Limits
    Rows that see no key have ``D_i = 0`` (their out is 0) and add nothing; rows of no sequence
    are never read.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types

from ...runtime.spec import KernelSpec, Sample, Tiles
from ..attention import (F32_1D, F32_3D, I32, SEQUENCES, AttentionConfig,
                         grid_lengths, sequence_arguments)
from ..common.masks import make_seqlen_info

THREADS = 256


@lru_cache(maxsize=None)
def make_sink_grad_kernel(VARLEN):
    """The kernel of dense batches, or (``VARLEN``) of packed sequences."""
    seqlen_info = make_seqlen_info(VARLEN)
    ZERO = float32(0.0)

    def flash_bwd_sink_simt(lse, delta, sink, dsink, seqlen_q, seqlen_k, total_k,
                            cu_seqlens_q, cu_seqlens_k, seqused_k, status):
        tree = cuda.shared.array(THREADS, float32)
        tid = cuda.threadIdx.x
        h = cuda.blockIdx.x
        s = sink[h]
        acc = ZERO
        for b in range(lse.shape[0]):
            q0, _, len_q, _, _ = seqlen_info(b, seqlen_q, seqlen_k, lse.shape[2], total_k,
                                             cu_seqlens_q, cu_seqlens_k, seqused_k, status)
            for i in range(q0 + tid, q0 + len_q, THREADS):
                acc += math.exp(s - lse[b, h, i]) * delta[b, h, i]
        tree[tid] = acc
        width = THREADS // 2
        while width > 0:
            cuda.syncthreads()
            if tid < width:
                tree[tid] += tree[tid + width]
            width //= 2
        if tid == 0:
            dsink[h] = -tree[0]

    return flash_bwd_sink_simt


class Spec(KernelSpec):
    """(lse, delta, sink, dsink, Sq, Sk, total_k, the sequences); grid (Hq,). Problem: lse and
    delta (B, Hq, Sq) float32 (varlen: the packed (Hq, total_q) seen per sequence), sink and
    dsink (Hq,) float32, and the forward's q, k and sequences."""

    name = "flash_bwd_sink_simt"
    Config = AttentionConfig

    def config(self, problem):
        # Only whether rows come in packed sequences decides the code.
        return AttentionConfig(0, False, "float32", problem.cu_seqlens_q is not None)

    def entry(self, config, device):
        return THREADS

    def tiles(self, config, entry):
        return Tiles(1, 1, entry, 0)

    def make(self, config, tiles):
        return make_sink_grad_kernel(config.varlen)

    def signature(self, config):
        return types.void(F32_3D, F32_3D, F32_1D, F32_1D, I32, I32, I32, *SEQUENCES)

    def grid(self, config, tiles, p):
        return (p["lse"].shape[1],)

    def arguments(self, config, p):
        sq, sk = grid_lengths(p)
        return (p["lse"], p["delta"], p["sink"], p["dsink"], np.int32(sq), np.int32(sk),
                np.int32(p["k"].shape[1]), *sequence_arguments(p))

    def samples(self):
        return [Sample(f"simt sink grad varlen={varlen}", (0, False, "float32", varlen))
                for varlen in (False, True)]


SPEC = Spec()
