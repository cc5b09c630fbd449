"""Score modifiers: what flash-attn's ``softcap``, ``alibi_slopes`` and ``learnable_sink`` do to
the softmax, in the units each kernel holds its scores in.

With ``s`` the scaled score of query ``i`` and key ``j`` (``diag = Sk - Sq`` of the sequence)
the softmax sees

    softcap * tanh(s / softcap)  -  slope * |i + diag - j|          (softcap first, then ALiBi)

and a sink adds ``exp(sink)`` to every row's sum and nothing to its output: a key of value zero
that every row sees. A kernel holds S either as raw ``Q K^T`` (the tensor-core kernels: the
scale rides in the exponent, ``exp2(S scale_log2 - ...)``) or already times ``scale log2(e)``
(``BASE2``: the SIMT kernels pre-scale Q), so each factor is converted once per CTA into those
units: the cap's ``cap_in``, ``cap_out`` (``S -> cap_out tanh(S cap_in)``) and ALiBi's slope.

``make_score_mods(BASE2, SOFTCAP, ALIBI)`` returns two device functions:

    mods = factors(softcap, alibi_slopes, b, h, scale_log2, rel0)
        the CTA's (cap_in, cap_out, alibi, rel0) as float32: ``alibi`` is the slope of head
        ``h`` of batch entry ``b`` (``alibi_slopes`` is (B, Hq), a broadcast (Hq,) having batch
        stride 0) in S's units, ``rel0`` the offset ``diag - n_start`` that turns a row and a
        key of the kernel's view (keys from ``n_start`` on) into ``i + diag - j``
    score, slope = modified(s, mods, rel)
        the score the softmax sees for S element ``s`` at relative position ``rel = i + diag -
        j`` (float32), and its derivative by ``s`` (the backward's chain rule: ``1 - tanh^2``
        under the cap, else 1)

The cap's tanh is ``1 - 2 / (1 + 2^(2 log2(e) |x|))`` with its sign: the special-function unit's
2^x and reciprocal (``ex2.approx``, ``rcp.approx``), the two operations of libdevice's ``tanhf``
without its polynomial branch for ``|x| < 0.6``, where this form is exact to about 1e-7 in
absolute terms, which is what a score needs (it is multiplied by the cap and exponentiated:
an absolute error). It is fewer instructions and registers per score, so the wgmma backward's
64-row accumulators keep it without spilling; ``tanh.approx.f32`` (one unit operation) would
be cheaper still but is only good to 2^-11 relative, up to 0.015 on a score capped at 30.

Each option is a compile-time flag: off, its code is not generated and its arguments are not
read, so a plain kernel is the kernel without modifiers. ``make_sink(BASE2, SINK)`` gives the
row state a sink starts from.
"""

import math

from numba import cuda, float32

from ..instructions import convert
from . import constants


def make_score_mods(BASE2, SOFTCAP=False, ALIBI=False):
    """``(factors, modified)`` for one kernel (the module's docstring)."""
    LOG2E, ONE, ZERO = constants.LOG2E, float32(1.0), float32(0.0)
    TWO, TWO_LOG2E = float32(2.0), float32(2.0 * constants.LOG2E)
    exp2, rcp = convert.exp2_approx, convert.rcp_approx

    @cuda.jit(device=True, inline="always")
    def tanh(x):
        # 2^(2 log2(e) |x|) = inf for large |x| gives 1 / inf = 0, so t = 1 exactly there.
        t = ONE - TWO * rcp(exp2(abs(x) * TWO_LOG2E) + ONE)
        return math.copysign(t, x)

    @cuda.jit(device=True, inline="always")
    def factors(softcap, alibi_slopes, b, h, scale_log2, rel0):
        # S units per natural-log unit of the scaled score: log2(e) (BASE2) or 1 / scale.
        unit = LOG2E if BASE2 else LOG2E / scale_log2
        cap_in = cap_out = alibi = ZERO
        if SOFTCAP:  # c tanh(s / c) with s = S / unit: cap_out tanh(S cap_in)
            cap_in, cap_out = ONE / (softcap * unit), softcap * unit
        if ALIBI:
            alibi = alibi_slopes[b, h] * unit
        return cap_in, cap_out, alibi, float32(rel0)

    @cuda.jit(device=True, inline="always")
    def modified(s, mods, rel):
        slope = ONE
        if SOFTCAP:
            t = tanh(s * mods[0])
            s = mods[1] * t
            slope = ONE - t * t
        if ALIBI:  # |rel| is a free operand modifier of the FFMA
            s -= mods[2] * abs(rel)
        return s, slope

    return factors, modified


def make_sink(BASE2, SINK=False):
    """Device function ``sink_start(sink, h, scale_log2) -> (m_start, l_start)``: the row
    maximum and the sum a row's online softmax starts from. Without ``SINK`` (-inf, 0), nothing
    seen; with it, head ``h``'s sink as a key already seen: its logit in S's units (module
    docstring) and its ``exp`` at that maximum, 1. The sum being spread over the lanes that
    share a row, only one of them starts from 1. A row that sees no key then ends with ``out =
    0`` and ``lse = sink``."""
    LOG2E, ONE, ZERO = constants.LOG2E, float32(1.0), float32(0.0)
    NEG_INF = constants.NEG_INF

    @cuda.jit(device=True, inline="always")
    def sink_start(sink, h, scale_log2):
        if SINK:
            unit = LOG2E if BASE2 else LOG2E / scale_log2
            return sink[h] * unit, ONE
        return NEG_INF, ZERO

    return sink_start
