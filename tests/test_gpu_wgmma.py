"""flash_wgmma on TESTING.md's edge lengths (5) and causal alignment (1, 2) at
head dims that exercise each row of its tile table: 64 (three consumers,
BLOCK_N = 128), 72 (BLOCK_N = 112; Q K^T's last k16 step half zero-padding, P V's
N = 72 stops 8 columns into a 64-column block), 80, 96 (BLOCK_N = 96, three
stages), 112 (two stages), 128 (three consumers at BLOCK_N = 64, two at 128 under
the causal mask), 160 (three consumers, three column blocks), 192 (two consumers,
BLOCK_N = 112) and 256 (BLOCK_N = 64, four column blocks). Each length lands
differently on the 64-row consumer tiles and the key tiles, so the producer's
zero-fill, the fully masked rows and the pipeline's prologue and epilogue (one key
tile, two, more than the STAGES buffers) are all covered."""

from __future__ import annotations

import pytest

from cupy_attention.dispatch import FAMILIES

from helpers import (as_float, check_attention, make_qkv, plain_attention, problem_for,
                     run_and_check, seed_for, to_bhsd)

pytestmark = pytest.mark.gpu

NAME = "flash_wgmma"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["square", "square-causal", "q17", "k113-causal", "q-long-causal"])
@pytest.mark.parametrize("L", [1, 2, 5, 17, 113, 1023])
@pytest.mark.parametrize("D", [64, 72, 80, 96, 112, 128, 160, 192, 256])
def test_lengths_off_every_tile(D, L, variant, dtype, device_cc):
    Sq, Sk = {"square": (L, L), "square-causal": (L, L), "q17": (17, L),
              "k113-causal": (L, 113), "q-long-causal": (L + 300, L)}[variant]
    shape = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                 dtype=dtype, layout="bhsd", causal=variant.endswith("causal"))
    reason = FAMILIES[NAME].check(problem_for(**shape), device_cc)
    if reason:
        pytest.skip(reason)
    run_and_check(NAME, seed=seed_for(NAME, D, L, variant, dtype), meta=dict(part="wgmma-lengths"),
                  **shape)


@pytest.mark.parametrize("how", ["broadcast-heads", "broadcast-batch", "reversed-rows",
                                 "one-row-repeated", "bshd-strided"])
@pytest.mark.parametrize("D", [72, 128])
def test_key_value_views_and_tensor_maps(D, how, device_cc):
    """K and V reach flash_wgmma through tensor maps: a broadcast head or batch axis
    (stride 0) is a map axis of size 1, read at coordinate 0; views no map can
    describe (rows reversed, every row the same row) run flash_mma's kernel. Each
    must match the plain implementation."""
    import cupy
    import cupy_attention as ca

    from cupy_attention import tma
    from cupy_attention.families.base import bhs_strides

    B, Hq, Hkv, Sq, Sk, dtype = 2, 4, 2, 77, 113, "bfloat16"
    layout = "bshd" if how == "bshd-strided" else "bhsd"
    reason = FAMILIES[NAME].check(problem_for(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq,
                                              seqlen_k=Sk, head_dim=D, dtype=dtype), device_cc)
    if reason:
        pytest.skip(reason)
    seed = seed_for(NAME, "views", D, how)
    q, k, v, _ = make_qkv(cupy, seed, batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq,
                          seqlen_k=Sk, head_dim=D, dtype=dtype, layout=layout)
    if how == "broadcast-heads":
        k, v = (cupy.broadcast_to(x[:, :1], x.shape) for x in (k, v))
    elif how == "broadcast-batch":
        k, v = (cupy.broadcast_to(x[:1], x.shape) for x in (k, v))
    elif how == "reversed-rows":
        k, v = (x[:, :, ::-1] for x in (k, v))
    elif how == "one-row-repeated":
        k, v = (cupy.broadcast_to(x[:, :, 5:6], x.shape) for x in (k, v))
    else:  # bshd with heads of a wider buffer: row stride 3 * Hkv * D
        wide = [cupy.concatenate([x, x, x], axis=2) for x in (k, v)]
        k, v = (w[:, :, Hkv:2 * Hkv] for w in wide)
    wants_map = how in ("broadcast-heads", "broadcast-batch", "bshd-strided")
    assert all(tma.tileable(B, Hkv, Sk, bhs_strides(x, layout)) for x in (k, v)) == wants_map
    out, lse = ca.attention(q, k, v, layout=layout, return_lse=True, kernel=NAME)
    ref, ref_lse = plain_attention(q, k, v, layout=layout)
    same, same_lse = plain_attention(q, k, v, layout=layout, precision=dtype)
    check_attention(to_bhsd(as_float(out), layout), ref, same, dtype, lse=lse.astype(cupy.float64),
                    ref_lse=ref_lse, same_lse=same_lse,
                    log=dict(kernel=NAME, dtype=dtype, D=D, view=how, part="wgmma-views"))
