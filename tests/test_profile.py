"""``cupy-attention profile`` on the CPU: parsing ncu's CSV, the summary, the roofline,
rendering and the chart, the ncu command line, and the typed errors without a GPU or
without ncu.

SAMPLE_CSV below is SYNTHETIC: written by hand in the layout of ``ncu --csv
--print-units base`` (details page: one row per launch and metric; ``==PROF==``
lines and the target's output before the header; thousands separators in values).
Its numbers are made up to give round results, not measured on any GPU."""

from __future__ import annotations

import io
import math
import sys

import pytest
from rich.console import Console

from cupy_attention import cli, device, profile

no_gpu_only = pytest.mark.skipif(
    device.device_count() > 0, reason="checks the no-GPU behaviour; this machine has a GPU")

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')
KERNEL = "void flash_wgmma_fwd<WgmmaTraits<128, 3, 64, __nv_bfloat16, 1, 3>, Variant<>>(FwdParams)"


def rows(lid: int, kernel: str, values: dict) -> list[str]:
    out = []
    for metric, (unit, value) in values.items():
        out.append(f'"{lid}","4242","python3","host","{kernel}","1","7","(512, 1, 1)",'
                   f'"(132, 1, 1)","0","9.0","Command line profiler metrics","{metric}",'
                   f'"{unit}","{value}"')
    return out


def launch_values(time_ns="1,000,000", read="2,000,000,000", write="1,000,000,000"):
    return {
        profile.DRAM_READ: ("byte", read),
        profile.DRAM_WRITE: ("byte", write),
        profile.DRAM_RATE: ("byte/second", "3,000,000,000,000"),
        profile.TIME: ("nsecond", time_ns),
        profile.TENSOR: ("%", "80.00"),
        profile.TENSOR_GMMA: ("%", "78.50"),
    }


SAMPLE_CSV = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    "==PROF== Profiling \"flash_wgmma_fwd\": 0%....50%....100% - 3 passes",
    "==PROF== Profiling \"flash_wgmma_fwd\": 0%....50%....100% - 3 passes",
    "some line the target printed",
    "==PROF== Disconnected from process 4242",
    HEADER,
    *rows(0, KERNEL, launch_values()),
    *rows(1, KERNEL, launch_values(time_ns="3,000,000")),
]) + "\n"

FLOPS = 4.0 * 4 * 16 * 4096 * 4096 * 128   # 549.8 GFLOP per call


def test_parse_csv_sample():
    launches = profile.parse_csv(SAMPLE_CSV)
    assert [x.id for x in launches] == [0, 1]
    assert launches[0].kernel == KERNEL
    m = launches[0].metrics
    assert m[profile.TIME] == pytest.approx(1e-3)          # ns -> s
    assert m[profile.DRAM_READ] == 2e9 and m[profile.DRAM_WRITE] == 1e9
    assert m[profile.DRAM_RATE] == 3e12
    assert m[profile.TENSOR] == 80.0 and m[profile.TENSOR_GMMA] == 78.5
    assert launches[1].metrics[profile.TIME] == pytest.approx(3e-3)


def test_parse_csv_rejects_output_without_a_table():
    with pytest.raises(ValueError, match="no CSV header"):
        profile.parse_csv("==PROF== Connected\n==ERROR== something\n")
    with pytest.raises(ValueError, match="lacks the column"):
        profile.parse_csv('"ID","Kernel Name","Metric Name"\n"0","k","m"\n')


@pytest.mark.parametrize("value,unit,base", [
    ("1,234.5", "nsecond", 1.2345e-6), ("2", "usecond", 2e-6), ("3", "msecond", 3e-3),
    ("1.5", "Gbyte", 1.5e9), ("2", "Tbyte/second", 2e12), ("7", "Kbyte/s", 7e3),
    ("42", "%", 42.0), ("17", "cycle", 17.0), ("n/a", "byte", None), ("", "", None),
])
def test_units(value, unit, base):
    got = profile.to_base(value, unit)
    assert got == (None if base is None else pytest.approx(base))


def test_summary_and_roofline_math():
    s = profile.summarize(profile.parse_csv(SAMPLE_CSV), repeats=2, flops=FLOPS)
    assert s["time_s"] == pytest.approx(2e-3)                       # (1 + 3) ms / 2 calls
    assert s["dram_bytes"] == pytest.approx(3e9)                    # (3 + 3) GB / 2
    assert s["dram_bps"] == pytest.approx(1.5e12)
    assert s["flops_per_s"] == pytest.approx(FLOPS / 2e-3)
    assert s["intensity"] == pytest.approx(FLOPS / 3e9)
    assert s["tensor_pct"] == pytest.approx(80.0)
    assert s["tensor_gmma_pct"] == pytest.approx(78.5)
    assert s["kernels"] == [{"kernel": KERNEL, "launches": 2, "time_s": pytest.approx(4e-3)}]

    peak = profile.device_peak("NVIDIA H100 80GB HBM3", "bfloat16")
    assert peak == profile.Peak("H100 SXM", 989e12, 3.35e12)
    r = profile.roofline(s, peak)
    assert r["ridge"] == pytest.approx(989e12 / 3.35e12)
    ai = FLOPS / 3e9                                                 # 183 FLOP/B: below the ridge
    assert r["bound"] == "memory" and ai < r["ridge"]
    assert r["attainable_flops"] == pytest.approx(ai * 3.35e12)
    assert r["pct_of_roof"] == pytest.approx(100 * s["flops_per_s"] / (ai * 3.35e12))
    assert r["flops_pct_of_peak"] == pytest.approx(100 * s["flops_per_s"] / 989e12)
    assert r["dram_pct_of_peak"] == pytest.approx(100 * 1.5e12 / 3.35e12)
    # compute-bound when the traffic is small
    s2 = dict(s, intensity=1000.0)
    r2 = profile.roofline(s2, peak)
    assert r2["bound"] == "compute" and r2["attainable_flops"] == 989e12
    assert profile.roofline(s, None) == {}


def test_summary_without_byte_counts_uses_the_rate():
    launches = profile.parse_csv(SAMPLE_CSV)
    for x in launches:
        x.metrics[profile.DRAM_READ] = None
    s = profile.summarize(launches, repeats=1, flops=FLOPS)
    assert s["dram_bytes"] == pytest.approx(3e12 * 4e-3)
    with pytest.raises(ValueError):
        profile.summarize([], 1, FLOPS)


@pytest.mark.parametrize("name,dtype,label,flops,bw", [
    ("NVIDIA H100 80GB HBM3", "float16", "H100 SXM", 989e12, 3.35e12),
    ("NVIDIA H100 PCIe", "bfloat16", "H100 PCIe", 756e12, 2.0e12),
    ("NVIDIA H200", "bfloat16", "H200 SXM", 989e12, 4.8e12),
    ("NVIDIA H200 NVL", "bfloat16", "H200 NVL", 835e12, 4.8e12),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", "A100 SXM 80GB", 312e12, 2.039e12),
    ("NVIDIA A100-SXM4-40GB", "float16", "A100 40GB", 312e12, 1.555e12),
    ("NVIDIA A100-SXM4-80GB", "float32", "A100 SXM 80GB", 19.5e12, 2.039e12),
])
def test_device_table(name, dtype, label, flops, bw):
    assert profile.device_peak(name, dtype) == profile.Peak(label, flops, bw)


def test_unknown_device_has_no_roofline():
    assert profile.device_peak("NVIDIA GeForce GT 710", "float16") is None


def report(peak=True):
    s = profile.summarize(profile.parse_csv(SAMPLE_CSV), 2, FLOPS)
    name = "NVIDIA H100 80GB HBM3" if peak else "Some GPU"
    return {"problem": "bf16 D=128 S=4096 B=4 H=16", "device": name, "summary": s,
            "roofline": profile.roofline(s, profile.device_peak(name, "bfloat16"))}


def test_render():
    buf = io.StringIO()
    profile.render(report(), Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    for text in ("achieved TFLOP/s", "274.9", "989", "DRAM throughput", "1.500", "3.35",
                 "memory-bound", "tensor pipes active", "80.0", "wgmma", "flash_wgmma_fwd"):
        assert text in out, text
    buf = io.StringIO()
    profile.render(report(peak=False), Console(file=buf, width=200, color_system=None))
    assert "not in the roofline table" in buf.getvalue()


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = profile.write_plot(report(), tmp_path / "roof.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        profile.write_plot(report(peak=False), tmp_path / "none.png")


def test_plot_without_matplotlib_raises_module_not_found(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError):
        profile.write_plot(report(), tmp_path / "roof.png")


def test_metrics_per_arch():
    assert profile.TENSOR_GMMA in profile.metrics_for(90)
    assert profile.TENSOR_HMMA in profile.metrics_for(80)
    assert profile.metrics_for(None) == profile.BASE_METRICS
    for m in profile.BASE_METRICS:
        assert m in profile.metrics_for(90)


def test_ncu_command():
    args = cli.parse_args(["profile", "--shape", "2,32,8,1k,1k,128", "--causal", "--repeats", "5"])
    cmd = profile.ncu_command("/usr/local/cuda/bin/ncu", args, 90)
    assert cmd[0] == "/usr/local/cuda/bin/ncu"
    for flag in ("--csv", "--profile-from-start", "--print-units", "--clock-control"):
        assert flag in cmd
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert profile.TIME in metrics and profile.TENSOR_GMMA in metrics
    tail = cmd[cmd.index("cupy_attention.profile_target") + 1:]
    assert tail == ["--shape", "2,32,8,1024,1024,128", "--dtype", "bfloat16", "--kernel", "auto",
                    "--repeats", "5", "--causal"]
    args = cli.parse_args(["profile", "--shape", "1,8,8,64,64,64", "--locked-clocks"])
    assert "--clock-control" not in profile.ncu_command("ncu", args, 80)


def test_target_parses_what_the_command_passes():
    from cupy_attention import profile_target

    args = profile_target.parse(["--shape", "2,32,8,1024,1024,128", "--dtype", "bfloat16",
                                 "--kernel", "auto", "--repeats", "5", "--causal"])
    assert args.shape == (2, 32, 8, 1024, 1024, 128) and args.causal == "on"
    assert args.dtypes == ("bfloat16",) and args.repeats == 5


def test_explain_failure():
    err = profile.explain_failure(1, "==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                                     "permission to access NVIDIA GPU Performance Counters")
    assert isinstance(err, profile.NcuPermissionError) and err.exit_code == 4
    err = profile.explain_failure(9, "==ERROR== Failed to find metric foo\n")
    assert type(err) is profile.ProfileError and "Failed to find metric" in str(err)
    assert err.exit_code == 1


def test_find_ncu_missing(monkeypatch):
    monkeypatch.setattr(profile.shutil, "which", lambda name: None)
    with pytest.raises(profile.NcuNotFoundError, match="not on PATH") as exc:
        profile.find_ncu()
    assert exc.value.exit_code == 3
    with pytest.raises(profile.NcuNotFoundError, match="not at /nowhere/ncu"):
        profile.find_ncu("/nowhere/ncu")


@pytest.mark.parametrize("argv,message", [
    (["profile"], "needs --shape"),
    (["profile", "--shape", "1,8,8,64,64,64", "--shape", "1,8,8,64,64,64"], None),
    (["profile", "--shape", "1,8,8,64,64,64", "--repeats", "0"], "--repeats"),
    (["profile", "--shape", "1,8,8,64,64,64", "--dtype", "bf16,fp16"], "one --dtype"),
    (["profile", "--shape", "1,8,8,64,64,64", "--causal", "both"], "one problem"),
])
def test_bad_arguments(argv, message, capsys):
    if message is None:  # the last --shape wins, as argparse's "store" does
        assert cli.parse_args(argv).shape == (1, 8, 8, 64, 64, 64)
        return
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@no_gpu_only
def test_profile_without_gpu_is_one_clear_error(capsys):
    assert cli.main(["profile", "--shape", "1,8,8,1k,1k,64"]) == 1
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "Traceback" not in out


def test_profile_without_ncu_is_a_typed_error_with_its_exit_code(capsys, monkeypatch):
    monkeypatch.setattr(device, "require_device", lambda: None)
    monkeypatch.setattr(profile.shutil, "which", lambda name: None)
    assert cli.main(["profile", "--shape", "1,8,8,1k,1k,64"]) == 3
    out = capsys.readouterr().out
    assert "NcuNotFoundError" in out and "ncu is not on PATH" in out and "Traceback" not in out


def test_profile_runs_ncu_and_renders(capsys, monkeypatch, tmp_path):
    """The whole command with ncu and the device faked: the CSV above comes back."""
    monkeypatch.setattr(device, "require_device", lambda: None)
    monkeypatch.setattr(device, "compute_capability", lambda dev: 90)
    monkeypatch.setattr(device, "device_name", lambda dev: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(profile.shutil, "which", lambda name: "/opt/ncu")
    seen = {}

    class Done:
        returncode = 0
        stdout = SAMPLE_CSV
        stderr = ""

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return Done()

    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    monkeypatch.setenv("COLUMNS", "200")
    out_json = tmp_path / "p.json"
    assert cli.main(["profile", "--shape", "4,16,16,4k,4k,128", "--repeats", "2",
                     "--json", str(out_json)]) == 0
    assert seen["cmd"][0] == "/opt/ncu"
    out = capsys.readouterr().out
    assert "achieved TFLOP/s" in out and "H100" in out
    import json

    data = json.loads(out_json.read_text())
    assert data["schema"] == profile.SCHEMA
    assert math.isclose(data["summary"]["time_s"], 2e-3)
    assert data["roofline"]["bound"] == "memory"

    class Failed(Done):
        returncode = 1
        stdout = "==PROF== Connected\n"
        stderr = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"

    monkeypatch.setattr(profile.subprocess, "run", lambda cmd, **kw: Failed())
    assert cli.main(["profile", "--shape", "4,16,16,4k,4k,128"]) == 4
    assert "NcuPermissionError" in capsys.readouterr().out
