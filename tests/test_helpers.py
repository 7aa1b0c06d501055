"""The test suite's own machinery, on the host: the tolerance rule rejects what it
must, the plain same-precision implementation rounds where TESTING.md says, and
the GPU driver (views, NaN poisoning, checks) runs end to end on the reference
kernel with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import (
    DTYPES,
    as_float,
    cast,
    make_qkv,
    noise_floor,
    plain_attention,
    round_to,
    run_and_check,
    tolerance,
)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bits_round_trip(dtype):
    x = np.array([0.0, -0.0, 1.0, -2.5, 3.14159, 1e-3, 65504.0, np.inf, -np.inf, np.nan])
    y = as_float(cast(x, dtype))
    r = round_to(x, dtype)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(x))
    fin = ~np.isnan(x)
    np.testing.assert_array_equal(y[fin], r[fin])
    eps = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    np.testing.assert_allclose(y[np.isfinite(x)], x[np.isfinite(x)], rtol=eps)


def test_bf16_rounding_is_nearest_even():
    import ml_dtypes

    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    want = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(round_to(x, "bfloat16"), want)


def test_noise_floor_is_the_rounding_floor():
    ref = np.linspace(-3, 3, 101)
    assert noise_floor(ref, "float32") < 1e-6
    assert 1e-4 < noise_floor(ref, "float16") < 1e-2
    assert noise_floor(ref, "bfloat16") > noise_floor(ref, "float16")


def _outputs(seed=0, dtype="float16"):
    rng = np.random.default_rng(seed)
    q, k, v = (cast(rng.standard_normal((1, 2, 33, 16)), dtype) for _ in range(3))
    ref, ref_lse = plain_attention(q, k, v, causal=True)
    same, same_lse = plain_attention(q, k, v, causal=True, precision=dtype)
    return ref, same, ref_lse, same_lse


def test_same_precision_is_not_float64():
    ref, same, ref_lse, same_lse = _outputs()
    err = np.abs(same - ref).max()
    assert 0 < err < 1e-2
    assert np.array_equal(round_to(same, "float16"), same)


def test_rule_accepts_rounded_reference_and_rejects_bad_outputs():
    ref, same, ref_lse, same_lse = _outputs()
    tolerance(round_to(ref, "float16"), ref, same, "float16")        # passes
    fig = tolerance(same, ref, same, "float16")
    assert fig.ratio == pytest.approx(1.0)
    worse = ref + 3 * (same - ref) + 0.01 * np.sign(same - ref + 1e-30)
    with pytest.raises(AssertionError, match=r"max\|out-ref\|"):
        tolerance(worse, ref, same, "float16")
    nan = ref.copy()
    nan[0, 1, 5, 3] = np.nan
    with pytest.raises(AssertionError, match="NaN/Inf"):
        tolerance(nan, ref, same, "float16")
    # LSE: -inf rows must be -inf exactly.
    lse_ref = ref_lse.copy()
    lse_ref[0, 0, 0] = -np.inf
    lse_out = lse_ref.copy()
    tolerance(lse_out, lse_ref, lse_ref, "float32", "lse")
    lse_out[0, 0, 0] = -1e30
    with pytest.raises(AssertionError, match="-inf"):
        tolerance(lse_out, lse_ref, lse_ref, "float32", "lse")


@pytest.mark.parametrize("view", ["contiguous", "packed", "padded"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_views_hold_the_values_and_nan_elsewhere(view, layout):
    q, k, v, bufs = make_qkv(np, 1, batch=2, heads_q=6, heads_kv=2, seqlen_q=5, seqlen_k=9,
                             head_dim=7, dtype="bfloat16", layout=layout, view=view)
    shape_q = (2, 6, 5, 7) if layout == "bhsd" else (2, 5, 6, 7)
    assert q.shape == shape_q and q.strides[-1] == q.itemsize
    for x in (q, k, v):
        assert np.isfinite(as_float(x)).all()
    if view != "contiguous":
        assert not q.flags.c_contiguous
        if view == "padded":
            assert all(b.outside_untouched() for b in bufs.values())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", ["contiguous", "packed", "padded"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_driver_on_the_reference_kernel(dtype, view, layout, tmp_path, monkeypatch):
    log = tmp_path / "errors.jsonl"
    monkeypatch.setenv("CUPY_ATTENTION_ERROR_LOG", str(log))
    run_and_check("reference", batch=2, heads_q=6, heads_kv=2, seqlen_q=7, seqlen_k=12,
                  head_dim=9, dtype=dtype, layout=layout, view=view, causal=True, xp=np, seed=3)
    import json

    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["kernel"] == "reference" and rows[0]["dtype"] == dtype
    assert rows[0]["out_max_err"] <= rows[0]["out_atol"] + 2 * rows[0]["out_same_err"]
    assert "lse_max_err" in rows[0]


def test_prewarm_compiles_the_selected_parameters_only():
    """conftest.prewarm_cases: a module whose PREWARM entries are its tests' (name, case)
    parameters (PREWARM_PARAMS) contributes those of selected tests only; another module
    its whole list; modules of CPU tests nothing."""
    from types import SimpleNamespace as NS

    import conftest

    class Module:   # hashable, as test modules are
        def __init__(self, **attrs):
            self.__dict__.update(attrs)

    a, b, c = dict(d=64), dict(d=128), dict(d=256)
    grid = Module(PREWARM=[("flash_mma", a), ("flash_mma", b), ("flash", c)], PREWARM_PARAMS=True)
    shapes = Module(PREWARM=[("naive", dict(d=8)), ("tiled", dict(d=16))])
    cpu = Module(PREWARM=[("flash", dict(d=32))])

    def item(module, gpu=True, **params):
        it = NS(module=module, keywords={"gpu": 1} if gpu else {})
        if params:
            it.callspec = NS(params=params)
        return it

    items = [item(grid, name="flash_mma", case=b), item(grid, name="flash", case=c),
             item(shapes), item(cpu, gpu=False)]
    assert conftest.prewarm_cases(items) == [("flash_mma", b), ("flash", c)] + shapes.PREWARM
    # an equal case dict that is not the parameter object itself is not selected
    assert conftest.prewarm_cases([item(grid, name="flash_mma", case=dict(d=64))]) == []
