"""runtime/compiler.py: the loop marks of the compile (the PTX tests of the tc kernels show the
marks keep their register arrays out of local memory), and the error a compile without the CUDA
toolkit's libraries raises."""

import pytest

from numba_flash.runtime import compiler
from helpers import run_without, user_traceback


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

    marked = compiler.mark_loops_for_unrolling(LOOPS_IR)
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


# A kernel compiled for sm_90 through the cache (whose key asks NVVM's version and whose entry is
# linked, which takes NVRTC) and without it (the front end alone; the link waits for the launch).
WITHOUT_TOOLKIT = """
from numba import types
from numba_flash.runtime import compiler
from numba_flash.runtime.env import CudaSetupError

def kernel(x):
    x[0] = 1.0

for key in (("probe", 0, ()), None):
    try:
        compiler.compile_kernel(kernel, (types.float32[::1],), 0, (9, 0), key=key)
        print("compiled")
    except CudaSetupError as e:
        print(str(e).split(":")[0])
compiler.compile_kernel(kernel, (types.float32[::1],), 0, (9, 0), key=("probe", 0, ()))
"""


@pytest.mark.parametrize("library, links_at_launch", [("nvvm", False), ("nvrtc", True)])
def test_a_compile_without_a_toolkit_library_names_it_and_the_extras(library, links_at_launch,
                                                                     tmp_path):
    run = run_without([library], WITHOUT_TOOLKIT, env={"NUMBA_FLASH_CACHE_DIR": str(tmp_path)})
    missing = f"the CUDA toolkit library 'lib{library}.so"  # pathfinder's names: ".so.13 or ..."
    cached, uncached = run.stdout.splitlines()
    assert cached.startswith(missing), run.stdout + run.stderr
    assert uncached == ("compiled" if links_at_launch else cached)
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("numba_flash.runtime.env.CudaSetupError: " + missing), run.stderr
    assert 'pip install "numba_flash[cu13]"' in last and '"numba_flash[cu12]"' in last
    assert "DynamicLibNotFoundError" not in run.stderr
    assert len(user_traceback(run.stderr)) <= 2, run.stderr  # the script's line, compile_kernel
