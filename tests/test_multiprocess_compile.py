"""Eight processes compile the same new instantiation into one empty cache at once:
each gets the same valid kernel, the cache ends with exactly one valid entry and no
temporary files, and a second wave of eight processes compiles nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time

from cupy_attention import jit

N = 8
PROBE = """\
template <class T>
__global__ void mp_probe(T* y, int n) { if (threadIdx.x < n) y[threadIdx.x] = T(2); }
"""
EXPR, NAME = "mp_probe<double>", "mp_probe[f64]"

CHILD = textwrap.dedent("""
    import hashlib, sys, time
    from pathlib import Path
    from cupy_attention import jit
    jit.kernels_dir = lambda: Path(sys.argv[1])
    go = Path(sys.argv[2])
    Path(sys.argv[3]).touch()
    while not go.exists():
        time.sleep(0.001)
    compiled = []
    real = jit.compile_spec
    jit.compile_spec = lambda s, a: compiled.append(1) or real(s, a)
    c = jit.load_or_compile(jit.KernelSpec("mp_probe.cu", sys.argv[4], sys.argv[5]), "sm_80")
    print(hashlib.sha256(c.cubin).hexdigest(), len(compiled))
""")


def _wave(kdir, tmp_path, tag):
    go = tmp_path / f"go-{tag}"
    env = dict(os.environ, PYTHONPATH=str(jit.kernels_dir().parent) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    ready = [tmp_path / f"ready-{tag}-{i}" for i in range(N)]
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(kdir), str(go), str(r), EXPR, NAME],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in ready]
    deadline = time.time() + 180
    while not all(r.exists() for r in ready) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()                                   # release all eight together
    results = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err
    return [tuple(out.split()) for out, _ in results]


def test_eight_processes_one_entry_no_temp_files(tmp_path, isolated_cache, monkeypatch):
    kdir = tmp_path / "kernels"
    shutil.copytree(jit.kernels_dir(), kdir)
    (kdir / "mp_probe.cu").write_text(PROBE)
    first = _wave(kdir, tmp_path, "a")
    assert len({d for d, _ in first}) == 1, "every process got the same kernel"
    files = sorted(isolated_cache.iterdir())
    assert len(files) == 1 and files[0].suffix == ".bin" and not files[0].name.startswith("."), files
    monkeypatch.setattr(jit, "kernels_dir", lambda: kdir)
    monkeypatch.setattr(jit, "_sources_digest", None)
    spec = jit.KernelSpec("mp_probe.cu", EXPR, NAME)
    assert files[0] == jit.cache_path(spec, "sm_80")
    got = jit._decode(files[0].read_bytes(), spec, "sm_80", jit.cache_key(spec, "sm_80"))
    assert got is not None and hashlib.sha256(got.cubin).hexdigest() == first[0][0]
    second = _wave(kdir, tmp_path, "b")
    assert all(n == "0" for _, n in second), "a warm cache compiles nothing"
    assert {d for d, _ in second} == {first[0][0]}
    assert sorted(isolated_cache.iterdir()) == files
