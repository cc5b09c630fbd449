"""The paged MLA decode checks both families run (simt/test_mla_decode.py and
tc/test_mla_decode_wgmma.py): adversarial paged caches and one decode through the public API
against the float64 reference.

The caches are adversarial: sequences live in shuffled pages, every cache slot no sequence owns
is NaN, and every block-table entry past a sequence's last page is a huge sentinel, so a kernel
that reads one slot or table entry too many fails (NaN in the output, or an out-of-range page).
"""

import ml_dtypes
import numpy as np
import pytest

import numba_flash as nf
from numba_flash import reference as ref
from numba_flash.runtime import arrays
from helpers import (SIMULATOR, DTYPES, assert_close_rule, assert_lse, nan_like, randn, to_device,
                     to_host)

SENTINEL = 1 << 30  # block-table entries no sequence uses: far outside any cache


def cdiv(a, b):
    return -(-a // b)


def paged_cache(rng, seqlens, page, h_kv, d, fmt, spare_pages=3, spare_columns=2):
    """``(k_cache, block_table)``: the rows of each sequence in shuffled pages, NaN elsewhere."""
    used = [cdiv(int(n), page) for n in seqlens]
    num_blocks = sum(used) + spare_pages
    cache = np.full((num_blocks, page, h_kv, d), np.nan, np.float32)
    table = np.full((len(seqlens), max(used) + spare_columns), SENTINEL, np.int32)
    pages = iter(rng.permutation(num_blocks))
    for i, n in enumerate(seqlens):
        for j in range(used[i]):
            table[i, j] = p = next(pages)
            rows = min(page, int(n) - j * page)
            cache[p, :rows] = rng.standard_normal((rows, h_kv, d))
    return cache.astype(DTYPES[fmt]), table


def mla_lowp(q, k_cache, block_table, seqlens, head_dim_v, causal, attn_sink=None):
    """The same-dtype plain attention of the tolerance rule in docs/design.md, one sequence at
    a time (float64 out); ``attn_sink`` scales each row as ``reference.mla_decode_ref`` does,
    the result rounded again."""
    b, s_q, h_q, _ = q.shape
    page = k_cache.shape[1]
    out = np.zeros((b, s_q, h_q, head_dim_v))
    for i, n in enumerate(int(n) for n in seqlens):
        if n:
            pages = block_table[i, :cdiv(n, page)]
            k = k_cache[pages].reshape(1, -1, *k_cache.shape[2:])[:, :n]
            out[i:i + 1] = ref.attention_lowp(q[i:i + 1], k, k[..., :head_dim_v], causal)
    if attn_sink is not None:
        _, lse = ref.mla_decode_ref(q, k_cache, block_table, seqlens, head_dim_v, causal=causal)
        share = 1 / (1 + np.exp(attn_sink.astype(np.float64)[None, :, None] - lse))
        out = ref.to_float64((out * share.transpose(0, 2, 1)[..., None]).astype(q.dtype))
    return out


# DeepSeek sizes for the tensor-core decodes' GPU tests: (seqlens, s_q, h_q, h_kv, d 576 = 512 +
# 64, dv 512, page, causal, fmt, num_sms, splits): one and two 64-row tiles of packed rows, a
# 64k + 1 request cut over many parts, lengths 0 and 1, causal s_q = 2, page sizes 1 / 16 (the
# row copies) and 64 / 256 (whole tiles per page), h_kv = 4, fp16 and bf16.
DEEPSEEK_CASES = [
    ([1 + 13 * i for i in range(128)], 1, 16, 1, 576, 512, 64, False, "bfloat16", None, None),
    ([65537, 1, 0, 5000, 777], 1, 16, 1, 576, 512, 64, False, "bfloat16", None, True),
    ([2048, 1500], 2, 128, 1, 576, 512, 64, True, "float16", None, None),
    ([1000, 10, 0, 300], 1, 128, 1, 576, 512, 64, False, "bfloat16", 132, True),
    ([200] * 128, 1, 128, 1, 576, 512, 256, False, "bfloat16", None, None),
    ([4097, 63, 64, 65, 0, 1], 2, 16, 1, 576, 512, 16, True, "bfloat16", 132, True),
    ([3000, 2000], 1, 32, 4, 576, 512, 64, False, "float16", 132, None),
    ([5000, 50], 2, 64, 1, 576, 512, 1, True, "bfloat16", 132, True),
]


def grow_keys(k_cache, table, seqlens, growth):
    """Key j of every sequence times 1 + growth j: later tiles score ever higher, so the running
    maximum moves again and again (a tile's maximum passes the last by more than the kernels'
    lazy threshold), not only at the first tile as on random caches."""
    page = k_cache.shape[1]
    for i, n in enumerate(int(n) for n in seqlens):
        for j in range(n):
            k_cache[table[i, j // page], j % page] *= 1 + growth * j


def run_case(rng, seqlens, s_q, h_q, h_kv, d, dv, page, causal, fmt, num_sms, splits=None,
             unaligned=False, backend="auto", growth=0.0, sink=False):
    """One decode through the public API, checked against the reference; ``splits`` (if not
    None) asserts whether the plan cut some request into pieces, i.e. whether the combine ran;
    ``unaligned`` passes the cache as a view that starts one element into wider rows;
    ``growth``: keys scaled by ``grow_keys``; ``sink``: a random ``attn_sink``."""
    seqlens = np.asarray(seqlens, np.int32)
    k_cache, table = paged_cache(rng, seqlens, page, h_kv, d, fmt)
    if growth:
        grow_keys(k_cache, table, seqlens, growth)
    dk_cache = to_device(k_cache)
    if unaligned:
        wide = np.zeros(k_cache.shape[:3] + (d + 1,), k_cache.dtype)
        wide[..., 1:] = k_cache
        dk_cache = to_device(wide)[..., 1:]
        assert not arrays.rows_16_byte_aligned(arrays.adapt(dk_cache, "k_cache"))
    q = randn(rng, (len(seqlens), s_q, h_q, d), fmt)
    metadata, num_splits = nf.get_mla_metadata(to_device(seqlens), s_q * h_q // h_kv, h_kv,
                                               num_sms=num_sms)
    if splits is not None:
        assert (np.diff(to_host(num_splits)) > 1).any() == splits, to_host(num_splits)
    out = nan_like(np.zeros((len(seqlens), s_q, h_q, dv), DTYPES[fmt]))
    attn_sink = (2 * rng.standard_normal(h_q)).astype(np.float32) if sink else None
    o, lse = nf.flash_mla_with_kvcache(to_device(q), dk_cache, to_device(table),
                                       to_device(seqlens), dv, metadata, num_splits,
                                       causal=causal, out=out, backend=backend,
                                       attn_sink=None if sink is False else to_device(attn_sink))
    assert o is out
    ro, rl = ref.mla_decode_ref(q, k_cache, table, seqlens, dv, causal=causal,
                                attn_sink=attn_sink)
    assert_close_rule(o, ro, mla_lowp(q, k_cache, table, seqlens, dv, causal, attn_sink), fmt)
    assert_lse(lse, rl)


def sparse_cache(rng, num_blocks, page, h_kv, d, fp8, used):
    """A cache whose rows ``used`` (flat row numbers) hold random values and all others NaN:
    bfloat16 (num_blocks, page, h_kv, d), or DeepSeek-V3.2's FP8 rows (num_blocks, page, 1,
    656) of bfloat16-sized values (NaN rows: every byte 0x7F, an e4m3 and float32 NaN)."""
    if fp8:
        rows = np.full((num_blocks * page, 656), 0x7F, np.uint8)
        rows[used] = ref.quantize_v32(rng.standard_normal((len(used), d)) / 4)
        return rows.reshape(num_blocks, page, 1, 656).view(ml_dtypes.float8_e4m3fn)
    rows = np.full((num_blocks * page, h_kv, d), np.nan, np.float32)
    rows[used] = rng.standard_normal((len(used), h_kv, d))
    return rows.reshape(num_blocks, page, h_kv, d).astype(DTYPES["bfloat16"])


def sparse_lowp(q, k_cache, indices, dv, topk_length, fp8, attn_sink):
    """``mla_lowp``'s plain attention for the sparse decode, one query token at a time."""
    b, s_q, h_q, _ = q.shape
    rows = ref.dequantize_v32(k_cache.reshape(-1, 1, 656)) if fp8 else \
        k_cache.reshape(-1, *k_cache.shape[2:])
    out = np.zeros((b, s_q, h_q, dv))
    for i in range(b):
        n = indices.shape[2] if topk_length is None else min(max(topk_length[i], 0),
                                                              indices.shape[2])
        for t in range(s_q):
            chosen = [r for r in indices[i, t, :n] if 0 <= r < len(rows)]
            if chosen:
                k = rows[chosen][None]
                out[i, t:t + 1] = ref.attention_lowp(q[i:i + 1, t:t + 1], k, k[..., :dv])[0]
    if attn_sink is not None:
        _, lse = ref.sparse_mla_ref(q, k_cache, indices, dv, topk_length=topk_length,
                                    is_fp8_kvcache=fp8)
        share = 1 / (1 + np.exp(attn_sink.astype(np.float64)[None, :, None] - lse))
        out = ref.to_float64((out * share.transpose(0, 2, 1)[..., None]).astype(q.dtype))
    return out


def run_sparse_case(rng, b, s_q, h_q, h_kv, d, dv, page, topk, fp8, backend="auto",
                    num_sms=None, sink=False, topk_length=None, empty_token=True,
                    bad_index=False, splits=None):
    """One sparse decode (DeepSeek-V3.2's ``indices``) through the public API against
    ``reference.sparse_mla_ref``: each token's indices are distinct rows of a shuffled cache
    whose other rows are NaN, then -1 padding; with ``empty_token`` the last token has none.
    ``num_sms``: the plan of ``get_mla_metadata(..., topk=...)`` passed in (else the call plans
    itself); ``topk_length``: (b,) lengths; ``sink``: a random ``attn_sink``; ``bad_index``:
    the first token's first two entries point past the cache and below -1 (skipped and
    reported); ``splits`` (with ``num_sms``) asserts whether the plan cuts a token's keys."""
    num_blocks = max(2, -(-(b * s_q * topk) // page))
    used = rng.permutation(num_blocks * page)[:num_blocks * page * 3 // 4]
    k_cache = sparse_cache(rng, num_blocks, page, h_kv, d, fp8, used)
    indices = np.full((b, s_q, topk), -1, np.int32)
    for i in range(b):
        for t in range(s_q):
            n = int(rng.integers(1, topk + 1))
            indices[i, t, :n] = rng.choice(used, n, replace=False)
    if empty_token:
        indices[-1, -1] = -1
    if bad_index:
        indices[0, 0, :2] = (num_blocks * page + 7, -5)
    q = (randn(rng, (b, s_q, h_q, d), "float32") / (4 if fp8 else 1)).astype(DTYPES["bfloat16"])
    plan = (None, None)
    if num_sms is not None:
        plan = nf.get_mla_metadata(to_device(np.zeros(b, np.int32)), s_q * h_q // h_kv, h_kv,
                                   h_q, fp8, topk, num_sms=num_sms)
        if splits is not None:
            assert (np.diff(to_host(plan[1])) > 1).any() == splits, to_host(plan[1])
    attn_sink = (2 * rng.standard_normal(h_q)).astype(np.float32) if sink else None
    lengths = None if topk_length is None else np.asarray(topk_length, np.int32)
    o, lse = nf.flash_mla_with_kvcache(
        to_device(q), to_device(k_cache), None, None, dv, *plan, is_fp8_kvcache=fp8,
        indices=to_device(indices), backend=backend,
        attn_sink=None if attn_sink is None else to_device(attn_sink),
        topk_length=None if lengths is None else to_device(lengths))
    if bad_index:
        with pytest.raises(RuntimeError, match="indices"):
            nf.check_errors()
    nf.check_errors()
    ro, rl = ref.sparse_mla_ref(q, k_cache, indices, dv, topk_length=lengths,
                                attn_sink=attn_sink, is_fp8_kvcache=fp8)
    assert to_host(o).shape == (b, s_q, h_q, dv) and to_host(lse).shape == (b, h_q, s_q)
    assert_close_rule(o, ro, sparse_lowp(q, k_cache, indices, dv, lengths, fp8, attn_sink),
                      "bfloat16")
    assert_lse(lse, rl)


def check_bad_device_values(rng, backend, page=16, d=32, dv=32):
    """Values only the device sees, each wrong in one way: a block-table entry inside a
    sequence that is no page of the cache (past its end, -1), a length past the table's columns,
    metadata naming requests outside the batch, split counts naming slots that do not exist.
    The decode must stay inside its arrays (on a GPU: no illegal address), leave the requests the
    bad value does not touch as they were, and report the value through ``nf.check_errors``."""
    # Two pages for request 0 (its entries are the bad ones), a bad length for request 1 that
    # reaches past the table's columns (planned for, so the walk goes that far at any page size).
    # At page 16: request 0 on two pages, both bad, and the table two columns wide, so 40 keys
    # end a tile past it (short requests: each tile costs seconds under the simulator).
    seqlens, long = ([20, 9], [20, 40]) if page < 64 else ([100, 33], [100, 200])
    seqlens = np.array(seqlens, np.int32)
    k_cache, table = paged_cache(rng, seqlens, page, 1, d, "bfloat16", spare_columns=0)
    q = to_device(randn(rng, (2, 1, 4, d), "bfloat16"))
    cache = to_device(k_cache)
    lens = to_device(seqlens)
    meta, splits = (to_host(x) for x in nf.get_mla_metadata(lens, 4, 1, num_sms=4))

    def decode(table=table, lens=lens, meta=meta, splits=splits):
        out = nan_like(np.zeros((2, 1, 4, dv), DTYPES["bfloat16"]))
        nf.flash_mla_with_kvcache(q, cache, to_device(table), lens, dv, to_device(meta),
                                  to_device(splits), backend=backend, out=out)
        return to_host(out)

    good = decode()
    nf.check_errors()  # good inputs: nothing to report
    bad_table = table.copy()
    bad_table[0, 0], bad_table[0, 1] = SENTINEL, -1
    long = to_device(np.array(long, np.int32))
    long_meta, long_splits = (to_host(x) for x in nf.get_mla_metadata(long, 4, 1, num_sms=4))
    bad_meta = meta.copy()
    bad_meta[0, 1] = 7  # the last request of part 0 past the batch
    # The bad metadata and the bad split counts share one decode (each decode is seconds of
    # emulation): this plan cuts no request, so the decode kernel writes no accumulator slot
    # (the only use of a split count there) and the combine, which bounds the counts, reads no
    # metadata; neither leaves a request to compare, and each sets its own status bit.
    bad_splits = np.array([0, 1 << 20, 1 << 21], np.int32)
    cases = [(["block_table"], dict(table=bad_table), [1]),
             (["cache_seqlens"], dict(lens=long, meta=long_meta, splits=long_splits), [0]),
             (["tile_scheduler_metadata", "num_splits"], dict(meta=bad_meta, splits=bad_splits),
              [])]
    for names, change, untouched in cases:
        got = decode(**change)
        for r in untouched:
            np.testing.assert_array_equal(got[r], good[r])
        with pytest.raises(RuntimeError, match=names[0]) as raised:
            nf.check_errors()
        for name in names[1:]:
            assert name in str(raised.value), (name, raised.value)
        nf.check_errors()  # cleared


def check_bad_table_walk(rng, backend, page, d, dv):
    """A kernel's own walk of the block table, in one decode: request 0 has a bad entry in its
    first pair of tiles (the prologue's reads), another in tile 2 and a length whose tile 3 lies
    past the table's columns (both read inside the tile loop, where a kernel may read entries
    ahead of their use). The decode must stay inside its arrays, report both values, and give
    request 1 its reference result. The metadata and split counts are read by the walk that
    every tensor-core decode shares (``check_bad_device_values`` covers them)."""
    seqlens = np.array([3 * page - 2, 33], np.int32)  # three pages, three columns
    k_cache, table = paged_cache(rng, seqlens, page, 1, d, "bfloat16", spare_columns=0)
    assert table.shape[1] == 3
    table[0, 0], table[0, 2] = SENTINEL, -1
    lens = np.array([3 * page + 9, 33], np.int32)  # request 0 planned into a fourth page
    q = randn(rng, (2, 1, 4, d), "bfloat16")
    out = nan_like(np.zeros((2, 1, 4, dv), DTYPES["bfloat16"]))
    meta = nf.get_mla_metadata(to_device(lens), 4, 1, num_sms=1)  # one piece: 2, 3 in the loop
    nf.flash_mla_with_kvcache(to_device(q), to_device(k_cache), to_device(table), to_device(lens),
                              dv, *meta, backend=backend, out=out)
    got = to_host(out)
    with pytest.raises(RuntimeError, match="block_table") as raised:
        nf.check_errors()
    assert "cache_seqlens" in str(raised.value)
    nf.check_errors()  # cleared
    want = ref.mla_decode_ref(q[1:], k_cache, table[1:], seqlens[1:], dv)[0]
    assert_close_rule(got[1:], want, mla_lowp(q[1:], k_cache, table[1:], seqlens[1:], dv, False),
                      "bfloat16")


# The tc decodes' negative-length tests run on a GPU only: the check is ``piece_of``'s, tested
# alone (tests/kernels/common/test_paged_kv.py) and through the simt decode under the simulator,
# and under the simulator each tc decode would add a minute of emulated tensor-core work.
TC_NEGATIVE_LENGTH_ON_A_GPU = pytest.mark.skipif(
    SIMULATOR, reason="piece_of's check: simt decode and test_paged_kv under the simulator")


def check_negative_length(rng, backend, page=16, d=32, dv=32, h_q=2):
    """A negative length among valid ones (causal, s_q = 2) is read as 0 and reported, with
    metadata from ``get_mla_metadata`` (two parts, the request ends the first) and with the
    decode planning itself: that request's rows come out as a length-0 request's (``out = 0``,
    ``lse = +inf``), the others as the reference's (bit for bit the same in both plans, neither
    of which cuts a request), and ``nf.check_errors`` names ``cache_seqlens``, once."""
    seqlens = np.array([40, -7, 9], np.int32)
    zeroed = np.maximum(seqlens, 0)
    k_cache, table = paged_cache(rng, zeroed, page, 1, d, "bfloat16")
    q = randn(rng, (3, 2, h_q, d), "bfloat16")
    lens = to_device(seqlens)
    plans = (nf.get_mla_metadata(lens, 2 * h_q, 1, num_sms=2), ())
    got = []
    for meta in plans:
        out = nan_like(np.zeros((3, 2, h_q, dv), DTYPES["bfloat16"]))
        _, lse = nf.flash_mla_with_kvcache(to_device(q), to_device(k_cache), to_device(table),
                                           lens, dv, *meta, causal=True, backend=backend,
                                           out=out)
        got.append((to_host(out).astype(np.float32), to_host(lse)))
        with pytest.raises(RuntimeError, match=r"^cache_seqlens: a length is negative \("):
            nf.check_errors()
        nf.check_errors()  # cleared
    (out, lse), (out_itself, lse_itself) = got
    assert (out[1] == 0).all() and np.isposinf(lse[1]).all()
    ro, rl = ref.mla_decode_ref(q, k_cache, table, zeroed, dv, causal=True)
    assert_close_rule(out, ro, mla_lowp(q, k_cache, table, zeroed, dv, True), "bfloat16")
    assert_lse(lse, rl)
    np.testing.assert_array_equal(out_itself, out)
    np.testing.assert_array_equal(lse_itself, lse)


def check_nan_query_row(rng, backend):
    """A NaN in one query row gives that row a NaN lse (and out); the other rows stay finite."""
    seqlens = np.array([100, 7], np.int32)
    k_cache, table = paged_cache(rng, seqlens, 16, 1, 32, "bfloat16")
    q = randn(rng, (2, 1, 4, 32), "bfloat16")
    q[0, 0, 2, 5] = np.nan
    out, lse = nf.flash_mla_with_kvcache(to_device(q), to_device(k_cache), to_device(table),
                                         to_device(seqlens), 32, backend=backend)
    lse = to_host(lse)
    assert np.isnan(lse[0, 2, 0])
    lse[0, 2, 0] = 0.0
    assert np.isfinite(lse).all()
