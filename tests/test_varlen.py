"""The varlen calls (api.flash_attn_varlen_fwd / _bwd / _func): packed sequences against the
float64 reference of the packed rows (reference.varlen_mask: a mask over all rows written from
the definition, not our dense calls per sequence), both backends and both tensor-core families,
rows of no sequence left unwritten, device-only offsets bounded and reported, and every
host-checkable refusal before any launch."""

import numpy as np
import pytest

import numba_flash as nf
from numba_flash import reference as ref
from numba_flash.runtime import device
from helpers import (SIMULATOR, assert_close_rule, assert_lse, int32_array, nan_like, randn,
                     to_device, to_host)
from kernels._backward_cases import check_sink_gradient

# An sm_80 part: the tc backend runs the mma.sync kernels (under the simulator too).
AMPERE = device.Device(cc=(8, 0), sms=8, shared_per_block=163 * 1024, shared_per_sm=164 * 1024)


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def packed(rng, lengths_q, lengths_k, fmt, hq=2, hk=1, d=16, extra=1):
    """Random packed q, k, v with ``extra`` rows past the last sequence (rows of none)."""
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = randn(rng, (cu_q[-1] + extra, hq, d), fmt)
    k, v = (randn(rng, (cu_k[-1] + extra, hk, d), fmt) for _ in range(2))
    return q, k, v, cu_q, cu_k


def reference_forward(q, k, v, mask):
    out, lse = ref.attention_fwd_ref(q[None], k[None], v[None], mask=mask)
    return out[0], lse[0], ref.attention_lowp(q[None], k[None], v[None], mask=mask)[0]


def family(name):
    """The device a tc family runs on here: wgmma on the simulated Hopper, mma.sync on sm_80."""
    if name == "mma":
        return device.plan_for(AMPERE)
    if not SIMULATOR and device.current().cc[:2] != (9, 0):
        pytest.skip("the wgmma kernels need a Hopper")
    return device.plan_for(device.current())


# Sequence 0 has more queries than keys (causal: its first rows see no key), sequence 1 none.
LENGTHS_Q, LENGTHS_K = [5, 0], [3, 2]
CASES = [("simt", None, "float32", False), ("simt", None, "bfloat16", True),
         ("tc", "wgmma", "float16", True), ("tc", "mma", "bfloat16", False)]


@pytest.mark.parametrize("backend, fam, fmt, causal", CASES)
def test_varlen_forward_matches_the_packed_reference(rng, backend, fam, fmt, causal):
    q, k, v, cu_q, cu_k = packed(rng, LENGTHS_Q, LENGTHS_K, fmt)
    out = nan_like(q)
    with family(fam) if fam else device.plan_for(device.current()):
        o, lse = nf.flash_attn_varlen_fwd(
            to_device(q), to_device(k), to_device(v), int32_array(cu_q), int32_array(cu_k),
            max(LENGTHS_Q), max(LENGTHS_K), causal=causal, backend=backend, out=out)
    assert o is out
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), causal)
    want, want_lse, lowp = reference_forward(q, k, v, mask)
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[rows], lowp[rows], fmt)
    assert_lse(to_host(lse)[:, rows], want_lse[:, rows])
    assert to_host(lse).shape == (2, len(q))
    assert np.isnan(to_host(o)[cu_q[-1]:].astype(np.float32)).all(), "a row of no sequence written"
    nf.check_errors()


@pytest.mark.parametrize("backend, fam, fmt, causal", CASES)
def test_varlen_backward_matches_the_packed_reference(rng, backend, fam, fmt, causal):
    """dq, dk, dv against the packed reference; the simt cases run twice and must repeat
    bitwise (the tc kernels' determinism is their dense tests': the varlen code adds no
    reduction)."""
    q, k, v, cu_q, cu_k = packed(rng, LENGTHS_Q, LENGTHS_K, fmt, extra=0)
    dout = randn(rng, q.shape, fmt)
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), causal)
    args = [to_device(x) for x in (dout, q, k, v)]
    repeats = 2 if backend == "simt" else 1
    with family(fam) if fam else device.plan_for(device.current()):
        out, lse = nf.flash_attn_varlen_fwd(*args[1:], int32_array(cu_q), int32_array(cu_k),
                                            max(LENGTHS_Q), max(LENGTHS_K), causal=causal,
                                            backend=backend)
        runs = [nf.flash_attn_varlen_bwd(*args, out, lse, int32_array(cu_q), int32_array(cu_k),
                                         max(LENGTHS_Q), max(LENGTHS_K), causal=causal,
                                         backend=backend) for _ in range(repeats)]
    want = ref.attention_bwd_ref(dout[None], q[None], k[None], v[None], mask=mask)
    lowp = ref.attention_bwd_lowp(dout[None], q[None], k[None], v[None], mask=mask)
    for name, got, w, lp in zip(("dq", "dk", "dv"), runs[0], want, lowp):
        assert_close_rule(got, w[0], lp[0], fmt, what=name)
    if repeats == 2:
        for first, again in zip(*runs):
            assert np.array_equal(to_host(first).view(np.uint8), to_host(again).view(np.uint8))
    # the keys of sequence 1, which has no query, get zero gradients
    assert not to_host(runs[0][1])[cu_k[1]:].astype(np.float32).any()
    nf.check_errors()


def test_seqused_k_limits_each_sequence_to_its_first_keys(rng):
    q, k, v, cu_q, cu_k = packed(rng, [2, 3], [4, 3], "float32")
    used = np.array([2, 3], np.int32)
    o, lse = nf.flash_attn_varlen_fwd(to_device(q), to_device(k), to_device(v), int32_array(cu_q),
                                      int32_array(cu_k), 3, 4, causal=True, backend="simt",
                                      seqused_k=int32_array(used))
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), True, seqused_k=used)
    want, want_lse, lowp = reference_forward(q, k, v, mask)
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[rows], lowp[rows], "float32")
    assert_lse(to_host(lse)[:, rows], want_lse[:, rows])
    nf.check_errors()


@pytest.mark.parametrize("cu_q, max_q", [([0, 4, 2], 4),    # decreasing
                                         ([0, 2, 9], 8),    # past the rows
                                         ([0, 5, 5], 3)])   # longer than max_seqlen_q
def test_offsets_only_the_device_sees_are_bounded_and_reported(rng, cu_q, max_q):
    """The kernels clamp each sequence into its array and bound: nothing outside the arrays is
    read or written (the simulator raises on an out-of-range index), and check_errors names
    the offsets."""
    q, k, v, _, cu_k = packed(rng, [2, 3], [3, 3], "float32", extra=0)
    nf.flash_attn_varlen_fwd(to_device(q), to_device(k), to_device(v), int32_array(cu_q),
                             int32_array(cu_k), max_q, 3, backend="simt")
    with pytest.raises(RuntimeError, match="cu_seqlens_q"):
        nf.check_errors()
    nf.check_errors()  # cleared


def paginate(rng, x, cu, page_size, width):
    """Packed rows ``x`` (total, H, D) as pages of ``page_size`` rows behind a block table
    (B, width): each sequence's keys from its key 0 in pages of its own, the pages shuffled,
    table entries past a sequence's pages a page number that does not exist (never read)."""
    b = len(cu) - 1
    counts = [-(-(cu[i + 1] - cu[i]) // page_size) for i in range(b)]
    order = rng.permutation(sum(counts) + 1)  # one page that no sequence owns
    pages = np.zeros((len(order), page_size, *x.shape[1:]), x.dtype)
    table = np.full((b, width), len(order) + 5, np.int32)
    slot = 0
    for i in range(b):
        for blk in range(counts[i]):
            rows = x[cu[i] + blk * page_size:min(cu[i + 1], cu[i] + (blk + 1) * page_size)]
            pages[order[slot], :len(rows)] = rows
            table[i, blk] = order[slot]
            slot += 1
    return pages, table


PAGED_CASES = [("simt", None, "float32", True, 3, None),
               ("tc", "wgmma", "float16", True, 5, None),
               ("tc", "mma", "bfloat16", False, 2, [2, 1])]


@pytest.mark.parametrize("backend, fam, fmt, causal, page_size, used", PAGED_CASES)
def test_paged_varlen_forward_matches_the_packed_reference(rng, backend, fam, fmt, causal,
                                                            page_size, used):
    """K and V in shuffled pages of odd sizes behind a block table (whose unused entries are
    not pages: never read), against the reference of the same keys packed."""
    lengths_q, lengths_k = [4, 3], [7, 2]
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, fmt)
    width = -(-max(lengths_k) // page_size) + 1
    (k_pages, table), (v_pages, _) = (paginate(np.random.default_rng(7), x, cu_k, page_size,
                                               width) for x in (k, v))
    used_k = None if used is None else int32_array(used)
    out = nan_like(q)
    with family(fam) if fam else device.plan_for(device.current()):
        o, lse = nf.flash_attn_varlen_fwd(
            to_device(q), to_device(k_pages), to_device(v_pages), int32_array(cu_q),
            int32_array(cu_k), max(lengths_q), max(lengths_k), causal=causal, backend=backend,
            out=out, seqused_k=used_k, block_table=int32_array(table))
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), causal,
                           seqused_k=None if used is None else np.array(used, np.int32))
    want, want_lse, lowp = reference_forward(q, k, v, mask)
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[rows], lowp[rows], fmt)
    assert_lse(to_host(lse)[:, rows], want_lse[:, rows])
    assert np.isnan(to_host(o)[cu_q[-1]:].astype(np.float32)).all(), "a row of no sequence written"
    nf.check_errors()


@pytest.mark.parametrize("backend, fam, fmt, page_size, window", [
    ("simt", None, "float16", 3, (5, 1)), ("tc", "mma", "bfloat16", 4, (9, -1)),
    ("tc", "wgmma", "float16", 5, (2, 0))])
def test_paged_sliding_window_starts_at_the_windows_first_page(rng, backend, fam, fmt,
                                                                page_size, window):
    """A window over paged keys: each query tile's keys from the page its window starts in (the
    table viewed from there; starts inside a page), with ALiBi's distances across that view."""
    lengths_q, lengths_k = [6, 2], [40, 9]
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, fmt)
    width = -(-max(lengths_k) // page_size) + 1
    (k_pages, table), (v_pages, _) = (paginate(np.random.default_rng(5), x, cu_k, page_size,
                                               width) for x in (k, v))
    slopes = np.array([0.5, 0.125], np.float32)[:q.shape[1]]
    with family(fam) if fam else device.plan_for(device.current()):
        o, lse = nf.flash_attn_varlen_fwd(
            to_device(q), to_device(k_pages), to_device(v_pages), int32_array(cu_q),
            int32_array(cu_k), max(lengths_q), max(lengths_k), causal=True, window_size=window,
            alibi_slopes=to_device(slopes), backend=backend, block_table=int32_array(table))
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), True, window_size=window)
    bias = ref.varlen_alibi_bias(slopes, cu_q, cu_k, len(q), len(k))
    args = (q[None], k[None], v[None], False, None, mask, None, bias)
    want, want_lse = ref.attention_fwd_ref(*args)
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[0][rows], ref.attention_lowp(*args)[0][rows], fmt)
    assert_lse(to_host(lse)[:, rows], want_lse[0][:, rows])
    nf.check_errors()


@pytest.mark.parametrize("fam, tiles", [("wgmma", (64, 16, 4, 0)), ("mma", (32, 16, 2, 0))])
def test_paged_tiles_past_the_first_read_the_pages_fetched_a_tile_ahead(rng, fam, tiles):
    """16-key tiles over 37 keys in pages of 3 (a page size below the rows one copy pass
    covers): the tensor-core kernels read each tile's table entries a tile ahead of its copy."""
    from numba_flash.kernels.tc import forward_mma, forward_wgmma

    spec = (forward_wgmma if fam == "wgmma" else forward_mma).SPEC
    lengths_q, lengths_k = [5, 2], [37, 20]
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, "bfloat16")
    (k_pages, table), (v_pages, _) = (paginate(np.random.default_rng(3), x, cu_k, 3, 14)
                                      for x in (k, v))
    with family(fam), spec.forcing(tiles):
        o, lse = nf.flash_attn_varlen_fwd(
            to_device(q), to_device(k_pages), to_device(v_pages), int32_array(cu_q),
            int32_array(cu_k), 5, 37, causal=True, backend="tc", block_table=int32_array(table))
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), True)
    want, want_lse, lowp = reference_forward(q, k, v, mask)
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[rows], lowp[rows], "bfloat16")
    assert_lse(to_host(lse)[:, rows], want_lse[:, rows])
    nf.check_errors()


@pytest.mark.parametrize("entry, cu_k, message", [(9, [0, 3, 6], "block_table"),
                                                  (-1, [0, 3, 6], "block_table"),
                                                  (0, [0, 3, 12], "cu_seqlens_k")])
def test_paged_keys_only_the_device_sees_are_bounded_and_reported(rng, entry, cu_k, message):
    """A table entry that is not a page reads as zeros; a sequence longer than its table's
    pages is cut to them: nothing outside k, v or the table is read (the simulator raises on
    an out-of-range index), and check_errors names the argument."""
    q, _, _, cu_q, _ = packed(rng, [2, 3], [3, 3], "float32", extra=0)
    k, v = (randn(rng, (4, 2, 1, 16), "float32") for _ in range(2))
    table = np.array([[0, 1, 2], [3, entry, 1]], np.int32)  # 3 pages of 2 keys a sequence
    nf.flash_attn_varlen_fwd(to_device(q), to_device(k), to_device(v), int32_array(cu_q),
                             int32_array(np.array(cu_k, np.int32)), 3, 9, backend="simt",
                             block_table=int32_array(table))
    with pytest.raises(RuntimeError, match=message):
        nf.check_errors()


def test_seqused_k_past_its_sequence_is_bounded_and_reported(rng):
    q, k, v, cu_q, cu_k = packed(rng, [2, 3], [3, 3], "float32", extra=0)
    nf.flash_attn_varlen_fwd(to_device(q), to_device(k), to_device(v), int32_array(cu_q),
                             int32_array(cu_k), 3, 3, backend="simt",
                             seqused_k=int32_array([5, -1]))
    with pytest.raises(RuntimeError, match="seqused_k"):
        nf.check_errors()


def _pages(rng):
    return dict(k=to_device(randn(rng, (3, 4, 1, 16), "float16")),
                v=to_device(randn(rng, (3, 4, 1, 16), "float16")))


def _good(rng):
    q, k, v, cu_q, cu_k = packed(rng, [2, 3], [3, 3], "float16", extra=0)
    return dict(q=to_device(q), k=to_device(k), v=to_device(v), cu_seqlens_q=int32_array(cu_q),
                cu_seqlens_k=int32_array(cu_k), max_seqlen_q=3, max_seqlen_k=3)


# Windows per sequence: sequence 0 (7 queries, 12 keys: bottom-right offset 5) with left 2 and
# right 1, sequence 1 empty of queries, sequence 2 (3 queries, 2 keys) causal with left 0.
WINDOW_CASES = [("simt", None, "bfloat16", False, (2, 1)), ("tc", "mma", "float16", True, (0, -1)),
                ("tc", "wgmma", "bfloat16", False, (3, 0))]


@pytest.mark.parametrize("backend, fam, fmt, causal, window", WINDOW_CASES)
def test_varlen_sliding_window_matches_the_packed_reference(rng, backend, fam, fmt, causal,
                                                            window):
    lengths_q, lengths_k = [7, 0, 3], [12, 4, 2]
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, fmt)
    out = nan_like(q)
    with family(fam) if fam else device.plan_for(device.current()):
        o, lse = nf.flash_attn_varlen_fwd(
            to_device(q), to_device(k), to_device(v), int32_array(cu_q), int32_array(cu_k),
            max(lengths_q), max(lengths_k), causal=causal, window_size=window, backend=backend,
            out=out)
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), causal, window_size=window)
    want, want_lse, lowp = reference_forward(q, k, v, mask)
    rows = slice(0, cu_q[-1])
    assert_close_rule(to_host(o)[rows], want[rows], lowp[rows], fmt)
    assert_lse(to_host(lse)[:, rows], want_lse[:, rows])
    nf.check_errors()


# (the wgmma pair's windows run in its dense tests: simulated, its varlen step costs a minute)
@pytest.mark.parametrize("backend, fam, fmt, causal, window", WINDOW_CASES[:2])
def test_varlen_sliding_window_backward_matches_the_packed_reference(rng, backend, fam, fmt,
                                                                     causal, window):
    lengths_q, lengths_k = [7, 0, 3], [12, 4, 2]
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, fmt, extra=0)
    dout = randn(rng, q.shape, fmt)
    args = [to_device(x) for x in (dout, q, k, v)]
    bounds = (int32_array(cu_q), int32_array(cu_k), max(lengths_q), max(lengths_k))
    with family(fam) if fam else device.plan_for(device.current()):
        out, lse = nf.flash_attn_varlen_fwd(*args[1:], *bounds, causal=causal,
                                            window_size=window, backend=backend)
        grads = nf.flash_attn_varlen_bwd(*args, out, lse, *bounds, causal=causal,
                                         window_size=window, backend=backend)
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), causal, window_size=window)
    want = ref.attention_bwd_ref(dout[None], q[None], k[None], v[None], mask=mask)
    lowp = ref.attention_bwd_lowp(dout[None], q[None], k[None], v[None], mask=mask)
    for name, got, w, lp in zip(("dq", "dk", "dv"), grads, want, lowp):
        assert_close_rule(got, w[0], lp[0], fmt, factor=3.0, what=name)
    nf.check_errors()


@pytest.mark.parametrize("backend, fam, fmt", [("simt", None, "float16"),
                                               ("tc", "mma", "bfloat16")])
def test_varlen_alibi_and_sinks_match_the_packed_reference(rng, backend, fam, fmt):
    """Per-sequence ALiBi slopes (B, Hq) and sinks, with a window, forward and backward: each
    sequence's distances from its own lengths; the empty sequence's rows are never written."""
    lengths_q, lengths_k = [7, 0, 3], [12, 4, 2]
    q, k, v, cu_q, cu_k = packed(rng, lengths_q, lengths_k, fmt, extra=0)
    hq = q.shape[1]
    slopes = (0.5 ** rng.integers(1, 6, (3, hq))).astype(np.float32)
    sink = rng.standard_normal(hq).astype(np.float32)
    dout = randn(rng, q.shape, fmt)
    args = [to_device(x) for x in (dout, q, k, v)]
    bounds = (int32_array(cu_q), int32_array(cu_k), max(lengths_q), max(lengths_k))
    options = dict(causal=True, window_size=(4, -1), alibi_slopes=to_device(slopes),
                   learnable_sink=to_device(sink), backend=backend)
    with family(fam) if fam else device.plan_for(device.current()):
        out, lse = nf.flash_attn_varlen_fwd(*args[1:], *bounds, **options)
        grads = nf.flash_attn_varlen_bwd(*args, out, lse, *bounds, **options)
    mask = ref.varlen_mask(cu_q, cu_k, len(q), len(k), True, window_size=(4, -1))
    bias = ref.varlen_alibi_bias(slopes, cu_q, cu_k, len(q), len(k))
    packed_args = (q[None], k[None], v[None], False, None, mask, None, bias, sink)
    want, want_lse = ref.attention_fwd_ref(*packed_args)
    assert_close_rule(out, want[0], ref.attention_lowp(*packed_args)[0], fmt)
    assert_lse(to_host(lse), want_lse[0])
    want = ref.attention_bwd_ref(dout[None], *packed_args)
    lowp = ref.attention_bwd_lowp(dout[None], *packed_args)
    for name, got, w, lp in zip(("dq", "dk", "dv"), grads, want, lowp):
        assert_close_rule(got, w[0], lp[0], fmt, factor=3.0, what=name)
    check_sink_gradient(grads[3], want[3], dout[None], *packed_args)
    nf.check_errors()


REFUSALS = {
    "q rank": (lambda g, rng: dict(q=to_device(randn(rng, (1, 5, 2, 16), "float16"))),
               ValueError, "^q: expected 3 dimensions"),
    "k heads": (lambda g, rng: dict(k=to_device(randn(rng, (6, 3, 16), "float16")),
                                    v=to_device(randn(rng, (6, 3, 16), "float16"))),
                ValueError, "^k: query heads"),
    "cu dtype": (lambda g, rng: dict(cu_seqlens_q=int32_array([0, 2, 5], np.int64)),
                 TypeError, "^cu_seqlens_q: expected int32"),
    "cu_k length": (lambda g, rng: dict(cu_seqlens_k=int32_array([0, 6])),
                    ValueError, r"^cu_seqlens_k: expected shape \(3,\)"),
    "no sequence": (lambda g, rng: dict(cu_seqlens_q=int32_array([0])),
                    ValueError, "^cu_seqlens_q: expected shape"),
    "max_seqlen": (lambda g, rng: dict(max_seqlen_q=0), ValueError, "^max_seqlen_q"),
    "dropout": (lambda g, rng: dict(dropout_p=0.5), NotImplementedError, "^dropout_p"),
    "seqused_k": (lambda g, rng: dict(seqused_k=int32_array([1, 2, 3])),
                  ValueError, r"^seqused_k: expected shape \(2,\)"),
    "window type": (lambda g, rng: dict(window_size=(4.0, 0)), TypeError,
                    "^window_size: expected a pair of ints"),
    "window side": (lambda g, rng: dict(window_size=(-2, 0)), ValueError,
                    "^window_size: each side must be -1"),
    "softcap": (lambda g, rng: dict(softcap=-30.0), ValueError, "^softcap: expected a finite"),
    "alibi dtype": (lambda g, rng: dict(alibi_slopes=int32_array([1, 2])), TypeError,
                    "^alibi_slopes: expected float32"),
    "alibi shape": (lambda g, rng: dict(alibi_slopes=to_device(np.zeros((3, 2), np.float32))), ValueError,
                    r"^alibi_slopes: expected shape \(2,\) or \(2, 2\)"),
    "sink shape": (lambda g, rng: dict(learnable_sink=to_device(np.zeros((2, 2), np.float32))), ValueError,
                   r"^learnable_sink: expected shape \(2,\)"),
    "paged k rank": (lambda g, rng: dict(block_table=int32_array([[0], [1]])),
                     ValueError, "^k: expected 4 dimensions"),
    "table shape": (lambda g, rng: dict(block_table=int32_array([0, 1]), **_pages(rng)),
                    ValueError, r"^block_table: expected shape \(2, n\)"),
    "page stride": (lambda g, rng: dict(block_table=int32_array([[0], [1]]),
                                        k=_pages(rng)["k"][::-1], v=_pages(rng)["v"]),
                    ValueError, "^k: pages and their rows must be 0 to 4 GiB apart"),
    "table dtype": (lambda g, rng: dict(block_table=int32_array([[0], [1]], np.int64),
                                        **_pages(rng)),
                    TypeError, "^block_table: expected int32"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_arguments_are_refused_before_anything_is_written(rng, case):
    change, exc, message = REFUSALS[case]
    args = _good(rng)
    args.update(change(args, rng))
    out = nan_like(np.zeros((5, 2, 16), np.float16))
    with pytest.raises(exc, match=message):
        nf.flash_attn_varlen_fwd(**args, out=out)
    assert np.isnan(to_host(out).astype(np.float32)).all()


def test_the_backward_refuses_an_lse_of_the_dense_layout(rng):
    args = _good(rng)
    with pytest.raises(ValueError, match=r"^lse: expected shape \(2, 5\)"):
        nf.flash_attn_varlen_bwd(args["q"], args["q"], args["k"], args["v"], args["q"],
                                 to_device(np.zeros((1, 2, 5), np.float32)),
                                 args["cu_seqlens_q"], args["cu_seqlens_k"], 3, 3)


def test_varlen_func_returns_out_or_out_and_lse(rng):
    args = _good(rng)
    out = nf.flash_attn_varlen_func(**args, backend="simt")
    both = nf.flash_attn_varlen_func(**args, backend="simt", return_lse=True)
    assert np.array_equal(to_host(out), to_host(both[0]))
    assert to_host(both[1]).shape == (2, 5)
