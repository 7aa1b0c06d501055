"""Markdown tables for benchmarks/results/notes-peers.md, computed from the H100 peer JSONs.

Every figure and ratio in that note's tables is printed here from the committed files, so
the note can be checked (or rebuilt) with::

    python scripts/peers_tables.py            # all sections
    python scripts/peers_tables.py train pdl  # some of them

Sections: train, mma, dropout, decode, pdl, tiles, head, decode-head (the README's
decode table). Each prints its tables, then a few "range" lines (min-max of a ratio
column) that the note's summaries quote.
"""

import json
import sys
from pathlib import Path

RES = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def load(name):
    return json.loads((RES / name).read_text())


def tf(x):
    return "-" if x is None else f"{x:.0f}"


def r2(x):
    return "-" if x is None else f"{x:.2f}"


def div(a, b):
    return None if a is None or b is None else a / b


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def span(label, xs):
    xs = [x for x in xs if x is not None]
    print(f"range {label}: {min(xs):.2f}-{max(xs):.2f} (n={len(xs)})")


def yn(c):
    return "yes" if c else "no"


def training_cells(rows):
    """{(D, S, causal): {impl: row}}"""
    cells = {}
    for r in rows:
        cells.setdefault((r["D"], r["S"], r["causal"]), {})[r["impl"]] = r
    return cells


def best_peer(got, key, peers):
    have = [(got[p][key], p) for p in peers if p in got and got[p].get(key) is not None]
    return max(have) if have else (None, None)


def section_train(name="h100-peers-train.json"):
    data = load(name)
    cells = training_cells(data["rows"])
    peers = ("cudnn", "flash2", "fa4")
    fwd_all, bwd_all, wins = [], [], {}
    for dim in sorted({k[0] for k in cells}):
        print(f"\nD = {dim}\n")
        rows, fwd_r, bwd_r = [], [], []
        for (d, s, causal), got in sorted(cells.items()):
            if d != dim:
                continue
            fbest, _ = best_peer(got, "fwd_tflops", peers)
            bbest, bname = best_peer(got, "bwd_tflops", peers)
            wins[bname] = wins.get(bname, 0) + 1
            fr = div(got["ours"]["fwd_tflops"], fbest)
            br = div(got["ours"]["bwd_tflops"], bbest)
            fwd_r.append(fr)
            bwd_r.append(br)
            rows.append([s, yn(causal)]
                        + [tf(got[i]["fwd_tflops"]) for i in ("ours",) + peers] + [r2(fr)]
                        + [tf(got[i]["bwd_tflops"]) for i in ("ours",) + peers] + [r2(br)])
        print(table(["S", "causal", "fwd ours", "cuDNN", "FA2", "FA4", "x best",
                     "bwd ours", "cuDNN", "FA2", "FA4", "x best"], rows))
        span(f"D={dim} fwd x best peer", fwd_r)
        span(f"D={dim} bwd x best peer", bwd_r)
        fwd_all += fwd_r
        bwd_all += bwd_r
    for dim in sorted({k[0] for k in cells}):
        for peer in peers:
            for k in ("fwd", "bwd"):
                span(f"D={dim} ours {k} x {peer}",
                     [got["ours"][f"{k}_tflops"] / got[peer][f"{k}_tflops"]
                      for (d, _, _), got in cells.items() if d == dim])
    ahead = sum(x >= 1.0 for x in fwd_all)
    print(f"forward cells where ours >= the faster peer: {ahead}/{len(fwd_all)}")
    span("all fwd x best peer", fwd_all)
    span("all bwd x best peer", bwd_all)
    print("faster backward peer per cell:", wins)
    print("max spread_pct:", f"{max(r['spread_pct'] for r in data['rows']):.1f}")


def section_mma(name="h100-peers-mma-det.json"):
    data = load(name)
    rows, fwd_r, bwd_r, det_r = [], [], [], []
    for (d, s, causal), got in sorted(training_cells(data["rows"]).items()):
        mma, fa2, ours, det = (got[i] for i in ("ours_mma", "flash2", "ours", "ours_det"))
        fr = mma["fwd_tflops"] / fa2["fwd_tflops"]
        br = mma["bwd_tflops"] / fa2["bwd_tflops"]
        dr = det["bwd_tflops"] / ours["bwd_tflops"]
        fwd_r.append(fr)
        bwd_r.append(br)
        det_r.append(dr)
        rows.append([d, s, yn(causal), tf(mma["fwd_tflops"]), tf(fa2["fwd_tflops"]), r2(fr),
                     tf(mma["bwd_tflops"]), tf(fa2["bwd_tflops"]), r2(br),
                     tf(ours["bwd_tflops"]), tf(det["bwd_tflops"]), r2(dr)])
    print(table(["D", "S", "causal", "mma fwd", "FA2", "ratio", "mma bwd", "FA2", "ratio",
                 "atomic bwd", "det bwd", "ratio"], rows))
    span("flash_mma fwd x FA2", fwd_r)
    span("flash_mma bwd x FA2", bwd_r)
    span("det / atomic bwd", det_r)
    for dim in (64, 128, 256):
        span(f"det / atomic D={dim}", [x for x, r in zip(det_r, rows) if r[0] == dim])


def section_dropout():
    drop = training_cells(load("h100-peers-dropout.json")["rows"])
    plain = training_cells(load("h100-peers-train.json")["rows"])
    impls = ("ours", "cudnn", "flash2")
    rows, own = [], []
    fwd_r, bwd_r = [], []
    meets = {(i, k): [] for i in impls for k in ("fwd", "bwd")}
    for key, got in sorted(drop.items()):
        d, s, causal = key
        fbest, _ = best_peer(got, "fwd_tflops", impls[1:])
        bbest, _ = best_peer(got, "bwd_tflops", impls[1:])
        fr = div(got["ours"]["fwd_tflops"], fbest)
        br = div(got["ours"]["bwd_tflops"], bbest)
        fwd_r.append(fr)
        bwd_r.append(br)
        rows.append([d, s, yn(causal)] + [tf(got[i]["fwd_tflops"]) for i in impls] + [r2(fr)]
                    + [tf(got[i]["bwd_tflops"]) for i in impls] + [r2(br)])
        base = plain.get(key)
        if base is None:
            continue
        line = [d, s, yn(causal)]
        for k in ("fwd", "bwd"):
            for i in impls:
                assert got[i]["B"] == base[i]["B"] and got[i]["Hq"] == base[i]["Hq"]
                x = got[i][f"{k}_tflops"] / base[i][f"{k}_tflops"]
                meets[(i, k)].append(x)
                line.append(f"**{x:.2f}**" if x >= 0.85 else f"{x:.2f}")
        own.append(line)
    print(table(["D", "S", "causal", "fwd ours", "cuDNN", "FA2", "x best",
                 "bwd ours", "cuDNN", "FA2", "x best"], rows))
    span("dropout fwd x best peer", fwd_r)
    span("dropout bwd x best peer", bwd_r)
    for dim in sorted({k[0] for k in drop}):
        pick = [i for i, k in enumerate(sorted(drop)) if k[0] == dim]
        span(f"dropout D={dim} fwd x best peer", [fwd_r[i] for i in pick])
        span(f"dropout D={dim} bwd x best peer", [bwd_r[i] for i in pick])
    print("\nDropout rate over the same implementation's plain rate (bold: >= 0.85)\n")
    print(table(["D", "S", "causal", "fwd ours", "cuDNN", "FA2", "bwd ours", "cuDNN", "FA2"],
                own))
    for (i, k), xs in meets.items():
        n = sum(x >= 0.85 for x in xs)
        print(f"{i} {k}: {min(xs):.2f}-{max(xs):.2f}, {n}/{len(xs)} cells >= 0.85")
        for dim in (64, 128, 256):
            span(f"  {i} {k} D={dim}", [x for x, r in zip(xs, own) if r[0] == dim])


def decode_rows(name):
    out = {}
    for r in load(name)["rows"]:
        if "tbps" in r:
            shape = (r["B"], r["Sq"], r["Sk"])
            out.setdefault(shape, {})[(r["impl"], r["page"])] = r["tbps"]
    return out


def section_decode():
    base = decode_rows("h100-peers-decode.json")
    one = decode_rows("h100-peers-decode-fa4-one-split.json")
    cols = [("ours", 0), ("ours", 16), ("ours", 1), ("cudnn", None), ("flash", None),
            ("fa4", 0), ("fa4", 16), ("flashinfer", 16), ("flashinfer", 1)]
    rows, ratio_rows, best_r, page_r = [], [], [], []
    names = {"cudnn": "cuDNN", "flash": "FA2", "fa4": "FA4", "flashinfer": "FI"}

    def label(c):
        return names[c[0]] + (f" p{c[1]}" if c[1] else "")

    for shape in sorted(base, key=lambda k: (k[1], k[0])):
        got = dict(base[shape])
        for k in (("fa4", 0), ("fa4", 16)):  # FA4 at one split, from the rerun
            got[k] = one.get(shape, {}).get(k)
        best, who = max((got[c], c) for c in cols[3:] if got.get(c) is not None)
        pbest, pwho = max((got[c], c) for c in (("fa4", 16), ("flashinfer", 16))
                          if got.get(c) is not None)
        br = got[("ours", 0)] / best
        pr = got[("ours", 16)] / pbest
        p1 = div(got[("ours", 1)], got.get(("flashinfer", 1)))
        best_r.append(br)
        page_r.append(pr)
        rows.append(list(shape) + [r2(got.get(c)) for c in cols])
        ratio_rows.append(list(shape) + [f"{label(who)} {best:.2f}", r2(br),
                                         f"{label(pwho)} {pbest:.2f}", r2(pr), r2(p1)])
    print(table(["B", "Sq", "Sk", "ours", "ours p16", "ours p1", "cuDNN", "FA2", "FA4",
                 "FA4 p16", "FI p16", "FI p1"], rows))
    print()
    print(table(["B", "Sq", "Sk", "best peer", "ours x best", "best p16 peer", "ours p16 x it",
                 "ours p1 x FI p1"], ratio_rows))
    span("decode ours contiguous x best peer", best_r)
    span("decode ours page 16 x best page-16 peer", page_r)
    span("decode ours page 1 x FlashInfer page 1",
         [g[("ours", 1)] / g[("flashinfer", 1)] for g in base.values() if ("flashinfer", 1) in g])
    for shape, g in base.items():
        if shape[1] > 1:
            ours = g[("ours", 0)]
            print(f"Sq={shape[1]}: ours contiguous x cuDNN {ours / g[('cudnn', None)]:.2f},"
                  f" x FA2 {ours / g[('flash', None)]:.2f}")
    # The rerun timed ours, cuDNN and FA2 again (and FA4 where num_splits=0 ran): agreement.
    diffs = []
    for shape, got in one.items():
        for k, v in got.items():
            if k in base.get(shape, {}):
                diffs.append(abs(v / base[shape][k] - 1))
    print(f"rerun vs first run, same rows: max |diff| {100 * max(diffs):.1f}% (n={len(diffs)})")


def section_pdl():
    data = load("h100-decode-pdl-ab.json")
    by = {}
    for run, rows in data["runs"].items():
        mode = run.split("-")[0]
        for r in rows:
            key = (r["B"], r["Sq"], r["Sk"], r["page"])
            by.setdefault(key, {}).setdefault(mode, []).append(r["tbps"])
    rows, ratios, rounds = [], [], []
    for key in sorted(by, key=lambda k: (k[1], k[0], k[3])):
        off, on = max(by[key]["off"]), max(by[key]["on"])
        ratios.append(on / off)
        for mode in ("off", "on"):
            a, b = by[key][mode]
            rounds.append(abs(a / b - 1))
        b, sq, sk, page = key
        rows.append([b, sq, sk, f"page {page}" if page else "contiguous", r2(off), r2(on),
                     f"{on / off:.3f}"])
    print(table(["B", "Sq", "Sk", "cache", "off TB/s", "on TB/s", "on / off"], rows))
    span("PDL on / off", ratios)
    print(f"same mode, round 1 vs round 2: max |diff| {100 * max(rounds):.1f}%")


def section_tiles():
    after = load("h100-variants-dropout-128rows.json")["rows"]
    before = load("h100-variants-dropout-shuffle.json")["rows"]

    def index(rows):
        return {(r["variant"], r["d"], r["s"], r["causal"]): r for r in rows}

    a, b = index(after), index(before)
    rows = []
    for (variant, d, s, causal), r in sorted(a.items()):
        if variant != "dropout":
            continue
        p = a[("plain", d, s, causal)]
        old = b.get((variant, d, s, causal))
        rows.append([d, s, yn(causal),
                     tf(old["bwd_tflops"]) if old else "-", r2(old["bwd_ratio"]) if old else "-",
                     tf(p["bwd_tflops"]), tf(r["bwd_tflops"]), r2(r["bwd_ratio"]),
                     r2(r["bwd_ratio"] / old["bwd_ratio"]) if old else "-",
                     r2(old["fwd_ratio"]) if old else "-", r2(r["fwd_ratio"])])
    print(table(["D", "S", "causal", "old bwd", "x plain", "plain bwd", "new bwd", "x plain",
                 "gain", "fwd old", "fwd new"], rows))


def section_head():
    """Section 10: the whole training grid again, one run at f4c8758."""
    section_train("h100-peers-train-f4c8758.json")
    print()
    section_mma("h100-peers-train-f4c8758.json")


def section_decode_head(name="h100-peers-decode-022664b.json"):
    """The README's decode table (one run, every peer at one split) and its ratios."""
    got = decode_rows(name)
    cols = [("ours", 0), ("ours", 16), ("ours", 1), ("cudnn", None), ("flash", None),
            ("fa4", 0), ("fa4", 16), ("fa4", 1), ("flashinfer", 16), ("flashinfer", 1)]
    rows, best_r, p16_r, p1_r = [], [], [], []
    for shape in sorted(got, key=lambda k: (k[1], k[0])):
        g = got[shape]
        rows.append(list(shape) + [r2(g.get(c)) for c in cols])
        best = max(g[c] for c in (("cudnn", None), ("flash", None), ("fa4", 0)))
        if shape[1] == 1:
            best_r.append(g[("ours", 0)] / best)
            p16_r.append(g[("ours", 16)] / g[("flashinfer", 16)])
            p1_r.append(g[("ours", 1)] / g[("flashinfer", 1)])
        else:
            print(f"Sq={shape[1]}: ours contiguous x FA4 {g[('ours', 0)] / g[('fa4', 0)]:.3f}, "
                  f"x cuDNN {g[('ours', 0)] / g[('cudnn', None)]:.2f}; ours page 16 x FA4 "
                  f"page 16 {g[('ours', 16)] / g[('fa4', 16)]:.2f}")
    print(table(["B", "Sq", "Sk", "ours", "ours p16", "ours p1", "cuDNN", "FA2", "FA4",
                 "FA4 p16", "FA4 p1", "FI p16", "FI p1"], rows))
    span("Sq = 1: ours contiguous x best of cuDNN, FA2, FA4", best_r)
    span("Sq = 1: ours page 16 x FlashInfer page 16", p16_r)
    span("Sq = 1: ours page 1 x FlashInfer page 1", p1_r)


SECTIONS = {"train": section_train, "mma": section_mma, "dropout": section_dropout,
            "decode": section_decode, "pdl": section_pdl, "tiles": section_tiles,
            "head": section_head, "decode-head": section_decode_head}

if __name__ == "__main__":
    for name in sys.argv[1:] or SECTIONS:
        print(f"\n## {name}")
        SECTIONS[name]()
