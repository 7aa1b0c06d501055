"""scripts/decode_ab.py: the A/B of two trees' decode_bench runs (no GPU: the trees'
decode_bench is a stand-in that writes a report)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import load_script


def _module():
    return load_script("scripts/decode_ab.py", "decode_ab")


def _report(seconds: dict) -> dict:
    rows = [dict(B=8, Hq=32, Hkv=8, Sq=sq, Sk=8192, D=64, impl="ours", page=page,
                 layout="nhd", seconds=s, tbps=1.0, spread_pct=0.0)
            for (sq, page), s in seconds.items()]
    rows.append(dict(B=8, Hq=32, Hkv=8, Sq=1, Sk=8192, D=64, impl="cudnn", page=None,
                     layout="hnd", seconds=1.0))
    rows.append(dict(B=8, Hq=32, Hkv=8, Sq=4, Sk=8192, D=64, impl="ours", page=1,
                     layout="nhd", error="ShapeError: ..."))
    return {"rows": rows}


def test_summary_takes_each_trees_fastest_round_and_the_old_spread():
    ab = _module()
    old = [_report({(1, 0): 10e-6, (16, 1): 40e-6}), _report({(1, 0): 11e-6, (16, 1): 40e-6})]
    new = [_report({(1, 0): 12e-6, (16, 1): 30e-6}), _report({(1, 0): 10e-6, (16, 1): 32e-6})]
    rows = {k[3]: r for k, *r in ab.summarize(old, new)}
    assert set(rows) == {1, 16}                       # torch rows and errors left out
    o, n, ratio, spread = rows[1]
    assert (o, n) == (10e-6, 10e-6) and ratio == pytest.approx(1.0)
    assert spread == pytest.approx(0.1)
    o, n, ratio, spread = rows[16]
    assert ratio == pytest.approx(40 / 30) and spread == 0.0
    text = ab.render(ab.summarize(old, new))
    assert "page=1" in text and "contig" in text and "median new/old 1.167" in text


def test_cells_missing_from_a_round_are_left_out():
    ab = _module()
    old = [_report({(1, 0): 10e-6, (16, 1): 40e-6})]
    new = [_report({(1, 0): 10e-6})]
    assert [k[3] for k, *_ in ab.summarize(old, new)] == [1]


def _tree(path: Path, seconds: float) -> str:
    script = path / "scripts" / "decode_bench.py"
    script.parent.mkdir(parents=True)
    script.write_text(textwrap.dedent(f"""
        import json, sys
        out = sys.argv[sys.argv.index("--json") + 1]
        assert "--no-torch" in sys.argv and "--pages" in sys.argv
        row = dict(B=1, Hq=32, Hkv=8, Sq=1, Sk=1024, D=128, impl="ours", page=16,
                   layout="nhd", seconds={seconds!r})
        json.dump({{"rows": [row]}}, open(out, "w"))
    """))
    return str(path)


def test_main_alternates_the_trees_and_writes_the_rounds(tmp_path, capsys):
    ab = _module()
    old, new = _tree(tmp_path / "old", 2e-5), _tree(tmp_path / "new", 1e-5)
    out = tmp_path / "ab.json"
    assert ab.main(["--trees", old, new, "--rounds", "2", "--json", str(out), "--",
                    "--pages", "16"]) == 0
    printed = capsys.readouterr()
    assert "2.000" in printed.out
    assert [line.split(":")[1].split()[0] for line in printed.err.splitlines()] == \
        ["old", "new", "old", "new"]
    saved = json.loads(out.read_text())
    assert len(saved["rounds"]["old"]) == 2 and saved["bench_args"] == ["--pages", "16"]
    assert saved["summary"][0]["ratio"] == pytest.approx(2.0)


def test_main_refuses_a_tree_without_the_script(tmp_path, capsys):
    ab = _module()
    with pytest.raises(SystemExit):
        ab.main(["--trees", str(tmp_path), str(tmp_path), "--", "--pages", "0"])
    assert "--trees" in capsys.readouterr().err
