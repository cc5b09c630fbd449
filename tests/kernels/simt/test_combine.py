"""Split-KV combine kernel on hand-made partials: the LSE merge, empty pieces, untouched rows."""

import numpy as np
import pytest

from numba_flash.kernels.simt import combine
from numba_flash.runtime import arrays, device, ptxcheck
from helpers import DTYPES, nan_like, to_device, to_host


def combine_ref(o_acc, lse_acc, num_splits, s_q, h_q):
    """float64 merge of every split request: ``(out, lse)``, NaN for requests of one piece."""
    b = len(num_splits) - 1
    out = np.full((b, s_q, h_q, o_acc.shape[-1]), np.nan)
    lse = np.full((b, h_q, s_q), np.nan)
    for r in range(b):
        lo, hi = num_splits[r], num_splits[r + 1]
        if hi - lo < 2:
            continue
        part = lse_acc[lo:hi].astype(np.float64)  # (n, h_q, s_q), base 2
        m = part.max(axis=0)
        empty = m == -np.inf  # no key in any piece
        m = np.where(empty, 0, m)
        g = np.log2(np.exp2(part - m).sum(axis=0) + empty) + m
        w = np.exp2(part - g)  # (n, h_q, s_q); 0 where empty
        out[r] = np.einsum("nht,nthd->thd", w, o_acc[lo:hi].astype(np.float64))
        lse[r] = np.where(empty, np.inf, g * np.log(2))
    return out, lse


# (pieces per request, s_q, h_q, dv, fmt): single-piece requests in between, rows past the last
# CTA's warp (s_q * h_q not a multiple of 4), dv not a multiple of 32.
CASES = [
    ([1, 3, 2, 1], 2, 3, 40, "bfloat16"),
    ([5, 1, 2], 1, 4, 64, "float16"),
    ([2, 1], 1, 1, 8, "float32"),
]


def run_combine(o_acc, lse_acc, num_splits, out, lse, status, dv, fmt, programmatic=False):
    problem = {name: arrays.adapt(to_device(x), name) for name, x in
               (("o_acc", o_acc), ("lse_acc", lse_acc), ("num_splits", num_splits))}
    problem.update(out=arrays.adapt(out, "out"), lse=arrays.adapt(lse, "lse"),
                   status=arrays.adapt(status, "status"))
    combine.SPEC.launch(combine.Config(dv, fmt, programmatic), problem,
                        arrays.stream_of(problem["lse"]), device.current())


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_combine_merges_pieces(case, rng):
    pieces, s_q, h_q, dv, fmt = case
    b = len(pieces)
    num_splits = np.concatenate([[0], np.cumsum(pieces)]).astype(np.int32)
    slots = int(num_splits[-1]) + 2  # the decode allocates b + num_sm_parts slots
    o_acc = rng.standard_normal((slots, s_q, h_q, dv)).astype(np.float32)
    lse_acc = (rng.standard_normal((slots, h_q, s_q)) * 3).astype(np.float32)
    lse_acc[num_splits[1], 0, 0] = -np.inf  # one piece saw no key for this row
    split = [r for r in range(b) if pieces[r] > 1]
    lo, hi = num_splits[split[0]], num_splits[split[0] + 1]
    lse_acc[lo:hi, -1, -1] = -np.inf  # a row that saw no key in any piece
    out = nan_like(np.zeros((b, s_q, h_q, dv), DTYPES[fmt]))
    lse = nan_like(np.zeros((b, h_q, s_q), np.float32))

    status = to_device(np.zeros(1, np.int32))
    # bf16 as the decode launches it on sm_90+: waiting for the kernel before it
    programmatic = fmt == "bfloat16" and device.current().cc >= (9, 0)
    run_combine(o_acc, lse_acc, num_splits, out, lse, status, dv, fmt, programmatic)
    assert to_host(status)[0] == 0  # good split counts: nothing to report

    ro, rl = combine_ref(o_acc, lse_acc, num_splits, s_q, h_q)
    got_o, got_l = to_host(out).astype(np.float64), to_host(lse)
    for r in range(b):
        if pieces[r] == 1:  # the decode kernel's job: must stay untouched
            assert np.isnan(got_o[r]).all() and np.isnan(got_l[r]).all()
            continue
        assert np.array_equal(np.isposinf(got_l[r]), np.isposinf(rl[r]))
        fin = np.isfinite(rl[r])
        np.testing.assert_allclose(got_l[r][fin], rl[r][fin], rtol=1e-5, atol=1e-5)
        eps = {"float32": 1e-5, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[fmt]
        np.testing.assert_allclose(got_o[r], ro[r], rtol=eps, atol=eps)
    assert (got_o[split[0], -1, -1] == 0).all()


def test_split_counts_naming_missing_slots_are_skipped_and_reported(rng):
    """num_splits past the accumulators (only the device sees them): the combine reads no slot
    that does not exist, writes nothing for those requests and sets BAD_SPLITS."""
    from numba_flash.kernels.common import status as device_status

    o_acc = rng.standard_normal((4, 1, 2, 8)).astype(np.float32)
    lse_acc = rng.standard_normal((4, 2, 1)).astype(np.float32)
    out = nan_like(np.zeros((2, 1, 2, 8), np.float32))
    lse = nan_like(np.zeros((2, 2, 1), np.float32))
    status = to_device(np.zeros(1, np.int32))
    run_combine(o_acc, lse_acc, np.array([0, 3, 9], np.int32), out, lse, status, 8, "float32")
    assert to_host(status)[0] == device_status.BAD_SPLITS
    assert np.isnan(to_host(out)[1]).all() and np.isnan(to_host(lse)[1]).all()
    assert np.isfinite(to_host(out)[0]).all()  # slots 0 .. 2 exist: merged


def test_combine_kernel_compiles_without_spills():
    """The sm_90 build the decode launches waits for the decode's grid before it reads the
    partials; the sm_80 one has no such instruction (ptxas would refuse it)."""
    for fmt, cc, programmatic in (("bfloat16", (9, 0), True), ("float32", (8, 0), False)):
        ptx, rep = ptxcheck.compile_report_isolated(
            "numba_flash.runtime.ptxcheck:spec_build", cc=cc,
            args=("numba_flash.kernels.simt.combine", [512, fmt, programmatic]))
        assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0, rep["log"]
        assert "ld.local" not in ptx
        assert ("griddepcontrol.wait" in ptx) == programmatic
