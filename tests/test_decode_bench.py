"""scripts/decode_bench.py's FLOP count for chunked prefill (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import load_script

db = load_script("scripts/decode_bench.py")


@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 37), (5, 5), (7, 20), (16, 3), (128, 300)])
def test_causal_flops_count_the_bottom_right_mask(sq, sk):
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    seen = int((j <= sk - sq + i).sum())   # query row i sees keys 0 .. Sk - Sq + i
    b, hq, d = 3, 4, 64
    assert db.causal_flops(b, hq, sq, sk, d) == 4 * d * b * hq * seen


def test_prefill_shapes_hold_their_queries_in_the_cache():
    for b, hq, hkv, sq, sk, d in db.PREFILL:
        assert 1 < sq <= sk and hq % hkv == 0 and d % 8 == 0
