"""launch.py's own machinery: the hand-packed kernel parameter block and the loop marks of the
compile (tile tables and kernel configurations are tested with the kernels that use them; the
PTX test of the tc forward shows the marks keep its register arrays out of local memory)."""

import ctypes

import numpy as np
import pytest
from numba import cuda, types

from numba_flash import arrays, launch
from helpers import SIMULATOR, to_device, to_host

U16_4D = types.Array(types.uint16, 4, "A")
F32_1D = types.Array(types.float32, 1, "A")


def device_tensor(shape, strides, itemsize, ptr, fmt="bfloat16"):
    return arrays.Tensor("x", None, "cupy", fmt, shape, strides, itemsize, ptr, 0, None)


def read(block, index, ctype):
    return ctype.from_address(block.pointers[index]).value


def test_parameter_block_follows_numbas_array_abi_and_alignment():
    block = launch._ParameterBlock((U16_4D, types.int32, types.float32, F32_1D, types.int32,
                                    types.float64))
    offsets = [p - block.pointers[0] for p in block.pointers]
    # a 4-d array: meminfo, parent, nitems, itemsize, data, 4 extents, 4 byte strides
    assert offsets[:13] == [8 * i for i in range(13)]
    assert offsets[13:15] == [104, 108]           # int32, float32: 4-byte aligned
    assert offsets[15:22] == [112 + 8 * i for i in range(7)]
    assert offsets[22:] == [168, 176]             # int32, then float64 padded to 8

    q = device_tensor((2, 3, 5, 8), (240, 80, 16, 1), 2, 0x7F0000001230)
    o = device_tensor((7,), (3,), 4, 0x7F0000004000, "float32")
    values, device = block.values((q, 9, 0.5, o, -4, 1.25))
    assert device == 0
    block.format.pack_into(block.buffer, 0, *values)
    assert [read(block, i, ctypes.c_int64) for i in range(13)] == \
        [0, 0, 240, 2, 0x7F0000001230, 2, 3, 5, 8, 480, 160, 32, 2]
    assert read(block, 13, ctypes.c_int32) == 9 and read(block, 14, ctypes.c_float) == 0.5
    assert [read(block, 15 + i, ctypes.c_int64) for i in range(7)] == \
        [0, 0, 7, 4, 0x7F0000004000, 7, 12]
    assert read(block, 22, ctypes.c_int32) == -4 and read(block, 23, ctypes.c_double) == 1.25


@pytest.mark.parametrize("case", ["count", "ndim", "itemsize", "host", "not a tensor"])
def test_parameter_block_refuses_what_the_signature_does_not_take(case):
    block = launch._ParameterBlock((U16_4D, types.int32))
    good = device_tensor((1, 2, 3, 8), (48, 24, 8, 1), 2, 4096)
    arg = {"ndim": device_tensor((2, 8), (8, 1), 2, 4096),
           "itemsize": device_tensor((1, 2, 3, 8), (48, 24, 8, 1), 4, 4096, "float32"),
           "host": arrays.adapt(np.zeros((1, 2, 3, 8), np.float16), "x") if SIMULATOR else None,
           "not a tensor": np.zeros((1, 2, 3, 8), np.uint16)}.get(case, good)
    if arg is None:
        pytest.skip("host arrays are refused by arrays.adapt on a GPU")
    args = (arg,) if case == "count" else (arg, 1)
    with pytest.raises(TypeError, match="launch:"):
        block.values(args)


def test_parameter_block_refuses_unknown_argument_types():
    with pytest.raises(TypeError, match="no parameter packing"):
        launch._ParameterBlock((types.complex64,))


def probe(x, out, n, s):
    """out[i] = x[i, 1] * s + n, with x a strided 2-d view."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i, 1] * s + n


@pytest.mark.skipif(SIMULATOR, reason="the parameter block is the GPU launch path")
def test_launch_passes_strided_views_and_scalars_to_a_real_kernel():
    f2 = types.Array(types.float32, 2, "A")
    kernel = launch.compile_kernel(probe, types.void(f2, F32_1D, types.int32, types.float32), 0)
    host = np.random.default_rng().standard_normal((40, 6)).astype(np.float32)
    x = arrays.adapt(to_device(host)[::2, 1:], "x")  # rows 2 apart, pointer one element in
    out = arrays.adapt(to_device(np.full(20, np.nan, np.float32)), "out")
    launch.launch(kernel, (1,), 32, arrays.stream_of(out), 0, x, out, np.int32(3),
                  np.float32(0.5))
    np.testing.assert_array_equal(to_host(out.obj), host[::2, 2] * np.float32(0.5) + 3)


# Two loops, as Numba lays them out: a header tested at the top (latch: an unconditional branch
# back) and one tested at the bottom (latch: a conditional branch back); existing metadata !0.
LOOPS_IR = """define void @f(i32 %n) {
entry:
  br label %B2
B2:
  %i = phi i32 [0, %entry], [%j, %B4]
  %c = icmp slt i32 %i, 4
  br i1 %c, label %B4, label %"B6.a"
B4:
  %j = add i32 %i, 1
  br label %B2
"B6.a":
  %k = phi i32 [0, %B2], [%k1, %"B6.a"]
  %k1 = add i32 %k, 1
  %d = icmp slt i32 %k1, %n
  br i1 %d, label %"B6.a", label %exit
exit:
  ret void
}
!0 = !{i32 1}
"""


def test_every_back_edge_and_nothing_else_is_marked_for_full_unrolling():
    import llvmlite.binding as llvm

    marked = launch.mark_loops_for_unrolling(LOOPS_IR)
    branches = [line.strip() for line in marked.splitlines() if line.strip().startswith("br ")]
    assert branches == [
        "br label %B2",
        'br i1 %c, label %B4, label %"B6.a"',
        "br label %B2, !llvm.loop !2",
        'br i1 %d, label %"B6.a", label %exit, !llvm.loop !3',
    ]
    # fresh ids past the module's own, one distinct loop id each, pointing at the unroll hint
    assert marked.endswith('!1 = !{!"llvm.loop.unroll.full"}\n'
                           "!2 = distinct !{!2, !1}\n!3 = distinct !{!3, !1}")
    llvm.parse_assembly(marked).verify()


def test_tc_forward_takes_the_first_tiles_of_which_two_blocks_fit_an_sm():
    """D = 128: 64-key blocks (102 KiB) where two fit (a Hopper's 228 KiB per SM), 32-key
    blocks (68 KiB) on an A100 (164 KiB) or an sm_86 part (100 KiB); the first entry when the
    device is not known."""
    kib = 1024
    pick = lambda per_sm: launch.tc_forward_tiles(128, shared_per_sm=per_sm)  # noqa: E731
    hopper, a100, sm86 = pick(228 * kib), pick(164 * kib), pick(100 * kib)
    assert (hopper.BLOCK_M, hopper.BLOCK_N, hopper.threads) == (128, 64, 128)
    assert hopper.shared_bytes == 2 * (128 + 4 * 64) * (128 + 8)
    assert (a100.BLOCK_N, sm86.BLOCK_N) == (32, 32)
    assert 2 * (a100.shared_bytes + launch.SHARED_RESERVED_PER_BLOCK) <= 164 * kib
    assert pick(None).spec == hopper.spec == (128, 64, 4, 0)
    assert launch.tc_forward_tiles(64, shared_per_sm=100 * kib).spec == (128, 64, 4, 0)  # no other


def test_hopper_runs_the_wgmma_family_with_tiles_that_fit():
    """Compute capability 9.0 runs forward_wgmma.py, anything else forward.py (mma.sync). Every
    wgmma tile is whole warpgroups (64 rows, 128 threads each) and fits the 227 KiB a Hopper
    block may have, alignment reserve included."""
    assert launch.tc_family((9, 0)) == "wgmma"
    assert {launch.tc_family(cc) for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0))} == {"mma"}
    for d in (8, 64, 96, 128, 200, 256):
        for causal in (False, True):
            t = launch.tc_forward_tiles(d, family="wgmma", causal=causal)
            assert t.BLOCK_M % 64 == 0 and t.threads == 2 * t.BLOCK_M and t.BLOCK_N % 16 == 0
            dpad = -(-d // 64) * 64
            assert t.shared_bytes == 2 * (t.BLOCK_M + 4 * t.BLOCK_N) * dpad + 1024
            assert t.shared_bytes <= 227 * 1024
    assert launch.tc_forward_tiles(64, family="wgmma").spec == (128, 64, 8, 0)
    assert launch.tc_forward_tiles(128, family="wgmma", causal=True).spec == (128, 128, 8, 0)
