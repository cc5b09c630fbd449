"""Split-KV combine: merge the partial results of the MLA decode requests cut into pieces.

What it computes
    When the scheduler cuts request ``req`` into ``n > 1`` pieces, the decode kernel leaves, for
    each query row and piece ``i`` (accumulator slot ``num_splits[req] + i``), the attention
    output over that piece's keys alone, ``O_i`` (float32, already divided by its own row sum),
    and its base-2 log-sum-exp ``lse_i``. The softmax over all keys weighs each piece by its
    share of the total sum of exponentials, so with

        M = max_i lse_i,   S = sum_i 2^(lse_i - M),   G = log2 S + M
        out = sum_i 2^(lse_i - G) O_i,   lse = G * ln 2 (natural log, as the API returns)

    (M keeps every power of two <= 1: no overflow whatever the magnitudes). A piece in which a
    row saw no key has ``lse_i = -inf``, weight 0; a row that saw no key in any piece gets
    ``out = 0``, ``lse = +inf``. Requests handled in one piece were written by the decode
    kernel: their CTAs return at once.

Attention sink (``Config.sink``: FlashMLA's ``attn_sink``, one logit per query head)
    The sink joins the softmax's sum and adds nothing to the output: every row's output shrinks
    by ``1 / (1 + exp(sink_h - lse))``, and the lse returned stays that of the keys (FlashMLA's
    convention; a row that sees no key keeps ``out = 0``, ``lse = +inf``). The merge applies it
    to the rows it writes; the rows the decode kernel wrote whole (one-piece requests) are
    scaled here in place, after the decode, so every decode kernel runs unchanged. Without a
    sink that code is not compiled.

Overlap with the decode (``Config.programmatic``: behind the sm_90 decodes)
    The kernel is launched as a programmatic dependent of the decode (``kernels/ptx/sync.py``),
    which allows it at its first instruction: once every decode CTA has started, the
    combine's CTAs may run on the SMs the decode leaves free. They read ``num_splits``
    (written before the decode started), return at once for the requests the decode finished
    itself, and wait for the decode (``wait_prior_grid``) only before reading its partials.
    When no request is split, the combine runs alongside the decode. CTA (0, 0) always waits:
    a grid none of whose CTAs waits could end before the decode, and the stream's later work,
    which waits for the combine, must find the decode's outputs written.

Grid / block mapping
    grid = (b, ceil(s_q * h_q / ROWS)); block = THREADS = 128 threads, one warp per query row
    (token t, head h); lane ``l`` owns the output columns ``l + 32 j``: consecutive lanes read
    and write consecutive columns. Every lane recomputes M and G from the ``n`` lse values (the
    same addresses across the warp: one broadcast load each); no shared memory, no barriers.

Limits
    Any HEAD_DIM_V; any number of pieces; split counts that name slots past the accumulators
    are skipped and reported in the status word (common/status.py). Accumulators: ``o_acc
    (slots, s_q, h_q, HEAD_DIM_V)`` and ``lse_acc (slots, h_q, s_q)`` float32. Column indices
    are uint64, as in mla_decode.py (no negative-index wraparound code).
"""

import math
from functools import lru_cache
from typing import NamedTuple

from numba import cuda, float32, types, uint64

from ...runtime.status import unread
from ...runtime.launcher import cdiv
from ...runtime.arrays import FLOAT_FORMATS
from ...runtime.spec import SM90, KernelSpec, Sample, Tiles

from ..common import constants, formats
from ..common.status import BAD_SPLITS, report
from ..instructions import sync

THREADS = 128
ROWS = THREADS // 32  # query rows per CTA, one per warp


@lru_cache(maxsize=None)
def make_combine_kernel(HEAD_DIM_V, FMT, PROGRAMMATIC, SINK=False):
    """Python kernel function specialised for one configuration (``SPEC`` compiles it)."""
    TD = -(-HEAD_DIM_V // 32)  # columns per lane
    DV_EXACT = HEAD_DIM_V % 32 == 0
    store, load = formats.storer(FMT), formats.loader(FMT)
    LOG2E, ONE = constants.LOG2E, float32(1.0)
    NEG_INF, POS_INF, LN2, NAN = (constants.NEG_INF, constants.POS_INF, constants.LN2,
                                  constants.NAN)
    ZERO = float32(0.0)

    def mla_combine_simt(o_acc, lse_acc, num_splits, out, lse, status, attn_sink):
        req = cuda.blockIdx.x
        if PROGRAMMATIC and req == 0 and cuda.blockIdx.y == 0:
            sync.wait_prior_grid()  # this grid never ends before the decode (docstring)
        s_q = out.shape[1]
        h_q = out.shape[2]
        row = cuda.blockIdx.y * ROWS + (cuda.threadIdx.x >> 5)
        lane = cuda.threadIdx.x & 31
        first = num_splits[req]
        n = num_splits[req + 1] - first
        if n <= 1 or row >= s_q * h_q:
            if SINK and row < s_q * h_q:  # the decode wrote the row whole: scaled here
                if PROGRAMMATIC:
                    sync.wait_prior_grid()  # the decode's row is written
                t = row // h_q
                h = row - t * h_q
                share = ONE / (ONE + math.exp(attn_sink[h] - lse[req, h, t]))
                for jd in range(TD):
                    col = lane + 32 * jd
                    if DV_EXACT or col < HEAD_DIM_V:
                        c = uint64(col)
                        out[req, t, h, c] = store(load(out[req, t, h, c]) * share)
            return  # written by the decode kernel / past the last row
        if first < 0 or first + n > lse_acc.shape[0]:  # slots that do not exist
            if lane == 0:
                report(status, BAD_SPLITS)
            return
        if PROGRAMMATIC:
            sync.wait_prior_grid()  # the decode's partials are complete and visible
        t = row // h_q
        h = row - t * h_q

        M = NEG_INF
        nan = False  # a NaN partial makes the row NaN (max() would pass over it)
        for i in range(n):
            x = lse_acc[first + i, h, t]
            nan |= x != x
            M = max(M, x)
        acc = cuda.local.array(TD, float32)
        for jd in range(TD):
            acc[jd] = ZERO
        G = POS_INF  # no key in any piece: out = 0, lse = +inf
        if nan:
            G = NAN
            for jd in range(TD):
                acc[jd] = NAN
        elif M != NEG_INF:
            S = ZERO
            for i in range(n):
                S += math.exp2(lse_acc[first + i, h, t] - M)
            G = math.log2(S) + M
            for i in range(n):
                w = math.exp2(lse_acc[first + i, h, t] - G)
                for jd in range(TD):
                    col = lane + 32 * jd
                    if DV_EXACT or col < HEAD_DIM_V:
                        acc[jd] += w * o_acc[first + i, t, h, uint64(col)]
        if SINK:  # the keys' share of the sum, less the sink's (docstring)
            share = ONE / (ONE + math.exp2(attn_sink[h] * LOG2E - G))
            for jd in range(TD):
                acc[jd] *= share
        for jd in range(TD):
            col = lane + 32 * jd
            if DV_EXACT or col < HEAD_DIM_V:
                out[req, t, h, uint64(col)] = store(acc[jd])
        if lane == 0:
            lse[req, h, t] = G * LN2  # +inf stays +inf

    return mla_combine_simt


# ----------------------------------------------------------------------------- spec

class Config(NamedTuple):
    head_dim_v: int
    fmt: str
    programmatic: bool = False  # launched to overlap the decode (sm_90+: the module docstring)
    sink: bool = False          # FlashMLA's attn_sink (the module docstring)


class Spec(KernelSpec):
    """(o_acc, lse_acc, num_splits, out, lse, status, attn_sink (h_q,) float32, read with
    ``sink`` only); grid (b, ceil(s_q * h_q / ROWS)): ROWS query rows (one per warp) per CTA, no
    shared memory."""

    name = "mla_combine_simt"
    Config = Config

    def entry(self, config, device):
        return ROWS

    def tiles(self, config, entry):
        return Tiles(entry, 0, THREADS, 0)

    def make(self, config, tiles):
        return make_combine_kernel(config.head_dim_v, config.fmt, config.programmatic,
                                   config.sink)

    def dependent(self, config):
        return config.programmatic

    def samples(self):
        """Each format on its own and, for sm_90, as the decode launches it (programmatic); a
        sink, both ways."""
        return [s for fmt in FLOAT_FORMATS for s in (
            Sample(f"simt mla combine dv=512 {fmt}", (512, fmt)),
            Sample(f"simt mla combine dv=512 {fmt} programmatic", (512, fmt, True), ccs=(SM90,)))
        ] + [Sample("simt mla combine dv=512 bfloat16 sink", (512, "bfloat16", False, True)),
             Sample("simt mla combine dv=512 bfloat16 programmatic sink",
                    (512, "bfloat16", True, True), ccs=(SM90,))]

    def signature(self, config):
        t = types.Array(formats.storage_type(config.fmt), 4, "A")
        f3, f4 = types.Array(types.float32, 3, "A"), types.Array(types.float32, 4, "A")
        f1, i1 = types.Array(types.float32, 1, "A"), types.Array(types.int32, 1, "A")
        return types.void(f4, f3, i1, t, f3, i1, f1)

    def grid(self, config, tiles, p):
        b, s_q, h_q, _ = p["out"].shape
        return (b, cdiv(s_q * h_q, tiles.BLOCK_M))

    def arguments(self, config, p):
        sink = p.get("attn_sink") or unread(p["status"], 1)
        return (p["o_acc"], p["lse_acc"], p["num_splits"], p["out"], p["lse"], p["status"],
                sink)


SPEC = Spec()
