"""The TESTING.md grid on every device kernel family, checked with the tolerance rule.

Sampling (per family, over the dtypes and head dims it supports):
  * every (dtype, head dim) pair once, other axes drawn at random;
  * every (dtype, (Sq, Sk, causal)) pair once, other axes drawn at random;
  * every value of Hkv, batch, layout and view at least once more;
  * every seventh case with large-magnitude logits.
Plus the full product, for float16, of a small family-independent subset
(padded views are in the sampled grid and in test_gpu_edges.py).
Draws are seeded by the family name: the case list (and the test ids) are stable.

Each case: fresh random inputs, NaN-poisoned `out` and `lse_out` (checked fully
written, and not written outside the view), float64 `ref` and same-precision
`same` from tests/helpers.py, figures logged to $CUPY_ATTENTION_ERROR_LOG.
"""

from __future__ import annotations

import itertools
import random
import zlib

import pytest

from cupy_attention.dispatch import FAMILIES

from helpers import DTYPES, LAYOUTS, problem_for, run_and_check, seed_for

HEAD_DIMS = (1, 8, 32, 40, 59, 64, 72, 80, 96, 111, 128, 160, 192, 224, 256)
SEQS = (
    (1, 1, False), (1, 147, False), (113, 203, False), (128, 217, False), (108, 256, False),
    (256, 512, False), (512, 256, False), (1023, 1024, False), (1024, 1023, False),
    (2048, 2048, False),
    (1, 239, True), (3, 799, True), (127, 512, True), (127, 513, True), (239, 1, True),
    (799, 3, True),
    (128, 217, True), (512, 256, True), (1024, 1023, True), (2048, 2048, True),
)
HEADS_Q = 6
HEADS_KV = (6, 2, 1)
BATCHES = (1, 4)
VIEWS = ("contiguous", "packed", "padded")
# Families that build an O(S^2) score matrix or run one thread per output are slow
# at long sequences: they get S <= 1024.
MAX_SEQ = {"naive": 1024, "tiled": 1024}
BIG_LOGITS = 4.0     # q and k scaled by this: logits of magnitude ~50


def _supports(name, c) -> bool:
    if max(c["seqlen_q"], c["seqlen_k"]) > MAX_SEQ.get(name, 1 << 30):
        return False
    p = problem_for(**{k: c[k] for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
                                         "head_dim", "dtype", "layout", "causal")})
    return FAMILIES[name].check(p, None) is None


def _case(dtype, head_dim, seq, hkv, batch, layout, view, n):
    sq, sk, causal = seq
    return dict(batch=batch, heads_q=HEADS_Q, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                head_dim=head_dim, dtype=dtype, layout=layout, view=view, causal=causal,
                magnitude=BIG_LOGITS if n % 7 == 6 else 1.0)


def sampled_cases(name):
    rng = random.Random(zlib.crc32(name.encode()))
    dtypes = [d for d in DTYPES if d in FAMILIES[name].dtypes]
    seqs = [s for s in SEQS if max(s[:2]) <= MAX_SEQ.get(name, 1 << 30)]
    out = []

    def add(dtype=None, head_dim=None, seq=None, hkv=None, batch=None, layout=None, view=None):
        for _ in range(50):       # redraw the free axes until the family takes the case
            c = _case(dtype or rng.choice(dtypes), head_dim or rng.choice(HEAD_DIMS),
                      seq or rng.choice(seqs), hkv or rng.choice(HEADS_KV),
                      batch or rng.choice(BATCHES), layout or rng.choice(LAYOUTS),
                      view or rng.choice(VIEWS), len(out))
            if _supports(name, c):
                out.append(c)
                return

    for dtype in dtypes:
        for d in HEAD_DIMS:
            add(dtype=dtype, head_dim=d)
        for seq in seqs:
            add(dtype=dtype, seq=seq)
    for hkv in HEADS_KV:
        add(hkv=hkv)
    for b in BATCHES:
        add(batch=b)
    for layout in LAYOUTS:
        add(layout=layout)
    for view in VIEWS:
        add(view=view)
    return out


PRODUCT_DTYPE = "float16"
PRODUCT_AXES = dict(
    head_dim=(8, 59, 128),
    seq=((1, 147, False), (113, 203, False), (127, 513, True), (239, 1, True)),
    hkv=HEADS_KV, batch=BATCHES, layout=LAYOUTS, view=("contiguous", "packed"),
)


def product_cases(name):
    out = []
    for d, seq, hkv, b, layout, view in itertools.product(*PRODUCT_AXES.values()):
        c = _case(PRODUCT_DTYPE, d, seq, hkv, b, layout, view, 0)
        c["want_lse"] = b == 1 or view == "packed"   # the no-LSE path too
        if _supports(name, c):
            out.append(c)
    return out


def case_id(c):
    return (f"{c['dtype']}-D{c['head_dim']}-S{c['seqlen_q']}x{c['seqlen_k']}"
            f"{'c' if c['causal'] else ''}-H{c['heads_q']}/{c['heads_kv']}-B{c['batch']}-"
            f"{c['layout']}-{c['view']}{'-big' if c['magnitude'] != 1.0 else ''}"
            f"{'' if c.get('want_lse', True) else '-nolse'}")


GRID = [(name, c) for name in FAMILIES for c in sampled_cases(name)]
PRODUCT = [(name, c) for name in FAMILIES for c in product_cases(name)]


# conftest.py compiles the instantiations of these cases in parallel up front, those
# of the selected tests only (they are the tests' parameters: PREWARM_PARAMS).
PREWARM = GRID + PRODUCT
PREWARM_PARAMS = True


def _run(name, c, device_cc, part):
    reason = FAMILIES[name].check(problem_for(**{k: c[k] for k in (
        "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "layout",
        "causal")}), device_cc)
    if reason:
        pytest.skip(f"{name} on this device: {reason}")
    run_and_check(name, seed=seed_for(part, name, case_id(c)), meta=dict(part=part), **c)


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", GRID, ids=[f"{n}-{case_id(c)}" for n, c in GRID])
def test_grid(name, case, device_cc):
    _run(name, case, device_cc, "grid")


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", PRODUCT, ids=[f"{n}-{case_id(c)}" for n, c in PRODUCT])
def test_product_float16(name, case, device_cc):
    _run(name, case, device_cc, "product")


def test_grid_covers_every_axis_value_per_family():
    """The sampling promise: each axis value appears with each family that takes it
    (runs on the CPU: it checks the case list, not a kernel)."""
    for name in FAMILIES:
        cases = [c for n, c in GRID if n == name]
        fam = FAMILIES[name]
        seen = lambda key: {c[key] for c in cases}  # noqa: E731
        assert seen("dtype") == {d for d in DTYPES if d in fam.dtypes}
        for d in HEAD_DIMS:
            for dtype in fam.dtypes:
                if _supports(name, _case(dtype, d, (1, 1, False), 1, 1, "bhsd", "contiguous", 0)):
                    assert any(c["head_dim"] == d and c["dtype"] == dtype for c in cases), (name, d, dtype)
        seqs = {(c["seqlen_q"], c["seqlen_k"], c["causal"]) for c in cases}
        assert {s for s in SEQS if _supports(name, _case(fam.dtypes[0], 64, s, 1, 1, "bhsd",
                                                         "contiguous", 0))} <= seqs
        assert seen("heads_kv") == set(HEADS_KV) and seen("batch") == set(BATCHES)
        assert seen("layout") == set(LAYOUTS) and seen("view") == set(VIEWS)
        assert any(c["magnitude"] != 1.0 for c in cases)
