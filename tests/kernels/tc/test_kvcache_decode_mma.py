"""The tensor-core KV-cache decode (kernels/tc/kvcache_decode_mma.py) through
``flash_attn_with_kvcache(backend="tc")`` against the float64 reference (test_kvcache.run):
sequences of several tiles (the ring's slots reused), maxima that move tile after tile, causal
chunks whose warps see no key, packed rows over two query tiles, pieces cut and combined, and
table entries that are not pages of the cache; the tile table, the parts per SM, the registry's
refusals and the compile check."""

import dataclasses

import numpy as np
import pytest
from numba import cuda

import numba_flash as nf
from numba_flash import backends
from numba_flash.kernels.tc import kvcache_decode_mma as kv
from numba_flash.runtime.device import Device
from helpers import (SIMULATOR, assert_compiles_clean, decode_problem, int32_array, randn,
                     to_device, to_host)
from test_kvcache import run

pytestmark = pytest.mark.skipif(
    not SIMULATOR and not (cuda.is_available()
                           and cuda.get_current_device().compute_capability >= (8, 0)),
    reason="mma.sync needs compute capability 8.0 or newer")

H200 = Device(cc=(9, 0), sms=132, shared_per_block=227 * 1024)
A100 = Device(cc=(8, 0), sms=108, shared_per_block=163 * 1024)
SM86 = Device(cc=(8, 6), sms=84, shared_per_block=99 * 1024)


def test_a_sequence_of_several_tiles_reuses_the_ring():
    # 200 cached keys + 1: four 64-key tiles, the two slots each written twice; key j scaled
    # by 1 + j / 20, so the row maxima move tile after tile (the lazy rescale fires).
    run(np.random.default_rng(1), b=1, hq=4, hk=1, d=32, s_c=210, seqlens=(200,),
        num_splits=1, grow=0.05, backend="tc")


def test_a_causal_chunk_of_eight_heads_over_two_query_tiles(rng):
    # s_q 3 x group 8 = 24 packed rows: two 16-row tiles; the chunk's last keys are the new
    # ones, and a warp's 16 keys may all lie past a row's diagonal.
    run(rng, b=2, sq=3, s_new=3, hq=8, hk=1, d=16, s_c=40, seqlens=(30, 13), causal=True,
        backend="tc")


def test_pieces_of_a_paged_cache_are_combined(rng):
    run(rng, b=2, hq=4, hk=1, d=16, s_c=200, page=16, seqlens=(150, 3), num_splits=3,
        backend="tc")


def test_table_entries_that_are_not_pages_are_zero_rows_and_reported(rng):
    q = to_device(randn(rng, (2, 1, 4, 16), "bfloat16"))
    kc, vc = (to_device(randn(rng, (6, 8, 1, 16), "bfloat16")) for _ in range(2))
    table = int32_array([[0, 1 << 30], [2, -1]])
    o, lse = nf.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=int32_array([12, 16]),
                                        block_table=table, return_softmax_lse=True,
                                        backend="tc")
    with pytest.raises(RuntimeError, match="block_table: an entry inside a sequence"):
        nf.check_errors()
    assert np.isfinite(to_host(o).astype(np.float32)).all()
    assert np.isfinite(to_host(lse)).all()


def test_the_tile_table_and_the_parts_per_sm():
    config = kv.SPEC.Config(4, 128, 128, False, "bfloat16", True, False, True, False)
    tiles = kv.SPEC.tiles(config, kv.TILES[0])
    assert (tiles.BLOCK_M, tiles.BLOCK_N, tiles.threads) == (16, 64, 128)
    # Q 16 x 136 and two tiles of 64 rows x (128 + 128 + 8) elements.
    assert tiles.shared_bytes == 2 * (16 * 136 + 2 * 64 * 264)
    assert kv.SPEC.parts_per_sm(config, H200) == 3
    assert kv.SPEC.parts_per_sm(config, A100) == 2
    assert kv.SPEC.parts_per_sm(config, SM86) == 1


def test_the_registry_sends_kvcache_decodes_here_and_names_what_it_refuses(rng):
    def problem(d, offset=0):
        q = to_device(np.zeros((1, 1, 4, d + offset), np.float16))[..., offset:]
        kc, vc = (to_device(np.zeros((1, 32, 1, d + offset), np.float16))[..., offset:]
                  for _ in range(2))
        from numba_flash import validate
        from numba_flash.kernels.problem import Decode
        c = validate.kvcache(q, kc, vc, None, None, None, None, int32_array([3]), None, None,
                             None, None, False, True, 0)
        return Decode(c.q, c.k_cache, c.cache_seqlens, c.cache_seqlens, d, c.scale, False,
                      v_cache=c.v_cache)

    for dev in (H200, A100):
        assert backends.decode_spec("tc", problem(128), dev)[0] is kv.SPEC
    assert backends.decode_spec("tc", problem(256), H200)[0] is kv.SPEC
    with pytest.raises(ValueError, match="multiples of 16 up to 128 here, got 256"):
        backends.decode_spec("tc", problem(256), A100)
    with pytest.raises(ValueError, match="16-byte chunks"):
        backends.decode_spec("tc", problem(64, offset=4), H200)
    assert backends.decode_spec("auto", problem(64, offset=4), H200)[0] is not kv.SPEC
    mla = decode_problem(64, 64, 16, page=16, fmt="float16")
    assert backends.decode_spec("tc", mla, dataclasses.replace(A100, cc=(8, 6)))[0] \
        is not kv.SPEC


def test_every_sample_compiles_to_mma_sync_without_spills():
    """The samples after the first (test_registry.py compiles that one), each for its targets;
    those of FP8 caches widen them with ``cvt ... e4m3x2``."""
    later = kv.SPEC.samples()[1:]
    for cc in ((8, 0), (9, 0)):
        assert_compiles_clean("tc.kvcache_decode_mma",
                              [(s.config, s.entry) for s in later if cc in s.ccs], ccs=(cc,),
                              must_contain=("mma.sync.aligned.m16n8k16", "cp.async", "ldmatrix"),
                              also=lambda config: ("cvt.rn.f16x2.e4m3x2",)
                              if kv.SPEC.Config(*config).cache else ())
