"""Pull the cubins out of cupy_attention's JIT disk cache, and optionally count SASS
instructions in each with cuobjdump.

    python3 scripts/cubin_extract.py CACHE_DIR OUT_DIR [--sass] [--json FILE]

A cache entry (cupy_attention/jit.py) is: 8-byte magic, SHA-256 of the rest,
8-byte little-endian JSON length, JSON metadata (name, arch, lowered name, ptxas
log...), then the cubin. Corrupt entries are skipped. With --sass each cubin is
disassembled and the tensor-core (HMMA/HGMMA), local-memory (LDL/STL: spills)
and shared-memory load/store instructions are counted per kernel.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cupy_attention import jit  # noqa: E402

COUNTED = ("HMMA", "HGMMA", "LDSM", "LDL", "STL", "LDS", "STS", "LDGSTS", "BAR")


def read_entry(path: Path):
    """(meta dict, cubin bytes), or None for anything that is not a valid entry."""
    return jit.read_entry(path.read_bytes())


def sass_counts(cubin: Path) -> dict:
    text = subprocess.run(["cuobjdump", "--dump-sass", str(cubin)], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text)
    counts = {op: 0 for op in COUNTED}
    for op in opcodes:
        if op in counts:
            counts[op] += 1
    counts["instructions"] = len(opcodes)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--sass", action="store_true", help="count instructions with cuobjdump")
    ap.add_argument("--json", type=Path, help="write the per-kernel rows here")
    ap.add_argument("--per-kernel", type=int, default=0,
                    help="at most this many entries per kernel (name before '['); 0: all")
    args = ap.parse_args(argv)
    if args.sass and shutil.which("cuobjdump") is None:
        print("cuobjdump not found; extracting only", file=sys.stderr)
        args.sass = False
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    taken: dict = {}
    for path in sorted(args.cache_dir.glob("*.bin")):
        entry = read_entry(path)
        if entry is None:
            continue
        meta, cubin = entry
        kernel = str(meta.get("name", "")).split("[")[0]
        taken[kernel] = taken.get(kernel, 0) + 1
        if args.per_kernel and taken[kernel] > args.per_kernel:
            continue
        # cuobjdump rejects paths with '=' or ',' (the readable names have both).
        target = args.out_dir / f"{len(rows):04d}-{meta.get('arch', 'sm')}.cubin"
        target.write_bytes(cubin)
        row = {"name": meta.get("name"), "arch": meta.get("arch"), "cubin": target.name}
        if args.sass:
            try:
                row.update(sass_counts(target))
            except (subprocess.SubprocessError, OSError) as exc:
                row["error"] = str(exc)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    cols = ["instructions", "HMMA", "HGMMA", "LDSM", "LDL", "STL"] if args.sass else []
    print(f"{len(rows)} cubins from {args.cache_dir}")
    if cols:
        print(f"{'kernel':64s} {'arch':7s} " + " ".join(f"{c:>7s}" for c in cols))
        for row in rows:
            print(f"{row['name'][:64]:64s} {row['arch']:7s} " +
                  " ".join(f"{row.get(c, '-'):>7}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
