"""Small kernels exercising the instructions of ``kernels/ptx`` ``mma``, ``memory`` and ``convert``
(through ``kernels/instructions.py``: the PTX on a GPU, the emulations under the simulator).

Each factory returns ``(python_function, signature)``: the tests run them through ``cuda.jit``
(simulator or GPU), and ``ptxcheck.compile_report_isolated`` compiles the same functions to PTX
in a process without the simulator (``"<this file>:probe"``).
"""

from numba import cuda, float32, types, uint16, uint32

from numba_flash.kernels.instructions import convert, memory, sync
from numba_flash.kernels.instructions import mma as mma_sync
from numba_flash.runtime.device import SIMULATOR

SHARED_ALIGN = memory.SHARED_ALIGN

THREADS = 64  # two warps: the emulations must keep warps apart
WARPS = THREADS // 32
STRIDE = 24  # padded shared row stride (elements): 48-byte rows keep 16-byte alignment
TILE = 16 * STRIDE  # one 16x16 tile in shared memory
SMEM = 3 * WARPS * TILE  # a, kt, v tiles of every warp
SCRATCH = mma_sync.scratch_size(THREADS)

_u16_3d = types.Array(types.uint16, 3, "C")
_u32_2d = types.Array(types.uint32, 2, "C")
_f32_2d = types.Array(types.float32, 2, "C")
_f32_3d = types.Array(types.float32, 3, "C")


def fragment_mma(fmt):
    """d[tid] = mma(a_words[tid], b_words[tid], c[tid]): fragments in, fragments out."""
    mma = mma_sync.mma(fmt)

    def kernel(a_words, b_words, c, d):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(SCRATCH, uint32)
        a = (a_words[tid, 0], a_words[tid, 1], a_words[tid, 2], a_words[tid, 3])
        b = (b_words[tid, 0], b_words[tid, 1])
        out = mma(a, b, (c[tid, 0], c[tid, 1], c[tid, 2], c[tid, 3]), scratch, tid)
        d[tid, 0] = out[0]
        d[tid, 1] = out[1]
        d[tid, 2] = out[2]
        d[tid, 3] = out[3]

    return kernel, (_u32_2d, _u32_2d, _f32_2d, _f32_2d)


def _store_c(out, w, g, t, col0, frag):
    out[w, g, col0 + 2 * t] = frag[0]
    out[w, g, col0 + 2 * t + 1] = frag[1]
    out[w, g + 8, col0 + 2 * t] = frag[2]
    out[w, g + 8, col0 + 2 * t + 1] = frag[3]


def tiles(fmt):
    """The FlashAttention inner step on one 16x16 tile per warp.

    Global ``a``, ``kt`` ([n][k]) and ``v`` ([k][n]) tiles (WARPS, 16, 16) go to shared memory by
    cp.async (rows of ``v`` at or past ``valid_rows`` zero-filled), then per warp:
    ``s = a @ kt^T`` (ldmatrix + ldmatrix_b_rowcol), ``av = a @ v`` (ldmatrix.trans), and
    ``pv = round(s) @ v`` with ``s`` packed in registers as the A operand. ``regs`` receives the
    raw ldmatrix registers: x4 of a, kt, v (trans), then x2 of kt and x2.trans of v.
    """
    mma = mma_sync.mma(fmt)
    pack = convert.pack(fmt)
    store_c = cuda.jit(device=True)(_store_c) if SIMULATOR else cuda.jit(
        device=True, inline="always")(_store_c)
    chunks_per_thread = 3 * WARPS * 32 // THREADS

    def kernel(a, kt, v, valid_rows, s_out, av_out, pv_out, regs):
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        smem = cuda.shared.array(SMEM, uint16, alignment=SHARED_ALIGN)
        scratch = cuda.shared.array(SCRATCH, uint32)

        # Global -> shared: 16 rows x 2 chunks of 8 elements per tile; A and K^T in one group,
        # V in a second one.
        for i in range(chunks_per_thread):
            chunk = tid + THREADS * i
            which = chunk // (WARPS * 32)
            w = (chunk >> 5) % WARPS
            row = (chunk >> 1) & 15
            col = (chunk & 1) * 8
            dst = (which * WARPS + w) * TILE + row * STRIDE + col
            if which == 0:
                memory.cp_async_16(smem, dst, a, (w, row, col))
            elif which == 1:
                memory.cp_async_16(smem, dst, kt, (w, row, col))
        memory.cp_async_commit()
        for i in range(chunks_per_thread):
            chunk = tid + THREADS * i
            which = chunk // (WARPS * 32)
            w = (chunk >> 5) % WARPS
            row = (chunk >> 1) & 15
            col = (chunk & 1) * 8
            dst = (which * WARPS + w) * TILE + row * STRIDE + col
            if which == 2:
                memory.cp_async_16_zfill(smem, dst, v, (w, row, col), row < valid_rows)
        memory.cp_async_commit()
        memory.cp_async_wait(1)
        memory.cp_async_wait(0)
        memory.cp_async_wait_all()
        cuda.syncthreads()

        base_a = warp * TILE
        base_k = (WARPS + warp) * TILE
        base_v = (2 * WARPS + warp) * TILE
        ra, ca = mma_sync.ldmatrix_a_rowcol(lane)
        rb, cb = mma_sync.ldmatrix_b_rowcol(lane)
        fa = mma_sync.ldmatrix_x4(smem, base_a + ra * STRIDE + ca, scratch, tid)
        fk = mma_sync.ldmatrix_x4(smem, base_k + rb * STRIDE + cb, scratch, tid)
        fv = mma_sync.ldmatrix_x4_trans(smem, base_v + ra * STRIDE + ca, scratch, tid)
        fk2 = mma_sync.ldmatrix_x2(smem, base_k + (lane & 7) * STRIDE + (lane & 8), scratch, tid)
        fv2 = mma_sync.ldmatrix_x2_trans(smem, base_v + (lane & 15) * STRIDE, scratch, tid)

        zero = (float32(0), float32(0), float32(0), float32(0))
        s0 = mma(fa, (fk[0], fk[1]), zero, scratch, tid)  # columns 0..7
        s1 = mma(fa, (fk[2], fk[3]), zero, scratch, tid)  # columns 8..15
        av0 = mma(fa, (fv[0], fv[1]), zero, scratch, tid)
        av1 = mma(fa, (fv[2], fv[3]), zero, scratch, tid)
        # The C fragments of s0 | s1 are the A fragment of the 16x16 tile s: no shared memory.
        p = (pack(s0[0], s0[1]), pack(s0[2], s0[3]), pack(s1[0], s1[1]), pack(s1[2], s1[3]))
        pv0 = mma(p, (fv[0], fv[1]), zero, scratch, tid)
        pv1 = mma(p, (fv[2], fv[3]), zero, scratch, tid)

        g = lane >> 2
        t = lane & 3
        store_c(s_out, warp, g, t, 0, s0)
        store_c(s_out, warp, g, t, 8, s1)
        store_c(av_out, warp, g, t, 0, av0)
        store_c(av_out, warp, g, t, 8, av1)
        store_c(pv_out, warp, g, t, 0, pv0)
        store_c(pv_out, warp, g, t, 8, pv1)
        for j in range(4):
            regs[tid, j] = fa[j]
            regs[tid, 4 + j] = fk[j]
            regs[tid, 8 + j] = fv[j]
        regs[tid, 12] = fk2[0]
        regs[tid, 13] = fk2[1]
        regs[tid, 14] = fv2[0]
        regs[tid, 15] = fv2[1]

    return kernel, (_u16_3d, _u16_3d, _u16_3d, types.int32, _f32_3d, _f32_3d, _f32_3d, _u32_2d)


def conversions():
    """Per element i: pack_f16x2 / pack_bf16x2 of x[i], their unpacked values, exp2_approx."""

    def kernel(x, f16, bf16, unpacked, xe, e2):
        i = cuda.grid(1)
        while i < x.shape[0]:
            p = convert.pack_f16x2(x[i, 0], x[i, 1])
            q = convert.pack_bf16x2(x[i, 0], x[i, 1])
            f16[i] = p
            bf16[i] = q
            u = convert.unpack_f16x2(p)
            w = convert.unpack_bf16x2(q)
            unpacked[i, 0] = u[0]
            unpacked[i, 1] = u[1]
            unpacked[i, 2] = w[0]
            unpacked[i, 3] = w[1]
            e2[i] = convert.exp2_approx(xe[i])
            i += cuda.gridsize(1)

    f32_1d = types.Array(types.float32, 1, "C")
    u32_1d = types.Array(types.uint32, 1, "C")
    return kernel, (_f32_2d, u32_1d, u32_1d, _f32_2d, f32_1d, f32_1d)


def fp8_conversions():
    """Per element i: f32_to_e4m3 of x[i] (bits), e4m3_to_f32 of code i (for codes < 256),
    rcp_approx of x[i], the pair of e4m3 codes pairs[i] widened to float16 and bfloat16
    pairs, and x[4 i .. 4 i + 3] rounded into the word quads[i]."""

    def kernel(x, bits, codes, decoded, rcp, pairs, f16x2, bf16x2, quads):
        i = cuda.grid(1)
        while i < x.shape[0]:
            bits[i] = convert.f32_to_e4m3(x[i])
            rcp[i] = convert.rcp_approx(x[i])
            if i < quads.shape[0]:
                quads[i] = convert.pack_e4m3x4(x[4 * i], x[4 * i + 1], x[4 * i + 2],
                                               x[4 * i + 3])
            if i < codes.shape[0]:
                decoded[i] = convert.e4m3_to_f32(codes[i])
            if i < pairs.shape[0]:
                f16x2[i] = convert.e4m3x2_to_f16x2(pairs[i])
                bf16x2[i] = convert.e4m3x2_to_bf16x2(pairs[i])
            i += cuda.gridsize(1)

    f32_1d = types.Array(types.float32, 1, "C")
    u8_1d = types.Array(types.uint8, 1, "C")
    u16_1d, u32_1d = types.Array(types.uint16, 1, "C"), types.Array(types.uint32, 1, "C")
    return kernel, (f32_1d, u8_1d, u8_1d, f32_1d, f32_1d, u16_1d, u32_1d, u32_1d, u32_1d)


def register_split(lto):
    """A warp-specialized block of three warpgroups: the first drops to 24 registers, the
    others rise to 240 and each thread sums a run of its row (``x`` (384, 64)) through 64
    live registers. Compiled with the launch cap 168 and, for ``lto``, as a whole program."""

    def kernel(x, out):
        tid = cuda.threadIdx.x
        if sync.warp_uniform(tid >> 7) == 0:
            sync.regs_decrease(24)
            out[tid] = 0.0
        else:
            sync.regs_increase(240)
            acc = cuda.local.array(64, float32)
            for i in range(64):
                acc[i] = x[tid, i]
            for r in range(4):
                for i in range(64):
                    acc[i] = acc[i] * float32(0.5) + acc[(i + 1) % 64]
            total = float32(0.0)
            for i in range(64):
                total += acc[i]
            out[tid] = total

    return kernel, (_f32_2d, types.Array(types.float32, 1, "C")), {
        "max_registers": 168, "lto": lto, "unroll_loops": True}


def probe(name, fmt="float16"):
    """Target for ``ptxcheck.compile_report_isolated``: ``probe("tiles", "bfloat16")``."""
    if name == "tiles":
        return tiles(fmt)
    if name == "fragment_mma":
        return fragment_mma(fmt)
    if name == "conversions":
        return conversions()
    if name == "fp8_conversions":
        return fp8_conversions()
    if name.startswith("register_split"):
        return register_split(name.endswith("lto"))
    raise ValueError(name)
