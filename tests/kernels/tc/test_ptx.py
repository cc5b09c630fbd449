"""The tensor-core instructions of kernels/tc/ptx.py: fragment layouts, ldmatrix, cp.async, packing.

Simulator: the emulations must give what the PTX ISA says the instructions give, so every check
here is against an independent NumPy construction of the fragments (written from the ISA's
formulas, not from ptx.py). GPU: the same tests run the real instructions, and one more compares
them with the emulations on random inputs. No GPU and no simulator needed: the PTX tests compile
the kernels in a child process and check the instructions and the register report.
"""

import functools
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32, uint16

from helpers import SIMULATOR, to_device, to_host
from numba_flash import ptxcheck
from numba_flash.kernels.tc import ptx
from numba_flash.kernels.tc.ptx import SHARED_ALIGN

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _ptx_kernels as K  # noqa: E402  (beside this file)

FMTS = ["float16", "bfloat16"]
_NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# ---- independent NumPy model of the fragments (PTX ISA, mma.m16n8k16 / ldmatrix) ------------

def to_bits(x, fmt):
    return np.asarray(x, np.float32).astype(_NP[fmt]).view(np.uint16)


def from_bits(bits, fmt):
    return np.asarray(bits, np.uint16).view(_NP[fmt]).astype(np.float64)


def _pair(lo, hi):
    return np.uint32(int(lo) | (int(hi) << 16))


def frag_a(A):
    """(16, 16) uint16 -> (32, 4) uint32: a0..a7 of every lane, two per register."""
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a = [A[g, 2 * t], A[g, 2 * t + 1], A[g + 8, 2 * t], A[g + 8, 2 * t + 1],
             A[g, 2 * t + 8], A[g, 2 * t + 9], A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9]]
        out[lane] = [_pair(a[2 * i], a[2 * i + 1]) for i in range(4)]
    return out


def frag_b(B):
    """(16, 8) uint16 (k x n) -> (32, 2) uint32: b0..b3 of every lane."""
    out = np.zeros((32, 2), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[lane] = [_pair(B[2 * t, g], B[2 * t + 1, g]), _pair(B[2 * t + 8, g], B[2 * t + 9, g])]
    return out


def frag_c(C):
    """(16, 8) float -> (32, 4) float32: c0..c3 of every lane."""
    out = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[lane] = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
    return out


def unfrag_c(frags):
    """Inverse of ``frag_c``."""
    C = np.full((16, 8), np.nan)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1] = frags[lane]
    return C


def assert_f32_product(out, A, B, C=None, what=""):
    """``out`` (float32 accumulate) against the float64 product: within a few float32 ulps of
    the magnitude sum |A| @ |B| + |C|."""
    C = np.zeros((A.shape[0], B.shape[1])) if C is None else C
    ref = A @ B + C
    bound = 4e-6 * (np.abs(A) @ np.abs(B) + np.abs(C)) + 1e-30
    err = np.abs(out - ref)
    assert not np.isnan(out).any(), what + ": NaN"
    assert (err <= bound).all(), \
        f"{what}: max err {err.max():.3g}, worst ratio {(err / bound).max():.3g}"


# ---- kernels ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _jit(name, *args):
    pyfunc, _ = getattr(K, name)(*args)
    return cuda.jit(pyfunc)


@cuda.jit
def _copy_kernel(g16, g32, row_ok, s_out16, s_out32, addr):
    """cp.async of 16-byte chunks: uint16 rows of a 2-D array (8 elements a chunk, zero-filled
    rows where ``row_ok`` is 0) and a 1-D float32 array (4 elements a chunk); ``addr`` gets
    shared addresses: of s16[0], s16[8] - s16[0], s32[4] - s32[0]."""
    tid = cuda.threadIdx.x
    s16 = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
    s32 = cuda.shared.array(64, float32, alignment=SHARED_ALIGN)
    row = tid >> 2
    col = (tid & 3) * 8
    ptx.cp_async_16_zfill(s16, row * 32 + col, g16, (row, col), row_ok[row] != 0)
    ptx.cp_async_16(s32, tid * 4, g32, tid * 4)
    ptx.cp_async_commit()
    ptx.cp_async_wait_all()
    cuda.syncthreads()
    for j in range(8):
        s_out16[tid * 8 + j] = s16[tid * 8 + j]
    for j in range(4):
        s_out32[tid * 4 + j] = s32[tid * 4 + j]
    if tid == 0:
        addr[0] = ptx.shared_address(s16, 0)
        addr[1] = ptx.shared_address(s16, 8) - ptx.shared_address(s16, 0)
        addr[2] = ptx.shared_address(s32, 4) - ptx.shared_address(s32, 0)


# ---- simulator and GPU: the instructions against the ISA's fragment layouts ------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_mma_fragments(fmt):
    """mma on fragments built from the ISA's layout tables; one independent tile per warp."""
    rng = np.random.default_rng(1)
    a_words = np.zeros((K.THREADS, 4), np.uint32)
    b_words = np.zeros((K.THREADS, 2), np.uint32)
    c = np.zeros((K.THREADS, 4), np.float32)
    tiles = []
    for w in range(K.WARPS):
        A = to_bits(rng.standard_normal((16, 16)), fmt)
        B = to_bits(rng.standard_normal((16, 8)), fmt)
        C = rng.standard_normal((16, 8)).astype(np.float32)
        lanes = slice(32 * w, 32 * w + 32)
        a_words[lanes], b_words[lanes], c[lanes] = frag_a(A), frag_b(B), frag_c(C)
        tiles.append((A, B, C))
    d = np.full((K.THREADS, 4), np.nan, np.float32)
    _jit("fragment_mma", fmt)[1, K.THREADS](a_words, b_words, c, d)
    for w, (A, B, C) in enumerate(tiles):
        lanes = slice(32 * w, 32 * w + 32)
        D = unfrag_c(d[lanes])
        assert_f32_product(D, from_bits(A, fmt), from_bits(B, fmt), C.astype(np.float64),
                           f"warp {w}")
        emulated = ptx.emulate_mma(a_words[lanes], b_words[lanes], c[lanes], fmt)
        np.testing.assert_allclose(d[lanes], emulated, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", FMTS)
def test_ldmatrix_cp_async_mma_tiles(fmt):
    """cp.async -> shared -> ldmatrix (x4, x4.trans, x2, x2.trans) -> mma, and P reused from
    registers as the A operand: S = A K^T, A V and round(S) V for one 16x16 tile per warp."""
    rng = np.random.default_rng(2)
    valid_rows = 13  # rows 13..15 of V are zero-filled by cp.async
    a = to_bits(rng.standard_normal((K.WARPS, 16, 16)), fmt)
    kt = to_bits(rng.standard_normal((K.WARPS, 16, 16)), fmt)
    v = to_bits(rng.standard_normal((K.WARPS, 16, 16)), fmt)
    s_out, av_out, pv_out = (np.full((K.WARPS, 16, 16), np.nan, np.float32) for _ in range(3))
    regs = np.zeros((K.THREADS, 16), np.uint32)
    _jit("tiles", fmt)[1, K.THREADS](a, kt, v, np.int32(valid_rows), s_out, av_out, pv_out, regs)

    v0 = v.copy()
    v0[:, valid_rows:, :] = 0
    for w in range(K.WARPS):
        lanes = slice(32 * w, 32 * w + 32)
        A, Kt, V = from_bits(a[w], fmt), from_bits(kt[w], fmt), from_bits(v0[w], fmt)
        # ldmatrix with the documented lane addresses yields exactly the mma fragments.
        np.testing.assert_array_equal(regs[lanes, 0:4], frag_a(a[w]))
        np.testing.assert_array_equal(regs[lanes, 4:6], frag_b(kt[w].T[:, 0:8]))
        np.testing.assert_array_equal(regs[lanes, 6:8], frag_b(kt[w].T[:, 8:16]))
        np.testing.assert_array_equal(regs[lanes, 8:10], frag_b(v0[w][:, 0:8]))
        np.testing.assert_array_equal(regs[lanes, 10:12], frag_b(v0[w][:, 8:16]))
        np.testing.assert_array_equal(regs[lanes, 12:14], regs[lanes, 4:6])  # x2 = x4[:2]
        np.testing.assert_array_equal(regs[lanes, 14:16], regs[lanes, 8:10])
        assert_f32_product(s_out[w].astype(np.float64), A, Kt.T, what=f"S warp {w}")
        assert_f32_product(av_out[w].astype(np.float64), A, V, what=f"AV warp {w}")
        P = s_out[w].astype(_NP[fmt]).astype(np.float64)  # the kernel's S, rounded (RNE)
        assert_f32_product(pv_out[w].astype(np.float64), P, V, what=f"PV warp {w}")


def test_ldmatrix_emulation_model():
    """``emulate_ldmatrix`` (host model, also the GPU reference) on scattered row addresses."""
    rng = np.random.default_rng(3)
    flat = rng.integers(0, 1 << 16, size=64 * 8, dtype=np.uint16)
    rows = rng.permutation(64)[:32]
    offsets = rows * 8
    M = flat.reshape(64, 8)
    for num in (2, 4):
        for trans in (False, True):
            got = ptx.emulate_ldmatrix(flat, offsets, num, trans)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for j in range(num):
                    mat = M[rows[8 * j:8 * j + 8]]  # matrix j: rows from lanes 8j..8j+7
                    if trans:
                        mat = mat.T
                    assert got[lane, j] == _pair(mat[g, 2 * t], mat[g, 2 * t + 1])


def _rne_cases(rng):
    """float32 pairs: random magnitudes, exact halfway cases for float16 and for bfloat16,
    overflow, float16 subnormals, signed zeros."""
    x = [rng.standard_normal(64) * 10.0 ** rng.integers(-6, 6, 64)]
    f16 = rng.standard_normal(64).astype(np.float16)
    nxt = np.nextafter(f16, np.float16(np.inf))
    x.append((f16.astype(np.float32) + nxt.astype(np.float32)) / 2)  # float16 ties
    bf = rng.integers(0, 1 << 16, 64, dtype=np.uint32) & 0xFF7F  # finite bfloat16 bits
    x.append(((bf << 16) | 0x8000).view(np.float32))  # bfloat16 ties (odd and even mantissas)
    x.append(((bf << 16) | 0x8001).view(np.float32))
    x.append(np.array([65504.0, 65520.0, 70000.0, -1e30, 6e-8, -3e-6, 0.0, -0.0]))
    x = np.concatenate(x).astype(np.float32)
    x = np.concatenate([x, x[::-1]])
    return x[: len(x) // 2 * 2].reshape(-1, 2)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_pack_round_to_nearest_even():
    rng = np.random.default_rng(4)
    x = _rne_cases(rng)
    xe = np.concatenate([rng.uniform(-30, 30, len(x) - 4), [0.0, 1.0, -126.5, -200.0]])
    xe = xe.astype(np.float32)
    f16 = np.zeros(len(x), np.uint32)
    bf16 = np.zeros(len(x), np.uint32)
    unpacked = np.full((len(x), 4), np.nan, np.float32)
    e2 = np.full(len(x), np.nan, np.float32)
    kernel = _jit("conversions")
    kernel[2, 32](x, f16, bf16, unpacked, xe, e2)
    want16 = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    wantbf = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    # lo (the first value) in bits 0-15, hi in bits 16-31
    np.testing.assert_array_equal(f16, want16[:, 0] | (want16[:, 1] << 16))
    np.testing.assert_array_equal(bf16, wantbf[:, 0] | (wantbf[:, 1] << 16))
    np.testing.assert_array_equal(unpacked[:, 0:2], x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(unpacked[:, 2:4], x.astype(ml_dtypes.bfloat16).astype(np.float32))
    ref = np.exp2(xe.astype(np.float64))
    ref[ref < 2.0 ** -126] = 0.0  # .ftz
    np.testing.assert_allclose(e2, ref, rtol=2e-6, atol=0)


def test_cp_async_copies():
    rng = np.random.default_rng(5)
    g16 = rng.integers(1, 1 << 16, size=(4, 32), dtype=np.uint16)
    g32 = rng.standard_normal(64).astype(np.float32)
    row_ok = np.array([1, 0, 1, 1], np.int32)
    out16 = np.zeros(128, np.uint16)
    out32 = np.zeros(64, np.float32)
    addr = np.zeros(3, np.uint32)
    _copy_kernel[1, 16](g16, g32, row_ok, out16, out32, addr)
    want = g16 * row_ok[:, None].astype(np.uint16)
    np.testing.assert_array_equal(out16.reshape(4, 32), want)
    np.testing.assert_array_equal(out32, g32)
    assert addr[0] % 16 == 0  # SHARED_ALIGN
    assert (addr[1], addr[2]) == (16, 16)  # byte offsets


@cuda.jit
def _store_kernel(src, dst, addr):
    """Rows of ``src`` staged in shared memory, then written to ``dst`` (3-D, the chunks along
    its last dimension) at the addresses ``global_address`` gives: one 16-byte store where the
    chunk is 16-byte aligned (a misaligned one faults), eight 16-bit stores where it is not.
    ``addr`` gets each chunk's address modulo 16."""
    tid = cuda.threadIdx.x
    s16 = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
    for j in range(8):
        s16[tid * 8 + j] = src[tid * 8 + j]
    cuda.syncthreads()
    a = ptx.global_address(dst, (tid >> 3, (tid >> 2) & 1, (tid & 3) * 8))
    addr[tid] = a & 15
    if a & 15 == 0:
        ptx.st_global_16(a, s16, tid * 8)
    else:
        ptx.st_global_16_unaligned(a, s16, tid * 8)


@pytest.mark.parametrize("offset", [0, 8, 4])
def test_16_byte_stores_and_global_addresses(offset):
    """Rows of 80 bytes: a view starting 0 or 8 elements in is 16-byte aligned, 4 is not."""
    rng = np.random.default_rng(6)
    src = rng.integers(1, 1 << 16, size=128, dtype=np.uint16)
    device = cuda.to_device if SIMULATOR else to_device  # the simulator launches views of these
    dst = device(np.zeros((2, 2, 40), np.uint16))
    addr = device(np.full(16, -1, np.int64))
    _store_kernel[1, 16](src, dst[..., offset:offset + 32], addr)
    got, addr = to_host(dst), to_host(addr)
    np.testing.assert_array_equal(addr, 0 if offset % 8 == 0 else 8)
    np.testing.assert_array_equal(got[..., offset:offset + 32].reshape(-1), src)
    assert not got[..., :offset].any() and not got[..., offset + 32:].any()


# ---- no GPU needed: the PTX and what ptxas makes of it -------------------------------------

_PROBE = str(pathlib.Path(K.__file__).resolve()) + ":probe"


def test_ptx_compiles_without_spills():
    jobs = [(_PROBE, (8, 0), ("tiles", "float16")),
            (_PROBE, (9, 0), ("tiles", "float16")),
            (_PROBE, (8, 0), ("tiles", "bfloat16")),
            (_PROBE, (9, 0), ("tiles", "bfloat16")),
            (_PROBE, (9, 0), ("conversions",))]
    results = ptxcheck.compile_reports_isolated(jobs)
    for (_, cc, args), (text, report) in zip(jobs, results):
        what = f"{args} at sm_{cc[0]}{cc[1]}"
        if args[0] == "tiles":
            ab = "f16" if args[1] == "float16" else "bf16"
            for needle in (f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32",
                           "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                           "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                           "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                           "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                           "cp.async.cg.shared.global", "cp.async.commit_group",
                           "cp.async.wait_group 1;", "cp.async.wait_group 0;",
                           f"cvt.rn.{ab}x2.f32", ".shared .align 16"):
                assert needle in text, f"{what}: no {needle!r} in the PTX"
        else:
            for needle in ("cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32", "ex2.approx.ftz.f32"):
                assert needle in text, f"{what}: no {needle!r} in the PTX"
        assert "ld.local" not in text and "st.local" not in text, what
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (what, report["log"])
        assert report["stack"] == 0, (what, report["log"])
        assert 0 < report["registers"] <= 128, (what, report["registers"])


def test_parse_ptxas_log():
    log = ("ptxas info    : 0 bytes gmem\n"
           "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'\n"
           "ptxas info    : Function properties for _Z1kPf\n"
           "ptxas         .     24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 24 bytes cumulative stack size\n"
           "info    : Function properties for '_Z1kPf':\n"
           "info    : used 255 registers, used 1 barriers, 24 stack, 3072 bytes smem, "
           "708 bytes cmem[0], 24 bytes lmem\n")
    r = ptxcheck.parse_ptxas_log(log)
    assert (r["registers"], r["spill_stores"], r["spill_loads"], r["stack"]) == (255, 16, 8, 24)
    assert (r["barriers"], r["smem"], r["lmem"]) == (1, 3072, 24)
    assert list(r["functions"]) == ["_Z1kPf"]


# ---- GPU only: real instructions against the emulations on random inputs ---------------------

def _random_bits(rng, shape, fmt):
    """Random finite 16-bit floats spanning many binades (normal and subnormal)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint32).astype(np.uint16)
    if fmt == "float16":
        bits &= 0xBBFF  # exponent < 0b01111: |x| < 1, no Inf/NaN, subnormals included
    else:
        # sign and mantissa random, biased exponent 112 ^ (0..31) = 80..127: |x| in [2^-47, 2),
        # so every product is a normal float32 and the sums stay finite
        bits = (bits & 0x807F) | 0x3800
        bits ^= rng.integers(0, 32, size=shape, dtype=np.uint16) << 7
    return bits


@pytest.mark.skipif(SIMULATOR, reason="needs a GPU: compares the real instructions")
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_matches_emulation(fmt):
    rng = np.random.default_rng(6)
    kernel = _jit("fragment_mma", fmt)
    for _ in range(20):
        a_bits = _random_bits(rng, (K.THREADS, 8), fmt)
        b_bits = _random_bits(rng, (K.THREADS, 4), fmt)
        a_words = a_bits.view(np.uint32).reshape(K.THREADS, 4).copy()
        b_words = b_bits.view(np.uint32).reshape(K.THREADS, 2).copy()
        c = rng.standard_normal((K.THREADS, 4)).astype(np.float32)
        d = np.full((K.THREADS, 4), np.nan, np.float32)
        kernel[1, K.THREADS](a_words, b_words, c, d)
        for w in range(K.WARPS):
            lanes = slice(32 * w, 32 * w + 32)
            emulated = ptx.emulate_mma(a_words[lanes], b_words[lanes], c[lanes], fmt)
            # Error bound from the magnitudes: emulate with |A|, |B|, |C|.
            abs_a = (a_bits[lanes] & 0x7FFF).view(np.uint32).reshape(32, 4)
            abs_b = (b_bits[lanes] & 0x7FFF).view(np.uint32).reshape(32, 2)
            scale = ptx.emulate_mma(abs_a, abs_b, np.abs(c[lanes]), fmt).astype(np.float64)
            err = np.abs(d[lanes].astype(np.float64) - emulated)
            assert (err <= 4e-6 * scale + 1e-37).all(), (w, err.max())
