"""scripts/peers_chart.py and scripts/decode_chart.py on the committed result files they
were written for (needs matplotlib: the plot extra; skipped without it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("script, result", [
    ("peers_chart.py", "h200-peers-train-grid-bf16-ab53dcf.json"),   # peer_bench.py rows
    ("decode_chart.py", "h200-decode-grid-2f3e939.json"),            # bench --decode-grid
    ("decode_chart.py", "h100-decode-mma.json"),                     # decode_bench.py rows
])
def test_chart_scripts_draw_the_committed_results(script, result, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "chart.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), str(RESULTS / result),
                           str(png)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000   # panels drawn, not an empty figure
