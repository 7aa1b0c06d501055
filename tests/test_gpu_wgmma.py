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

from helpers import problem_for, run_and_check, seed_for

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
