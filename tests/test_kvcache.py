"""flash_attn_with_kvcache (api.py on kernels/simt/kvcache_prepare.py and the decode with V in its
own cache): the append, rotary, cache_batch_idx, cache_leftpad, paged caches, causal chunks and
splits against reference.kvcache_ref (float64, from flash-attn's definition), every refusal
before anything is written, and device-only values bounded and reported.

Every case runs the decode ``auto`` picks (the tensor-core one, kernels/tc/kvcache_decode_mma.py,
for 16-bit inputs, head dims that are multiples of 16 and more than one packed row); the SIMT
decode runs the rest and, by name, the first cases again. Shapes keep group = Hq / Hk >= 4 (the
SIMT decode's wide variant) but for one MHA case: under the simulator the narrow variant's warp
shuffles cost seconds per CTA."""

import ml_dtypes
import numpy as np
import pytest

import numba_flash as nf
from numba_flash import reference as ref
from numba_flash.runtime import device
from helpers import (DTYPES, assert_close_rule, assert_lse, int32_array, nan_like, randn,
                     to_device, to_host)

E4M3 = ml_dtypes.float8_e4m3fn


def rotary_tables(rng, positions, rotary_dim, fmt):
    angles = rng.uniform(0, 2 * np.pi, (positions, rotary_dim // 2))
    return np.cos(angles).astype(DTYPES[fmt]), np.sin(angles).astype(DTYPES[fmt])


def cache(rng, shape, fmt, fp8):
    """Random cache contents: ``fmt`` values, or e4m3 ones of up to about 30."""
    if fp8:
        return (rng.standard_normal(shape) * 8).astype(np.float32).astype(E4M3)
    return randn(rng, shape, fmt)


def run(rng, fmt="bfloat16", b=2, sq=1, hq=8, hk=2, d=16, s_c=40, s_new=1, seqlens=(5, 30),
        page=None, rotary_dim=0, interleaved=True, causal=False, batch_idx=None, leftpad=None,
        num_splits=0, int_seqlens=False, softmax_scale=None, backend="auto", grow=0.0,
        window_size=(-1, -1), softcap=None, alibi=False, fp8=False):
    """One call on fresh random inputs against kvcache_ref: out (poisoned), lse and both caches
    after the append. ``grow``: cached key j scaled by 1 + grow j, so that later tiles score
    ever higher and the running maxima move tile after tile. ``window_size``, ``softcap``,
    ``alibi`` (random (B, Hq) slopes): the masks and modifiers. ``fp8``: float8_e4m3fn caches
    with random descales per (sequence, kv head)."""
    q = randn(rng, (b, sq, hq, d), fmt)
    rows = b if batch_idx is None else max(batch_idx) + 2
    if page is None:
        k_cache, v_cache = (cache(rng, (rows, s_c, hk, d), fmt, fp8) for _ in range(2))
        table = None
    else:
        per_seq = -(-s_c // page)
        k_cache, v_cache = (cache(rng, (b * per_seq + 1, page, hk, d), fmt, fp8)
                            for _ in range(2))
        table = rng.permutation(b * per_seq + 1)[:b * per_seq].reshape(b, per_seq)
        table = table.astype(np.int32)
    if grow:  # (contiguous caches: row j is key j)
        assert page is None
        scale = 1 + grow * np.arange(s_c)[:, None, None]
        k_cache = (k_cache.astype(np.float32) * scale).astype(k_cache.dtype)
    k = v = None
    if s_new:
        k, v = (randn(rng, (b, s_new, hk, d), fmt) for _ in range(2))
    cos = sin = None
    if rotary_dim:
        cos, sin = rotary_tables(rng, (table.shape[1] * page) if page else s_c, rotary_dim, fmt)
    lengths = seqlens[0] if int_seqlens else np.asarray(seqlens, np.int32)
    options = dict(cache_seqlens=lengths,
                   cache_batch_idx=None if batch_idx is None else np.asarray(batch_idx, np.int32),
                   cache_leftpad=None if leftpad is None else np.asarray(leftpad, np.int32),
                   block_table=table, causal=causal, softmax_scale=softmax_scale,
                   window_size=window_size, softcap=softcap,
                   alibi_slopes=(0.5 ** rng.integers(0, 5, (b, hq))).astype(np.float32)
                   if alibi else None)
    if fp8:  # stored values of about 30 times descales of 0.01-0.1: keys and values near 1
        options.update(k_descale=rng.uniform(0.01, 0.1, (b, hk)).astype(np.float32),
                       v_descale=rng.uniform(0.01, 0.1, (b, hk)).astype(np.float32))
    expect_out, expect_lse, expect_k, expect_v, q_used = ref.kvcache_ref(
        q, k_cache, v_cache, k, v, cos, sin, rotary_interleaved=interleaved, **options)

    dev = {name: (to_device(x) if isinstance(x, np.ndarray) else x)
           for name, x in options.items()}
    dk_cache, dv_cache = to_device(k_cache.copy()), to_device(v_cache.copy())
    out = nan_like(q)
    o, lse = nf.flash_attn_with_kvcache(
        to_device(q), dk_cache, dv_cache, None if k is None else to_device(k),
        None if v is None else to_device(v), None if cos is None else to_device(cos),
        None if sin is None else to_device(sin), rotary_interleaved=interleaved,
        num_splits=num_splits, return_softmax_lse=True, out=out, backend=backend, **dev)
    assert o is out
    nf.check_errors()  # nothing bad was seen
    # The caches: new values exactly, rotated keys within one rounding of the reference's
    # (FP8: one e4m3 step, 2^-3 relative or a subnormal's 2^-9).
    assert np.array_equal(to_host(dv_cache), expect_v)
    got_k = to_host(dk_cache).astype(np.float64)
    tol = 0 if not rotary_dim else 2 * float(np.finfo(np.float16).eps if fmt == "float16" else
                                             (2.0 ** -7 if fmt == "bfloat16" else 1e-6))
    rtol, atol = (2.0 ** -3, 2.0 ** -9) if fp8 and rotary_dim else (tol, tol)
    assert np.allclose(got_k, expect_k.astype(np.float64), rtol=rtol, atol=atol)
    # The attention, by the tolerance rule, over the query the call attended with.
    keys_used = None
    lowp = np.zeros_like(expect_out)
    for i in range(b):
        n_cached = (seqlens[0] if int_seqlens else seqlens[i])
        start = 0 if leftpad is None else leftpad[i]
        if n_cached + s_new - start <= 0:
            continue
        keys_used = True
        if page is None:
            row = i if batch_idx is None else batch_idx[i]
            kk, vv = (c[row, start:n_cached + s_new] for c in (expect_k, expect_v))
        else:
            kk, vv = (np.concatenate(list(c[table[i]]))[start:n_cached + s_new]
                      for c in (expect_k, expect_v))
        if fp8:
            kk = kk.astype(np.float64) * options["k_descale"][i][:, None]
            vv = vv.astype(np.float64) * options["v_descale"][i][:, None]
        n = len(kk)
        mask = (None if tuple(window_size) == (-1, -1) else
                ref.window_mask(sq, n, window_size, causal))
        bias = None if not alibi else ref.alibi_bias(options["alibi_slopes"][i], sq, n)
        lowp[i] = ref.attention_lowp(q_used[i:i + 1], kk[None], vv[None], causal,
                                     softmax_scale, mask, softcap, bias)[0]
    assert keys_used
    assert_close_rule(o, expect_out, lowp, fmt)
    assert_lse(lse, expect_lse)


@pytest.mark.parametrize("backend", ["auto", "simt"])
def test_decode_step_appends_one_token_and_attends_gqa(rng, backend):
    run(rng, backend=backend)


def test_chunk_with_causal_interleaved_rotary(rng, backend="auto"):
    # (the append and its rotary are one kernel whichever decode follows)
    run(rng, fmt="float16", sq=3, s_new=3, seqlens=(0, 20), rotary_dim=16, causal=True,
        backend=backend)


def test_neox_rotary_over_part_of_the_head_dim_and_a_non_causal_chunk(rng):
    run(rng, sq=2, s_new=2, rotary_dim=8, interleaved=False, seqlens=(7, 1), hq=4)


def test_paged_cache_with_an_odd_page_and_an_append_across_pages(rng):
    run(rng, page=5, s_new=4, sq=4, seqlens=(3, 14), causal=True, s_c=20)


def test_paged_cache_without_new_keys_and_an_empty_sequence(rng):
    run(rng, page=7, s_new=0, seqlens=(0, 12), causal=True, sq=2, s_c=21)


@pytest.mark.parametrize("backend", ["auto", "simt"])
def test_cache_batch_idx_and_leftpad(rng, backend):
    run(rng, batch_idx=[2, 0], leftpad=[3, 10], seqlens=(9, 25), s_new=2, sq=2, causal=True,
        hq=4, backend=backend)


def test_one_length_for_all_and_a_split_cache(rng):
    # Simulated 8 SMs, 2 kv heads: 4 parts of 7 blocks (each piece costs 5), so a sequence of
    # 130 keys (3 blocks) is cut and combined.
    run(rng, b=1, hq=4, seqlens=(130,), s_c=140, int_seqlens=True, softmax_scale=0.3)


def test_num_splits_one_gives_each_sequence_one_piece(rng):
    run(rng, seqlens=(40, 90), s_c=100, num_splits=1)


def test_a_group_of_eight_runs_as_two_narrow_tiles(rng):
    # 8 packed rows at D 128 are more than the narrow variant holds: two tiles of 4.
    run(rng, b=1, hq=8, hk=1, d=128, seqlens=(20,), s_c=24)


# Masks and score modifiers: a window whose left side leaves keys behind (the plan covers the
# window alone: 90 keys, window 16) on a split cache, a causal chunk in a window, a window with
# a right side (not causal), a softcap with ALiBi per (sequence, head), left padding with both.
@pytest.mark.parametrize("backend", ["auto", "simt"])
def test_sliding_window_decode_reads_the_window_alone(rng, backend):
    run(rng, b=2, hq=4, seqlens=(40, 90), s_c=100, window_size=(16, 0), causal=True,
        backend=backend)


@pytest.mark.parametrize("backend", ["auto", "simt"])
def test_causal_chunk_in_a_window_with_softcap_and_alibi(rng, backend):
    run(rng, sq=3, s_new=3, seqlens=(0, 20), causal=True, window_size=(4, -1), softcap=1.5,
        alibi=True, backend=backend)


def test_window_with_a_right_side_and_left_padding(rng):
    run(rng, sq=2, s_new=2, seqlens=(9, 25), leftpad=[3, 10], window_size=(5, 1), alibi=True,
        hq=4)


def test_float32_and_mha(rng):
    run(rng, fmt="float32", b=1, hq=1, hk=1, seqlens=(6,), s_c=8, d=8)


def test_whole_cache_when_no_lengths_are_given(rng):
    q = randn(rng, (1, 1, 4, 8), "bfloat16")
    kc, vc = (randn(rng, (1, 9, 1, 8), "bfloat16") for _ in range(2))
    o, lse = nf.flash_attn_with_kvcache(to_device(q), to_device(kc), to_device(vc),
                                        return_softmax_lse=True)
    expect, expect_lse = ref.attention_fwd_ref(q, kc, vc)
    assert_close_rule(o, expect, ref.attention_lowp(q, kc, vc), "bfloat16")
    assert_lse(lse, expect_lse)


@pytest.mark.parametrize("backend", ["auto", "simt"])
def test_fp8_cache_decode_step_rounds_the_append_and_scales_by_the_descales(rng, backend):
    run(rng, fp8=True, backend=backend)


def test_fp8_paged_cache_with_a_rotary_causal_chunk(rng):
    run(rng, "float16", sq=2, s_new=2, page=16, rotary_dim=8, interleaved=False, causal=True,
        seqlens=(3, 20), fp8=True)


def test_fp8_cache_of_rows_not_in_16_byte_chunks(rng):
    run(rng, d=8, hq=4, hk=1, seqlens=(7, 33), num_splits=2, fp8=True)


# ----------------------------------------------------------------------------- bad input

def small(rng):
    q = to_device(randn(rng, (2, 1, 4, 8), "bfloat16"))
    kc, vc = (to_device(randn(rng, (2, 6, 1, 8), "bfloat16")) for _ in range(2))
    kn, vn = (to_device(randn(rng, (2, 1, 1, 8), "bfloat16")) for _ in range(2))
    return q, kc, vc, kn, vn


REFUSALS = [
    (lambda a, rng: a.update(v=None), "k, v: pass both"),
    (lambda a, rng: a.update(cache_seqlens=None), "cache_seqlens: required"),
    (lambda a, rng: a.update(cache_seqlens=6), "cache_seqlens: expected 0 to 5"),
    (lambda a, rng: a.update(rotary_cos=to_device(randn(rng, (6, 4), "bfloat16"))),
     "rotary_cos, rotary_sin: pass both"),
    (lambda a, rng: a.update(block_table=int32_array([[0], [1]]),
                             cache_batch_idx=int32_array([0, 1])),
     "cache_batch_idx: not supported"),
    (lambda a, rng: a.update(num_splits=-1), "num_splits"),
    (lambda a, rng: a.update(k_cache=a["k_cache"][:1], v_cache=a["v_cache"][:1]),
     "k_cache: 1 cache rows for a batch of 2"),
    (lambda a, rng: a.update(q=a["k_cache"][:, :1]), "overlaps q"),
    (lambda a, rng: a.update(k=a["k"][:, :, :, :4], v=a["v"][:, :, :, :4]), "k, v: expected"),
]


@pytest.mark.parametrize("change, match", REFUSALS)
def test_refusals_write_nothing(rng, change, match):
    q, kc, vc, kn, vn = small(rng)
    before = to_host(kc).copy(), to_host(vc).copy()
    args = dict(q=q, k_cache=kc, v_cache=vc, k=kn, v=vn, cache_seqlens=int32_array([1, 2]))
    change(args, rng)
    with pytest.raises(ValueError, match=match):
        nf.flash_attn_with_kvcache(**args)
    assert np.array_equal(to_host(kc), before[0]) and np.array_equal(to_host(vc), before[1])


def fp8_small(rng):
    """small()'s arrays with float8_e4m3fn caches and their (2, 1) descales."""
    q, _, _, kn, vn = small(rng)
    kc, vc = (to_device(cache(rng, (2, 6, 1, 8), None, True)) for _ in range(2))
    kd, vd = (to_device(np.full((2, 1), 0.05, np.float32)) for _ in range(2))
    return dict(q=q, k_cache=kc, v_cache=vc, k=kn, v=vn, cache_seqlens=int32_array([1, 2]),
                k_descale=kd, v_descale=vd)


FP8_REFUSALS = [
    (lambda a, rng: a.update(v_descale=None), ValueError, "^v_descale: required"),
    (lambda a, rng: a.update(k_descale=to_device(np.ones((2, 2), np.float32))), ValueError,
     r"^k_descale: expected shape \(2, 1\)"),
    (lambda a, rng: a.update(v_descale=to_device(np.ones((2, 1), np.float16))), TypeError,
     "^v_descale: expected float32"),
    (lambda a, rng: a.update(v_cache=to_device(randn(rng, (2, 6, 1, 8), "bfloat16"))), TypeError,
     "^v_cache: dtype bfloat16 differs"),
    (lambda a, rng: a.update(q=to_device(randn(rng, (2, 1, 4, 8), "float32")),
                             k=to_device(randn(rng, (2, 1, 1, 8), "float32")),
                             v=to_device(randn(rng, (2, 1, 1, 8), "float32"))), TypeError,
     "^q: FP8 caches are read with float16 or bfloat16"),
    (lambda a, rng: a.update(k_cache=small(rng)[1], v_cache=small(rng)[2]), ValueError,
     "^k_descale: descales go with float8_e4m3fn caches"),
]


@pytest.mark.parametrize("change, exc, match", FP8_REFUSALS)
def test_fp8_cache_refusals_name_the_argument_and_write_nothing(rng, change, exc, match):
    args = fp8_small(rng)
    change(args, rng)
    before = to_host(args["k_cache"]).copy(), to_host(args["v_cache"]).copy()
    with pytest.raises(exc, match=match):
        nf.flash_attn_with_kvcache(**args)
    assert np.array_equal(to_host(args["k_cache"]), before[0], equal_nan=True)
    assert np.array_equal(to_host(args["v_cache"]), before[1], equal_nan=True)


def test_fp8_caches_need_compute_capability_8_9(rng):
    args = fp8_small(rng)
    before = to_host(args["k_cache"]).copy()
    with device.plan_for(device.Device(cc=(8, 6), sms=8, shared_per_block=99 * 1024)):
        with pytest.raises(ValueError, match="^k_cache: FP8 needs compute capability 8.9"):
            nf.flash_attn_with_kvcache(**args)
    assert np.array_equal(to_host(args["k_cache"]), before)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(window_size=(-3, 0)), ValueError, "^window_size"),
    (dict(softcap=-1.0), ValueError, "^softcap"),
    (dict(alibi_slopes=np.zeros((3, 4), np.float32)), ValueError, "^alibi_slopes: expected shape"),
])
def test_bad_masks_and_modifiers_are_refused_by_name(rng, kw, exc, match):
    q, kc, vc, _, _ = small(rng)
    kw = {name: to_device(x) if isinstance(x, np.ndarray) else x for name, x in kw.items()}
    with pytest.raises(exc, match=match):
        nf.flash_attn_with_kvcache(q, kc, vc, **kw)


def test_the_tensor_core_backend_names_why_it_cannot(rng):
    q, kc, vc, _, _ = small(rng)
    with pytest.raises(ValueError, match="does not implement key_start|does not implement v_cache"):
        nf.flash_attn_with_kvcache(q, kc, vc, backend="tc")


def test_device_only_values_are_bounded_and_reported(rng):
    q, kc, vc, kn, vn = small(rng)
    before_v = to_host(vc).copy()
    # Sequence 0 would append past the cache; sequence 1's row does not exist.
    nf.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=int32_array([6, 1]),
                               cache_batch_idx=int32_array([0, 5]))
    with pytest.raises(RuntimeError) as err:
        nf.check_errors()
    assert "cache_batch_idx" in str(err.value) and "run past the cache" in str(err.value)
    assert np.array_equal(to_host(vc), before_v)  # neither append was written
    # A negative length and a left padding past the sequence.
    o, lse = nf.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=int32_array([-3, 2]),
                                        cache_leftpad=int32_array([0, 4]),
                                        return_softmax_lse=True)
    with pytest.raises(RuntimeError, match="negative"):
        nf.check_errors()
    assert np.isposinf(to_host(lse)).all() and not to_host(o).astype(np.float32).any()
