"""kernels/common/wgmma_ops.cuh is generated: it must be what scripts/gen_wgmma.py writes."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_wgmma_ops_is_generated():
    gen = ROOT / "scripts" / "gen_wgmma.py"
    done = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True)
    assert done.returncode == 0, ("kernels/common/wgmma_ops.cuh differs from the generator's "
                                  "output: run python scripts/gen_wgmma.py --write")
