"""benchmarks/micro/pipes.cu (the pipe microbenchmarks behind
h200-wgmma-small-d-limits.md) still compiles against kernels/common/ for sm_90a,
without register spills (no GPU needed)."""

from helpers import load_script


def _load():
    return load_script("benchmarks/micro/pipes.py", "pipes")


def test_pipes_compile_without_spills():
    pipes = _load()
    names, cubin, res = pipes.compile_all()
    assert len(names) == len(pipes.SHAPES) + len(pipes.MIXES)
    assert all(names.values()), "every instantiation has a lowered name"
    assert cubin[:4] == b"\x7fELF"
    assert res.spill_stores == 0 and res.spill_loads == 0, res
    assert 0 < res.registers <= 255
