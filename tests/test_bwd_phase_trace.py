"""scripts/bwd_phase_trace.py without a GPU: its stamps still find every step of
flash_wgmma_bwd_dkdv's loop, and the stamped kernel compiles for sm_90a without spills
(a loop edit that moves a step's statement must update the script's BOUNDS)."""
from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT, load_script

trace = load_script("scripts/bwd_phase_trace.py")


def test_patch_stamps_every_step_and_the_kernel_compiles(tmp_path):
    tree = tmp_path / "tree"
    trace.patch(str(tree))
    src = (tree / "kernels" / "flash_wgmma_bwd.cu").read_text()
    steps = {step for _, step in trace.BOUNDS}
    for step in steps:
        assert src.count(f"CA_STAMP({step});") == 1, step
    assert src.count("ca_trace_wait(") == 3   # its definition and the two counted waits
    # the package's own source is untouched
    assert "CA_STAMP" not in (ROOT / "kernels" / "flash_wgmma_bwd.cu").read_text()
    code = (
        "from cupy_attention import jit\n"
        "from cupy_attention.variant import Variant\n"
        "from cupy_attention.families import flash_wgmma_bwd as fb\n"
        "vt = Variant(True)\n"
        "c = fb.config(128, vt, False)\n"
        "mode = fb._dq_mode(c, vt, False)\n"
        "spec = fb.dkdv_spec(c, 'bfloat16', vt, mode, flat=fb.flat_builds(c, vt, mode))\n"
        "r = jit.compile_spec(spec, 'sm_90a')\n"
        "assert 'ca_trace' in r.cubin.decode('latin-1'), 'not the stamped source'\n"
        "print(r.resources.spills)\n")
    env = dict(os.environ, PYTHONPATH=str(tree), CUPY_ATTENTION_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0"
