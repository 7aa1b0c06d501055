"""scripts/sass_loops.py without nvdisasm: its reading of nvdisasm's text (labels,
line records, predicated opcodes) and its loops (backward branches, largest first)."""
from __future__ import annotations

from helpers import load_script

sass_loops = load_script("scripts/sass_loops.py")

SASS = """
        .text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
	//## File "/x/kernels/flash_mma.cu", line 10
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
	//## File "/x/kernels/common/types.cuh", line 82
        /*0020*/                   MUFU.EX2 R2, R2 ;
.L_x_1:
        /*0030*/              @!P0 FADD R3, R3, R2 ;
        /*0040*/               @P1 BRA `(.L_x_1) ;
	//## File "/x/kernels/flash_mma.cu", line 12
        /*0050*/                   ISETP.GE.AND P0, PT, R0, 0x4, PT ;
        /*0060*/               @P0 BRA `(.L_x_0) ;
        /*0070*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*0080*/                   EXIT ;
"""


def test_parse_reads_addresses_lines_labels_and_opcodes():
    instructions, labels = sass_loops.parse(SASS)
    assert [a for a, _, _ in instructions] == list(range(0, 0x90, 0x10))
    assert labels == {"L_x_0": 0x10, "L_x_1": 0x30, "L_x_2": 0x80}
    assert instructions[0][2] is None and instructions[2][2] == ("types.cuh", 82)
    assert [sass_loops.opcode(t) for _, t, _ in instructions] == [
        "MOV", "HMMA", "MUFU", "FADD", "BRA", "ISETP", "BRA", "BRA", "EXIT"]


def test_loops_are_backward_branches_largest_first():
    found = sass_loops.loops(*sass_loops.parse(SASS))
    assert [(lo, hi, len(body)) for lo, hi, body in found] == [(0x10, 0x60, 6), (0x30, 0x40, 2)]


STUBS = SASS.replace("""        /*0080*/                   EXIT ;
""", """        /*0080*/                   EXIT ;
.L_x_3:
        /*0090*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R11+URZ], R14 ;
        /*00a0*/              @!P0 BRA `(.L_x_3) ;
        /*00b0*/                   BRA `(.L_x_1) ;
""")


def test_retry_stubs_after_the_last_exit_do_not_make_loops():
    found = sass_loops.loops(*sass_loops.parse(STUBS))
    assert [(lo, hi, len(body)) for lo, hi, body in found] == [
        (0x10, 0x60, 6), (0x30, 0x40, 2), (0x90, 0xa0, 2)]
