"""The JIT layer without a GPU: NVRTC compilation, the content-keyed disk cache,
its environment variables, corruption and concurrency, and compile errors.

Every test compiles a tiny probe kernel placed in a private copy of kernels/ (so
editing a header here touches nothing real); the probe includes the shared
headers like every family does.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cupy_attention import jit
from cupy_attention.errors import CompileError

REAL_KERNELS = jit.kernels_dir()

PROBE = """\
#include "common/softmax.cuh"
template <class T>
__global__ void probe_kernel(const T* x, T* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = from_float<T>(fast_exp2(to_float(x[i])));
}
"""
SPEC = jit.KernelSpec("probe.cu", "probe_kernel<f16>", "probe[f16]")
SPEC_B = jit.KernelSpec("probe.cu", "probe_kernel<float>", "probe[f32]")


@pytest.fixture
def kdir(tmp_path, monkeypatch):
    """A private copy of kernels/ plus probe.cu, used by the jit module."""
    d = tmp_path / "kernels"
    shutil.copytree(REAL_KERNELS, d)
    (d / "probe.cu").write_text(PROBE)
    monkeypatch.setattr(jit, "kernels_dir", lambda: d)
    monkeypatch.setattr(jit, "_sources_digest", None)
    return d


@pytest.fixture
def compiles(monkeypatch):
    """Counts real NVRTC compilations done through jit.compile_spec."""
    calls = []
    real = jit.compile_spec

    def counting(spec, arch):
        calls.append((spec.name, arch))
        return real(spec, arch)

    monkeypatch.setattr(jit, "compile_spec", counting)
    return calls


def entries(d: Path):
    return sorted(p for p in d.glob("*.bin")) if d.is_dir() else []


def decode_file(path: Path, spec, arch):
    return jit._decode(path.read_bytes(), spec, arch, jit.cache_key(spec, arch))


def test_compile_spec_without_gpu(kdir):
    c = jit.compile_spec(SPEC, "sm_80")
    assert c.cubin[:4] == b"\x7fELF"
    assert "probe_kernel" in c.lowered_name and c.lowered_name.startswith("_Z")
    assert c.resources.registers > 0 and c.resources.spills == 0


def test_key_follows_every_header(kdir):
    k0 = jit.cache_key(SPEC, "sm_80")
    header = kdir / "common" / "types.cuh"
    original = header.read_text()
    header.write_text(original + "\n// an edit\n")
    jit.sources_digest(refresh=True)
    k1 = jit.cache_key(SPEC, "sm_80")
    assert k1 != k0
    (kdir / "common" / "new_block.cuh").write_text("#pragma once\n")
    jit.sources_digest(refresh=True)
    k2 = jit.cache_key(SPEC, "sm_80")
    assert k2 not in (k0, k1)
    (kdir / "common" / "new_block.cuh").unlink()
    header.write_text(original)
    os.utime(header, (time.time() + 100, time.time() + 100))    # mtime alone is no change
    jit.sources_digest(refresh=True)
    assert jit.cache_key(SPEC, "sm_80") == k0
    # Any kernel source counts, not only the one being compiled.
    (kdir / "naive.cu").write_text((kdir / "naive.cu").read_text() + "\n")
    jit.sources_digest(refresh=True)
    assert jit.cache_key(SPEC, "sm_80") != k0


def test_key_follows_arch_expr_compiler_and_version(kdir, monkeypatch):
    k = jit.cache_key(SPEC, "sm_80")
    assert jit.cache_key(SPEC, "sm_90a") != k
    assert jit.cache_key(SPEC, "sm_90") != jit.cache_key(SPEC, "sm_90a")
    assert jit.cache_key(SPEC_B, "sm_80") != k
    monkeypatch.setattr(jit, "nvrtc_version", lambda: (99, 1))
    k_nvrtc = jit.cache_key(SPEC, "sm_80")
    assert k_nvrtc != k
    monkeypatch.setattr(jit, "__version__", "999.0")
    assert jit.cache_key(SPEC, "sm_80") not in (k, k_nvrtc)


def test_edited_header_is_recompiled_not_loaded_stale(kdir, isolated_cache, compiles):
    jit.load_or_compile(SPEC, "sm_80")
    jit.load_or_compile(SPEC, "sm_80")
    assert len(compiles) == 1
    header = kdir / "common" / "softmax.cuh"
    header.write_text(header.read_text() + "\n// edited\n")
    jit.sources_digest(refresh=True)
    jit.load_or_compile(SPEC, "sm_80")
    assert len(compiles) == 2
    assert len(entries(isolated_cache)) == 2


def test_cache_dir_env_moves_the_cache(kdir, isolated_cache, compiles, tmp_path, monkeypatch):
    assert jit.cache_dir() == isolated_cache
    c1 = jit.load_or_compile(SPEC, "sm_80")
    files = entries(isolated_cache)
    assert len(files) == 1 and files[0] == jit.cache_path(SPEC, "sm_80")
    assert stat.S_IMODE(isolated_cache.stat().st_mode) & 0o077 == 0, "cache dir is user-only"
    c2 = jit.load_or_compile(SPEC, "sm_80")
    assert len(compiles) == 1 and c2.cubin == c1.cubin and c2.lowered_name == c1.lowered_name
    assert c2.resources == c1.resources
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(other))
    jit.load_or_compile(SPEC, "sm_80")
    assert len(compiles) == 2 and len(entries(other)) == 1
    assert jit.cache_size()[0] == 1 and jit.clear_cache() == 1 and not entries(other)


def test_no_cache_env_disables_the_disk_cache(kdir, isolated_cache, compiles, monkeypatch):
    monkeypatch.setenv("CUPY_ATTENTION_NO_CACHE", "1")
    jit.load_or_compile(SPEC, "sm_80")
    jit.load_or_compile(SPEC, "sm_80")
    assert len(compiles) == 2
    assert not isolated_cache.exists() or not any(isolated_cache.iterdir())


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "foreign"])
def test_corrupt_cache_file_is_recompiled_and_replaced(kdir, isolated_cache, compiles, damage):
    good = jit.load_or_compile(SPEC, "sm_80")
    path = jit.cache_path(SPEC, "sm_80")
    blob = path.read_bytes()
    if damage == "flip":
        i = len(blob) - 100                      # inside the cubin
        blob = blob[:i] + bytes([blob[i] ^ 0xFF]) + blob[i + 1:]
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "garbage":
        blob = os.urandom(len(blob))
    elif damage == "empty":
        blob = b""
    else:                                        # a valid entry of another kernel
        other = jit.compile_spec(SPEC_B, "sm_80")
        blob = jit._encode(other, jit.cache_key(SPEC_B, "sm_80"))
    path.write_bytes(blob)
    assert decode_file(path, SPEC, "sm_80") is None
    again = jit.load_or_compile(SPEC, "sm_80")
    assert len(compiles) == 2 + (damage == "foreign"), "the damaged file must not be loaded"
    assert again.cubin == good.cubin
    assert decode_file(path, SPEC, "sm_80") is not None, "the entry is rewritten valid"


CHILD = textwrap.dedent("""
    import hashlib, os, sys, time
    from pathlib import Path
    from cupy_attention import jit
    jit.kernels_dir = lambda: Path(sys.argv[1])
    go = Path(sys.argv[2])
    Path(sys.argv[3]).touch()          # ready
    while not go.exists():
        time.sleep(0.001)
    spec = jit.KernelSpec("probe.cu", "probe_kernel<bf16>", "probe[bf16]")
    c = jit.load_or_compile(spec, "sm_80")
    print(hashlib.sha256(c.cubin).hexdigest())
""")


def test_two_processes_compile_the_same_kernel_at_once(kdir, isolated_cache, tmp_path):
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(REAL_KERNELS.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(kdir), str(go), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in ready]
    deadline = time.time() + 120
    while not all(r.exists() for r in ready) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()               # both children imported: release them together
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    digests = {out.strip() for out, _ in results}
    assert len(digests) == 1
    files = list(isolated_cache.iterdir())
    assert [f.suffix for f in files] == [".bin"], f"exactly one entry, no temp files: {files}"
    spec = jit.KernelSpec("probe.cu", "probe_kernel<bf16>", "probe[bf16]")
    loaded = decode_file(files[0], spec, "sm_80")
    assert loaded is not None and __import__("hashlib").sha256(loaded.cubin).hexdigest() in digests


def test_dump_source(kdir, tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    monkeypatch.setenv("CUPY_ATTENTION_DUMP_SOURCE", str(dump))
    jit.compile_spec(SPEC, "sm_90a")
    cu = list(dump.glob("*.cu"))
    assert len(cu) == 1 and "probe" in cu[0].name and "sm_90a" in cu[0].name
    text = cu[0].read_text()
    assert PROBE in text and SPEC.expr in text and "-arch=sm_90a" in text
    assert list(dump.glob("*.log"))


def test_compile_error_carries_name_and_log(kdir, tmp_path, monkeypatch):
    bogus = jit.KernelSpec("probe.cu", "probe_kernel<NoSuchType>", "probe[bogus]")
    monkeypatch.setenv("CUPY_ATTENTION_DUMP_SOURCE", str(tmp_path / "dump"))
    with pytest.raises(CompileError) as info:
        jit.compile_spec(bogus, "sm_80")
    err = info.value
    assert err.spec_name == "probe[bogus]" and "probe[bogus]" in str(err)
    assert "NoSuchType" in err.log and "error" in err.log
    assert err.log in str(err)
    assert list((tmp_path / "dump").glob("*.log")), "failed compiles are dumped too"


def test_resources_parse_spills():
    log = ("ptxas info    : Used 96 registers, 24 bytes stack frame, 16 bytes spill stores, "
           "8 bytes spill loads\nptxas info    : Used 40 registers, 0 bytes spill stores, "
           "0 bytes spill loads, 1024 bytes smem")
    r = jit.parse_resources(log)
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_frame, r.static_smem) == (96, 16, 8, 24, 1024)
    assert r.spills == 24


def test_launch_config_mirrors_cuda_h():
    """The ctypes CUlaunchAttribute / CUlaunchConfig of the programmatic launches
    (jit.launch_packed(dependent=True)) have cuda.h's layout (CUDA 12 and 13: checked
    against /usr/local/cuda-13.0/include/cuda.h with gcc, 2026-11-27), and the one
    attribute is programmatic stream serialization (6) with the int value 1."""
    import ctypes
    import struct as st

    assert ctypes.sizeof(jit._LaunchAttribute) == 72
    assert jit._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(jit._LaunchConfig) == 56
    assert (jit._LaunchConfig.stream.offset, jit._LaunchConfig.attrs.offset,
            jit._LaunchConfig.num_attrs.offset) == (32, 40, 48)
    attr = jit._PROGRAMMATIC_SERIALIZATION
    raw = ctypes.string_at(ctypes.addressof(attr), ctypes.sizeof(attr))
    assert st.unpack_from("<i", raw, 0)[0] == 6 and st.unpack_from("<i", raw, 8)[0] == 1


def test_arch_cc():
    from cupy_attention.device import arch_cc

    assert [arch_cc(a) for a in ("sm_80", "sm_86", "sm_90a", "sm_100a", "sm_120")] == \
        [80, 86, 90, 100, 120]
