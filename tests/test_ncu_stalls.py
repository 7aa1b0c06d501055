"""scripts/ncu_stalls.py on a small ncu source-page CSV written out here: kernel blocks,
samples, the top instructions with their stall reasons (and the unnamed rest), and the
share of rarely executed instructions."""
from __future__ import annotations

from helpers import load_script

ncu_stalls = load_script("scripts/ncu_stalls.py")

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)",'
          '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed",'
          '"stall_barrier","stall_long_sb","stall_barrier (Not Issued)"')
CSV = "\n".join([
    "==PROF== Connected to process 1",
    '"Kernel Name","void k1<1>(P)",',
    HEADER,
    '"0x10","  BAR.SYNC 0x0","6","5","1,024","0","0","5"',
    '"0x20","@P0 BRA 0x40","90","80","1,024","80","10","70"',
    '"0x30","  UTMALDG.4D [UR8], [UR4]","4","3","32","0","0","0"',
    '"Kernel Name","void k2<2>(P)",',
    HEADER,
    '"0x10","  HGMMA.64x64x16.F32.BF16 R8, R4, gdesc[UR8], RZ","50","45","64","0","0","0"',
    '"0x20","  LDS R7, [R6]","10","9","64","0","10","0"',
    "==PROF== Disconnected from process 1",
])


def test_parse_splits_the_kernels_and_reads_their_rows():
    kernels = ncu_stalls.parse(CSV.splitlines(keepends=True))
    assert [k.name for k in kernels] == ["void k1<1>(P)", "void k2<2>(P)"]
    assert [len(k.rows) for k in kernels] == [3, 2]
    assert kernels[0].samples == 100 and kernels[1].samples == 60
    assert ncu_stalls._num(kernels[0].rows[0][ncu_stalls.EXECUTED]) == 1024


def test_stall_reasons_leave_out_the_not_issued_columns():
    row = ncu_stalls.parse(CSV.splitlines())[0].rows[1]
    assert ncu_stalls.stalls(row) == {"barrier": 80.0, "long_sb": 10.0}


def test_report_orders_by_samples_and_names_the_rest():
    k1, k2 = ncu_stalls.parse(CSV.splitlines())
    lines = ncu_stalls.report(k1, top=2, few=True).splitlines()
    assert lines[1].strip() == "3 instructions, 100 samples"
    assert "90.0%" in lines[2] and "BRA" in lines[2] and "barrier 80" in lines[2]
    assert "6.0%" in lines[3] and "unnamed 6" in lines[3]
    # the one instruction run 32 times against 1024: 4 of 100 samples
    assert lines[-1].endswith("1, 4.0% of the samples")
    text = ncu_stalls.report(k2, top=1, few=False)
    assert "HGMMA" in text and "unnamed 50" in text and "LDS" not in text


def test_main_refuses_a_file_without_kernels(tmp_path, capsys):
    path = tmp_path / "empty.csv"
    path.write_text("==PROF== nothing\n")
    assert ncu_stalls.main([str(path)]) == 1
    assert "no kernel blocks" in capsys.readouterr().err
    path.write_text(CSV)
    assert ncu_stalls.main([str(path), "--top", "1"]) == 0
    assert "void k2<2>(P)" in capsys.readouterr().out
