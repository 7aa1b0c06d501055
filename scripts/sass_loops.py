"""The loops of one kernel instantiation, read off its SASS: each backward branch's
body, its size and opcodes, and with --lines the source lines the instructions of the
largest loop come from. CPU only (NVRTC and nvdisasm; no GPU).

    python scripts/sass_loops.py 'flash_mma[D=128,BM=128,BN=64,W=4,ST=2,bf16]' \\
        [--arch sm_90a] [--lines 20] [--nvdisasm PATH]

NAME is a CI instantiation's name as scripts/ptxas_report.py lists them (the first
name containing it is taken). nvdisasm comes with the CUDA toolkit, or from the
`nvidia-cuda-nvdisasm` wheel (`pip download nvidia-cuda-nvdisasm --no-deps`, then
unzip: nvidia/cu*/bin/nvdisasm). Counts are static: a loop nested in the largest one
is also listed on its own, and both branches of an if are counted.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TENSOR = ("HMMA", "HGMMA", "LDSM")
_LINE = re.compile(r'//## File "(?P<file>[^"]*)", line (?P<line>\d+)')
_INST = re.compile(r"/\*(?P<addr>[0-9a-f]+)\*/\s+(?P<text>[^;]*);")
_LABEL = re.compile(r"^\.(?P<label>L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?\.?(?P<label>L_x_\d+)")
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?(?P<op>[A-Z][A-Z0-9_]*)")


def parse(sass: str):
    """(instructions, label addresses) of nvdisasm -c [-g] output: each instruction
    as (address, text, (file, line) or None)."""
    instructions, labels, pending, where = [], {}, [], None
    for raw in sass.splitlines():
        line = raw.strip()
        m = _LINE.search(line)
        if m:
            where = (Path(m["file"]).name, int(m["line"]))
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m["label"])
            continue
        m = _INST.match(line)
        if m:
            addr = int(m["addr"], 16)
            for label in pending:
                labels[label] = addr
            pending = []
            instructions.append((addr, m["text"].strip(), where))
    return instructions, labels


def opcode(text: str) -> str:
    m = _OPCODE.match(text)
    return m["op"] if m else "?"


def loops(instructions, labels):
    """Every backward branch's body, largest first: (first, last address, body).
    Out-of-line code after the function's last unconditional EXIT (ptxas puts an
    mbarrier wait's retry there) jumps back into the body when done: those branches
    return, they do not close a loop, and are left out."""
    exits = [addr for addr, text, _ in instructions if text == "EXIT"]
    body_end = exits[-1] if exits else None
    found = []
    for addr, text, _ in instructions:
        m = _BRANCH.search(text)
        if m and labels.get(m["label"], addr) < addr:
            lo = labels[m["label"]]
            if body_end is not None and lo < body_end < addr:
                continue
            found.append((lo, addr, [x for x in instructions if lo <= x[0] <= addr]))
    return sorted(found, key=lambda x: -len(x[2]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a CI instantiation's name, or part of one")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--lines", type=int, default=0,
                    help="this many source lines of the largest loop, by instructions "
                         "other than the tensor cores' (HMMA, HGMMA, LDSM)")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"), help="its path")
    a = ap.parse_args(argv)
    if not a.nvdisasm:
        ap.error("nvdisasm not found: pass --nvdisasm (see the module docstring)")

    from ptxas_report import ci_jobs

    from cupy_attention import jit

    specs = [spec for spec, _ in ci_jobs() if a.name in spec.name]
    if not specs:
        ap.error(f"no CI instantiation's name contains {a.name!r}")
    spec = specs[0]
    src = (jit.kernels_dir() / spec.source).read_text()
    cubin, _, log = jit.compile_source(src, spec.source, [spec.expr], a.arch,
                                       extra_options=("-lineinfo",))
    if cubin is None:
        print(log, file=sys.stderr)
        return 1
    path = Path("/tmp") / f"sass_loops_{a.arch}.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([a.nvdisasm, "-c", "-g", str(path)], capture_output=True, text=True,
                          check=True, timeout=120).stdout
    instructions, labels = parse(sass)
    print(f"{spec.name} ({a.arch}): {len(instructions)} instructions, "
          f"{jit.parse_resources(log)}")
    found = loops(instructions, labels)
    for lo, hi, body in found:
        ops = collections.Counter(opcode(t) for _, t, _ in body)
        top = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
        print(f"loop {lo:#07x}-{hi:#07x}: {len(body):5d}  {top}")
    if a.lines and found:
        body = found[0][2]
        by_line = collections.Counter(w for _, t, w in body if opcode(t) not in TENSOR)
        print(f"largest loop, instructions other than {', '.join(TENSOR)}, by source line:")
        for (file, line), n in by_line.most_common(a.lines):
            print(f"  {n:5d}  {file}:{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
