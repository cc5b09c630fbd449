"""runtime/compiler.py: the loop marks of the compile (the PTX tests of the tc kernels show the
marks keep their register arrays out of local memory)."""

from numba_flash.runtime import compiler


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
