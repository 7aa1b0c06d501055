"""The kernel argument structs in cupy_attention/params.py match the C structs in
kernels/common/params.cuh: NVRTC compiles a probe that static_asserts every
field offset, the size and the alignment (a mismatch fails the compilation)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cupy_attention import jit, params

from helpers import nvrtc_probe


def struct_dtypes():
    """(C struct name, NumPy dtype) for every ``*_DTYPE`` in params.py: FWD_DTYPE -> FwdParams."""
    out = []
    for attr in sorted(dir(params)):
        dt = getattr(params, attr)
        if attr.endswith("_DTYPE") and isinstance(dt, np.dtype) and dt.names:
            out.append((attr[:-len("_DTYPE")].capitalize() + "Params", dt))
    return out


# NVRTC (12.x) has no <cstddef>, and its front end does not know
# __builtin_offsetof; EDG's own __INTADDR__ gives the same constant expression.
OFFSETOF = """
#if defined(__has_builtin)
#if __has_builtin(__builtin_offsetof)
#define CA_OFFSETOF(T, m) __builtin_offsetof(T, m)
#endif
#endif
#ifndef CA_OFFSETOF
#define CA_OFFSETOF(T, m) ((unsigned long long)__INTADDR__(&(((T*)0)->m)))
#endif
"""


def probe_source(struct: str, dt: np.dtype, lie: bool = False) -> str:
    lines = ['#include "common/params.cuh"', OFFSETOF]
    for i, name in enumerate(dt.names):
        off = dt.fields[name][1] + (4 if lie and i == len(dt.names) // 2 else 0)
        lines.append(f'static_assert(CA_OFFSETOF({struct}, {name}) == {off}, '
                     f'"offset of {struct}::{name} is not {off}");')
        size = dt.fields[name][0].itemsize
        lines.append(f'static_assert(sizeof((({struct}*)0)->{name}) == {size}, '
                     f'"size of {struct}::{name} is not {size}");')
    lines.append(f'static_assert(sizeof({struct}) == {dt.itemsize}, "sizeof({struct})");')
    lines.append(f'static_assert(alignof({struct}) == {dt.alignment}, "alignof({struct})");')
    return "\n".join(lines) + "\n"


def nvrtc_compile(src: str) -> tuple[bool, str]:
    return nvrtc_probe(src, ["-std=c++17", f"-I{jit.kernels_dir()}", "-arch=sm_80"])


STRUCTS = struct_dtypes()


def test_there_is_a_struct_to_check():
    assert any(name == "FwdParams" for name, _ in STRUCTS)


@pytest.mark.parametrize("struct,dt", STRUCTS, ids=[s for s, _ in STRUCTS])
def test_offsets_match_the_c_struct(struct, dt):
    ok, log = nvrtc_compile(probe_source(struct, dt))
    assert ok, f"{struct} and params.py disagree:\n{log}"


@pytest.mark.parametrize("struct,dt", STRUCTS, ids=[s for s, _ in STRUCTS])
def test_probe_catches_a_wrong_offset(struct, dt):
    """The probe is not vacuous: one offset off by 4 bytes fails to compile."""
    ok, log = nvrtc_compile(probe_source(struct, dt, lie=True))
    assert not ok and "static assertion failed" in log, log
    assert f"offset of {struct}::{dt.names[len(dt.names) // 2]} is not" in log, log


def c_field_names(struct: str) -> list[str]:
    """Field names of ``struct`` in declaration order, read off params.cuh."""
    text = (jit.kernels_dir() / "common" / "params.cuh").read_text()
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    body = re.search(rf"struct\s+{struct}\s*\{{(.*?)\}};", text, flags=re.S)
    assert body, f"struct {struct} not found in params.cuh"
    names = []
    for decl in body.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        first, *rest = decl.split(",")
        names.append(re.findall(r"[A-Za-z_]\w*", first)[-1])
        names.extend(r.strip().lstrip("*").strip() for r in rest)
    return names


@pytest.mark.parametrize("struct,dt", STRUCTS, ids=[s for s, _ in STRUCTS])
def test_same_fields_in_the_same_order(struct, dt):
    assert c_field_names(struct) == list(dt.names)


def test_make_struct_bytes():
    rec = params.make_struct(params.FWD_DTYPE, {"seqlen_q": 7, "scale": 0.5, "k": 0xDEADBEEF})
    raw = bytes(np.asarray(rec).tobytes())
    assert len(raw) == params.FWD_DTYPE.itemsize
    off = params.FWD_DTYPE.fields["seqlen_q"][1]
    assert int.from_bytes(raw[off:off + 4], "little") == 7
    off = params.FWD_DTYPE.fields["k"][1]
    assert int.from_bytes(raw[off:off + 8], "little") == 0xDEADBEEF
    off = params.FWD_DTYPE.fields["scale"][1]
    assert np.frombuffer(raw[off:off + 4], dtype=np.float32)[0] == 0.5
    untouched = params.FWD_DTYPE.fields["heads_q"][1]
    assert raw[untouched:untouched + 4] == b"\0\0\0\0"
