"""``cupy-attention tune`` and the tuned table (cupy_attention/tuning.py) on the CPU:
candidates per family, the persistence key and file, the decision rule, dispatch
through a tuned entry; the CLI's paths without a GPU. The GPU test at the end tunes
one small problem into a temporary cache and checks that ``auto`` then uses it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cupy_attention import bench, cli, device, dispatch, jit, tune, tuning
from cupy_attention.families import flash_mma, flash_wgmma
from cupy_attention.families.base import HOPPER_SMEM

from helpers import nvrtc_probe, static_asserts

ROOT = Path(__file__).resolve().parent.parent

no_gpu_only = pytest.mark.skipif(
    device.device_count() > 0, reason="checks the no-GPU behaviour; this machine has a GPU")

HEAD_DIMS = (1, 8, 32, 59, 64, 72, 80, 96, 112, 128, 160, 192, 224, 256)


def problem(d=128, causal=False, dtype="bfloat16", s=1024, hq=8, hkv=8, sq=None):
    return bench.Case("fwd", 2, hq, hkv, sq or s, s, d, dtype, causal).problem(0)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(d))
    monkeypatch.delenv("CUPY_ATTENTION_NO_CACHE", raising=False)
    tuning.reset()
    yield d
    tuning.reset()


# ---------------------------------------------------------------------------
# Candidates

@pytest.mark.parametrize("name", list(dispatch.FAMILIES))
def test_candidates_are_nonempty_valid_and_start_with_the_table(name):
    family = dispatch.FAMILIES[name]
    checked = 0
    for d in HEAD_DIMS:
        for dtype in family.dtypes:
            for causal in (False, True):
                sq = 1 if name == "decode" else None
                p = problem(d, causal, dtype, hkv=2 if name == "decode" else 8, sq=sq)
                if family.check(p, 90) is not None:
                    continue
                for smem in (HOPPER_SMEM, 163 * 1024, 99 * 1024):
                    cands = family.candidates(p, smem)
                    assert cands, (name, d, dtype, causal, smem)
                    assert cands[0] == family.table_config(p, smem)
                    assert len(set(cands)) == len(cands)
                    assert all(isinstance(c, tuple) and all(type(x) is int for x in c)
                               for c in cands)
                    checked += 1
                    if name == "flash_wgmma":
                        assert all(flash_wgmma.config_fits(d, c) for c in cands[1:])
                        assert len(cands) <= flash_wgmma.MAX_CANDIDATES
                    if name == "flash_mma":
                        assert all(flash_mma.config_fits(d, c, False, smem) for c in cands[1:])
                        assert len(cands) <= flash_mma.MAX_CANDIDATES
                    if name == "flash":
                        from cupy_attention.families.flash import Config
                        assert all(Config(d, *c).smem <= min(smem, 163 * 1024) for c in cands)
    assert checked


def test_tensor_core_families_have_something_to_tune():
    for name, d in (("flash_wgmma", 128), ("flash_mma", 64), ("flash_mma", 256), ("flash", 64)):
        assert len(dispatch.FAMILIES[name].candidates(problem(d))) > 1, name
    for name in ("tiled", "naive"):
        assert len(dispatch.FAMILIES[name].candidates(problem(64))) == 1


def test_wgmma_candidates_respect_shared_memory_and_registers():
    for d in range(64, 257, 8):
        for cfg in flash_wgmma.candidates(d, False) + flash_wgmma.candidates(d, True):
            assert flash_wgmma.smem_bytes(d, cfg) <= flash_wgmma.SMEM_LIMIT
            consumers, bn, _, _ = cfg
            assert bn % 16 == 0 and consumers in (2, 3)


def test_mma_dense_mask_candidates_use_16_row_warps():
    p = bench.Case("fwd", 1, 4, 4, 256, 256, 128, "float16", False).problem(0)
    p = type(p)(**{**p.__dict__, "mask_kind": "bool"})
    for cfg in dispatch.FAMILIES["flash_mma"].candidates(p)[1:]:
        assert cfg[0] // cfg[2] == 16


# ---------------------------------------------------------------------------
# Keys and files

def test_mma_stage_counts_and_their_fallbacks():
    """flash_mma's table takes three stages at D_PAD = 192 (Hopper-sized shared memory);
    where they do not fit (A100: 163 KB) the same tile with two stages, not the small
    fallbacks; 99 KB devices the small ones."""
    assert flash_mma.tiles_for(192) == (128, 64, 8, 3) == flash_mma.tiles_for(184)
    assert flash_mma.tiles_for(176) == (128, 64, 8, 2) == flash_mma.tiles_for(208)
    assert flash_mma.tiles_for(192, smem_limit=163 * 1024) == (128, 64, 8, 2)
    assert flash_mma.tiles_for(192, smem_limit=99 * 1024) in flash_mma.SMALL_SMEM_TILES
    # D_PAD = 256: one stage (96 KB: two blocks an SM on Hopper, one on 99 KB devices)
    assert flash_mma.tiles_for(256) == (64, 64, 4, 1) == flash_mma.tiles_for(256, smem_limit=99 * 1024)
    assert flash_mma.tiles_for(240) == (128, 64, 8, 2)
    assert flash_mma.config_fits(256, (64, 64, 4, 1))


def mma_smem_probe(lie: bool = False) -> str:
    """static_asserts that MmaTraits::SMEM_BYTES (what flash_mma addresses: rows
    padded, or swizzled at D_PAD = 256) is the host's _smem (what the launch
    asks for) at every padded head dim and every table, fallback and candidate tile."""
    cfgs = {c for row in flash_mma.TILES for c in row[1:4]}
    cfgs |= set(flash_mma.CANDIDATE_POOL) | set(flash_mma.SMALL_SMEM_TILES)
    checks = []
    for d_pad in range(16, 257, 16):
        for bm, bn, warps, stages in sorted(cfgs):
            smem = flash_mma._smem(d_pad, (bm, bn, warps, stages)) + (16 if lie else 0)
            traits = f"MmaTraits<{d_pad}, {bm}, {bn}, {warps}, {stages}, bf16, true>"
            checks.append((f"{traits}::SMEM_BYTES == {smem}",
                           f"SMEM_BYTES D_PAD={d_pad} {bm}x{bn} w{warps} s{stages}"))
            if lie:
                break
    return static_asserts("flash_mma.cu", checks)


def test_mma_host_shared_memory_matches_the_kernel():
    ok, log = nvrtc_probe(mma_smem_probe(), jit.options_for("sm_80"))
    assert ok, f"flash_mma.py's _smem and MmaTraits::SMEM_BYTES disagree:\n{log}"
    ok, log = nvrtc_probe(mma_smem_probe(lie=True), jit.options_for("sm_80"))
    assert not ok and "SMEM_BYTES D_PAD=16" in log, log


def test_problem_key_buckets_lengths_and_names_the_variant():
    k = tuning.problem_key("flash_wgmma", problem(128, True, s=3000))
    assert k == "flash_wgmma|bfloat16|D=128|causal|Sq<=4096|Sk<=4096"
    assert tuning.problem_key("flash_wgmma", problem(128, True, s=4096)) == k
    assert tuning.problem_key("flash_wgmma", problem(128, True, s=4097)) != k
    assert tuning.problem_key("flash_mma", problem(64)).split("|")[3] == "plain"
    assert [tuning.bucket(n) for n in (0, 1, 2, 3, 1024, 1025)] == [1, 1, 2, 4, 1024, 2048]


def test_persist_key_and_path(cache):
    a = tuning.persist_key("NVIDIA H100 80GB HBM3", "580.159.04", "12.9")
    assert a == {"device": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "nvrtc": "12.9",
                 "version": tuning.__version__}
    path = tuning.table_path(a)
    assert path.parent == cache and path.name.startswith("tuning-") and path.suffix == ".json"
    for other in (tuning.persist_key("NVIDIA H200", "580.159.04", "12.9"),
                  tuning.persist_key("NVIDIA H100 80GB HBM3", "575.51.03", "12.9"),
                  tuning.persist_key("NVIDIA H100 80GB HBM3", "580.159.04", "13.0"),
                  tuning.persist_key("NVIDIA H100 80GB HBM3", "580.159.04", "12.9", "0.2.0")):
        assert tuning.table_path(other) != path


def test_driver_version_text():
    text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
            "(dvs-builder@U22)  Thu Jan  1 2026\nGCC version:  gcc version 12.3.0\n")
    assert tuning.parse_driver_version(text) == "580.159.04"
    assert tuning.parse_driver_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024") == "550.54.15"
    assert tuning.parse_driver_version("nothing here") is None


KEY = tuning.persist_key("NVIDIA H100 80GB HBM3", "580.159.04", "12.9")


def entry(cfg, source="tuned"):
    return {"family": "flash_wgmma", "config": list(cfg), "table": [3, 64, 1, 3],
            "source": source, "ms": 1.0, "table_ms": 1.1}


def test_save_is_atomic_merges_and_reloads(cache):
    k1 = tuning.problem_key("flash_wgmma", problem(128))
    k2 = tuning.problem_key("flash_wgmma", problem(128, True))
    path = tuning.save(KEY, {k1: entry((2, 128, 1, 2))})
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    tuning.save(KEY, {k2: entry((3, 64, 1, 3), "table")})
    data = tuning.read_table(path, KEY)
    assert set(data["entries"]) == {k1, k2} and data["schema"] == tuning.SCHEMA
    assert data["entries"][k1]["config"] == [2, 128, 1, 2]
    assert tuning.read_table(path, tuning.persist_key("other", "1", "1")) is None
    assert tuning.tuning_files() == [path]
    assert tuning.clear() == 1 and tuning.tuning_files() == []


def test_a_crash_mid_write_keeps_the_old_file(cache, monkeypatch):
    k1 = tuning.problem_key("flash_wgmma", problem(128))
    path = tuning.save(KEY, {k1: entry((2, 128, 1, 2))})
    before = path.read_bytes()

    def boom(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        tuning.save(KEY, {k1: entry((3, 80, 1, 3))})
    assert path.read_bytes() == before
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_untrusted_directory_is_neither_written_nor_read(cache):
    k1 = tuning.problem_key("flash_wgmma", problem(128))
    path = tuning.save(KEY, {k1: entry((2, 128, 1, 2))})
    cache.chmod(0o777)
    try:
        with pytest.raises(tuning.TuningError, match="writable by group or others"):
            tuning.save(KEY, {k1: entry((3, 80, 1, 3))})
    finally:
        cache.chmod(0o700)
    path.chmod(0o666)  # a file others could rewrite is not read
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        assert tuning.read_table(path, KEY) is None


def test_no_cache_refuses_to_save(cache, monkeypatch):
    monkeypatch.setenv("CUPY_ATTENTION_NO_CACHE", "1")
    with pytest.raises(tuning.TuningError, match="CUPY_ATTENTION_NO_CACHE"):
        tuning.save(KEY, {})


def test_lookup_reads_the_file_once_per_device(cache, monkeypatch):
    p = problem(128)
    k1 = tuning.problem_key("flash_wgmma", p)
    tuning.save(KEY, {k1: entry((2, 128, 1, 2)), "junk": {"config": "x"}})
    calls = []

    def key(device_id):
        calls.append(device_id)
        return KEY

    monkeypatch.setattr(tuning, "current_key", key)
    assert tuning.lookup("flash_wgmma", p, 0) == (2, 128, 1, 2)
    assert tuning.lookup("flash_wgmma", p, 0) == (2, 128, 1, 2)
    assert tuning.lookup("flash_mma", p, 0) is None
    assert calls == [0]
    assert "junk" not in tuning._TABLES[0]


# ---------------------------------------------------------------------------
# The decision rule

def timing(ms, rounds, spread=None):
    if spread is None:
        spread = 100 * abs(rounds[0] - rounds[1]) / min(rounds)
    return {"ms": ms, "ms_rounds": rounds, "spread_pct": spread}


def test_decide_never_takes_a_slower_or_noisy_winner():
    table = timing(1.00, [1.00, 1.01])
    assert tuning.decide(table, timing(0.90, [0.90, 0.901]))[0]                # 11% and clear
    assert not tuning.decide(table, timing(1.05, [1.05, 1.05]))[0]             # slower
    assert not tuning.decide(table, timing(0.98, [0.98, 0.98]))[0]             # 2% < 3%
    assert not tuning.decide(table, timing(0.95, [0.90, 1.005]))[0]            # rounds overlap
    assert not tuning.decide(timing(1.0, [0.9, 1.1], 22.0), timing(0.85, [0.85, 0.85]))[0]
    ok, why = tuning.decide(table, timing(0.96, [0.96, 0.96]), min_gain=0.05)
    assert not ok and "5%" in why
    assert tuning.decide(table, timing(0.96, [0.96, 0.96]), min_gain=0.0)[0]
    assert not tuning.decide(timing(0.0, [0, 0], 0), timing(0.5, [0.5, 0.5]))[0]


def test_choose_keeps_the_table_unless_decide_agrees():
    rows = [{"config": [3, 64, 1, 3], "table": True, **timing(1.0, [1.0, 1.0])},
            {"config": [3, 80, 1, 3], "table": False, **timing(0.99, [0.99, 0.99])},
            {"config": [2, 128, 1, 2], "table": False, "error": "CompileError: x"}]
    kept, why = tune.choose(rows, 0.03)
    assert kept is rows[0] and "3,80,1,3" in why
    rows[1].update(timing(0.8, [0.8, 0.8]))
    assert tune.choose(rows, 0.03)[0] is rows[1]
    rows[1]["error"] = "max error: rejected"
    assert tune.choose(rows, 0.03)[0] is rows[0]
    with pytest.raises(ValueError):
        tune.choose([{"config": [1], "table": True, "error": "boom"}], 0.03)


# ---------------------------------------------------------------------------
# Dispatch through a tuned entry

def test_auto_uses_a_tuned_entry_when_present(monkeypatch):
    p = problem(128, s=4096)
    family = dispatch.choose(p, "auto", 90)
    assert family.name == "flash_wgmma"
    table = family.table_config(p)
    tuned = next(c for c in family.candidates(p) if c != table)
    monkeypatch.setattr(tuning, "_TABLES", {0: {}})
    assert family.config_for(p, 0) == table
    monkeypatch.setattr(tuning, "_TABLES", {0: {tuning.problem_key(family.name, p): tuned}})
    assert family.config_for(p, 0) == tuned
    # the plan a launch builds names the tuned tiles
    plan = flash_wgmma._plan(p.head_dim, p.dtype, p.variant, family.config_for(p, 0))
    assert f"BN={tuned[1]}" in plan[0].name and plan[1] == 64 * tuned[0]
    # other lengths, dtypes and variants keep the table
    for other in (problem(128, s=8192), problem(128, True, s=4096),
                  problem(128, dtype="float16", s=4096)):
        assert family.config_for(other, 0) == family.table_config(other)
    # an entry that is not a candidate (hand edit, old file) is ignored
    monkeypatch.setattr(tuning, "_TABLES", {0: {tuning.problem_key(family.name, p): (1, 16, 4, 9)}})
    assert family.config_for(p, 0) == table


def test_flash_mma_fallback_of_wgmma_reads_flash_mma_entries(monkeypatch):
    p = problem(128, s=4096)
    mma = dispatch.FAMILIES["flash_mma"]
    tuned = mma.candidates(p)[1]
    monkeypatch.setattr(tuning, "_TABLES", {0: {tuning.problem_key("flash_mma", p): tuned}})
    monkeypatch.setattr(device, "max_shared_per_block", lambda dev: HOPPER_SMEM)
    for family in (mma, dispatch.FAMILIES["flash_wgmma"]):
        spec_ = family.planner(p, 0)(True)[0]
        assert f"BM={tuned[0]},BN={tuned[1]},W={tuned[2]},ST={tuned[3]}" in spec_.name


def test_forced_config_wins_while_active(monkeypatch):
    p = problem(128)
    family = dispatch.FAMILIES["flash_wgmma"]
    monkeypatch.setattr(tuning, "_TABLES", {0: {}})
    cand = family.candidates(p)[2]
    with tuning.forced("flash_wgmma", cand):
        assert family.config_for(p, 0) == cand
        assert dispatch.FAMILIES["flash_mma"].config_for(p, 0) == \
            dispatch.FAMILIES["flash_mma"].table_config(p)
    assert family.config_for(p, 0) == family.table_config(p)


# ---------------------------------------------------------------------------
# The command without a GPU

def test_arguments():
    args = cli.parse_args(["tune", "--preset", "llama"])
    cases = tune.build_cases(args)
    assert args.causal == "on" and all(c.causal for c in cases)
    assert {(c.heads_q, c.heads_kv, c.head_dim) for c in cases} == set(tune.PRESETS["llama"])
    assert {c.seqlen_q for c in cases} == set(tune.PRESET_SEQLENS)
    assert all(c.batch * c.seqlen_q == tune.TOKENS for c in cases)
    args = cli.parse_args(["tune", "--shape", "2,32,8,1k,2k,128", "--shape", "1,8,8,512,512,64",
                           "--causal", "both", "--dtype", "bf16,fp16"])
    cases = tune.build_cases(args)
    assert len(cases) == 8
    assert cases[0] == bench.Case("fwd", 2, 32, 8, 1024, 2048, 128, "bfloat16", False)
    assert cli.parse_args(["tune", "--shape", "1,8,8,64,64,64"]).causal == "off"
    assert cli.parse_args(["tune", "--shape", "1,8,8,64,64,64", "--causal"]).causal == "on"


@pytest.mark.parametrize("argv,message", [
    (["tune"], "give --shape"),
    (["tune", "--shape", "1,8,8,64,64,64", "--preset", "llama"], "give --shape"),
    (["tune", "--shape", "1,8,8,64,64"], "six integers"),
    (["tune", "--shape", "1,8,3,64,64,64"], "multiple of Hkv"),
    (["tune", "--preset", "nope"], "invalid choice"),
    (["tune", "--show", "--clear"], "choose one"),
    (["tune", "--show", "--preset", "llama"], "take no problems"),
    (["tune", "--preset", "llama", "--reps", "3"], "--reps"),
    (["tune", "--preset", "llama", "--kernels", "nope"], "unknown kernel family"),
    (["tune", "--preset", "llama", "--min-gain", "-1"], "--min-gain"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_list_show_clear_need_no_gpu(cache, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    assert cli.main(["tune", "--shape", "2,16,4,1k,1k,128", "--list"]) == 0
    out = capsys.readouterr().out
    assert "flash_wgmma" in out and "(3,64,1,3)" in out
    assert cli.main(["tune", "--show"]) == 0
    assert "no tuned tables" in capsys.readouterr().out
    tuning.save(KEY, {tuning.problem_key("flash_wgmma", problem(128)): entry((2, 128, 1, 2))})
    assert cli.main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3" in out and "2,128,1,2" in out
    assert cli.main(["tune", "--clear"]) == 0
    assert "removed 1 tuned table" in capsys.readouterr().out
    assert tuning.tuning_files() == []


@no_gpu_only
def test_tune_without_gpu_is_one_clear_error(capsys):
    assert cli.main(["tune", "--shape", "1,8,8,1k,1k,64"]) == 1
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "Traceback" not in out


# ---------------------------------------------------------------------------
# GPU: tune one small problem end to end, then auto uses the entry

PROBE = r"""
import json, sys
import cupy
import cupy_attention as ca
from cupy_attention import bench, tuning
from cupy_attention.families import flash_mma
q = bench.cupy_randn(cupy, (1, 8, 1024, 32), "bfloat16")
k = bench.cupy_randn(cupy, (1, 8, 1024, 32), "bfloat16")
v = bench.cupy_randn(cupy, (1, 8, 1024, 32), "bfloat16")
with bench.recording_specs() as specs:
    out = ca.attention(q, k, v, causal=True)
    cupy.cuda.Device().synchronize()
p = bench.Case("fwd", 1, 8, 8, 1024, 1024, 32, "bfloat16", True).problem(0)
print(json.dumps({"specs": specs, "key": tuning.problem_key("flash_mma", p),
                  "looked_up": list(tuning.lookup("flash_mma", p, 0) or ()),
                  "finite": bool(cupy.isfinite(out.astype(cupy.float32)).all())}))
"""


@pytest.mark.gpu
def test_gpu_tune_then_auto_uses_the_entry(tmp_path, device_cc):
    if device_cc < 80:
        pytest.skip("flash_mma needs compute capability 8.0+")
    env = dict(os.environ, CUPY_ATTENTION_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    env.pop("CUPY_ATTENTION_NO_CACHE", None)
    # D = 32: flash_mma is what auto picks on every sm_80+ GPU (flash_wgmma starts at 64)
    res = subprocess.run([sys.executable, "-m", "cupy_attention.cli", "tune", "--shape",
                          "1,8,8,1k,1k,32", "--causal", "--reps", "20",
                          "--json", str(tmp_path / "tune.json")],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "tune.json").read_text())
    (result,) = report["results"]
    assert result["family"] == "flash_mma"
    rows = result["rows"]
    assert rows[0]["table"] and len(rows) > 1
    timed = [r for r in rows if "ms" in r]
    assert rows[0] in timed and len(timed) >= 2
    # each candidate ran its own instantiation
    names = [r["specs"][0] for r in timed]
    assert len(set(names)) == len(names)
    (key, kept), = report["entries"].items()
    if kept["source"] == "tuned":
        assert kept["ms"] < kept["table_ms"] * (1 - tuning.MIN_GAIN)
    files = list((tmp_path / "cache").glob("tuning-*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["entries"][key]["config"] == kept["config"]
    # a fresh process: auto reads the tuned table lazily and launches the kept config
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    probe = json.loads(res.stdout.strip().splitlines()[-1])
    assert probe["key"] == key and probe["looked_up"] == kept["config"] and probe["finite"]
    bm, bn, warps, stages = kept["config"]
    assert any(f"BM={bm},BN={bn},W={warps},ST={stages}" in s for s in probe["specs"]), probe
    # and show lists it
    res = subprocess.run([sys.executable, "-m", "cupy_attention.cli", "tune", "--show"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and key.split("|")[0] in res.stdout
