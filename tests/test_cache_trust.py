"""Cache trust: a cubin is code, so the disk cache is used only when no one else can
have written it. Untrusted directories and entries produce one warning and an
in-memory compile; nothing is read from or written to them."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest

from cupy_attention import jit

PROBE = """\
template <class T>
__global__ void probe_kernel(T* y) { y[threadIdx.x] = T(1); }
"""
SPEC = jit.KernelSpec("probe.cu", "probe_kernel<float>", "probe[f32]")
SPEC_B = jit.KernelSpec("probe.cu", "probe_kernel<int>", "probe[i32]")
ARCH = "sm_80"

posix_only = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership model")


@pytest.fixture
def kdir(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    shutil.copytree(jit.kernels_dir(), d)
    (d / "probe.cu").write_text(PROBE)
    monkeypatch.setattr(jit, "kernels_dir", lambda: d)
    monkeypatch.setattr(jit, "_sources_digest", None)
    monkeypatch.setattr(jit, "_warned", set())
    return d


@pytest.fixture
def compiles(monkeypatch):
    calls = []
    real = jit.compile_spec

    def counting(spec, arch):
        calls.append(spec.name)
        return real(spec, arch)

    monkeypatch.setattr(jit, "compile_spec", counting)
    return calls


def _load(spec=SPEC):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = jit.load_or_compile(spec, ARCH)
    return out, [str(x.message) for x in w if "not using the kernel cache" in str(x.message)]


@posix_only
def test_private_directory_is_trusted_and_hit(kdir, isolated_cache, compiles):
    _, warns = _load()
    _, warns2 = _load()
    assert warns == warns2 == [] and compiles == ["probe[f32]"]
    assert jit.cache_trust_problem() is None


@posix_only
def test_group_writable_directory_with_planted_entry_is_not_read(kdir, isolated_cache, compiles):
    _load()                                 # a valid entry, as an attacker could plant one
    path = jit.cache_path(SPEC, ARCH)
    before = path.read_bytes()
    os.chmod(isolated_cache, 0o770)
    out, warns = _load()
    assert len(warns) == 1 and "writable by group or others" in warns[0]
    assert compiles == ["probe[f32]"] * 2, "compiled into memory, entry ignored"
    assert path.read_bytes() == before and len(list(isolated_cache.iterdir())) == 1, "nothing written"
    assert out.cubin
    _, warns = _load(SPEC_B)
    assert warns == [], "warned once per directory"


@posix_only
def test_group_writable_entry_is_ignored_and_replaced(kdir, isolated_cache, compiles):
    _load()
    path = jit.cache_path(SPEC, ARCH)
    os.chmod(path, 0o666)
    _, warns = _load()
    assert len(warns) == 1 and str(path) in warns[0] and compiles == ["probe[f32]"] * 2
    assert os.stat(path).st_mode & 0o022 == 0, "rewritten as the user's private file"
    _, warns = _load()
    assert warns == [] and len(compiles) == 2


@posix_only
def test_symlinked_entry_is_not_followed(kdir, isolated_cache, compiles, tmp_path):
    _load()
    path = jit.cache_path(SPEC, ARCH)
    elsewhere = tmp_path / "elsewhere.bin"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    _, warns = _load()
    assert len(warns) == 1 and "symlink" in warns[0] and len(compiles) == 2


@posix_only
def test_own_symlink_to_private_directory_is_trusted(kdir, tmp_path, monkeypatch, compiles):
    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    link = tmp_path / "link-cache"
    link.symlink_to(real)
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(link))
    monkeypatch.delenv("CUPY_ATTENTION_NO_CACHE", raising=False)
    _load()
    _, warns = _load()
    assert warns == [] and len(compiles) == 1 and len(list(real.iterdir())) == 1


@posix_only
def test_symlink_to_shared_directory_is_not_trusted(kdir, tmp_path, monkeypatch, compiles):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    link = tmp_path / "link-cache"
    link.symlink_to(shared)
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(link))
    monkeypatch.delenv("CUPY_ATTENTION_NO_CACHE", raising=False)
    _, warns = _load()
    assert len(warns) == 1 and list(shared.iterdir()) == []


@posix_only
def test_truncated_entry_is_a_miss(kdir, isolated_cache, compiles):
    _load()
    path = jit.cache_path(SPEC, ARCH)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    out, warns = _load()
    assert warns == [] and len(compiles) == 2 and out.cubin
    assert jit.read_entry(path.read_bytes()) is not None, "rewritten whole"


@posix_only
def test_entry_swapped_for_another_kernels_valid_entry_is_a_miss(kdir, isolated_cache, compiles):
    _load()
    _load(SPEC_B)
    a, b = jit.cache_path(SPEC, ARCH), jit.cache_path(SPEC_B, ARCH)
    b_bytes = b.read_bytes()
    a.write_bytes(b_bytes)                  # checksum valid, but for the other kernel
    out, _ = _load()
    assert len(compiles) == 3 and out.spec == SPEC
    assert a.read_bytes() != b_bytes


@posix_only
def test_directory_owned_by_another_uid(kdir, compiles, monkeypatch, tmp_path):
    other = tmp_path / "other-cache"
    other.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(other, 65534, 65534)       # root can hand a directory to "nobody"
    else:
        other = next((p for p in ("/", "/usr") if os.stat(p).st_uid != os.getuid()), None)
        if other is None:
            pytest.skip("cannot make or find a directory owned by another uid")
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(other))
    monkeypatch.delenv("CUPY_ATTENTION_NO_CACHE", raising=False)
    out, warns = _load()
    assert len(warns) == 1 and "owned by uid" in warns[0] and out.cubin
