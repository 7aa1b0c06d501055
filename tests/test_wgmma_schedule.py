"""flash_wgmma's choice of where its causal query blocks start (query_shift), on
the host: which rows a partial block gets, and that the choice stays in range."""

from __future__ import annotations

import pytest

from cupy_attention.families.flash_wgmma import query_shift


@pytest.mark.parametrize("seqlen, block_m", [(192, 192), (384, 192), (1536, 192), (512, 128),
                                             (4096, 128)])
def test_whole_blocks_stay_in_place(seqlen, block_m):
    assert query_shift(seqlen, seqlen, block_m, 128) == 0


@pytest.mark.parametrize("seqlen_q, seqlen_k, block_m, block_n, shift", [
    # S = 512 and 1k, BLOCK_M = 192, BLOCK_N = 128 (D = 64): the partial block (128 and
    # 64 rows) goes first; measured 1.03x and 1.07x against shift 0 on the H200
    (512, 512, 192, 128, 64),
    (1024, 1024, 192, 128, 128),
    # BLOCK_N = 96 (D = 96, 112), S = 512 and 2k: shifting by 64 would end every block
    # 64 rows into a key tile, one more key tile per block (0.92x, 0.96x measured)
    (512, 512, 192, 96, 0),
    (2048, 2048, 192, 96, 0),
    # one query row: one consumer works wherever it sits; ties keep 0
    (1, 1, 192, 128, 0),
])
def test_measured_cases(seqlen_q, seqlen_k, block_m, block_n, shift):
    assert query_shift(seqlen_q, seqlen_k, block_m, block_n) == shift


@pytest.mark.parametrize("block_m, block_n", [(192, 128), (192, 112), (192, 96), (192, 64),
                                              (128, 128), (128, 112)])
def test_shift_keeps_every_row_in_a_block(block_m, block_n):
    """0 <= shift <= the last block's overhang: the last block still reaches the last
    row, and the first block still starts at or before row 0."""
    for seqlen_q in list(range(1, 700, 7)) + [1000, 1023, 3000, 16000]:
        for seqlen_k in (seqlen_q, seqlen_q // 3 + 1, 2 * seqlen_q):
            overhang = -(-seqlen_q // block_m) * block_m - seqlen_q
            shift = query_shift(seqlen_q, seqlen_k, block_m, block_n)
            assert 0 <= shift <= overhang, (seqlen_q, seqlen_k, shift)
