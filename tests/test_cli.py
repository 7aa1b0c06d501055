"""The command line and the benchmark's CPU-side parts: argument parsing, the case
grid, ratios, tables, JSON and plots from a synthetic report. No GPU, no torch."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import cupy_attention as ca
from cupy_attention import bench, cli, device, dispatch

ROOT = Path(__file__).resolve().parent.parent

no_gpu_only = pytest.mark.skipif(
    device.device_count() > 0, reason="checks the no-GPU behaviour; this machine has a GPU")


def render(fn, *args) -> str:
    buf = io.StringIO()
    fn(*args, Console(file=buf, width=220, color_system=None))
    return buf.getvalue()


def cases(*argv):
    return bench.build_cases(cli.parse_args(["bench", *argv]))


# ---------------------------------------------------------------------------
# info / cache / bench without a GPU

@no_gpu_only
def test_info_without_gpu_says_so_and_lists_kernels():
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    res = subprocess.run([sys.executable, "-m", "cupy_attention.cli", "info"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stdout.splitlines() if "no CUDA device" in line]
    assert len(lines) == 1
    for name in ("NVRTC", "JIT cache", *dispatch.FAMILIES, "reference"):
        assert name in res.stdout


@no_gpu_only
def test_bench_without_gpu_is_one_clear_error(capsys):
    assert cli.main(["bench", "--quick"]) == 1
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "Traceback" not in out


def test_cache_show_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(tmp_path))
    (tmp_path / "x-sm_90a-0.bin").write_bytes(b"0" * 2048)
    assert cli.main(["cache"]) == 0
    assert "1 entries, 2.0 KiB" in capsys.readouterr().out
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 cache entries" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.bin"))


# ---------------------------------------------------------------------------
# arguments and cases

def test_default_grid_is_benchmarks_md():
    grid, notes = cases()
    assert notes == []
    assert len(grid) == 6 * 7 * 2 * 2
    assert {c.dtype for c in grid} == {"bfloat16", "float16"}
    assert {c.head_dim for c in grid} == set(bench.HEAD_DIMS)
    for c in grid:
        assert c.batch * c.seqlen_q == 16384
        assert c.heads_q == 2048 // c.head_dim == c.heads_kv
        assert c.seqlen_q == c.seqlen_k and c.kind == "fwd"


def test_quick_subset():
    args = cli.parse_args(["bench", "--quick"])
    assert args.overhead and args.reps == bench.QUICK_REPS
    assert args.quadratic_max_seqlen == bench.QUICK_QUADRATIC_MAX
    grid, _ = bench.build_cases(args)
    bf16 = [c for c in grid if c.dtype == "bfloat16"]
    assert {(c.seqlen_q, c.head_dim, c.causal) for c in bf16} == {
        (s, d, c) for s in (1024, 4096) for d in (64, 128) for c in (False, True)}
    assert [(c.seqlen_q, c.head_dim) for c in grid if c.dtype == "float32"] == [(2048, 64)]


def test_subset_flags():
    grid, _ = cases("--seqlens", "1k,2k", "--head-dims", "96", "--dtypes", "fp32",
                    "--causal", "on", "--reps", "25")
    assert [(c.seqlen_q, c.head_dim, c.dtype, c.causal, c.batch, c.heads_q) for c in grid] == [
        (1024, 96, "float32", True, 16, 21), (2048, 96, "float32", True, 8, 21)]


def test_shape_and_decode():
    grid, _ = cases("--shape", "2,3,100,40", "--dtype", "bf16", "--causal", "off", "--decode")
    assert grid[0] == bench.Case("fwd", 2, 3, 3, 100, 100, 40, "bfloat16", False)
    decode = grid[1:]
    assert [(c.batch, c.seqlen_k, c.seqlen_q, c.page) for c in decode] == [
        (b, sk, sq, page) for b, sk, sq in bench.DECODE_SHAPES for page in bench.DECODE_PAGES]
    assert all(c.kind == "decode" and (c.heads_q, c.heads_kv) == (32, 8) for c in decode)
    assert {c.page for c in decode} == {0, 16, 1} and {c.seqlen_q for c in decode} == {1, 4}


def test_decode_grid_covers_issue_35():
    grid, notes = cases("--no-grid", "--decode-grid")
    assert all(c.kind == "decode" for c in grid) and any("GiB" in n for n in notes)
    assert {c.batch for c in grid} == {1, 8, 64, 256}
    assert {c.seqlen_k for c in grid} == {1024, 8192, 32768, 131072}
    assert {(c.heads_q, c.heads_kv) for c in grid} == {(32, 8), (32, 32)}
    assert {c.head_dim for c in grid} == {64, 128, 256}
    assert {c.seqlen_q for c in grid} == {1, 4, 16}
    assert {c.page for c in grid} == {0, 1, 16, 64}
    assert all(c.kv_bytes() <= bench.DECODE_MAX_BYTES for c in grid)
    assert len(set(grid)) == len(grid)


def test_decode_grid_times_decode_beside_two_torch_backends():
    """The grid's policy (Runner._policy_skip, on a stand-in for the Runner's state):
    other families and backends skipped on decode cases unless named; the forward
    grid's cases and the anchor set (--decode without --decode-grid) untouched."""
    from types import SimpleNamespace

    from cupy_attention.bench.runner import Runner

    skip = Runner._policy_skip
    decode = bench.decode_cases(grid=True)[0]
    fwd = bench.grid_case(1024, 64, "bfloat16", False)
    on = SimpleNamespace(decode_grid=True, named=set(), quadratic_max=4096)
    for name in bench.DECODE_GRID_TIMED:
        assert skip(on, name, False, decode) is None
    for name in ("flash_wgmma", "flash", "torch:efficient"):
        assert "decode grid" in skip(on, name, False, decode)
        assert skip(on, name, False, fwd) is None
    assert skip(SimpleNamespace(**{**on.__dict__, "named": {"flash_wgmma"}}), "flash_wgmma",
                False, decode) is None
    assert skip(SimpleNamespace(**{**on.__dict__, "decode_grid": False}), "flash", False,
                decode) is None


def test_paged_rows_compare_with_contiguous_torch():
    c = bench.decode_cases()[0]
    paged = bench.Case(**{**c.__dict__, "page": 16})
    rows = [bench.make_row(c, "torch:cudnn", "torch", ms=2.0),
            bench.make_row(paged, "decode", "ours", ms=1.0)]
    bench.add_ratios(rows)
    assert rows[1]["speedup_cudnn"] == pytest.approx(2.0)
    assert bench.case_key(rows[1]) != bench.case_key(rows[0])
    old = {k: v for k, v in rows[0].items() if k != "page"}   # a row from before "page"
    assert bench.case_key(old) == bench.case_key(rows[0])


def test_backward_flag(monkeypatch):
    if bench.backward_available():   # loaded on first use (PEP 562): remove both ways
        monkeypatch.delattr(ca, "attention_backward")
        monkeypatch.delitem(ca._LAZY, "attention_backward")
    grid, notes = cases("--shape", "1,2,64,64", "--dtype", "bf16", "--backward")
    assert len(grid) == 2 and notes == [
        "backward benchmarks: not implemented yet (cupy_attention has no attention_backward)"]
    monkeypatch.setattr(ca, "attention_backward", lambda *a, **k: None, raising=False)
    grid, notes = cases("--shape", "1,2,64,64", "--dtype", "bf16", "--backward")
    assert notes == [] and [c.kind for c in grid] == ["fwd", "fwd", "bwd", "bwd"]


@pytest.mark.parametrize("argv, message", [
    (["--reps", "5"], "at least 20"),
    (["--quick", "--seqlens", "1k"], "--quick picks its own cases"),
    (["--kernels", "nope"], "unknown kernel family nope"),
    (["--torch-backends", "xla"], "unknown torch backend xla"),
    (["--dtypes", "int8"], "unknown dtype"),
    (["--shape", "1,2,3"], "B,H,S,D"),
    (["--seqlens", "1x"], "not an integer"),
    (["--no-grid"], "nothing to run"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_flops():
    c = bench.grid_case(4096, 128, "bfloat16", False)
    assert c.flops() == 4 * 4 * 16 * 4096 * 4096 * 128
    assert bench.Case(**{**c.__dict__, "causal": True}).flops() == c.flops() / 2
    assert bench.Case(**{**c.__dict__, "kind": "bwd"}).flops() == c.flops() * 2.5
    row = bench.make_row(c, "flash_mma", "ours", ms=2.0)
    assert row["tflops"] == pytest.approx(c.flops() / 2e-3 / 1e12)
    d = bench.decode_cases()[0]
    assert bench.make_row(d, "x", "ours", ms=1.0)["tbps"] == pytest.approx(
        2 * 1 * 8 * 32768 * 128 * 2 / 1e-3 / 1e12)


def test_training_steps_add_forward_and_backward_per_implementation():
    fwd = bench.grid_case(4096, 128, "bfloat16", True)
    bwd = bench.Case(**{**fwd.__dict__, "kind": "bwd"})
    rows = [bench.make_row(fwd, "flash_wgmma", "ours", ms=1.0),
            bench.make_row(fwd, "flash_mma", "ours", ms=1.5),
            bench.make_row(bwd, "flash_mma", "ours", ms=3.0),
            bench.make_row(bwd, "flash", "ours", ms=9.0),
            bench.make_row(fwd, "torch:flash", "torch", ms=1.2),
            bench.make_row(bwd, "torch:flash", "torch", ms=4.0),
            bench.make_row(fwd, "torch:cudnn", "torch", ms=0.5),
            bench.make_row(bwd, "torch:cudnn", "torch", skipped="declined")]
    steps = {s["impl"]: s for s in bench.training_steps(rows)}
    assert set(steps) == {"ours", "torch:flash"}   # cuDNN has no backward row with a time
    assert steps["ours"]["step_ms"] == pytest.approx(4.0)   # fastest forward + fastest backward
    assert steps["ours"]["speedup_flash"] == pytest.approx(5.2 / 4.0)
    assert "speedup_cudnn" not in steps["ours"]
    out = io.StringIO()
    bench.render_steps(list(steps.values()), Console(file=out, width=200))
    assert "training step" in out.getvalue() and "5.200" in out.getvalue()


# ---------------------------------------------------------------------------
# rendering from a synthetic report

def figures(ms: float, **extra) -> dict:
    return {"ms": ms, "ms_rounds": [ms, ms * 1.01], "spread_pct": 1.0, "cold_s": 0.5,
            "reps": 20, "input_sets": 1, "extra_bytes": 0, "max_err": 1e-3, **extra}


def synthetic_report() -> dict:
    rows = []
    for d in (64, 128):
        for s in (1024, 4096):
            for causal in (False, True):
                c = bench.grid_case(s, d, "bfloat16", causal)
                rows.append(bench.make_row(c, "flash_mma", "ours",
                                           **figures(1.0, specs=[f"flash_mma[D={d}]"])))
                rows.append(bench.make_row(c, "naive", "ours", **figures(8.0, max_err="nan")))
                rows.append(bench.make_row(c, "torch:flash", "torch", **figures(1.5)))
                rows.append(bench.make_row(c, "torch:cudnn", "torch", **figures(0.8)))
                rows.append(bench.make_row(c, "torch:math", "torch", skipped="O(S^2) baseline"))
    fp32 = bench.grid_case(2048, 64, "float32", False)
    rows.append(bench.make_row(fp32, "naive", "ours", error="CompileError: NVRTC failed"))
    for c in bench.decode_cases():
        rows.append(bench.make_row(c, "flash_mma", "ours", **figures(0.05)))
        rows.append(bench.make_row(c, "torch:flash", "torch", **figures(0.06)))
    bench.add_ratios(rows)
    return {
        "schema": bench.SCHEMA,
        "env": {"device": {"id": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": 90,
                           "arch": "sm_90a", "sms": 132, "memory_bytes": 80 << 30,
                           "l2_bytes": 50 << 20},
                "driver": "580.1", "cuda_driver": "13.0", "cupy": "14.2.0", "nvrtc": "13.0",
                "torch": "2.11.0", "cupy_attention": "0.1.0", "commit": "0123456789abcdef",
                "dirty": False, "date": "2026-11-22T00:00:00+00:00",
                "command": "cupy-attention bench --quick"},
        "method": {"rounds": 2, "reps_per_round": 20},
        "notes": ["torch note"],
        "results": rows,
        "overhead": {"problem": "bf16 D=64 S=128 B=1 H=1", "calls": 1000, "kernel": "flash_mma",
                     "rows": [{"what": "attention() on cupy arrays", "host_us": 35.0,
                               "wall_us": 36.0, "gpu_us": 6.0}],
                     "cold": {"specs": ["flash_mma[D=64]"], "compiled_entries": 1,
                              "empty_cache_s": 4.2, "disk_cache_s": 0.02, "hot_s": 4e-5}},
    }


def test_ratios_are_anchor_time_over_row_time():
    rows = synthetic_report()["results"]
    mma = next(r for r in rows if r["kernel"] == "flash_mma" and r["kind"] == "fwd")
    assert mma["speedup_flash"] == pytest.approx(1.5)
    assert mma["speedup_cudnn"] == pytest.approx(0.8)
    dec = next(r for r in rows if r["kernel"] == "flash_mma" and r["kind"] == "decode")
    assert dec["speedup_flash"] == pytest.approx(1.2) and "speedup_cudnn" not in dec
    assert all("speedup_flash" not in r for r in rows if "ms" not in r)


def test_render_report():
    text = render(bench.render_report, synthetic_report())
    for expected in ("NVIDIA H100 80GB HBM3", "0123456789abcdef", "cupy-attention bench --quick",
                     "forward · bfloat16 · D=64", "forward · bfloat16 · D=128",
                     "decode · bfloat16",
                     "TFLOPs", "KV TB/s", "1.50×", "0.80×", "nan", "torch note",
                     "instantiations timed: flash_mma[D=64], flash_mma[D=128]",
                     "error naive on fp32 D=64 S=2048 B=8 H=32: CompileError: NVRTC failed",
                     "8 kernel/case pairs skipped", "host overhead per hot call",
                     "4.20 s with an empty cache"):
        assert expected in text, expected


def test_case_line():
    report = synthetic_report()
    c = bench.grid_case(1024, 64, "bfloat16", False)
    rows = [r for r in report["results"] if bench.case_key(r) == bench.case_key(c.__dict__)]
    line = bench.case_line(c, rows)
    assert line.startswith("bf16 D=64 S=1024 B=16 H=32: flash_mma ") and line.endswith("TFLOPs")


def test_json_round_trip_and_report_command(tmp_path, capsys):
    report = synthetic_report()
    path = tmp_path / "out" / "bench.json"
    bench.write_json(report, path)
    assert json.loads(path.read_text()) == report
    assert bench.load_report(path) == report
    assert cli.main(["report", str(path)]) == 0
    assert "forward · bfloat16 · D=128" in capsys.readouterr().out

    other = tmp_path / "other.json"
    other.write_text("{}")
    assert cli.main(["report", str(other)]) == 1
    assert "not a cupy-attention bench report" in capsys.readouterr().out


def test_json_refuses_nan(tmp_path):
    report = synthetic_report()
    report["results"][0]["ms"] = float("nan")
    with pytest.raises(ValueError):
        bench.write_json(report, tmp_path / "bad.json")


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    paths = bench.write_plots(synthetic_report(), tmp_path)
    assert sorted(p.name for p in paths) == [
        "speedup-bf16-causal.png", "speedup-bf16-noncausal.png",
        "tflops-bf16-causal.png", "tflops-bf16-noncausal.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_without_matplotlib_say_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    text = render(bench.plot_or_say, synthetic_report(), tmp_path)
    assert "matplotlib is not importable" in text
    assert not list(tmp_path.iterdir())


def test_bench_subpackage_keeps_the_old_names_and_one_runner():
    """bench.py became the cupy_attention.bench subpackage: the names importers use
    stay importable from it, and Runner still has every method, now from its parts."""
    for name in ("_SPIN_SOURCE", "_git_commit", "cold_probe", "recording_specs", "run", "add_arguments", "finish_arguments", "Runner", "BenchError", "SHORT",
                 "system_info", "render_report", "plot_or_say", "load_report", "write_json"):
        assert hasattr(bench, name), name
    for method in ("time_calls", "extra_memory", "input_sets", "_torch_sdpa", "_torch_forward",
                   "overhead", "_overhead_row", "run_case", "_run_backward", "method"):
        assert callable(getattr(bench.Runner, method)), method
    assert bench.__doc__.startswith("Benchmark harness")
