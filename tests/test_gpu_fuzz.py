"""Random valid problems against the float64 reference, with TESTING.md's rule.

A seeded NumPy RNG (``CUPY_ATTENTION_FUZZ_SEED``, default below; the count with
``CUPY_ATTENTION_FUZZ_N``) draws each problem: a forward family, then one of a few
fixed kernel configurations of that family (head dim from {64, 128, 40}, dtype,
band: none / causal / a random two-sided window, softcap sometimes) so the number of
distinct instantiations stays small, then free run-time axes: B (1-3), Hkv (1-3)
and the GQA group (1, 2, 4), Sq and Sk (1-300; decode: Sq 1-8), layout, and a view
(contiguous, slices of one packed QKV allocation, padded strides). The window's
bounds are run-time values, so they vary per problem. Every forward runs into
NaN-poisoned ``out``/``lse_out`` buffers (checked to be fully written, and nothing
written outside a padded view); one problem in BWD_EVERY with a backward family
and no softcap also runs the backward (deterministic or not, per configuration)
against the float64 plain backward (factor 3).

A failure names the seed and the problem: rerun it alone with
``pytest tests/test_gpu_fuzz.py -k 'p0123'`` (ids are stable for a seed).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.dispatch import BACKWARD_FAMILIES, FAMILIES

from helpers import (as_float, check_attention, make_out, make_qkv, noise_floor,
                     plain_attention, plain_backward, prewarm_calls, problem_for, to_bhsd, tolerance)

pytestmark = pytest.mark.gpu

SEED = int(os.environ.get("CUPY_ATTENTION_FUZZ_SEED", "20261125"))
N = int(os.environ.get("CUPY_ATTENTION_FUZZ_N", "300"))
BWD_EVERY = 4

# (head dim, dtype, band, softcap, deterministic backward) per family: the kernel
# instantiations this module compiles.
CONFIGS = {
    "decode": [(128, "bfloat16", "causal", False, False), (40, "float16", "window", True, False)],
    "flash_wgmma": [(64, "float16", "none", False, True), (128, "bfloat16", "causal", False, False),
                    (128, "float16", "window", False, True), (64, "bfloat16", "causal", True, False)],
    "flash_mma": [(64, "bfloat16", "none", False, False), (128, "float16", "causal", False, True),
                  (40, "bfloat16", "window", False, False), (40, "float16", "causal", True, True)],
    "flash": [(64, "float32", "causal", False, True), (128, "bfloat16", "none", False, False),
              (40, "float16", "window", False, True), (64, "float16", "causal", True, False)],
    "tiled": [(64, "float32", "none", False, False), (40, "float16", "causal", False, False)],
    "naive": [(40, "bfloat16", "window", False, False), (64, "float32", "causal", True, False)],
}


@dataclasses.dataclass(frozen=True)
class Case:
    idx: int
    family: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str
    causal: bool
    window: tuple | None
    softcap: float | None
    layout: str
    view: str
    backward: bool
    deterministic: bool

    @property
    def id(self) -> str:
        band = "causal" if self.causal else f"w{self.window[0]}_{self.window[1]}" if self.window \
            else "full"
        return (f"p{self.idx:04d}-{self.family}-B{self.B}-H{self.Hq}_{self.Hkv}-S{self.Sq}_{self.Sk}"
                f"-D{self.D}-{self.dtype}-{band}{'-cap' if self.softcap else ''}-{self.layout}"
                f"-{self.view}{'-bwd' if self.backward else ''}")

    def shape(self):
        return dict(batch=self.B, heads_q=self.Hq, heads_kv=self.Hkv, seqlen_q=self.Sq,
                    seqlen_k=self.Sk, head_dim=self.D, dtype=self.dtype, layout=self.layout)


def draw(seed: int = SEED, n: int = N) -> list[Case]:
    rng = np.random.default_rng(seed)
    names = list(CONFIGS)
    cases = []
    for idx in range(n):
        family = names[int(rng.integers(len(names)))]
        configs = CONFIGS[family]
        D, dtype, band, cap, det = configs[int(rng.integers(len(configs)))]
        hkv = int(rng.integers(1, 4))
        group = int(rng.choice([1, 2, 4]))
        sq = int(rng.integers(1, 9)) if family == "decode" else int(rng.integers(1, 301))
        sk = int(rng.integers(1, 301))
        window = None
        if band == "window":
            window = (int(rng.integers(0, 65)), int(rng.integers(0, 33)))
        cases.append(Case(
            idx=idx, family=family, B=int(rng.integers(1, 4)), Hq=hkv * group, Hkv=hkv,
            Sq=sq, Sk=sk, D=D, dtype=dtype, causal=band == "causal", window=window,
            softcap=float(rng.choice([5.0, 30.0])) if cap else None,
            layout=("bhsd", "bshd")[int(rng.integers(2))],
            view=("contiguous", "packed", "padded")[int(rng.integers(3))],
            backward=(idx % BWD_EVERY == 0 and family in BACKWARD_FAMILIES and not cap
                      and dtype != "float32"),
            deterministic=det))
    return cases


CASES = draw()


def band_mask(c: Case):
    """The window as a boolean [Sq, Sk] mask for the plain implementations (None
    without a window; causal goes through their own ``causal``)."""
    if c.window is None:
        return None
    i = np.arange(c.Sq)[:, None] + (c.Sk - c.Sq)
    j = np.arange(c.Sk)[None, :]
    return (j >= i - c.window[0]) & (j <= i + c.window[1])


def _cc():
    import cupy

    from cupy_attention import device

    return device.compute_capability(cupy.cuda.runtime.getDevice())


def _inputs(c: Case, xp, values=True):
    return make_qkv(xp, c.idx * 7 + SEED, view=c.view, values=values, **c.shape())


def _outs(c: Case, xp):
    return make_out(xp, batch=c.B, heads_q=c.Hq, seqlen_q=c.Sq, head_dim=c.D, dtype=c.dtype,
                    layout=c.layout, padded=c.view == "padded")


def _all_calls():
    import cupy

    for c in CASES:
        q, k, v, _ = _inputs(c, cupy, values=False)
        o, l_ = _outs(c, cupy)
        opts = dict(causal=c.causal, window=c.window, softcap=c.softcap, layout=c.layout)
        try:
            ca.attention(q, k, v, out=o.view, lse_out=l_.view, kernel=c.family, **opts)
        except Exception:
            continue
        if c.backward:
            try:
                ca.attention_backward(o.view, q, k, v, o.view, l_.view, kernel=c.family,
                                      deterministic=c.deterministic, **opts)
            except Exception:
                pass


@pytest.fixture(scope="module", autouse=True)
def _prewarm():
    prewarm_calls(_all_calls)


def _run(c: Case):
    import cupy

    p = problem_for(causal=c.causal, **c.shape())
    reason = FAMILIES[c.family].check(p, _cc())
    if reason is not None:
        pytest.skip(f"{c.family}: {reason}")
    q, k, v, _ = _inputs(c, cupy)
    out_b, lse_b = _outs(c, cupy)
    opts = dict(causal=c.causal, window=c.window, softcap=c.softcap, layout=c.layout)
    out, lse = ca.attention(q, k, v, out=out_b.view, lse_out=lse_b.view, return_lse=True,
                            kernel=c.family, **opts)
    assert out is out_b.view and lse is lse_b.view
    bm = band_mask(c)
    mask = None if bm is None else cupy.asarray(bm)
    plain = dict(causal=c.causal, mask=mask, layout=c.layout, softcap=c.softcap)
    ref, ref_lse = plain_attention(q, k, v, **plain)
    same, same_lse = plain_attention(q, k, v, precision=c.dtype, **plain)
    check_attention(to_bhsd(as_float(out), c.layout), ref, same, c.dtype,
                    lse=lse.astype(cupy.float64), ref_lse=ref_lse, same_lse=same_lse)
    assert out_b.outside_untouched() and lse_b.outside_untouched(), "wrote outside the view"
    if not c.backward:
        return
    from cupy_attention import device

    smem = device.max_shared_per_block(cupy.cuda.runtime.getDevice())
    reason = BACKWARD_FAMILIES[c.family].check(p, _cc(), smem)
    if reason is not None:
        return   # the forward was checked; this family's backward declines it here
    dout = cupy.ascontiguousarray(make_qkv(cupy, c.idx * 7 + SEED + 3, **c.shape())[0])
    grads = ca.attention_backward(dout, q, k, v, out, lse, kernel=c.family,
                                  deterministic=c.deterministic, **opts)
    bwd = dict(causal=c.causal, mask=mask, layout=c.layout)
    refs = plain_backward(dout, q, k, v, **bwd)
    sames = plain_backward(dout, q, k, v, precision=c.dtype, **bwd)
    for what, g, r, s in zip(("dq", "dk", "dv"), grads, refs, sames):
        # one key per row (Sk = 1, a window of width 1) makes dq = dk = 0 exactly in
        # float64, and the rule's noise floor 0: allow the dtype's noise at the
        # kernel's own scale there, as test_gpu_variants.py does.
        extra = noise_floor(s, c.dtype) if not float(abs(r).max()) else 0.0
        tolerance(to_bhsd(as_float(g), c.layout), r, s, c.dtype, what=what, factor=3.0,
                  extra=extra)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_fuzz(c):
    try:
        _run(c)
    except AssertionError as exc:
        raise AssertionError(f"fuzz seed {SEED}, problem {c.idx}: {c}\n{exc}") from None


def test_draw_is_reproducible():
    """The same seed draws the same problems (so a failure can be rerun)."""
    assert draw(SEED, 50) == CASES[:50]
