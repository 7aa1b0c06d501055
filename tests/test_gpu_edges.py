"""TESTING.md "Defined behaviour on edge inputs" 1-9 on every device kernel family
(10, streams, is in test_gpu_interop.py). Cases that could leave the CUDA context
broken (misaligned base pointers, offsets past 2^31) run in a child process:
tests/gpu_isolated.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.dispatch import FAMILIES

from helpers import (
    as_float,
    bits_of,
    make_qkv,
    plain_attention,
    problem_for,
    run_and_check,
    seed_for,
    set_values,
    standin,
    tolerance,
)

pytestmark = pytest.mark.gpu

NAMES = list(FAMILIES)
# Families whose P@V runs on tensor cores multiply masked probabilities (exactly 0)
# by V, so NaN/Inf in a *masked* V row reaches the output (0 * NaN), as in
# FlashAttention. Documented in kernels/flash_mma.cu; K-side masking is exact.
V_MASKED_NAN_LEAKS = {"flash_mma", "flash_wgmma"}


# Shapes whose instantiations conftest.py compiles in parallel before the tests.
PREWARM = [
    (name, dict(batch=1, heads_q=2, heads_kv=1, seqlen_q=70, seqlen_k=90, head_dim=D,
                dtype="float16" if "float16" in FAMILIES[name].dtypes else FAMILIES[name].dtypes[0],
                causal=causal, view=view))
    for name in FAMILIES for D in (64, 72, 1, 3, 13, 59, 111, 250) for causal in (False, True)
    for view in ("contiguous", "padded")
]


def main_dtype(name):
    dtypes = FAMILIES[name].dtypes
    return "float16" if "float16" in dtypes else dtypes[0]


def require(name, cc, *, mask=None, **shape):
    m = None if mask is None else standin(mask.shape, str(mask.dtype))
    p = problem_for(mask=m, **shape)
    reason = FAMILIES[name].check(p, cc)
    if reason:
        pytest.skip(f"{name}: {reason}")


def shape(B=2, Hq=4, Hkv=2, Sq=64, Sk=64, D=64, dtype="float16", layout="bhsd", causal=False):
    return dict(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                dtype=dtype, layout=layout, causal=causal)


def rows_close(out, ref, same, dtype, sel):
    """The tolerance rule restricted to the query rows selected by ``sel`` (an index
    into [B, Hq, Sq]; NumPy parts are moved to the device)."""
    import cupy

    if isinstance(sel, tuple):
        sel = tuple(cupy.asarray(s) if isinstance(s, np.ndarray) else s for s in sel)
    elif isinstance(sel, np.ndarray):
        sel = cupy.asarray(sel)
    return tolerance(as_float(out)[sel], ref[sel], same[sel], dtype)


def random_mask(kind, shp, seed):
    """A NumPy mask: bool (70% attend) or float32 bias (30% -inf)."""
    rng = np.random.default_rng(seed)
    if kind == "bool":
        m = rng.random(shp) > 0.3
    else:
        m = rng.standard_normal(shp).astype(np.float32) * 2
        m[rng.random(shp) < 0.3] = -np.inf
    return m


# 1 ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["causal", "bool", "add"])
@pytest.mark.parametrize("name", NAMES)
def test_fully_masked_rows(name, how, device_cc):
    import cupy

    dtype = main_dtype(name)
    B, Hq, Sq, Sk = 2, 4, 70, 20
    mask = None
    if how != "causal":
        m = random_mask(how, (B, 1, Sq, Sk), seed_for(name, how))
        dead_rows = [0, 3, 33, 69]
        m[:, :, dead_rows] = False if how == "bool" else -np.inf
        if how == "bool":
            m[:, :, [i for i in range(Sq) if i not in dead_rows], 0] = True   # the rest is alive
        else:
            m[:, :, [i for i in range(Sq) if i not in dead_rows], 0] = 0.0
        mask = cupy.asarray(m)
    else:
        dead_rows = list(range(Sq - Sk))        # bottom-right: rows i < Sq - Sk see nothing
    s = shape(B=B, Hq=Hq, Sq=Sq, Sk=Sk, dtype=dtype, causal=how == "causal")
    require(name, device_cc, mask=mask, **s)
    out, lse = run_and_check(name, mask=mask, seed=seed_for(name, how), **s)
    dead = np.zeros(Sq, dtype=bool)
    dead[dead_rows] = True
    got = as_float(out).get()
    lse = lse.get()
    assert np.array_equal(np.isneginf(lse).all(axis=(0, 1)), dead), "LSE is -inf exactly on dead rows"
    assert (got[:, :, dead] == 0).all(), "fully masked rows give exactly 0"
    assert not np.isnan(got).any() and not np.isnan(lse).any()


# 2 ------------------------------------------------------------------------------

@pytest.mark.parametrize("Sq,Sk", [(5, 133), (133, 5), (64, 200), (200, 64), (129, 130)])
@pytest.mark.parametrize("name", NAMES)
def test_causal_is_bottom_right(name, Sq, Sk, device_cc):
    s = shape(Sq=Sq, Sk=Sk, dtype=main_dtype(name), causal=True, layout="bshd")
    require(name, device_cc, **s)
    out, lse = run_and_check(name, seed=seed_for(name, Sq, Sk), **s)
    got = as_float(out).swapaxes(1, 2)
    dead = max(Sq - Sk, 0)
    assert (got[:, :, :dead] == 0).all() and bool(np.isneginf(lse[:, :, :dead].get()).all())
    assert bool(np.isfinite(lse[:, :, dead:].get()).all())


# 3 ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_very_negative_logits(name, device_cc):
    """Logits -1e5 + O(1) (q[:, 0] = 1000, k[:, 0] = -100, scale 1): the softmax is
    that of the O(1) part; output neither zero nor NaN. fp32 holds a score near 1e5
    to about 2^-7, so each probability carries a relative error up to ~1e5 * 2^-22
    beyond what a same-precision computation of the O(1) part would have."""
    for dtype in FAMILIES[name].dtypes:
        s = shape(B=1, Hq=2, Hkv=1, Sq=100, Sk=300, D=64, dtype=dtype)
        require(name, device_cc, **s)
        q, k, v, _ = make_qkv(__import__("cupy"), seed_for(name, dtype, "neg"), magnitude=0.3,
                              **{key: s[key] for key in s if key not in ("causal",)})
        set_values(q, (Ellipsis, 0), 1000.0)
        set_values(k, (Ellipsis, 0), -100.0)
        out, lse = ca.attention(q, k, v, scale=1.0, return_lse=True, kernel=name)
        ref, ref_lse = plain_attention(q, k, v, scale=1.0)
        same, _ = plain_attention(q, k, v, scale=1.0, precision=dtype)
        assert float(ref_lse.max()) < -9.9e4
        delta = 1e5 * 2.0**-22
        extra = 2 * delta * float(np.abs(as_float(v)).max())
        tolerance(as_float(out), ref, same, dtype, extra=extra)
        assert float(np.abs(as_float(out)).max()) > 0.5 * float(np.abs(ref).max()), "zero-collapsed"
        lse_err = float(np.abs(lse.astype(np.float64) - ref_lse).max())
        assert lse_err <= 8 * 2.0**-24 * 1e5, f"LSE off by {lse_err}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [-0.7, 0.0, 4.0])
@pytest.mark.parametrize("name", NAMES)
def test_scale_of_any_sign(name, scale, causal, device_cc):
    """A negative scale turns the row max into the min of the raw scores, 0 makes
    every attended key equal, and 4 makes row maxima jump by far more than
    flash_wgmma's lazy-rescale margin from tile to tile. Sk = 700 gives every
    family interior key tiles (no mask), where flash_wgmma folds the scale into
    the exponent, besides its edge and diagonal tiles."""
    import math

    dtype = main_dtype(name)
    s = shape(B=1, Hq=2, Hkv=1, Sq=200, Sk=700, D=72, dtype=dtype, causal=causal)
    require(name, device_cc, **s)
    q, k, v, _ = make_qkv(__import__("cupy"), seed_for(name, scale, causal, "scale"),
                          **{key: s[key] for key in s if key != "causal"})
    out, lse = ca.attention(q, k, v, causal=causal, scale=scale, return_lse=True, kernel=name)
    ref, ref_lse = plain_attention(q, k, v, causal=causal, scale=scale)
    same, _ = plain_attention(q, k, v, causal=causal, scale=scale, precision=dtype)
    tolerance(as_float(out), ref, same, dtype)
    lse_err = float(np.abs(lse.astype(np.float64) - ref_lse).max())
    lse_scale = max(1.0, float(np.abs(ref_lse).max()))
    assert lse_err <= 1e-3 * lse_scale + 4 * 2.0**-23 * lse_scale / math.log(2), \
        f"LSE off by {lse_err}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", ["rise-0.15", "rise-1", "jump"])
@pytest.mark.parametrize("name", NAMES)
def test_row_maxima_climbing_along_the_keys(name, pattern, causal, device_cc):
    """Row maxima that climb through the keys. "rise-x": the keys grow by a factor
    1 + x every 37 rows (no kernel's tile size), scaled to 12 at the end: with 0.15
    mostly by less than flash_wgmma's lazy margin, some tiles failing its max-free
    bound and settled, with 1 on nearly every interior tile. "jump": keys from row
    400 on are 60 times larger, so scores leap by far more than 128 in the exp2
    domain and overflow a max-free exponent (flash_wgmma recomputes that tile)."""
    xp = __import__("cupy")
    dtype = main_dtype(name)
    s = shape(B=1, Hq=2, Hkv=1, Sq=150, Sk=900, D=72, dtype=dtype, causal=causal)
    require(name, device_cc, **s)
    q, k, v, _ = make_qkv(xp, seed_for(name, pattern, causal, "climb"),
                          **{key: s[key] for key in s if key != "causal"})
    rows = xp.arange(s["seqlen_k"])[None, None, :, None]
    if pattern == "jump":
        grow = xp.where(rows >= 400, 60.0, 1.0)
    else:
        grow = 1.0 + float(pattern[5:]) * (rows // 37)
        grow = grow / float(grow.max()) * 12.0
    bits = bits_of(as_float(k) * grow, dtype, xp)
    k.view(bits.dtype)[...] = bits
    out = ca.attention(q, k, v, causal=causal, kernel=name)
    ref, _ = plain_attention(q, k, v, causal=causal)
    same, _ = plain_attention(q, k, v, causal=causal, precision=dtype)
    tolerance(as_float(out), ref, same, dtype)



@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["flash_wgmma", "flash_mma"])
def test_softcapped_scores_that_leap(name, causal, device_cc):
    """Softcap 50 bounds a score to +-50, 144 apart in the exp2 domain: queries of
    positive entries meet keys pointing away from them up to row 400 (scores near
    -50) and towards them after (near +50), so the max-free softmax's exponent
    overflows on that tile (ex2 gives inf) and flash_wgmma must recompute it under
    the exact max, as it does for plain scores (test_row_maxima_climbing_along_the_keys)."""
    xp = __import__("cupy")
    dtype = main_dtype(name)
    s = shape(B=1, Hq=2, Hkv=1, Sq=150, Sk=900, D=64, dtype=dtype, causal=causal)
    require(name, device_cc, **s)
    q, k, v, _ = make_qkv(xp, seed_for(name, causal, "leap"),
                          **{key: s[key] for key in s if key != "causal"})
    rows = xp.arange(s["seqlen_k"])[None, None, :, None]
    qb = bits_of(xp.abs(as_float(q)), dtype, xp)
    kb = bits_of(xp.abs(as_float(k)) * xp.where(rows >= 400, 30.0, -30.0), dtype, xp)
    q.view(qb.dtype)[...] = qb
    k.view(kb.dtype)[...] = kb
    out, lse = ca.attention(q, k, v, causal=causal, kernel=name, softcap=50.0, return_lse=True)
    ref, ref_lse = plain_attention(q, k, v, causal=causal, softcap=50.0)
    same, same_lse = plain_attention(q, k, v, causal=causal, softcap=50.0, precision=dtype)
    tolerance(as_float(out), ref, same, dtype)
    assert bool(xp.isfinite(lse).all())
    assert float(xp.abs(lse - ref_lse).max()) <= 2 * float(xp.abs(same_lse - ref_lse).max()) + 1e-3


# 4 ------------------------------------------------------------------------------

def _nan_case(name, cc, *, causal=True, mask=None, D=64):
    import cupy

    s = shape(B=1, Hq=2, Hkv=1, Sq=150, Sk=150, D=D, dtype=main_dtype(name), causal=causal)
    require(name, cc, mask=mask, **s)
    q, k, v, _ = make_qkv(cupy, seed_for(name, causal, D, "nan"),
                          **{key: s[key] for key in s if key != "causal"})
    return s, q, k, v


def _run(name, s, q, k, v, mask=None):
    return ca.attention(q, k, v, causal=s["causal"], mask=mask, return_lse=True, kernel=name)


@pytest.mark.parametrize("name", NAMES)
def test_nan_in_keys_beyond_the_causal_bound_does_not_leak(name, device_cc):
    s, q, k, v = _nan_case(name, device_cc)
    ref, ref_lse = plain_attention(q, k, v, causal=True)
    same, _ = plain_attention(q, k, v, causal=True, precision=s["dtype"])
    set_values(k, (slice(None), slice(None), 100), np.nan)   # seen by queries >= 100
    set_values(k, (slice(None), slice(None), 120, 5), np.inf)
    out, lse = _run(name, s, q, k, v)
    rows = np.arange(150) < 100
    rows_close(out, ref, same, s["dtype"], (slice(None), slice(None), rows))
    # NaN in an attended key propagates to the rows that attend it.
    assert bool(np.isnan(as_float(out)[:, :, 100:]).all())
    assert not bool(np.isfinite(lse[:, :, 100:]).any())


@pytest.mark.parametrize("side", ["k", "v"])
@pytest.mark.parametrize("name", NAMES)
def test_nan_in_keys_masked_by_a_bool_mask_does_not_leak(name, side, device_cc):
    import cupy

    if side == "v" and name in V_MASKED_NAN_LEAKS:
        pytest.skip(f"{name}: P@V on tensor cores computes 0 * NaN for masked V (documented)")
    mask = cupy.ones((150,), dtype=bool)
    masked = [0, 7, 64, 149]
    mask[masked] = False
    s, q, k, v = _nan_case(name, device_cc, causal=False, mask=mask)
    ref, _ = plain_attention(q, k, v, mask=mask)
    same, _ = plain_attention(q, k, v, mask=mask, precision=s["dtype"])
    x = k if side == "k" else v
    for j, val in zip(masked, (np.nan, np.inf, -np.inf, np.nan)):
        set_values(x, (slice(None), slice(None), j), val)
    out, lse = _run(name, s, q, k, v, mask)
    rows_close(out, ref, same, s["dtype"], Ellipsis)
    assert bool(np.isfinite(lse).all())


@pytest.mark.parametrize("name", NAMES)
def test_nan_in_values_beyond_the_causal_bound_does_not_leak(name, device_cc):
    if name in V_MASKED_NAN_LEAKS:
        pytest.skip(f"{name}: P@V on tensor cores computes 0 * NaN for masked V (documented)")
    s, q, k, v = _nan_case(name, device_cc)
    ref, _ = plain_attention(q, k, v, causal=True)
    same, _ = plain_attention(q, k, v, causal=True, precision=s["dtype"])
    set_values(v, (slice(None), slice(None), 100), np.nan)
    set_values(v, (slice(None), slice(None), 120), -np.inf)
    out, _ = _run(name, s, q, k, v)
    rows_close(out, ref, same, s["dtype"], (slice(None), slice(None), np.arange(150) < 100))
    assert bool(np.isnan(as_float(out)[:, :, 100:]).all())


@pytest.mark.parametrize("name", NAMES)
def test_nan_in_an_attended_value_propagates_to_its_column(name, device_cc):
    s, q, k, v = _nan_case(name, device_cc, causal=False)
    set_values(v, (0, 0, 37, 3), np.nan)
    out, lse = _run(name, s, q, k, v)
    got = as_float(out)
    assert bool(np.isnan(got[..., 3]).all())
    assert bool(np.isfinite(np.delete(got.get(), 3, axis=-1)).all()) and bool(np.isfinite(lse).all())


@pytest.mark.parametrize("name", NAMES)
def test_nan_in_a_query_stays_in_its_row(name, device_cc):
    s, q, k, v = _nan_case(name, device_cc, causal=False)
    ref, _ = plain_attention(q, k, v)
    same, _ = plain_attention(q, k, v, precision=s["dtype"])
    set_values(q, (0, 1, 77, 10), np.nan)
    out, lse = _run(name, s, q, k, v)
    assert bool(np.isnan(as_float(out)[0, 1, 77]).all()) and bool(np.isnan(lse[0, 1, 77]))
    keep = np.ones((1, 2, 150), dtype=bool)
    keep[0, 1, 77] = False
    rows_close(out, ref, same, s["dtype"], keep)


@pytest.mark.parametrize("name", NAMES)
def test_nan_past_the_end_of_k_and_v_is_never_read(name, device_cc):
    """k/v are the first 77 rows of 300-row NaN-filled allocations: a tile that runs
    past Sk must not pull the NaN rows in (for V too: they are not masked, they are
    outside the tensor)."""
    import cupy

    dtype = main_dtype(name)
    s = shape(B=2, Hq=4, Hkv=2, Sq=93, Sk=77, D=64, dtype=dtype)
    require(name, device_cc, **s)
    dims = {key: val for key, val in s.items() if key != "causal"}
    q, k_long, v_long, _ = make_qkv(cupy, seed_for(name, "tail"), **{**dims, "seqlen_k": 300})
    set_values(k_long, (slice(None), slice(None), slice(77, None)), np.nan)
    set_values(v_long, (slice(None), slice(None), slice(77, None)), np.nan)
    k, v = k_long[:, :, :77], v_long[:, :, :77]
    for causal in (False, True):
        out, lse = ca.attention(q, k, v, causal=causal, return_lse=True, kernel=name)
        ref, _ = plain_attention(q, k, v, causal=causal)
        same, _ = plain_attention(q, k, v, causal=causal, precision=dtype)
        tolerance(as_float(out), ref, same, dtype)
        assert not bool(np.isnan(lse).any())


# 5 ------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["square", "square-causal", "q17", "k113-causal"])
@pytest.mark.parametrize("L", [1, 2, 5, 17, 113, 1023])
@pytest.mark.parametrize("name", NAMES)
def test_lengths_off_every_tile(name, L, variant, device_cc):
    Sq, Sk = {"square": (L, L), "square-causal": (L, L), "q17": (17, L),
              "k113-causal": (L, 113)}[variant]
    s = shape(B=2, Hq=4, Hkv=2, Sq=Sq, Sk=Sk, D=72, dtype=main_dtype(name),
              causal=variant.endswith("causal"))
    require(name, device_cc, **s)
    run_and_check(name, seed=seed_for(name, L, variant), meta=dict(part="lengths"), **s)


# 6 ------------------------------------------------------------------------------

@pytest.mark.parametrize("empty", ["B", "Sq", "Sk", "B-Sk"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("name", NAMES)
def test_empty_inputs(name, layout, empty, device_cc, monkeypatch):
    import cupy

    B = 0 if empty.startswith("B") else 2
    Sq = 0 if empty == "Sq" else 9
    Sk = 0 if empty.endswith("Sk") else 11
    s = shape(B=B, Sq=Sq, Sk=Sk, dtype=main_dtype(name), layout=layout)
    require(name, device_cc, **s)

    def no_launch(*args, **kwargs):
        raise AssertionError("an empty problem must not launch a kernel")

    monkeypatch.setattr(FAMILIES[name], "launch", no_launch)
    q, k, v, _ = make_qkv(cupy, 0, **{key: val for key, val in s.items() if key != "causal"})
    for causal in (False, True):
        out, lse = ca.attention(q, k, v, causal=causal, layout=layout, return_lse=True,
                                kernel=name)
        assert isinstance(out, cupy.ndarray) and out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (B, 4, Sq) and lse.dtype == cupy.float32
        if out.size:       # Sk = 0: every query attends nothing
            assert bool((as_float(out) == 0).all()) and bool(cupy.isneginf(lse).all())


# 7 ------------------------------------------------------------------------------

@pytest.mark.parametrize("view", ["contiguous", "padded", "packed"])
@pytest.mark.parametrize("D", [1, 3, 13, 59, 111, 250])
@pytest.mark.parametrize("name", NAMES)
def test_head_dims_off_multiples_of_8(name, D, view, device_cc):
    s = shape(B=2, Hq=4, Hkv=2, Sq=70, Sk=90, D=D, dtype=main_dtype(name), causal=D % 2 == 1,
              layout="bshd" if D % 3 == 0 else "bhsd")
    require(name, device_cc, **s)
    run_and_check(name, view=view, seed=seed_for(name, D, view), meta=dict(part="odd-D"), **s)


# masks (API feature; each family that takes the mask kind) --------------------

MASKS = {
    "bool-full": ("bool", (2, 4, 100, 150), np.bool_),
    "bool-batch-bcast": ("bool", (2, 1, 100, 150), np.bool_),
    "bool-2d": ("bool", (100, 150), np.bool_),
    "bool-keys": ("bool", (150,), np.bool_),
    "add-f32-heads": ("add", (1, 4, 100, 150), np.float32),
    "add-f16-2d": ("add", (100, 150), np.float16),
    "add-f32-rows": ("add", (2, 1, 100, 1), np.float32),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", list(MASKS))
@pytest.mark.parametrize("name", NAMES)
def test_masks(name, kind, causal, device_cc):
    import cupy

    how, shp, np_dt = MASKS[kind]
    m = random_mask(how, shp, seed_for(name, kind)).astype(np_dt)
    if how == "add":
        m[..., 0] = 0   # keep every row alive unless causality kills it
    mask = cupy.asarray(m)
    s = shape(B=2, Hq=4, Hkv=2, Sq=100, Sk=150, D=64, dtype=main_dtype(name), causal=causal)
    require(name, device_cc, mask=mask, **s)
    run_and_check(name, mask=mask, seed=seed_for(name, kind, causal), meta=dict(part="mask"), **s)


# 7 (misaligned base pointers) and 8 (offsets past 2^31) in a child process -------

ISOLATED = [(name, check) for name in NAMES for check in ("misaligned", "offsets64")]


@pytest.fixture(scope="module")
def isolated_results():
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), str(here), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(here / "gpu_isolated.py"), *NAMES], env=env,
                          capture_output=True, text=True, timeout=600)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[(row["family"], row["check"])] = row
    return results, proc


@pytest.mark.parametrize("name,check", ISOLATED, ids=[f"{n}-{c}" for n, c in ISOLATED])
def test_isolated(name, check, isolated_results):
    results, proc = isolated_results
    row = results.get((name, check))
    if row is None:
        pytest.fail(f"the child process stopped before {name}/{check} (rc {proc.returncode}):\n"
                    f"{proc.stderr[-3000:]}")
    if row["status"] == "skip":
        pytest.skip(row["detail"])
    assert row["status"] == "ok", row["detail"]


# 9 ------------------------------------------------------------------------------

def test_flash_mma_forward_sections_change_only_the_order(monkeypatch, device_cc):
    """flash_mma's causal forward grid in sections of (head, batch) pairs (base.section;
    24 pairs: sections of 8): output and LSE bitwise those of one pair after another
    (each block owns its rows), both within the tolerance rule."""
    from cupy_attention import api

    s = shape(B=3, Hq=8, Hkv=4, Sq=300, Sk=333, D=128, dtype="bfloat16", causal=True)
    require("flash_mma", device_cc, **s)
    runs = []
    for bound in (1, 8):
        monkeypatch.setenv("CUPY_ATTENTION_SECTION", str(bound))
        monkeypatch.setattr(api, "_HOT", type(api._HOT)(api._HOT_LIMIT))
        runs.append(run_and_check("flash_mma", seed=seed_for("fwd-section"), **s))
    (o1, l1), (o8, l8) = runs
    assert bool((as_float(o1) == as_float(o8)).all()), "out differs between section bounds 1 and 8"
    assert bool((l1 == l8).all()), "LSE differs between section bounds 1 and 8"
