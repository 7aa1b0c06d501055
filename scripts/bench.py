#!/usr/bin/env python3
"""Same as `cupy-attention bench ...`, runnable from a checkout without installing.

    python scripts/bench.py --quick --json bench.json --plot plots/
    python scripts/bench.py --help
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cupy_attention.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
