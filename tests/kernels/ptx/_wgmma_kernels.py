"""A kernel exercising every instruction of ``kernels/ptx/wgmma.py`` (and ``sync.proxy_fence``).

``chain(fmt, n, a_regs, trans_b)`` returns ``(python_function, signature)``: one warpgroup
computes ``D = A B (+ C)`` for A 64 x K and B K x n as a chain of four wgmma k-steps (K 64, or
128 for e4m3), with A from shared memory (a descriptor) or from registers, and B stored K-major
or MN-major. Images are 16-bit words whatever the format: the rows are 128 bytes either way. The tests
run it through ``cuda.jit`` (simulator or GPU) and ``ptxcheck`` compiles it for sm_90a
(``"<this file>:chain"``).
"""

from numba import cuda, float32, types, uint16, uint32, uint64

from numba_flash.kernels.instructions import memory, sync, wgmma

SHARED_ALIGN = memory.SHARED_ALIGN

THREADS = 128  # one warpgroup
K = 64         # 16-bit columns of A, rows of B: four k-steps of 32 bytes
A_ELEMS = 64 * K
SCRATCH = wgmma.scratch_size(THREADS)


def chain(fmt, n, a_regs, trans_b):
    """Kernel ``(a_img, b_img, a_frag, c, d, accumulate)``: ``a_img`` / ``b_img`` are the
    operands' shared-memory images (wgmma.tile_offset layout: A 64 rows, B n rows K-major or
    64 rows MN-major), ``a_frag[tid, ks]`` the thread's A registers of k-step ks, ``c`` /
    ``d`` the thread's n / 2 accumulator registers before / after; ``accumulate`` 0 makes the
    first k-step overwrite (scale-d false)."""
    mma = (wgmma.mma_rs if a_regs else wgmma.mma_ss)(fmt, n, trans_b)
    regs = n // 2
    b_elems = n * K  # 16-bit words
    smem_elems = A_ELEMS + b_elems + wgmma.TILE_ALIGN // 2
    # B's k-step: 32 bytes along a K-major row, or 16 rows of an MN-major tile (16-byte units);
    # an MN-major tile's next 64 columns are its next column block, 64 rows of 128 bytes.
    b_step = 16 * wgmma.SWIZZLE_BYTES // 16 if trans_b else 2
    b_lbo = K * wgmma.SWIZZLE_BYTES if trans_b else 16

    def kernel(a_img, b_img, a_frag, c, d, accumulate):
        smem = cuda.shared.array(smem_elems, uint16, alignment=SHARED_ALIGN)
        scratch = cuda.shared.array(SCRATCH, uint32)
        tid = cuda.threadIdx.x
        base = wgmma.aligned_base(smem)
        for i in range(tid, A_ELEMS, THREADS):
            smem[base + i] = a_img[i]
        for i in range(tid, b_elems, THREADS):
            smem[base + A_ELEMS + i] = b_img[i]
        acc = cuda.local.array(regs, float32)
        for i in range(regs):
            acc[i] = c[tid, i]
        sync.proxy_fence()
        cuda.syncthreads()
        desc_a = wgmma.descriptor(smem, base, 16, 8 * wgmma.SWIZZLE_BYTES)
        desc_b = wgmma.descriptor(smem, base + A_ELEMS, b_lbo, 8 * wgmma.SWIZZLE_BYTES)
        wgmma.fence()
        for ks in range(4):
            b = desc_b + uint64(ks * b_step)
            if a_regs:
                a = (a_frag[tid, ks, 0], a_frag[tid, ks, 1], a_frag[tid, ks, 2], a_frag[tid, ks, 3])
                mma(acc, 0, a, b, accumulate != 0 or ks > 0, smem, scratch, tid)
            else:
                mma(acc, 0, desc_a + uint64(2 * ks), b, accumulate != 0 or ks > 0, smem, scratch,
                    tid)
        wgmma.commit()
        wgmma.wait(0)
        wgmma.fence_operands(acc, regs)
        for i in range(regs):
            d[tid, i] = acc[i]

    u16, u32_3d = types.Array(types.uint16, 1, "C"), types.Array(types.uint32, 3, "C")
    f32_2d = types.Array(types.float32, 2, "C")
    return kernel, (u16, u16, u32_3d, f32_2d, f32_2d, types.int32)
